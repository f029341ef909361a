"""Measure what one packet costs in *our* implementation, on this machine.

The simulator (:mod:`swemu.model`) predicts the emulator's own loopback
setup and says how many emulator shards a real link would need from these
numbers (seconds):

* ``switch_kernel`` / ``switch_call``: :meth:`swemu.core.engine.SwitchEngine.process`
  per received packet and per call (the Numba batch kernel: lookup,
  bitmap/count, aggregation, result building; the per-call part is mostly the
  dispatch of a kernel with ~30 array arguments);
* ``host_kernel`` / ``host_call``: the :mod:`swemu.protocol.worker.protocol` work of a worker
  per packet and per call (``Allreduce`` with its exponent pass, ``initial``,
  ``receive`` with quantization and result scaling, ``packets``);
* both kernels' per-packet costs again at a small size code, so that the cost
  of other packet sizes is interpolated (``switch_kernel_at(values)``);
* ``switch_in_situ`` / ``host_in_situ``: the CPU the emulator (from ``/proc``)
  and a worker (``time.process_time`` around each call) really spend per call
  in a real ``switchml run``-like setup, divided by what the loopback model
  charges with the isolated costs. Costs that only appear when processes wake
  each other across cores (sends that wake a sleeping receiver, small batches,
  cache traffic) make this well above 1 (1.6–2 on the development machine).
* ``send`` / ``recv``: one Python ``sendto`` / ``recvfrom_into`` of a datagram of
  that size over loopback UDP, in the loops the data planes use;
* ``wakeup``: what it costs to wake a process blocked on its socket (half a
  cross-process ping-pong, minus its send and receive).

Per-packet and per-call costs are separated by running the same lockstep
allreduce (no sockets, no waiting) with batches of 64 and of 1 datagram. The
kernels are warmed first (Numba, ``cache=True``). Costs are *CPU* time of the
measuring thread (``time.thread_time``), so that other load on a shared machine
does not inflate them, and the best of ``repeats`` runs of each batch size,
alternating (see :func:`measure_kernels`); contention is the model's job
(:func:`swemu.model.loopback.simulate_loopback`), not the calibration's. Scheduler
behaviour beyond that model, and spurious retransmissions of a starved worker,
show up as the prediction error in ``switchml simulate check``.

``switchml simulate --calibrate`` runs :func:`calibrate` and writes the JSON that
later runs load (:func:`load`); without a file, :data:`DEFAULT` (measured on the
development machine) is used.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

#: Where ``--calibrate`` writes and later runs read (override with SWITCHML_CALIBRATION).
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "bench" / "results" / "calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Per-packet and per-call CPU costs of our implementation (seconds)."""

    switch_kernel: float
    switch_call: float
    host_kernel: float
    host_call: float
    send: float
    recv: float
    wakeup: float
    #: the kernels' per-packet costs again at ``small_code`` (0: not measured), so
    #: that costs at other packet sizes can be interpolated (``*_at``)
    switch_kernel_small: float = 0.0
    host_kernel_small: float = 0.0
    small_code: int = 1
    #: real CPU per call of the emulator / of a worker in a real multi-process run,
    #: divided by what the loopback model charges with the costs above (1: not
    #: measured); the loopback model multiplies each process's costs by it
    switch_in_situ: float = 1.0
    host_in_situ: float = 1.0
    size_code: int = 6
    workers: int = 2
    window: int = 128
    dtype: str = "float32"
    nbytes: int = 16 << 20
    cores: int = 2
    machine: str = ""
    measured_at: str = ""
    extra: dict = field(default_factory=dict)

    def _at(self, small: float, big: float, values: int | None) -> float:
        """Linear in the values per packet between the two measured sizes (the
        kernels' fixed part plus their per-value aggregation/quantization)."""
        if values is None or small <= 0:
            return big
        v0, v1 = 32 << self.small_code, 32 << self.size_code
        return max(0.0, small + (big - small) * (values - v0) / (v1 - v0))

    def switch_kernel_at(self, values: int | None = None) -> float:
        """Switch kernel seconds per packet of ``values`` int32 (default: the calibrated size)."""
        return self._at(self.switch_kernel_small, self.switch_kernel, values)

    def host_kernel_at(self, values: int | None = None) -> float:
        """Host kernel seconds per packet of ``values`` int32 (default: the calibrated size)."""
        return self._at(self.host_kernel_small, self.host_kernel, values)

    def switch_packet_at(self, values: int | None = None) -> float:
        """CPU seconds of the emulator per received packet in full batches of 64,
        socket I/O included (a multicast sends W results per W packets received,
        so one send per packet on average)."""
        per_call = (self.switch_call + self.wakeup) / 64
        return self.switch_kernel_at(values) + self.recv + self.send + per_call

    def host_packet_at(self, values: int | None = None) -> float:
        """CPU seconds of a worker per packet sent and result received (full batches)."""
        per_call = (self.host_call + self.wakeup) / 64
        return self.host_kernel_at(values) + self.recv + self.send + per_call

    def shard_pps_at(self, values: int | None = None) -> float:
        """Packets per second one emulator shard (one core) takes in, with today's I/O."""
        return 1.0 / self.switch_packet_at(values)

    def shard_pps_kernel_only_at(self, values: int | None = None) -> float:
        """The same if socket I/O cost nothing (the bound for a faster data path)."""
        return 1.0 / (self.switch_kernel_at(values) + self.switch_call / 64)

    @property
    def switch_packet(self) -> float:
        return self.switch_packet_at()

    @property
    def host_packet(self) -> float:
        return self.host_packet_at()

    @property
    def shard_pps(self) -> float:
        return self.shard_pps_at()

    @property
    def shard_pps_kernel_only(self) -> float:
        return self.shard_pps_kernel_only_at()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})


