"""The paper's experiment on one machine: an emulated rack with rate-limited links.

Topology (all inside network namespaces this module creates, named with a
per-run prefix ``swml<pid>-``)::

    ns <p>w0: veth <p>0w 10.201.0.10 ─┐                 ┌─ ns <p>sw: bridge <p>br 10.201.0.1
    ns <p>w1: veth <p>1w 10.201.0.11 ─┼── port <p>0s ───┤   (the emulator serves here)
    ...                               └── port <p>1s ───┘

Every worker has one veth pair to the switch namespace, whose far end is a port of
a Linux bridge; each direction is shaped with ``tc tbf`` on its egress (worker end:
worker→switch, bridge port: switch→worker), optionally with ``netem`` delay/loss
under it. The emulator listens on the bridge's address, so SwitchML packets cross
the worker's two shaped links exactly as they would cross a ToR switch's ports, and
the workers' gloo TCP traffic crosses the same bridge (uplink of the sender,
downlink of the receiver). Nothing leaves the namespaces: the addresses
(10.201.0.0/24 by default) exist only there, and there is no route out.

:class:`Rack` builds and removes the namespaces; :func:`run_benchmark` starts the
emulator in the switch namespace and one :mod:`bench.cluster_worker` per worker
namespace, then measures SwitchML, gloo ring allreduce, a parameter server and one
shaped link, interleaved, with CPU counters sampled around every timed collective.
:func:`summarize`, :func:`markdown_table` and :func:`plot_speedup` turn the records
into the artefacts ``switchml cluster run`` writes. :func:`cleanup_leftovers`
removes what killed runs left behind.

Needs root (``ip netns``), iproute2's ``ip`` and ``tc``, and the ``tbf`` qdisc
(``netem`` only for ``delay``/``loss``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX_RE = re.compile(r"^swml(\d+)-")
ETH_HEADER = 14  # tc counts L2 bytes
METHODS = ("switchml", "ring", "ps", "link")
SWITCH_UDP_PORT = 48864
SWITCH_CONTROL_PORT = 50099
GLOO_PORT = 29500


class ClusterError(RuntimeError):
    """The rack could not be built or a run failed (one line, says what to do)."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP during a run: unwinds like Ctrl-C so the rack is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def default_prefix() -> str:
    """``swml<pid>-``: unique per live process, and the pid tells cleanup whose it was."""
    return f"swml{os.getpid()}-"


