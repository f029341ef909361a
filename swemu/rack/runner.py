"""The run: the emulators (the rack's switch; with several racks a root and a child
per rack, ``serve --parent``; the flat switch), one rack worker (``cli.rack_worker``)
per worker namespace, the interleaved schedule of methods and sizes, the records.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cpu import CPUSample, udp_errors
from .netns import (
    GLOO_PORT,
    METHODS,
    SWITCH_CONTROL_PORT,
    SWITCH_UDP_PORT,
    ClusterError,
    signals_as_exceptions,
)
from .rack import Rack, Shaping

#: The program each worker namespace runs (started by its command line, not imported:
#: it is a hostlib worker, and the rack stands below hostlib).
WORKER_MODULE = "cli.rack_worker"
#: How its result lines start on stdout (other output is ignored).
PREFIX = "CLUSTER "


@dataclass
class BenchConfig:
    """What to measure: the cross product of rates × worker counts × sizes × methods,
    ``reps`` times, interleaved."""

    rates_gbps: Sequence[float] = (0.5, 1.0, 2.5)
    workers: Sequence[int] = (2, 4, 8)
    racks: int = 1  # max(workers) split rack by rack; > 1: a fabric (a child switch per rack)
    oversubscriptions: Sequence[float] = (1.0,)  # of the rack uplinks (racks > 1)
    sizes: Sequence[int] = (16 << 20, 64 << 20)
    reps: int = 5
    methods: Sequence[str] = METHODS
    packet_size: int = 6
    window: int | None = None  # None: hostlib's default for the packet size
    mtu: int = 9000
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_bytes: int = 4 << 20
    emulator_nice: int = -10  # < 0: the emulator before the workers on the CPU (a switch
    # has its own silicon; on a 2-core host it must not queue behind the workers)
    prefix: str | None = None
    subnet: str = "10.201.0"
    step_timeout: float = 120.0  # plus 20× the ideal time of the step

    def validate(self) -> None:
        from swemu.protocol import wire

        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(
                f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}"
            )
        if not self.rates_gbps or min(self.rates_gbps) <= 0:
            raise ValueError("link rates must be positive")
        if not self.workers or min(self.workers) < 2 or max(self.workers) > 32:
            raise ValueError("worker counts must be in 2..32")
        if self.racks < 1 or max(self.workers) % self.racks:
            raise ValueError(
                f"{max(self.workers)} workers do not split evenly into {self.racks} racks"
            )
        if self.racks == 1 and "flat" in self.methods:
            raise ValueError("method flat (one switch serving every rack) needs --racks 2 or more")
        if not self.oversubscriptions or min(self.oversubscriptions) < 1:
            raise ValueError("oversubscriptions must be at least 1 (1: a non-blocking uplink)")
        if self.racks == 1 and tuple(self.oversubscriptions) != (1.0,):
            raise ValueError("oversubscription is of rack uplinks: it needs --racks 2 or more")
        if not self.sizes or any(s <= 0 or s % 4 for s in self.sizes):
            raise ValueError("sizes must be positive multiples of 4 bytes (float32)")
        if self.reps < 1:
            raise ValueError("reps must be at least 1")
        import ipaddress

        try:
            net = ipaddress.ip_network(f"{self.subnet}.0/24")
        except ValueError:
            raise ValueError(f"subnet {self.subnet!r} is not three octets like 10.201.0") from None
        if not net.is_private or net.is_loopback:
            raise ValueError(f"subnet {net} is not a private range (10/8, 172.16/12, 192.168/16)")
        extra = self.racks + 1 if self.racks > 1 else 1 if "flat" in self.methods else 0
        if int(self.subnet.split(".")[2]) + extra > 255:
            raise ValueError(f"subnet {net} leaves no room for the next {extra} /24s")
        frame = wire.packet_len(self.packet_size) + 28  # + UDP and IPv4 headers
        if frame > self.mtu:
            raise ValueError(
                f"size code {self.packet_size} makes {frame}-byte IP packets, more than "
                f"the MTU {self.mtu}: raise --mtu (9000 fits code 6) or lower --packet-size"
            )


def ideal_time(
    method: str,
    workers: int,
    nbytes: int,
    rate_gbps: float,
    *,
    hosts: int | None = None,
    oversubscription: float = 1.0,
) -> float:
    """The link-rate-bound time of one collective of ``nbytes`` per worker.

    With S bytes per worker and full-duplex links of B bit/s:

    - SwitchML: every worker sends S up and receives S down, concurrently: 8S/B.
    - ring allreduce: reduce-scatter then allgather, each (W-1) steps of S/W on
      every link in both directions: 2(W-1)/W · 8S/B.
    - parameter server at rank 0 (a worker too): its downlink carries the W-1 other
      tensors and its uplink W-1 sums; pipelined, both run at once: (W-1) · 8S/B
      (a dedicated server, not a worker, would need W · 8S/B).
    - link: one tensor over one link: 8S/B.
    - flat: one switch serving every worker, as SwitchML: 8S/B.

    Racks of ``hosts`` workers (ranks placed rack by rack; None: one rack) joined
    by uplinks of U = hosts · B / ``oversubscription`` bit/s add each method's
    bytes on the busiest uplink direction over U: S for SwitchML (the rack's
    partial aggregate up, the result down), 2(W-1)/W · S for the ring (one ring
    edge enters and one leaves each rack), (W - hosts) · S for the parameter
    server (rack 0's uplink brings every other rack's tensors to rank 0).

    Headers are not counted (SwitchML size code 6: 52 bytes per 8192 of payload on
    the wire, plus one window of exponent packets per float32 call; TCP at MTU
    9000: 66 bytes per 8948), so a perfect run comes within ~1-7% of these.
    """
    t = 8 * nbytes / (rate_gbps * 1e9)
    ring = 2 * (workers - 1) / workers
    factor = {"switchml": 1.0, "ring": ring, "ps": float(workers - 1), "link": 1.0, "flat": 1.0}
    on_hosts = factor[method] * t
    if hosts is None or workers <= hosts or method in ("link", "flat"):
        return on_hosts
    uplink = {"switchml": 1.0, "ring": ring, "ps": float(workers - hosts)}[method]
    return max(on_hosts, uplink * t * oversubscription / hosts)


class _Worker:
    """The launcher's handle on one worker process: JSON lines in, JSON lines out."""

    def __init__(self, rank: int, proc: subprocess.Popen, log: Path) -> None:
        self.rank = rank
        self.proc = proc
        self.log = log
        self._buf = b""

    def send(self, **cmd: Any) -> None:
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise ClusterError(self._died()) from None

    def recv(self, deadline: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(PREFIX):
                    msg = json.loads(text[len(PREFIX) :])
                    if "error" in msg:
                        raise ClusterError(f"worker {self.rank}: {msg['error']}")
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(f"worker {self.rank} did not answer in time\n{self.tail()}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise ClusterError(self._died())
                self._buf += chunk

    def _died(self) -> str:
        self.proc.poll()
        return f"worker {self.rank} exited (status {self.proc.returncode})\n{self.tail()}"

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Record:
    """One timed collective."""

    rep: int
    rate_gbps: float
    workers: int
    nbytes: int
    method: str
    time: float
    ideal: float
    ok: bool
    worst: float
    retransmissions: int
    counters: dict[str, float] = field(default_factory=dict)  # CPU, link bytes, drops
    oversubscription: float = 1.0  # of the rack uplinks (several racks)


def start_emulator(
    rack: Rack,
    tmp: Path,
    nice: int = 0,
    *,
    ns: str | None = None,
    host: str | None = None,
    parent: str | None = None,
    name: str = "emulator",
) -> tuple[subprocess.Popen, Path]:
    """Start ``switchml-emu serve`` in namespace ``ns`` on ``host`` (default: the
    rack's top switch), a child of ``parent`` (``HOST:PORT``) if given; wait until it
    serves. Returns the process and its log (``tmp/<name>.log``)."""
    from swemu.launch import child_env

    ready = tmp / f"{name}.json"
    log = tmp / f"{name}.log"
    argv = [sys.executable, "-m", "cli.main", "serve", "--host", host or rack.switch_ip]
    if nice:  # a real switch does not share its CPU with the workers
        argv = ["nice", "-n", str(nice), *argv]
    argv += ["--port", str(SWITCH_UDP_PORT), "--control-port", str(SWITCH_CONTROL_PORT)]
    argv += ["--log-level", "warning", "--ready-file", str(ready)]
    if parent:
        argv += ["--parent", parent]
    with open(log, "wb") as f:
        proc = rack.popen(
            ns or rack.switch_ns,
            argv,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=f,
            env=child_env(),
        )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ClusterError(
                f"the {name} did not start:\n{log.read_text(errors='replace')[-2000:]}"
            )
        time.sleep(0.05)
    return proc, log


def start_switches(rack: Rack, tmp: Path, nice: int = 0) -> dict[str, subprocess.Popen]:
    """Every switch of ``rack``: the top one (``emulator``); with several racks a
    child of it in each rack's switch namespace (``emulator_rack<k>``,
    ``serve --parent``: the fabric of docs/protocol.md §7); the flat switch
    (``emulator_flat``) if the rack has one. Keys name their processes' CPU."""
    emu, _ = start_emulator(rack, tmp, nice)
    switches = {"emulator": emu}
    root = f"{rack.switch_ip}:{SWITCH_CONTROL_PORT}"
    for k in range(rack.racks if rack.racks > 1 else 0):
        ns, ip = rack.rack_switch_ns(k), rack.rack_switch_ip(k)
        name = f"emulator_rack{k}"
        switches[name], _ = start_emulator(rack, tmp, nice, ns=ns, host=ip, parent=root, name=name)
    if rack.flat:
        switches["emulator_flat"], _ = start_emulator(
            rack, tmp, nice, ns=rack.flat_ns, host=rack.flat_ip, name="emulator_flat"
        )
    return switches


def _start_workers(rack: Rack, config: BenchConfig, tmp: Path) -> list[_Worker]:
    import random

    from swemu.launch import child_env

    n = max(config.workers)
    session = random.getrandbits(48) << 8
    workers = []
    for r in range(n):
        env = child_env(
            CLUSTER_RANK=str(r),
            CLUSTER_SIZE=str(n),
            CLUSTER_WORLDS=",".join(map(str, sorted(set(config.workers)))),
            CLUSTER_IP=rack.worker_ip(r),
            CLUSTER_GLOO_INIT=f"tcp://{rack.worker_ip(0)}:{GLOO_PORT}",
            CLUSTER_SWITCH=f"{rack.worker_switch_ip(r)}:{SWITCH_UDP_PORT}",
            CLUSTER_CONTROL=f"{rack.worker_switch_ip(r)}:{SWITCH_CONTROL_PORT}",
            CLUSTER_FLAT_IP=rack.worker_flat_ip(r) if rack.flat else "",
            CLUSTER_FLAT_SWITCH=f"{rack.flat_ip}:{SWITCH_UDP_PORT}" if rack.flat else "",
            CLUSTER_FLAT_CONTROL=f"{rack.flat_ip}:{SWITCH_CONTROL_PORT}" if rack.flat else "",
            CLUSTER_SESSION=str(session),
            CLUSTER_PACKET_SIZE=str(config.packet_size),
            CLUSTER_WINDOW=str(config.window or ""),
            GLOO_SOCKET_IFNAME=rack.worker_if(r),
            OMP_NUM_THREADS="1",  # 2 cores for up to 8 workers: no thread pools
        )
        log = tmp / f"worker{r}.log"
        with open(log, "wb") as f:
            proc = rack.popen(
                rack.worker_ns(r),
                [sys.executable, "-m", WORKER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=f,
                env=env,
            )
        workers.append(_Worker(r, proc, log))
    deadline = time.monotonic() + 300
    for w in workers:
        w.recv(deadline)
    return workers


def _rotated(items: Sequence[Any], rep: int) -> list[Any]:
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


def _schedule(config: BenchConfig) -> Iterator[tuple[int, float, float, int, int, str]]:
    """(rep, rate, oversubscription, W, size, method), interleaved: every rep visits
    every point, and the order of rates, oversubscriptions and methods rotates from
    rep to rep so that slow drifts of the machine (other load, thermal) spread over
    all methods alike."""
    for rep in range(config.reps):
        for rate in _rotated(config.rates_gbps, rep):
            for over in _rotated(config.oversubscriptions, rep):
                for w in config.workers:
                    for size in config.sizes:
                        for method in _rotated(config.methods, rep):
                            if method == "link" and w != min(config.workers):
                                continue  # one link: measured once per rate and size
                            yield rep, rate, over, w, size, method


def _step(
    rack: Rack,
    workers: list[_Worker],
    pids: dict[str, int],
    config: BenchConfig,
    w: int,
    method: str,
    nbytes: int,
    iteration: int,
    ideal: float,
) -> tuple[float, bool, float, int, dict[str, float]]:
    """One collective on ranks 0..w-1: prepare, time, check. Returns (time, ok,
    worst error ratio, retransmissions, counters of the timed part: CPU
    utilisation, the bytes the busiest host link direction carried and each rack
    uplink direction (``rackup<k>_bytes``, ``rackdown<k>_bytes``), tbf drops, UDP
    datagrams the kernel dropped at sockets)."""
    group = workers[:w]
    switches = [pid for name, pid in pids.items() if name.startswith("emulator")]
    deadline = time.monotonic() + config.step_timeout + 20 * ideal
    for wk in group:
        wk.send(cmd="prepare", w=w, method=method, nbytes=nbytes, iteration=iteration)
    for wk in group:
        wk.recv(deadline)
    links0 = rack.link_counters(w)  # outside the CPU window: tc costs CPU too
    # one process per namespace: the emulators (switches), the workers
    udp0 = [sum(map(udp_errors, switches)), sum(udp_errors(wk.proc.pid) for wk in group)]
    before = CPUSample.take(pids)
    for wk in group:
        wk.send(cmd="go")
    done = [wk.recv(deadline) for wk in group]
    counters = CPUSample.take(pids).since(before)
    links1 = rack.link_counters(w)
    carried = {k: links1[k][0] - links0[k][0] for k in links1 if k in links0}
    hosts = [v for k, v in carried.items() if not k.startswith("rack")]
    counters["busiest_link_bytes"] = max(hosts, default=0)
    counters.update({f"{k}_bytes": v for k, v in carried.items() if k.startswith("rack")})
    counters["drops"] = sum(links1[k][1] - links0[k][1] for k in links1 if k in links0)
    counters["udp_errors_switch"] = sum(map(udp_errors, switches)) - udp0[0]
    counters["udp_errors_workers"] = sum(udp_errors(wk.proc.pid) for wk in group) - udp0[1]
    for wk in group:
        wk.send(cmd="check")
    checks = [wk.recv(deadline) for wk in group]
    t = max(d["time"] for d in done)  # a collective ends when its last worker has its result
    ok = all(c["ok"] for c in checks)
    worst = max(c["worst"] for c in checks)
    retx = sum(d.get("retransmissions", 0) for d in done)
    counters["spurious"] = sum(d.get("spurious", 0) for d in done)
    return t, ok, worst, retx, counters


def run_benchmark(
    config: BenchConfig,
    on_record: Callable[[Record], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> list[Record]:
    """Build a rack, run the schedule, remove the rack; the list of measurements.

    The rack, the emulator and the workers are removed on return, on error, on
    Ctrl-C and on SIGTERM/SIGHUP (then :class:`Interrupted` propagates).
    """
    config.validate()
    say = on_status or (lambda msg: None)
    records: list[Record] = []
    tmp = Path(tempfile.mkdtemp(prefix=f"swml-cluster-{os.getpid()}-"))  # logs, ready file
    try:
        with (
            signals_as_exceptions(),
            Rack(
                max(config.workers),
                racks=config.racks,
                flat="flat" in config.methods,
                prefix=config.prefix,
                subnet=config.subnet,
                mtu=config.mtu,
            ) as rack,
        ):
            if rack.racks == 1:
                say(
                    f"rack {rack.prefix}*: {rack.num_workers} workers, "
                    f"bridge {rack.switch_ip}, MTU {rack.mtu}"
                )
            else:
                say(
                    f"racks {rack.prefix}*: {rack.racks} of {rack.hosts} workers, root switch "
                    f"{rack.switch_ip}, rack switches "
                    f"{', '.join(map(rack.rack_switch_ip, range(rack.racks)))}, MTU {rack.mtu}"
                )
            shaping = Shaping(
                config.rates_gbps[0], config.delay_ms, config.loss_pct, config.queue_bytes
            )
            rack.shape(shaping, config.oversubscriptions[0])
            switches = start_switches(rack, tmp, config.emulator_nice)
            say(f"{'emulator' if len(switches) == 1 else 'switches'} serving; starting workers ...")
            workers = _start_workers(rack, config, tmp)
            pids = {
                **{name: p.pid for name, p in switches.items()},
                **{f"worker{wk.rank}": wk.proc.pid for wk in workers},
            }
            say("workers ready; warming up every method")
            for w in config.workers:
                for method in config.methods:
                    if method != "link" or w == min(config.workers):
                        _step(rack, workers, pids, config, w, method, 1 << 20, 99, 0.0)
            hosts = rack.hosts if rack.racks > 1 else None
            for rep, rate, over, w, size, method in _schedule(config):
                if rack.shaping is None or (rack.shaping.rate_gbps, rack.oversubscription) != (
                    rate,
                    over,
                ):
                    shaping = Shaping(rate, config.delay_ms, config.loss_pct, config.queue_bytes)
                    rack.shape(shaping, over)
                ideal = ideal_time(method, w, size, rate, hosts=hosts, oversubscription=over)
                t, ok, worst, retx, counters = _step(
                    rack, workers, pids, config, w, method, size, rep, ideal
                )
                rec = Record(rep, rate, w, size, method, t, ideal, ok, worst, retx, counters, over)
                records.append(rec)
                if on_record:
                    on_record(rec)
            for wk in workers:
                wk.send(cmd="quit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return records