#: Measured on the development machine (2 shared AMD EPYC cores, Python 3.11,
#: size code 6, 2 workers, window 128, float32, 16 MiB; ``switchml simulate
#: --calibrate`` on 2026-12-02 13:25); used when there is no calibration file.
DEFAULT = Calibration(
    switch_kernel=2.48e-6,
    switch_call=9.60e-6,
    host_kernel=9.72e-6,
    host_call=6.84e-6,
    send=6.91e-6,
    recv=4.15e-6,
    wakeup=18.16e-6,
    switch_kernel_small=0.19e-6,
    host_kernel_small=0.95e-6,
    small_code=1,
    switch_in_situ=1.29,
    host_in_situ=1.17,
    machine="development machine (x86_64, 2 shared AMD EPYC cores, Python 3.11)",
    measured_at="built-in default (2026-12-02)",
)


def load(path: str | os.PathLike | None = None) -> Calibration:
    """The calibration written by :func:`save` (``path``, $SWITCHML_CALIBRATION or
    :data:`DEFAULT_PATH`), or :data:`DEFAULT` when there is none."""
    p = Path(path or os.environ.get("SWITCHML_CALIBRATION") or DEFAULT_PATH)
    if not p.exists():
        return DEFAULT
    return Calibration.from_json(json.loads(p.read_text()))


def save(cal: Calibration, path: str | os.PathLike | None = None) -> Path:
    """Write ``cal`` as JSON (creating the directory); return the path."""
    p = Path(path or os.environ.get("SWITCHML_CALIBRATION") or DEFAULT_PATH)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(cal.to_json(), indent=2) + "\n")
    return p