# ---------------------------------------------------------------- commands
def _cmd(argv: Sequence[str], *, check: bool = True) -> str:
    """Run ``ip``/``tc``; a failure becomes a :class:`ClusterError` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def namespaces_permitted() -> str | None:
    """None if this process may create network namespaces, else the reason why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{default_prefix()}probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"`ip netns add` failed: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def list_namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    out = _cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> list[str]:
    out = _cmd(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names


def leftovers(prefix: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with ``prefix``."""
    return [n for n in list_namespaces() + _root_links() if n.startswith(prefix)]


def _netns_pids(ns: str) -> list[int]:
    out = _cmd(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_pids(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGTERM the given processes (ours: started inside our namespaces), then SIGKILL."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove_namespace(ns: str) -> None:
    _kill_pids(_netns_pids(ns))
    _cmd(["ip", "netns", "del", ns], check=False)


def cleanup_leftovers(*, everything: bool = False) -> list[str]:
    """Remove namespaces (and their processes), root links and log directories of
    dead runs.

    A name ``swml<pid>-...`` belongs to a dead run when no process ``pid`` exists;
    ``everything`` also removes those of live runs. Returns what was removed.
    """
    removed = []
    for name in list_namespaces():
        m = PREFIX_RE.match(name)
        if m and (everything or not Path(f"/proc/{m.group(1)}").exists()):
            _remove_namespace(name)
            removed.append(name)
    for name in _root_links():
        m = PREFIX_RE.match(name)
        if m and (everything or not Path(f"/proc/{m.group(1)}").exists()):
            _cmd(["ip", "link", "del", name], check=False)
            removed.append(name)
    for path in Path(tempfile.gettempdir()).glob("swml-cluster-*-*"):  # run_benchmark's logs
        pid = path.name.split("-")[2]
        if pid.isdigit() and (everything or not Path(f"/proc/{pid}").exists()):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Interrupted` (SIGINT already raises
    KeyboardInterrupt), so ``finally`` blocks remove the rack on every exit."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Teardown must finish: hold SIGINT/SIGTERM/SIGHUP until it has."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# -------------------------------------------------------------------- rack
@dataclass(frozen=True)
class Shaping:
    """One direction of every link: a token bucket at ``rate_gbps`` (tbf) and,
    optionally, netem ``delay_ms`` / ``loss_pct`` under it."""

    rate_gbps: float
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_bytes: int = 4 << 20

    def burst_bytes(self, mtu: int) -> int:
        """Bucket depth: 2 ms of the rate, so that late softirq wake-ups on a loaded
        machine do not lose tokens, and never less than a few full frames (tbf drops
        a frame bigger than its bucket)."""
        return int(max(4 * (mtu + ETH_HEADER), self.rate_gbps * 1e9 / 8 * 2e-3))


class Rack:
    """The namespaces, bridge and shaped veth pairs of one emulated rack.

    Every name starts with ``prefix`` (default ``swml<pid>-``); interface names
    stay within Linux's 15 characters for up to 32 workers. Use as a context
    manager: the rack is removed on exit, on Ctrl-C, on SIGTERM/SIGHUP (with
    :func:`signals_as_exceptions`) and on error. Processes started with
    :meth:`popen` are stopped before their namespaces are deleted.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        prefix: str | None = None,
        subnet: str = "10.201.0",
        mtu: int = 9000,
    ) -> None:
        if not 1 <= num_workers <= 32:
            raise ValueError("a rack has 1..32 workers")
        self.num_workers = num_workers
        self.prefix = prefix or default_prefix()
        if len(self.prefix) + 3 > 15:
            raise ValueError(f"prefix {self.prefix!r} is too long for interface names")
        self.subnet = subnet
        self.mtu = mtu
        self.switch_ns = f"{self.prefix}sw"
        self.bridge = f"{self.prefix}br"
        self.shaping: Shaping | None = None
        self._created: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen] = []

    # names and addresses
    def worker_ns(self, i: int) -> str:
        return f"{self.prefix}w{i}"

    def worker_if(self, i: int) -> str:
        """The worker's end of its link (in the worker's namespace)."""
        return f"{self.prefix}{i}w"

    def switch_port(self, i: int) -> str:
        """The switch's end of worker ``i``'s link (a bridge port)."""
        return f"{self.prefix}{i}s"

    @property
    def switch_ip(self) -> str:
        return f"{self.subnet}.1"

    def worker_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    # lifetime
    def __enter__(self) -> Rack:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        """Build the namespaces, the bridge and the (unshaped) links."""
        for ns in [self.switch_ns, *map(self.worker_ns, range(self.num_workers))]:
            _cmd(["ip", "netns", "add", ns])
            self._created.append(ns)
            _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        sw = self.switch_ns
        _cmd(["ip", "-n", sw, "link", "add", self.bridge, "type", "bridge"])
        # A switch does not run the host's firewall: with br_netfilter loaded,
        # bridged packets would pass the (empty) iptables hooks and a route lookup
        # each, CPU the workers need. The setting is per namespace.
        for table in ("iptables", "ip6tables", "arptables"):
            knob = f"/proc/sys/net/bridge/bridge-nf-call-{table}"
            _cmd(["ip", "netns", "exec", sw, "sh", "-c", f"[ ! -e {knob} ] || echo 0 > {knob}"])
        for i in range(self.num_workers):
            ns, wif, port = self.worker_ns(i), self.worker_if(i), self.switch_port(i)
            # created directly inside the namespaces: nothing ever appears in the root one
            mtu = str(self.mtu)
            peer = ["peer", "name", port, "netns", sw, "mtu", mtu]
            _cmd(["ip", "link", "add", wif, "netns", ns, "mtu", mtu, "type", "veth", *peer])
            _cmd(["ip", "-n", ns, "addr", "add", f"{self.worker_ip(i)}/24", "dev", wif])
            _cmd(["ip", "-n", ns, "link", "set", wif, "up"])
            _cmd(["ip", "-n", sw, "link", "set", port, "master", self.bridge, "up"])
        _cmd(["ip", "-n", sw, "link", "set", self.bridge, "mtu", str(self.mtu), "up"])
        _cmd(["ip", "-n", sw, "addr", "add", f"{self.switch_ip}/24", "dev", self.bridge])

    def shape(self, shaping: Shaping) -> None:
        """(Re)shape both directions of every link; processes may keep running."""
        burst = shaping.burst_bytes(self.mtu)
        tbf = ["tbf", "rate", f"{int(shaping.rate_gbps * 1e9)}bit", "burst", str(burst)]
        tbf += ["limit", str(max(shaping.queue_bytes, 2 * burst))]
        netem = []
        if shaping.delay_ms or shaping.loss_pct:
            netem = ["netem", "limit", "100000"]
            if shaping.delay_ms:
                netem += ["delay", f"{shaping.delay_ms}ms"]
            if shaping.loss_pct:
                netem += ["loss", f"{shaping.loss_pct}%"]
        for i in range(self.num_workers):
            for ns, dev in (
                (self.worker_ns(i), self.worker_if(i)),
                (self.switch_ns, self.switch_port(i)),
            ):
                _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf])
                if netem:
                    try:
                        child = ["parent", "1:1", "handle", "10:", *netem]
                        _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, *child])
                    except ClusterError as exc:
                        raise ClusterError(
                            f"cannot add netem delay/loss ({exc}); the kernel may lack "
                            "sch_netem: run without --delay/--loss"
                        ) from None
        self.shaping = shaping

    def link_counters(self, workers: int) -> dict[str, tuple[int, int]]:
        """Cumulative (bytes, drops) of the tbf qdisc of each link direction of
        workers ``0 .. workers-1``: ``up<i>`` (worker i to switch), ``down<i>``."""
        out: dict[str, tuple[int, int]] = {}
        where = [(self.switch_ns, "down")] + [(self.worker_ns(i), "up") for i in range(workers)]
        for ns, direction in where:
            for q in json.loads(_cmd(["tc", "-s", "-j", "-n", ns, "qdisc", "show"]) or "[]"):
                if q.get("kind") == "tbf" and q["dev"].startswith(self.prefix):
                    i = int(q["dev"][len(self.prefix) : -1])
                    if i < workers:
                        out[f"{direction}{i}"] = (int(q["bytes"]), int(q["drops"]))
        return out

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *argv]

    def popen(self, ns: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a process in ``ns``; it is stopped when the rack is removed, and
        dies with this process. It gets its own session, so a Ctrl-C reaches only
        the launcher, which then tears down in order."""
        from swemu.serving.launch import spawn  # SIGTERM when this process dies, SIGKILL included

        proc = spawn(self.exec_argv(ns, argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def destroy(self) -> None:
        """Stop our processes, delete our namespaces (and with them every veth and
        the bridge); idempotent, uninterruptible. Raises if anything is left."""
        with _signals_blocked():
            for p in self._procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self._procs.clear()
            for ns in reversed(self._created):
                _remove_namespace(ns)
            self._created.clear()
        left = leftovers(self.prefix)
        if left:
            raise ClusterError(
                f"could not remove {', '.join(left)}; try `switchml cluster --cleanup`"
            )


# --------------------------------------------------------------------- CPU
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of all cores since boot, from /proc/stat
    (busy includes irq and softirq: the kernel's packet forwarding)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return (total - idle) / _CLK_TCK, total / _CLK_TCK


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(rest[11]) + int(rest[12])) / _CLK_TCK  # fields 14, 15 of stat(5)


def udp_errors(pid: int) -> int:
    """UDP datagrams the kernel dropped (receive-buffer overflows and other input
    errors, send-buffer overflows) in the network namespace of process ``pid``."""
    try:
        with open(f"/proc/{pid}/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
    except OSError:
        return 0
    if len(rows) < 2:
        return 0
    counters = dict(zip(rows[0][1:], map(int, rows[1][1:])))
    return counters.get("InErrors", 0) + counters.get("SndbufErrors", 0)


@dataclass
class CPUSample:
    """Counters at one instant: the machine's and each of our processes'."""

    wall: float
    busy: float
    total: float
    procs: dict[str, float]

    @classmethod
    def take(cls, pids: dict[str, int]) -> CPUSample:
        busy, total = machine_cpu()
        return cls(time.monotonic(), busy, total, {k: process_cpu(p) for k, p in pids.items()})

    def since(self, start: CPUSample) -> dict[str, float]:
        """Utilisation between ``start`` and this sample: the machine's busy fraction
        of all cores, and cores used by the emulator and by all our processes."""
        wall = max(self.wall - start.wall, 1e-9)
        used = {k: self.procs[k] - start.procs.get(k, 0.0) for k in self.procs}
        return {
            "machine_busy": min(
                1.0, (self.busy - start.busy) / max(self.total - start.total, 1e-9)
            ),
            "emulator_cores": used.get("emulator", 0.0) / wall,
            "ours_cores": sum(used.values()) / wall,
        }


# --------------------------------------------------------------- benchmark
@dataclass
class BenchConfig:
    """What to measure: the cross product of rates × worker counts × sizes × methods,
    ``reps`` times, interleaved."""

    rates_gbps: Sequence[float] = (0.5, 1.0, 2.5)
    workers: Sequence[int] = (2, 4, 8)
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
        frame = wire.packet_len(self.packet_size) + 28  # + UDP and IPv4 headers
        if frame > self.mtu:
            raise ValueError(
                f"size code {self.packet_size} makes {frame}-byte IP packets, more than "
                f"the MTU {self.mtu}: raise --mtu (9000 fits code 6) or lower --packet-size"
            )


def ideal_time(method: str, workers: int, nbytes: int, rate_gbps: float) -> float:
    """The link-rate-bound time of one collective of ``nbytes`` per worker.

    With S bytes per worker and full-duplex links of B bit/s:

    - SwitchML: every worker sends S up and receives S down, concurrently: 8S/B.
    - ring allreduce: reduce-scatter then allgather, each (W-1) steps of S/W on
      every link in both directions: 2(W-1)/W · 8S/B.
    - parameter server at rank 0 (a worker too): its downlink carries the W-1 other
      tensors and its uplink W-1 sums; pipelined, both run at once: (W-1) · 8S/B
      (a dedicated server, not a worker, would need W · 8S/B).
    - link: one tensor over one link: 8S/B.

    Headers are not counted (SwitchML size code 6: 52 bytes per 8192 of payload on
    the wire, plus one window of exponent packets per float32 call; TCP at MTU
    9000: 66 bytes per 8948), so a perfect run comes within ~1-7% of these.
    """
    t = 8 * nbytes / (rate_gbps * 1e9)
    factor = {
        "switchml": 1.0,
        "ring": 2 * (workers - 1) / workers,
        "ps": float(workers - 1),
        "link": 1.0,
    }[method]
    return factor * t


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
        from .cluster_worker import PREFIX

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


def _start_emulator(rack: Rack, tmp: Path, nice: int = 0) -> tuple[subprocess.Popen, Path]:
    from swemu.serving.launch import child_env

    ready = tmp / "emulator.json"
    log = tmp / "emulator.log"
    argv = [sys.executable, "-m", "cli.main", "serve", "--host", rack.switch_ip]
    if nice:  # a real switch does not share its CPU with the workers
        argv = ["nice", "-n", str(nice), *argv]
    argv += ["--port", str(SWITCH_UDP_PORT), "--control-port", str(SWITCH_CONTROL_PORT)]
    argv += ["--log-level", "warning", "--ready-file", str(ready)]
    with open(log, "wb") as f:
        proc = rack.popen(
            rack.switch_ns, argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=child_env()
        )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ClusterError(
                f"the emulator did not start:\n{log.read_text(errors='replace')[-2000:]}"
            )
        time.sleep(0.05)
    return proc, log


def _start_workers(rack: Rack, config: BenchConfig, tmp: Path) -> list[_Worker]:
    import random

    from swemu.serving.launch import child_env

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
            CLUSTER_SWITCH=f"{rack.switch_ip}:{SWITCH_UDP_PORT}",
            CLUSTER_CONTROL=f"{rack.switch_ip}:{SWITCH_CONTROL_PORT}",
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
                [sys.executable, "-m", "bench.cluster_worker"],
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


def _schedule(config: BenchConfig) -> Iterator[tuple[int, float, int, int, str]]:
    """(rep, rate, W, size, method), interleaved: every rep visits every point, and
    the order of rates and methods rotates from rep to rep so that slow drifts of
    the machine (other load, thermal) spread over all methods alike."""
    rates, methods = list(config.rates_gbps), list(config.methods)
    for rep in range(config.reps):
        k = rep % len(rates)
        for rate in rates[k:] + rates[:k]:
            for w in config.workers:
                for size in config.sizes:
                    j = rep % len(methods)
                    for method in methods[j:] + methods[:j]:
                        if method == "link" and w != min(config.workers):
                            continue  # one link: measured once per rate and size
                        yield rep, rate, w, size, method


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
    utilisation, the bytes the busiest link direction carried, tbf drops, UDP
    datagrams the kernel dropped at sockets)."""
    group = workers[:w]
    deadline = time.monotonic() + config.step_timeout + 20 * ideal
    for wk in group:
        wk.send(cmd="prepare", w=w, method=method, nbytes=nbytes, iteration=iteration)
    for wk in group:
        wk.recv(deadline)
    links0 = rack.link_counters(w)  # outside the CPU window: tc costs CPU too
    # one process per namespace: the emulator (switch), the workers
    udp0 = [udp_errors(pids["emulator"]), sum(udp_errors(wk.proc.pid) for wk in group)]
    before = CPUSample.take(pids)
    for wk in group:
        wk.send(cmd="go")
    done = [wk.recv(deadline) for wk in group]
    counters = CPUSample.take(pids).since(before)
    links1 = rack.link_counters(w)
    carried = {k: links1[k][0] - links0[k][0] for k in links1 if k in links0}
    counters["busiest_link_bytes"] = max(carried.values(), default=0)
    counters["drops"] = sum(links1[k][1] - links0[k][1] for k in links1 if k in links0)
    counters["udp_errors_switch"] = udp_errors(pids["emulator"]) - udp0[0]
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
                max(config.workers), prefix=config.prefix, subnet=config.subnet, mtu=config.mtu
            ) as rack,
        ):
            say(
                f"rack {rack.prefix}*: {rack.num_workers} workers, "
                f"bridge {rack.switch_ip}, MTU {rack.mtu}"
            )
            shaping = Shaping(
                config.rates_gbps[0], config.delay_ms, config.loss_pct, config.queue_bytes
            )
            rack.shape(shaping)
            emu, _ = _start_emulator(rack, tmp, config.emulator_nice)
            say("emulator serving; starting workers ...")
            workers = _start_workers(rack, config, tmp)
            pids = {"emulator": emu.pid, **{f"worker{wk.rank}": wk.proc.pid for wk in workers}}
            say("workers ready; warming up every method")
            for w in config.workers:
                for method in config.methods:
                    if method != "link" or w == min(config.workers):
                        _step(rack, workers, pids, config, w, method, 1 << 20, 99, 0.0)
            for rep, rate, w, size, method in _schedule(config):
                if rack.shaping is None or rack.shaping.rate_gbps != rate:
                    shaping = Shaping(rate, config.delay_ms, config.loss_pct, config.queue_bytes)
                    rack.shape(shaping)
                ideal = ideal_time(method, w, size, rate)
                t, ok, worst, retx, counters = _step(
                    rack, workers, pids, config, w, method, size, rep, ideal
                )
                rec = Record(rep, rate, w, size, method, t, ideal, ok, worst, retx, counters)
                records.append(rec)
                if on_record:
                    on_record(rec)
            for wk in workers:
                wk.send(cmd="quit")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return records


