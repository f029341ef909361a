"""Switch-only benchmark: packets/s of the emulator's data path, aggregation vs echo.

A server process runs the emulator's data plane on one UDP socket, either as the
switch (``agg``: the Numba engine, W workers registered directly in the engine)
or as an echo of the same I/O path (``echo``: every datagram back to its
sender, no switch). A client process owns W sockets and drives rounds of
pre-built packets: each socket sends one packet per slot of a window of K
slots, then receives K packets back (the multicast results in ``agg``, its own
packets in ``echo``), so both modes move exactly the same packets in and out.
The two modes run alternately in one invocation; the report is the ratio.

``--shards S`` runs S server processes as ``serve --shards`` does (shard i
holds the slots ``s % S == i`` on its own port; the client sends slot s to
port ``s % S``), so that 1 and 2 shards can be compared side by side.

``--formats 32,16`` measures the 16-bit values of docs/protocol.md §4.2 beside the
32-bit ones, interleaved in the same invocation: a job registered for the format,
packets with the format bit set and 2N 16-bit lanes (bounded for W workers, as
hostlib sends them) in the same bytes. The packets being as long, the ratio of
the packet rates is the ratio per byte (and a 16-bit packet carries twice the
values).

``python -m bench switch --engine`` measures the switch kernel alone, in memory (no
sockets): bytes per second of each value format, alternating.

Run: ``python -m bench.switch [--size-code 3] [--workers 4] [--window 32] [--shards 1]
[--formats 32,16]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from swemu.protocol import fastio, wire
from swemu.protocol.jit import kernel
from swemu.protocol.netutil import set_socket_buffers
from swemu.protocol.worker import quant


def serve(
    mode: str,
    ports: list[int],
    size_code: int,
    window: int,
    ready: str,
    shard: tuple[int, int] = (0, 1),
    value_formats: int = 0,
) -> None:
    """The server process: one data plane in ``mode`` (shard ``i`` of ``S``), until
    SIGTERM; the job registered with ``value_formats`` (1: the 16-bit format)."""
    import asyncio

    from swemu.core.engine import EngineConfig, SwitchEngine, warmup
    from swemu.serving.dataplane import DataPlane, bind_udp

    async def main() -> None:
        warmup()
        engine = SwitchEngine(EngineConfig(pool_size=max(window, 1)), shard=shard)
        for rank, port in enumerate(ports):
            engine.register(
                session_id=1,
                rank=rank,
                num_workers=len(ports),
                ipv4=0x7F000001,
                udp_port=port,
                packet_size=size_code,
                pool_size=window,
                value_formats=value_formats,
            )
        sock = bind_udp("127.0.0.1", 0)
        dp = DataPlane(engine, sock, asyncio.get_running_loop(), echo=mode == "echo")
        dp.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        Path(ready).write_text(str(sock.getsockname()[1]))
        await stop.wait()
        dp.stop()
        sock.close()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


@kernel
def _rounds(fds, rounds, window, pkt_ptr, plen, dst_ip, dst_ports, tx, rx, rows):
    """Drive ``rounds`` windows through the switch (slot s to ``dst_ports[s]``;
    ``tx``/``rx`` the vectors, ``rows`` where results are received); return
    rounds completed (fewer means a receive timed out: a packet was lost)."""
    w = fds.shape[0]
    out = fastio.Sends(
        np.empty(window, np.int64),
        np.full(window, plen, np.int64),
        np.full(window, dst_ip, np.uint32),
        dst_ports,
    )
    for r in range(rounds):
        st = r & 1
        for k in range(w):
            for s in range(window):
                out.ptr[s] = pkt_ptr[st, k, s]
            sent = fastio.send_batch(fds[k], tx, window, out)
            if sent < window:
                return r
        for k in range(w):
            got = 0
            while got < window:
                n = fastio.recv_batch_flags(fds[k], rx, min(window - got, 64), rows, 0)
                if n <= 0:
                    return r  # SO_RCVTIMEO expired: lost packets
                got += n
    return rounds


def measure(
    mode: str,
    *,
    workers: int,
    size_code: int,
    window: int,
    seconds: float,
    shards: int = 1,
    values16: bool = False,
) -> float:
    """Packets per second into the switch (= out of it) for ``shards`` servers in
    ``mode``; ``values16``: 16-bit packets to a job registered for them."""
    plen = wire.packet_len(size_code)
    socks = []
    for _ in range(workers):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_socket_buffers(s)
        s.bind(("127.0.0.1", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, np.array([2, 0], np.int64).tobytes())
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    with tempfile.TemporaryDirectory() as tmp:
        readies = [os.path.join(tmp, f"ready{i}") for i in range(shards)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.switch",
                    "--serve",
                    mode,
                    "--ports",
                    ",".join(map(str, ports)),
                    "--size-code",
                    str(size_code),
                    "--window",
                    str(window),
                    "--ready",
                    ready,
                    "--shard",
                    str(i),
                    "--shards",
                    str(shards),
                    "--value-formats",
                    str(int(values16)),
                ]
            )
            for i, ready in enumerate(readies)
        ]
        try:
            for proc, ready in zip(procs, readies):
                while not os.path.exists(ready):
                    if proc.poll() is not None:
                        raise RuntimeError("benchmark server exited at start")
                    time.sleep(0.02)
            time.sleep(0.05)
            server_ports = [int(Path(ready).read_text()) for ready in readies]
            dst_ports = np.array([server_ports[s % shards] for s in range(window)], np.int32)
            rng = np.random.default_rng(0)
            pkts = np.zeros((2, workers, window, plen), np.uint8)
            lanes = 2 * quant.offset16(workers)  # the largest 16-bit value W workers send
            for st in range(2):
                for k in range(workers):
                    for s in range(window):
                        if values16:
                            n = wire.values16_per_packet(size_code)
                            values = rng.integers(0, lanes + 1, n)
                        else:
                            n = wire.values_per_packet(size_code)
                            values = rng.integers(-1000, 1000, n, dtype=np.int32)
                        pkts[st, k, s] = np.frombuffer(
                            wire.encode(
                                size_code=size_code,
                                job_number=0,
                                tsi=s,
                                set=st,
                                slot=s,
                                values=values,
                                values16=values16,
                            ),
                            np.uint8,
                        )
            ptr = (
                pkts.ctypes.data
                + np.arange(2 * workers * window, dtype=np.int64).reshape(2, workers, window) * plen
            )
            tx, rx = fastio.MsgVec(max(window, 1)), fastio.MsgVec(64)
            rxbuf = np.zeros((64, plen + 1), np.uint8)
            rx.point_at_rows(rxbuf)
            rows = fastio.Rows(
                rxbuf, np.zeros(64, np.int32), np.zeros(64, np.uint32), np.zeros(64, np.int32)
            )
            fds = np.array([s.fileno() for s in socks], np.int64)
            args = (window, ptr, plen, 0x7F000001, dst_ports, tx.tx(), rx.rx(), rows)
            _rounds(fds, 4, *args)  # warm up (and compile)
            t0 = time.perf_counter()
            done, total = 0, 0
            while time.perf_counter() - t0 < seconds:
                r = _rounds(fds, 50, *args)
                done += r
                if r < 50:
                    raise RuntimeError(f"{mode}: packets were lost; use a smaller --window")
            elapsed = time.perf_counter() - t0
            total = done * workers * window
            return total / elapsed
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(10)
            for s in socks:
                s.close()


def engine_rates(
    workers: int,
    size_code: int,
    window: int,
    rounds: int,
    reps: int,
    formats: tuple[int, ...] = (32, 16),
) -> dict:
    """The switch kernel alone (``--engine``): :meth:`SwitchEngine.process` on
    prebuilt batches of W workers' packets, one per slot of a window, the sets
    alternating so that every packet is a new contribution and every W-th completes
    a slot; no sockets, so what differs between the formats is the kernel's work.
    Formats alternate, ``reps`` times ``rounds`` windows each; bytes in per second
    of this thread's CPU time (the kernel runs in it)."""
    from swemu.core.engine import Batch, EngineConfig, SwitchEngine

    plen = wire.packet_len(size_code)
    rng = np.random.default_rng(0)
    lanes = 2 * quant.offset16(workers)
    setups = {}
    for bits in formats:
        eng = SwitchEngine(EngineConfig(pool_size=window))
        for rank in range(workers):
            eng.register(
                session_id=1,
                rank=rank,
                num_workers=workers,
                ipv4=0x7F000001,
                udp_port=1000 + rank,
                packet_size=size_code,
                pool_size=window,
                value_formats=int(bits == 16),
            )
        batches = []
        for st in range(2):
            rows = []
            for s in range(window):
                for k in range(workers):
                    if bits == 16:
                        vals = rng.integers(0, lanes + 1, wire.values16_per_packet(size_code))
                    else:
                        n = wire.values_per_packet(size_code)
                        vals = rng.integers(-1000, 1000, n, dtype=np.int32)
                    data = wire.encode(
                        size_code=size_code,
                        job_number=0,
                        tsi=s,
                        set=st,
                        slot=s,
                        values=vals,
                        values16=bits == 16,
                    )
                    rows.append((data, 1000 + k))
            for lo in range(0, len(rows), 64):
                b = Batch(64, plen)
                for data, port in rows[lo : lo + 64]:
                    b.add(data, 0x7F000001, port)
                batches.append(b)
        setups[bits] = (eng, batches)
    rates: dict[int, list[float]] = {bits: [] for bits in formats}
    for eng, batches in setups.values():  # compile and touch the pools
        for b in batches:
            eng.process(b)
    for rep in range(reps):
        for bits in formats if rep % 2 == 0 else formats[::-1]:
            eng, batches = setups[bits]
            total = rounds * sum(b.n for b in batches) * plen / 2
            t0 = time.thread_time()  # CPU time: a shared machine's preemption is not in it
            for _ in range(rounds // 2):
                for b in batches:
                    eng.process(b)
            rates[bits].append(total / (time.thread_time() - t0))
    out = {
        "workers": workers,
        "size_code": size_code,
        "packet_bytes": plen,
        "window": window,
        "reps": reps,
        "bytes_per_s": {str(b): statistics.median(v) for b, v in rates.items()},
        "bytes_per_s_all": {str(b): v for b, v in rates.items()},
    }
    if 16 in rates and 32 in rates:
        paired = [a / b for a, b in zip(rates[16], rates[32], strict=True)]
        out["b16_over_b32_paired"] = statistics.median(paired)
    return out


def run(
    workers: int,
    size_code: int,
    window: int,
    reps: int,
    seconds: float,
    shards: int = 1,
    formats: tuple[int, ...] = (32,),
) -> dict:
    """Alternate agg/echo ``reps`` times (each value format in ``formats``, 32 and
    16 bits, interleaved); medians and the ratios."""
    modes = [(mode, bits) for bits in formats for mode in ("agg", "echo")]
    rates: dict[tuple[str, int], list[float]] = {m: [] for m in modes}
    for rep in range(reps):
        for mode, bits in modes if rep % 2 == 0 else modes[::-1]:
            rates[mode, bits].append(
                measure(
                    mode,
                    workers=workers,
                    size_code=size_code,
                    window=window,
                    seconds=seconds,
                    shards=shards,
                    values16=bits == 16,
                )
            )
    by_format = {}
    for bits in formats:
        agg = statistics.median(rates["agg", bits])
        echo = statistics.median(rates["echo", bits])
        by_format[bits] = {
            "agg_pps": agg,
            "echo_pps": echo,
            "ratio": agg / echo,
            "agg_all": rates["agg", bits],
            "echo_all": rates["echo", bits],
            "values_per_packet": (2 if bits == 16 else 1) * wire.values_per_packet(size_code),
        }
    first = by_format[formats[0]]
    agg, echo = first["agg_pps"], first["echo_pps"]
    extra = {}
    if 16 in by_format and 32 in by_format:
        # per byte: the packets are as long; per value: twice as many
        paired = [a / b for a, b in zip(rates["agg", 16], rates["agg", 32], strict=True)]
        extra["agg16_over_agg32"] = by_format[16]["agg_pps"] / by_format[32]["agg_pps"]
        extra["agg16_over_agg32_paired"] = statistics.median(paired)
    return {
        "formats": {str(b): v for b, v in by_format.items()},
        **extra,
        "workers": workers,
        "size_code": size_code,
        "packet_bytes": wire.packet_len(size_code),
        "window": window,
        "shards": shards,
        "reps": reps,
        "agg_pps": agg,
        "echo_pps": echo,
        "ratio": agg / echo,
        "agg_all": first["agg_all"],
        "echo_all": first["echo_all"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", choices=["agg", "echo"], help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)
    p.add_argument("--ready", help=argparse.SUPPRESS)
    p.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--value-formats", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shards", type=int, default=1, help="data-plane processes (as serve --shards)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--size-code", type=int, default=3)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if not fastio.AVAILABLE:
        print("the switch-only benchmark needs recvmmsg/sendmmsg (64-bit Linux)", file=sys.stderr)
        return 1
    if a.serve:
        ports = [int(x) for x in a.ports.split(",")]
        serve(a.serve, ports, a.size_code, a.window, a.ready, (a.shard, a.shards), a.value_formats)
        return 0
    if not 1 <= a.shards <= 16:
        p.error("--shards must be in 1..16")
    res = run(a.workers, a.size_code, a.window, a.reps, a.seconds, a.shards)
    print(
        f"switch-only, {res['packet_bytes']}-byte packets, W={a.workers}, window {a.window}, "
        f"{a.shards} shard(s): "
        f"aggregation {res['agg_pps'] / 1e3:.0f} kpkt/s, echo {res['echo_pps'] / 1e3:.0f} "
        f"kpkt/s, ratio {res['ratio']:.2f}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