# ----------------------------------------------------------------- kernels
def _lockstep(
    workers: int, size_code: int, window: int, nbytes: int, dtype: str
) -> Callable[[int], tuple[float, int, float, int, int, int]]:
    """An in-memory switch engine and worker protocols, and a function running one
    allreduce through them in lockstep with batches of at most ``cap`` datagrams
    that returns ``(host seconds, host calls, switch seconds, switch calls,
    packets sent by the workers, packets the switch took in)``."""
    from swemu.core.engine import Batch, EngineConfig, SwitchEngine, warmup
    from swemu.protocol import wire
    from swemu.protocol.worker.protocol import Timing, WorkerProtocol
    from swemu.protocol.worker.testdata import worker_input

    warmup()
    eng = SwitchEngine(EngineConfig(pool_size=window, max_jobs=1))
    addrs = [(0x7F000001, 40000 + r) for r in range(workers)]
    rank_of = {port: r for r, (_, port) in enumerate(addrs)}
    for r, (ip, port) in enumerate(addrs):
        eng.register(
            session_id=1,
            rank=r,
            num_workers=workers,
            ipv4=ip,
            udp_port=port,
            packet_size=size_code,
            pool_size=window,
        )
    timing = Timing(timeout=60.0, max_timeout=60.0, no_progress=600.0)
    protos = [
        WorkerProtocol(num_workers=workers, size_code=size_code, window=window, timing=timing)
        for _ in range(workers)
    ]
    plen = wire.packet_len(size_code)
    batch = Batch(64, plen + 1)
    rbuf = [np.zeros((64, plen + 1), np.uint8) for _ in range(workers)]
    rlens = [np.zeros(64, np.int32) for _ in range(workers)]
    ok = np.ones(64, np.uint8)
    inputs = [worker_input(r, nbytes // 4, 0, np.dtype(dtype)) for r in range(workers)]
    outs = [np.empty_like(x) for x in inputs]
    clock = time.thread_time  # CPU time: immune to preemption by other load

    def one_call(cap: int) -> tuple[float, int, float, int, int, int]:
        t_host = t_sw = 0.0
        host_calls = sw_calls = sent = swept = 0
        up: list[tuple[int, bytes]] = []
        ops = []
        for r in range(workers):
            t0 = clock()
            op = protos[r].allreduce(inputs[r], outs[r], 0.0)
            pk = op.packets(op.initial(0.0))
            t_host += clock() - t0
            host_calls += 1
            up.extend((r, bytes(p)) for p in pk)
            sent += len(pk)
            ops.append(op)
        while up:
            inbox: list[list[bytes]] = [[] for _ in range(workers)]
            for s in range(0, len(up), cap):
                part = up[s : s + cap]
                for i, (r, data) in enumerate(part):
                    batch.buf[i, : len(data)] = np.frombuffer(data, np.uint8)
                    batch.lens[i] = len(data)
                    batch.ip[i] = addrs[r][0]
                    batch.port[i] = addrs[r][1]
                batch.n = len(part)
                t0 = clock()
                eng.process(batch, 0.0)
                t_sw += clock() - t0
                sw_calls += 1
                swept += len(part)
                for d in range(batch.n_dest):
                    row = int(batch.dest_row[d])
                    w = rank_of[int(batch.dest_port[d])]
                    inbox[w].append(batch.out_buf[row, : batch.out_len[row]].tobytes())
            up = []
            for r in range(workers):
                box = inbox[r]
                for s in range(0, len(box), cap):
                    part = box[s : s + cap]
                    for i, data in enumerate(part):
                        rbuf[r][i, : len(data)] = np.frombuffer(data, np.uint8)
                        rlens[r][i] = len(data)
                    t0 = clock()
                    pk = ops[r].packets(ops[r].receive(rbuf[r], rlens[r], ok, len(part), 0.0))
                    t_host += clock() - t0
                    host_calls += 1
                    up.extend((r, bytes(p)) for p in pk)
                    sent += len(pk)
        if not all(op.done for op in ops):
            raise RuntimeError("calibration allreduce did not finish (protocol stalled)")
        return t_host, host_calls, t_sw, sw_calls, sent, swept

    return one_call


def _split(runs: list[tuple[float, int, int]]) -> tuple[float, float]:
    """Per-call and per-packet cost from two runs ``(seconds, calls, packets)``
    (one with batches of 64, one with batches of 1); never negative."""
    (t1, c1, p1), (t2, c2, p2) = runs
    det = c1 * p2 - c2 * p1
    per_call = (t1 * p2 - t2 * p1) / det
    per_pkt = (c1 * t2 - c2 * t1) / det
    if per_call < 0:  # noise: attribute everything to packets
        return 0.0, min(t1 / p1, t2 / p2)
    if per_pkt < 0:
        return min(t1 / c1, t2 / c2), 0.0
    return per_call, per_pkt


def measure_kernels(
    *,
    workers: int = 2,
    size_code: int = 6,
    window: int = 128,
    nbytes: int = 16 << 20,
    dtype: str = "float32",
    repeats: int = 3,
) -> dict[str, float]:
    """Switch and host kernel costs per call and per packet (best of ``repeats``).

    The per-packet part can be a few percent of a one-datagram call, so the runs
    with batches of 64 and of 1 alternate in time (a drift in the machine's
    speed, such as another process's cache traffic, then hits both alike), and
    the garbage collector is off while they run (a collection inside a timed
    call, likely in a process with a large heap, is not a kernel's cost)."""
    one_call = _lockstep(workers, size_code, window, nbytes, dtype)
    one_call(64)  # warm: compile or load the cached kernels, touch the pool
    collecting = gc.isenabled()
    gc.disable()
    try:
        pairs = [(one_call(64), one_call(1)) for _ in range(repeats)]
    finally:
        if collecting:
            gc.enable()
    best: dict[int, list] = {}
    for cap, runs in zip((64, 1), zip(*pairs)):
        host = min(runs, key=lambda r: r[0])
        sw = min(runs, key=lambda r: r[2])
        best[cap] = [(host[0], host[1], host[4]), (sw[2], sw[3], sw[5])]
    host_call, host_pkt = _split([best[64][0], best[1][0]])
    sw_call, sw_pkt = _split([best[64][1], best[1][1]])
    return {
        "host_call": host_call,
        "host_kernel": host_pkt,
        "switch_call": sw_call,
        "switch_kernel": sw_pkt,
        "packets_per_worker": best[64][0][2] // workers,
    }


def measure_socket(size_code: int = 6, bursts: int = 300, repeats: int = 3) -> tuple[float, float]:
    """Seconds per datagram of a Python ``sendto`` and of a ``recvfrom_into`` (with
    the bookkeeping the data planes do per datagram) over loopback UDP, in bursts
    of 64; one process, so no scheduler wait is included. Best of ``repeats``."""
    from swemu.protocol import wire

    plen = wire.packet_len(size_code)
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
        dest = b.getsockname()
        src_ip, src_ports = "127.0.0.1", frozenset({a.getsockname()[1]})
        burst = 64
        payload = np.zeros((burst, plen), np.uint8)
        rows = [memoryview(payload[i]) for i in range(burst)]
        dests = [dest] * burst
        order = np.arange(burst, dtype=np.int32)
        inbuf = np.zeros((burst, plen + 1), np.uint8)
        inrows = [memoryview(inbuf[i]) for i in range(burst)]
        lens = np.zeros(burst, np.int32)
        ok = np.zeros(burst, np.uint8)
        sendto, recv_into = a.sendto, b.recvfrom_into
        clock = time.thread_time

        def run(count: int) -> tuple[float, float, int]:
            t_send = t_recv = 0.0
            got = 0
            for _ in range(count):
                t0 = clock()
                for s in order.tolist():
                    try:
                        sendto(rows[s], dests[s])
                    except (BlockingIOError, InterruptedError):
                        pass
                t1 = clock()
                n = 0
                while n < burst:
                    try:
                        nbytes, addr = recv_into(inrows[n])
                    except (BlockingIOError, InterruptedError):
                        break
                    lens[n] = nbytes
                    ok[n] = addr[0] == src_ip and addr[1] in src_ports
                    n += 1
                t_recv += clock() - t1
                t_send += t1 - t0
                got += n
            if got == 0:
                raise RuntimeError("no datagram came back over loopback")
            return t_send / (count * burst), t_recv / got, got

        run(20)
        results = [run(bursts) for _ in range(repeats)]
        return min(r[0] for r in results), min(r[1] for r in results)
    finally:
        a.close()
        b.close()


_ECHO = """
import selectors, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
s.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
print(s.getsockname()[1], flush=True)
buf = bytearray(20000)
rounds = int(sys.argv[1])
for i in range(rounds):
    if i == 200:
        t0 = time.thread_time()
    sel.select()
    n, a = s.recvfrom_into(buf)
    s.sendto(memoryview(buf)[:n], a)
print(time.thread_time() - t0, flush=True)
"""


def measure_wakeup(
    size_code: int = 6, rounds: int = 2000, send: float = 0.0, recv: float = 0.0
) -> float:
    """CPU seconds a process spends being woken for a datagram (epoll wait, context
    switch, loop overhead), beyond its receive: from a ping-pong with another
    process where both sides wait in ``select``. Both sides' CPU time per round
    trip is ``2 · (wakeup + recv + send)``."""
    import selectors

    from swemu.protocol import wire

    child = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(rounds + 200)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sel = selectors.DefaultSelector()
    try:
        port = int(child.stdout.readline())
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        data = bytes(wire.packet_len(size_code))
        buf = bytearray(len(data) + 1)
        dest = ("127.0.0.1", port)
        mine = 0.0
        for i in range(rounds + 200):
            if i == 200:  # the first 200 warm up
                mine = time.thread_time()
            s.sendto(data, dest)
            if not sel.select(timeout=10.0):
                raise RuntimeError("the echo process did not answer")
            s.recv_into(buf)
        mine = time.thread_time() - mine
        theirs = float(child.stdout.readline())
        child.wait(timeout=10)
    finally:
        sel.close()
        s.close()
        if child.poll() is None:
            child.kill()
            child.wait()
    return max(0.0, (mine + theirs) / (2 * rounds) - send - recv)


_CPU_WORKER = """
import json, os, time
import numpy as np
import hostlib
from swemu.protocol.worker.testdata import worker_input
ctx = hostlib.from_env()
n = int(os.environ["SWITCHML_RUN_SIZE"]) // 4
dt = np.dtype(os.environ["SWITCHML_RUN_DTYPE"])
cpu = []
with ctx:
    tick = np.zeros(1, np.int32)
    ctx.allreduce(worker_input(ctx.rank, 4096, 0, dt))
    y = np.empty(n, dt)
    for it in range(int(os.environ["SWITCHML_RUN_ITERS"])):
        x = worker_input(ctx.rank, n, it, dt)
        ctx.allreduce(tick, out=tick)
        c0 = time.process_time()
        ctx.allreduce(x, out=y)
        cpu.append(time.process_time() - c0)
print(json.dumps(cpu), flush=True)
"""


def _proc_cpu(pid: int) -> float:
    """utime + stime of a process in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_in_situ(
    cal: Calibration,
    *,
    workers: int = 2,
    size_code: int = 6,
    window: int = 128,
    nbytes: int = 16 << 20,
    dtype: str = "float32",
    iters: int = 3,
) -> tuple[float, float]:
    """Run a local emulator and ``workers`` worker processes as ``switchml run``
    does and return ``(emulator, worker)`` real CPU per allreduce divided by what
    :func:`swemu.model.loopback.simulate_loopback` charges with ``cal``'s costs.

    The emulator's CPU is read from ``/proc`` around the workers' whole life
    (its own start-up excluded; the workers' warm-up and line-up calls are
    counted in packets); a worker's is ``time.process_time`` around each call.
    """
    import random
    import statistics

    from swemu.launch import EmulatorProcess, child_env

    from .loopback import simulate_loopback

    base = {"switch_in_situ": 1.0, "host_in_situ": 1.0}
    model = simulate_loopback(
        Calibration.from_json({**cal.to_json(), **base}),
        workers=workers,
        nbytes=nbytes,
        size_code=size_code,
        window=window,
        is_float=dtype == "float32",
        cores=os.cpu_count() or 1,
    )
    session = random.getrandbits(62) | 1
    with EmulatorProcess() as emu:
        before = _proc_cpu(emu.proc.pid)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CPU_WORKER],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=child_env(
                    RANK=str(r),
                    WORLD_SIZE=str(workers),
                    SWITCHML_SWITCH=emu.switch,
                    SWITCHML_CONTROL=emu.control,
                    SWITCHML_SESSION_ID=str(session),
                    SWITCHML_PACKET_SIZE=str(size_code),
                    SWITCHML_WINDOW=str(window),
                    SWITCHML_RUN_SIZE=str(nbytes),
                    SWITCHML_RUN_DTYPE=dtype,
                    SWITCHML_RUN_ITERS=str(iters),
                ),
            )
            for r in range(workers)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        after = _proc_cpu(emu.proc.pid)
    if any(p.returncode for p in procs):
        raise RuntimeError("a calibration worker failed")
    worker_cpu = statistics.median(c for out in outs for c in json.loads(out.splitlines()[-1]))
    # packets the emulator took in: the timed calls plus the warm-up and line-up calls
    per_call = model.detail["packets_per_worker"]
    warm = -(-4096 // (32 << size_code))  # the 4096-value warm-up call's chunks
    warm += min(window, warm) if dtype == "float32" else 0
    per_worker = iters * per_call + warm + iters  # + one 1-value line-up call per iteration
    switch_cpu_per_call = (after - before) * per_call / per_worker
    return (
        switch_cpu_per_call / model.detail["cpu_switch"],
        worker_cpu / model.detail["cpu_worker"],
    )


def calibrate(
    *,
    workers: int = 2,
    size_code: int = 6,
    window: int = 128,
    nbytes: int = 16 << 20,
    dtype: str = "float32",
    repeats: int = 3,
    in_situ: bool = True,
) -> Calibration:
    """Measure every cost for one configuration (about fifteen seconds), the
    kernels' per-packet costs at a second size code (1, or 3 if 1 is the main
    one) for interpolation to other packet sizes, and (``in_situ``, Linux; about
    fifteen seconds more) the in-situ factors of a real multi-process run."""
    k = measure_kernels(
        workers=workers,
        size_code=size_code,
        window=window,
        nbytes=nbytes,
        dtype=dtype,
        repeats=repeats,
    )
    small_code = 1 if size_code != 1 else 3
    small = measure_kernels(
        workers=workers,
        size_code=small_code,
        window=window,
        nbytes=min(nbytes, 1 << 20),
        dtype=dtype,
        repeats=repeats,
    )
    send, recv = measure_socket(size_code, repeats=repeats)
    wake = measure_wakeup(size_code, send=send, recv=recv)
    cal = Calibration(
        switch_kernel_small=small["switch_kernel"],
        host_kernel_small=small["host_kernel"],
        small_code=small_code,
        switch_kernel=k["switch_kernel"],
        switch_call=k["switch_call"],
        host_kernel=k["host_kernel"],
        host_call=k["host_call"],
        send=send,
        recv=recv,
        wakeup=wake,
        size_code=size_code,
        workers=workers,
        window=window,
        dtype=dtype,
        nbytes=nbytes,
        cores=os.cpu_count() or 1,
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        measured_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        extra={
            "packets_per_worker": int(k["packets_per_worker"]),
            "loadavg_1min": os.getloadavg()[0],
        },
    )
    if not in_situ or not os.path.exists("/proc/self/stat"):
        return cal
    fs, fh = measure_in_situ(
        cal, workers=workers, size_code=size_code, window=window, nbytes=nbytes, dtype=dtype
    )
    return replace(cal, switch_in_situ=fs, host_in_situ=fh)


# ------------------------------------------------------------------- check
def background_load(seconds: float = 1.0, samples: int = 50) -> float:
    """Mean number of *other* runnable processes over ``seconds`` (Linux
    ``/proc/stat`` procs_running, minus this sampler); 0 where unavailable."""
    try:
        values = []
        for _ in range(samples):
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running"):
                        values.append(int(line.split()[1]) - 1)
                        break
            time.sleep(seconds / samples)
        return max(0.0, sum(values) / len(values)) if values else 0.0
    except OSError:
        return 0.0


def run_switchml(
    workers: int, nbytes: int, iters: int, *, dtype: str = "float32", timeout: float = 600.0
) -> dict:
    """Run the real ``switchml run --workers W --size N --iters I --json F`` (local
    emulator, its default size code 6 and window 128) and return its JSON report."""
    import tempfile

    from swemu.launch import child_env

    with tempfile.TemporaryDirectory(prefix="switchml-check-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            sys.executable,
            "-c",
            "from cli.main import switchml_main; switchml_main()",
            "run",
            "--workers",
            str(workers),
            "--size",
            str(nbytes),
            "--dtype",
            dtype,
            "--iters",
            str(iters),
            "--json",
            str(out),
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), check=False
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"switchml run failed (exit {proc.returncode}): {tail[0]}")
        return json.loads(out.read_text())


def check(
    cal: Calibration,
    *,
    workers: int = 2,
    nbytes: int = 16 << 20,
    iters: int = 3,
    dtype: str = "float32",
    measured: dict | None = None,
    background: float | None = None,
) -> dict:
    """Predict a ``switchml run`` on this machine and compare it with a real one.

    The prediction is made twice: for an idle machine (all cores ours) and with
    the background load sampled just before and after the run (that many other
    CPU-bound processes sharing the run queue). ``measured`` skips the run
    (a report written by ``switchml run --json``); ``background`` replaces the
    sampled load.
    """
    import statistics

    from .loopback import simulate_loopback

    cores = os.cpu_count() or 1
    before = background_load() if background is None else background
    report = measured or run_switchml(workers, nbytes, iters, dtype=dtype)
    after = background_load() if background is None else background
    bg = (before + after) / 2
    times = [r["time"] for r in report["iters"]]
    med = statistics.median(times)
    kw = {
        "workers": workers,
        "nbytes": nbytes,
        "size_code": report.get("packet_size", 6),
        "window": report.get("window", 128),
        "is_float": dtype == "float32",
    }
    idle = simulate_loopback(cal, cores=cores, **kw)
    loaded = simulate_loopback(cal, cores=cores, background=bg, **kw)
    return {
        "workers": workers,
        "nbytes": nbytes,
        "iters": times,
        "retransmissions": [r.get("retransmissions", 0) for r in report["iters"]],
        "measured": med,
        "background": bg,
        "cores": cores,
        "predicted_idle": idle.time,
        "predicted_loaded": loaded.time,
        "error_idle": idle.time / med - 1,
        "error_loaded": loaded.time / med - 1,
        "retransmissions_predicted": loaded.detail["retransmissions"],
        "cpu_switch": loaded.detail["cpu_switch"],
        "cpu_worker": loaded.detail["cpu_worker"],
    }