# ----------------------------------------------------------------- results
FAITHFUL_EFFICIENCY = 0.8  # measured within 1.25× of the link-bound time


def summarize(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Medians per (rate, W, size, method), with ideal, efficiency and CPU."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault((r.rate_gbps, r.workers, r.nbytes, r.method), []).append(r)
    rows = []
    for (rate, w, nbytes, method), rs in sorted(groups.items()):
        med = statistics.median(r.time for r in rs)
        rows.append(
            {
                "rate_gbps": rate,
                "workers": w,
                "nbytes": nbytes,
                "method": method,
                "reps": len(rs),
                "median_s": med,
                "min_s": min(r.time for r in rs),
                "max_s": max(r.time for r in rs),
                "ideal_s": rs[0].ideal,
                "efficiency": rs[0].ideal / med,
                "ok": all(r.ok for r in rs),
                "retransmissions": sum(r.retransmissions for r in rs),
                "spurious": sum(int(r.counters.get("spurious", 0)) for r in rs),
                "wire_ideal_s": statistics.median(
                    r.counters.get("busiest_link_bytes", 0) for r in rs
                )
                * 8
                / (rate * 1e9),
                "drops": sum(int(r.counters.get("drops", 0)) for r in rs),
                "udp_errors_switch": sum(int(r.counters.get("udp_errors_switch", 0)) for r in rs),
                "udp_errors_workers": sum(int(r.counters.get("udp_errors_workers", 0)) for r in rs),
                "machine_busy": statistics.median(r.counters.get("machine_busy", 0) for r in rs),
                "ours_cores": statistics.median(r.counters.get("ours_cores", 0) for r in rs),
                "emulator_cores": statistics.median(
                    r.counters.get("emulator_cores", 0) for r in rs
                ),
            }
        )
    return rows


def speedups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SwitchML's speedup over ring and PS per (rate, W, size), with the theory."""
    by = {(r["rate_gbps"], r["workers"], r["nbytes"], r["method"]): r for r in rows}
    out = []
    for (rate, w, nbytes, method), r in sorted(by.items()):
        if method != "switchml":
            continue
        entry: dict[str, Any] = {"rate_gbps": rate, "workers": w, "nbytes": nbytes}
        for other in ("ring", "ps"):
            o = by.get((rate, w, nbytes, other))
            if o:
                entry[f"vs_{other}"] = o["median_s"] / r["median_s"]
                entry[f"vs_{other}_theory"] = o["ideal_s"] / r["ideal_s"]
        out.append(entry)
    return out


def faithful_up_to(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per method, the highest rate up to which every measured point (all W and
    sizes, at this and every lower rate) came within 1.25× of its link-bound
    time — i.e. the link, not the CPU, set the pace. None: not even the lowest."""
    out: dict[str, float | None] = {}
    for method in sorted({r["method"] for r in rows}):
        best = None
        for rate in sorted({r["rate_gbps"] for r in rows if r["method"] == method}):
            pts = [r for r in rows if r["method"] == method and r["rate_gbps"] == rate]
            if all(p["efficiency"] >= FAITHFUL_EFFICIENCY for p in pts):
                best = rate
            else:
                break
        out[method] = best
    return out


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    mark = "" if r["ok"] else " WRONG"
    return f"{r['median_s'] * 1e3:.0f} ({r['ideal_s'] * 1e3:.0f}){mark}"


def _speed(s: dict[str, Any] | None, o: dict[str, Any] | None) -> str:
    if not s or not o:
        return "–"
    return f"{o['median_s'] / s['median_s']:.2f}× ({o['ideal_s'] / s['ideal_s']:.2f}×)"


def _busy(r: dict[str, Any] | None) -> str:
    return f"{r['machine_busy'] * 100:.0f}%" if r else "–"


def _cores(r: dict[str, Any] | None, emulator: bool = False) -> str:
    if not r:
        return "–"
    return f"{r['ours_cores']:.2f}" + (f" ({r['emulator_cores']:.2f})" if emulator else "")


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per (rate, W, size): every method's median (and ideal) in ms,
    SwitchML's speedups with their theory, the machine's CPU busy fraction and
    the cores our processes used (the emulator's in brackets) during SwitchML
    and ring."""
    by = {(r["rate_gbps"], r["workers"], r["nbytes"], r["method"]): r for r in rows}
    head = (
        "| rate | W | size | SwitchML ms (ideal) | ring ms (ideal) | PS ms (ideal) "
        "| link ms (ideal) | speedup vs ring (theory) | vs PS (theory) "
        "| machine busy SwitchML / ring | our cores SwitchML (emulator) / ring |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for rate, w, nbytes in sorted({k[:3] for k in by}):
        pt = {m: by.get((rate, w, nbytes, m)) for m in METHODS}
        sw, ring = pt["switchml"], pt["ring"]
        lines.append(
            f"| {rate:g} Gb/s | {w} | {_mib(nbytes)} | {_cell(sw)} | {_cell(ring)} "
            f"| {_cell(pt['ps'])} | {_cell(pt['link'])} | {_speed(sw, ring)} "
            f"| {_speed(sw, pt['ps'])} | {_busy(sw)} / {_busy(ring)} "
            f"| {_cores(sw, True)} / {_cores(ring)} |"
        )
    return head + "\n".join(lines) + "\n"


def plot_speedup(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Speedup of SwitchML over ring (and over PS) vs W, one line per rate and
    size, with the link-bound theory 2(W-1)/W (and W-1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp = speedups(rows)
    has_ps = any("vs_ps" in s for s in sp)
    fig, axes = plt.subplots(
        1, 2 if has_ps else 1, figsize=(11 if has_ps else 6, 4.2), squeeze=False
    )
    ws = sorted({s["workers"] for s in sp})
    for ax, other, theory, title in (
        (axes[0][0], "ring", lambda w: 2 * (w - 1) / w, "SwitchML vs gloo ring"),
        *(((axes[0][1], "ps", lambda w: w - 1, "SwitchML vs parameter server"),) if has_ps else ()),
    ):
        grid = [w / 10 for w in range(10, 10 * max(ws, default=8) + 1)]  # from W = 1
        ax.plot(grid, [theory(w) for w in grid], "k--", label="link-bound theory")
        for rate in sorted({s["rate_gbps"] for s in sp}):
            for nbytes in sorted({s["nbytes"] for s in sp}):
                pts = [
                    s
                    for s in sp
                    if s["rate_gbps"] == rate and s["nbytes"] == nbytes and f"vs_{other}" in s
                ]
                if pts:
                    ax.plot(
                        [p["workers"] for p in pts],
                        [p[f"vs_{other}"] for p in pts],
                        marker="o",
                        label=f"{rate:g} Gb/s, {_mib(nbytes)}",
                    )
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("workers W")
        ax.set_ylabel(f"time({other}) / time(SwitchML)")
        ax.set_title(title)
        ax.set_xticks(sorted({1, *ws}))
        ax.legend(fontsize=7)
    fig.suptitle("Emulated rack on one machine (rate-limited veth links, medians)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def code_state() -> dict[str, Any]:
    """The commit of this checkout and its modified tracked files (read-only git),
    so that a result names the code that produced it."""
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True)
    return {
        "commit": head.stdout.strip() or None,
        "modified_files": [line[3:] for line in dirty.stdout.splitlines()]
        if dirty.returncode == 0
        else None,
    }


def write_json(
    path: str | Path,
    config: BenchConfig,
    records: Sequence[Record],
    rows: Sequence[dict[str, Any]],
    *,
    complete: bool = True,
    code: dict[str, Any] | None = None,
) -> None:
    """Everything: configuration, machine (with its load: it may be shared), every
    measurement, the summary; ``complete`` is False for what a failed run saved.
    ``code``: :func:`code_state` taken when the run started (default: now)."""
    doc = {
        "complete": complete,
        "code": code if code is not None else code_state(),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "loadavg_at_end": os.getloadavg(),
        },
        "records": [asdict(r) for r in records],
        "summary": list(rows),
        "speedups": speedups(rows),
        "faithful_up_to_gbps": faithful_up_to(rows),
    }
    Path(path).write_text(json.dumps(doc, indent=1))
