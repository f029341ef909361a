"""Fuzz the packet parser and the switch engine for a bounded time.

Each round builds a batch of datagrams that mixes random bytes, truncated and
bit-flipped valid packets, valid packets of wrong size codes or slots, and
valid packets from registered, spoofed and unknown sources, and runs it through

* :func:`swemu.protocol.wire.decode` (must return a packet or raise ``PacketError``),
* the compiled engine (:meth:`SwitchEngine.process`), checked against the
  plain-Python reference (:class:`swemu.core.reference.ReferenceSwitch`) action by
  action and byte by byte, and against invariants: every packet gets exactly
  one action, pool memory never changes, results only go to registered
  workers, a job's counters only move for packets from its own workers.

Run: ``python -m bench.fuzz --seconds 600`` (CI runs it for a few seconds).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from swemu.core.engine import Action, Batch, EngineConfig, SwitchEngine
from swemu.core.reference import ReferenceSwitch
from swemu.protocol import wire

JOBS = [  # session, W, size code, pool, worker addresses
    (1, 3, 1, 8, [(0x7F000001, 5001), (0x7F000001, 5002), (0x7F000002, 0)]),
    (2, 2, 0, 4, [(0x0A000001, 6001), (0x0A000002, 6002)]),
]
STRANGERS = [(0x7F000001, 5999), (0x0A000003, 6001), (0x01020304, 80)]


def _setup() -> tuple[SwitchEngine, ReferenceSwitch]:
    eng = SwitchEngine(EngineConfig(pool_size=16, max_jobs=4))
    ref = ReferenceSwitch()
    for sid, w, code, pool, addrs in JOBS:
        ref.add_job(sid, w, code, pool)
        for rank, (ip, port) in enumerate(addrs):
            eng.register(
                session_id=sid,
                rank=rank,
                num_workers=w,
                ipv4=ip,
                udp_port=port,
                packet_size=code,
                pool_size=pool,
            )
            ref.add_worker(sid, rank, ip, port)
    return eng, ref


def _datagram(rng: np.random.Generator) -> tuple[bytes, tuple[int, int]]:
    _sid, _w, code, pool, addrs = JOBS[rng.integers(len(JOBS))]
    src = addrs[rng.integers(len(addrs))]
    if src[1] == 0:
        src = (src[0], int(rng.integers(1, 65536)))
    if rng.random() < 0.1:
        src = STRANGERS[rng.integers(len(STRANGERS))]
    kind = rng.integers(6)
    if kind == 0:
        return rng.bytes(int(rng.integers(0, 300))), src
    c = code if rng.random() < 0.9 else int(rng.integers(8))
    n = wire.values_per_packet(c)
    vals = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    data = bytearray(
        wire.encode(
            size_code=c,
            job_number=int(rng.integers(256)),
            tsi=int(rng.integers(4)),
            set=int(rng.integers(2)),
            slot=int(rng.integers(pool + 2)),
            values=vals,
            e0=int(rng.integers(-128, 128)),
            e1=int(rng.integers(-128, 128)),
        )
    )
    if kind == 1:
        data = data[: int(rng.integers(0, len(data)))]
    elif kind == 2:
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(data)))
            data[i] ^= 1 << int(rng.integers(8))
    elif kind == 3:
        data += rng.bytes(int(rng.integers(1, 8)))
    return bytes(data), src


def fuzz(seconds: float, seed: int = 0, batch: int = 32) -> dict:
    """Fuzz for ``seconds``; raise AssertionError on the first failure."""
    rng = np.random.default_rng(seed)
    eng, ref = _setup()
    memory = eng.memory_in_use
    registered = {a for *_, addrs in JOBS for a in addrs}
    b = Batch(batch)
    t0 = time.monotonic()
    n_datagrams = 0
    while time.monotonic() - t0 < seconds:
        b.n = 0
        sent = []
        for _ in range(batch):
            data, src = _datagram(rng)
            try:
                wire.decode(data)
            except wire.PacketError:
                pass
            b.add(data, *src)
            sent.append((data, src))
        eng.process(b)
        got = b.results()
        want = []
        for r, (data, src) in enumerate(sent):
            action, out = ref.receive(data, src)
            assert Action(int(b.action[r])) == action, (seed, data.hex(), src)
            want += out
        assert got == want, seed
        for _, (ip, port) in got:
            assert (ip, port) in registered or (ip, 0) in registered
        assert eng.memory_in_use == memory
        n_datagrams += batch
    return {"seconds": time.monotonic() - t0, "datagrams": n_datagrams, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=int(time.time()))
    a = p.parse_args(argv)
    res = fuzz(a.seconds, a.seed)
    print(
        f"fuzzed {res['datagrams']} datagrams in {res['seconds']:.0f} s (seed {a.seed}): no failure"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
