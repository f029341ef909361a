"""Several data-plane processes behind one control plane: ``serve --shards S``.

Theory of operation
-------------------
One data plane (:mod:`swemu.serving.dataplane`) drains one UDP socket on one core. To
go past one core the emulator runs S data-plane *shards*, each a process of its
own with its own event loop, :class:`~swemu.serving.dataplane.DataPlane` and
:class:`~swemu.core.engine.SwitchEngine`, shard i on UDP port P + i. The main process
keeps everything that is not per packet: the gRPC control plane
(:class:`~swemu.core.controller.SessionController`, Barrier/Broadcast, ``GetStats``,
``SetFaults``), the metrics endpoint and the live view.

*Slots are split by number.* Shard i holds slot s of every job iff
``s % S == i``, at local index ``s // S`` (:func:`swemu.core.engine.shard_slots`
slots of each job), so the S pools of a job take together exactly what one
unsharded pool takes and the control plane's ``--max-pool-memory`` budget stays
honest. Workers learn the ports from ``UdpSessionResponse.data_ports``
(docs/protocol.md §5) and send slot s to ``data_ports[s % S]``, so every packet of a
slot, its retransmissions and its results stay in one process and §2 holds
unchanged. A packet that reaches a shard for a slot another shard holds is
dropped and counted (``drop_wrong_shard``), never aggregated.

*Control channel.* Each shard has a :func:`multiprocessing.Pipe` to the main
process carrying ``(seq, op, args)`` requests and ``(seq, ok, value)`` replies.
:class:`ShardedTarget` implements :class:`swemu.core.controller.Target` by sending
every table write (create/drop job, set/remove worker, drop simulation) to
every shard, in order, and :meth:`ShardedTarget.commit` waits until all of
them were acknowledged: the UdpSession reply waits there (the ``commit`` hook
of :class:`~swemu.serving.control_plane.SessionService`), so a worker never sends to a shard
that does not know its job yet. Snapshots and fault settings are requests to
every shard too; :func:`merge_snapshots` sums the shards' counters into the one
snapshot shape ``GetStats``, ``stats``, ``top``, the metrics and the TUI read.

*Lifetime.* The main process binds the S sockets itself (a port in use is its
error, and port 0 finds S consecutive free ports) and hands them to shards
started with multiprocessing's ``spawn`` context. Shards ignore SIGINT (a
Ctrl-C reaches the whole process group; the main process stops them in order)
and exit when their pipe closes, so a main process that is killed leaves no
orphans. A shard that dies closes its pipe: the main process logs one line and
resolves :attr:`ShardedEmulator.failed`, on which ``serve`` exits non-zero.

*Idle timeout.* Each shard knows when it last saw a job's packet; the main
process polls the shards' idle times (a few times per ``--idle-timeout``, only
while jobs exist) and releases a job once every shard has been idle that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import ipaddress
import logging
import multiprocessing
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swemu.core.controller import (
    BITMAP_WORKERS,
    DropSimulation,
    JobParams,
    RegistrationError,
    SessionController,
    SwitchAddress,
    TargetLimits,
    WorkerAddress,
    table_state,
)
from swemu.core.engine import emulator_limits, emulator_room
from swemu.protocol.netutil import SWITCH_BUFFER_BYTES, buffer_advice, interface_mac, receive_buffer
from swemu.protocol.version import __version__
from swemu.protocol.wire import DEFAULT_CONTROL_PORT, DEFAULT_UDP_PORT

if TYPE_CHECKING:
    from swemu.core.engine import EngineConfig
    from swemu.core.faults import FaultConfig
    from swemu.observe.metrics import MetricsServer

# Numba, numpy and gRPC load where they are used: a shard needs no gRPC, the
# main process no data-plane kernels, and `serve --help`/option errors neither.

log = logging.getLogger("swemu.shards")

#: The most data-plane processes: the 16 ports 0xBEE0-0xBEEF a switch matches.
MAX_SHARDS = 16
#: Seconds the main process waits for a shard's answer before giving up on it.
REQUEST_TIMEOUT = 10.0
#: The SwitchML port range (docs/protocol.md §1); shards starting in it stay in it.
SWITCHML_PORTS = range(0xBEE0, 0xBEF0)


class ShardError(RuntimeError):
    """A data-plane shard failed a request, did not answer, or is gone."""


def check_shards(port: int, shards: int) -> None:
    """Raise ValueError (saying why) unless ``shards`` processes fit from ``port``.

    1..16 shards; ports P..P+S-1 must exist, and when P is a SwitchML port
    (0xBEE0-0xBEEF, the default 48864 included) they must all be SwitchML
    ports: a switch matches ``port & 0xFFF0 == 0xBEE0``.
    """
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"--shards {shards} must be in 1..{MAX_SHARDS}")
    if port == 0:
        return
    last = port + shards - 1
    if port in SWITCHML_PORTS and last not in SWITCHML_PORTS:
        raise ValueError(
            f"--shards {shards} from --port {port} needs ports up to {last}, past the "
            f"SwitchML range {SWITCHML_PORTS.start}-{SWITCHML_PORTS.stop - 1}"
        )
    if last > 0xFFFF:
        raise ValueError(f"--shards {shards} from --port {port} needs port {last} (> 65535)")


def bind_shard_sockets(host: str, port: int, count: int, attempts: int = 64) -> list[socket.socket]:
    """``count`` UDP sockets on ports ``port .. port+count-1`` (port 0: any
    consecutive free ones). OSError names the port that cannot be bound."""
    from swemu.serving.dataplane import bind_udp

    if port != 0:
        socks: list[socket.socket] = []
        try:
            for i in range(count):
                socks.append(bind_udp(host, port + i))
        except OSError:
            for s in socks:
                s.close()
            raise
        return socks
    for _ in range(attempts):
        socks = [bind_udp(host, 0)]
        first = socks[0].getsockname()[1]
        try:
            if first + count - 1 > 0xFFFF:
                raise OSError("no room above")
            for i in range(1, count):
                socks.append(bind_udp(host, first + i))
        except OSError:
            for s in socks:
                s.close()
            continue
        return socks
    raise OSError(f"cannot find {count} consecutive free UDP ports on {host}")


# ----------------------------------------------------------------------------- shard side
class _Shard:
    """One data-plane process: an engine holding slots ``s % count == index``, a
    data plane on its socket, and the requests of the main process."""

    def __init__(
        self,
        index: int,
        count: int,
        sock: socket.socket,
        conn: Any,
        config: EngineConfig,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        from swemu.core.engine import EmulatorTarget, SwitchEngine
        from swemu.serving.dataplane import DataPlane

        self.index = index
        self.sock = sock
        self.conn = conn
        self.loop = loop
        self.engine = SwitchEngine(config, shard=(index, count))
        self.target = EmulatorTarget(self.engine)
        self.data = DataPlane(self.engine, sock, loop)
        self.done = asyncio.Event()

    def on_readable(self) -> None:
        try:
            while self.conn.poll():
                seq, op, args = self.conn.recv()
                try:
                    value = getattr(self, f"op_{op}")(*args)
                except Exception as exc:  # reported to the main process, which decides
                    log.exception("shard %d: %s failed", self.index, op)
                    self.conn.send((seq, False, f"{type(exc).__name__}: {exc}"))
                else:
                    self.conn.send((seq, True, value))
        except (EOFError, OSError):  # the main process is gone: nobody to serve
            self.done.set()

    # requests (op_<name>), in the order the main process sent them
    def op_create_job(self, session_id: int, workers: int, code: int, pool: int) -> None:
        self.engine.create_job(session_id, workers, code, pool, self.loop.time())

    def op_delete_job(self, session_id: int, why: str) -> None:
        job = self.engine.jobs.get(session_id)
        if job is not None:
            self.engine.drop_job(job, why)

    def op_set_worker(self, session_id: int, rank: int, ip: int, port: int, mac: int) -> None:
        job = self.engine.jobs[session_id]
        self.engine.set_worker(job, rank, ip, port, mac)
        self.engine.touch(job, self.loop.time())  # registering is activity (idle timer)

    def op_remove_worker(self, session_id: int, rank: int) -> None:
        self.engine.remove_worker(self.engine.jobs[session_id], rank)

    def op_drops(self, ingress: float, egress: float) -> None:
        self.target.set_drop_simulation(DropSimulation(ingress, egress))

    def op_faults(
        self, config: FaultConfig, session_id: int, rank: int | None, seed: int | None
    ) -> None:
        from swemu.serving.fault_control import configure

        configure(self.engine, self.data, config, session_id=session_id, rank=rank, seed=seed)

    def op_idle(self) -> dict[int, float]:
        """Seconds since each job's last packet (or registration) in this shard."""
        now = self.loop.time()
        return {
            sid: now - float(self.engine.job_last_seen[job.index])
            for sid, job in self.engine.jobs.items()
        }

    def op_snapshot(self) -> dict[str, Any]:
        snap = self.engine.snapshot()
        now = self.loop.time()
        for job in snap["jobs"]:
            job["idle"] = now - job.pop("last_seen")  # clocks differ between processes
        snap["data_plane"] = {k: int(v) for k, v in dataclasses.asdict(self.data.stats).items()}
        return snap

    def op_stop(self) -> None:
        self.done.set()


async def _shard_serve(
    index: int,
    count: int,
    sock: socket.socket,
    conn: Any,
    config: EngineConfig,
    faults: FaultConfig | None,
    seed: int | None,
) -> None:
    from swemu.core.engine import warmup

    loop = asyncio.get_running_loop()
    try:
        warmup()
        shard = _Shard(index, count, sock, conn, config, loop)
        if faults is not None:
            shard.op_faults(faults, 0, None, seed)
        shard.data.start()
    except Exception as exc:  # said once, by the main process: no traceback here
        conn.send((0, False, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
    loop.add_reader(conn.fileno(), shard.on_readable)
    conn.send((0, True, {"pid": multiprocessing.current_process().pid}))
    try:
        await shard.done.wait()
    finally:
        loop.remove_reader(conn.fileno())
        shard.data.stop()
        sock.close()


def shard_main(
    index: int,
    count: int,
    sock: socket.socket,
    conn: Any,
    config: EngineConfig,
    faults: FaultConfig | None = None,
    seed: int | None = None,
    log_level: str = "info",
) -> None:
    """The entry point of shard ``index`` of ``count`` (a spawned process).

    Serves ``sock`` until the main process sends ``stop`` or goes away. Fault
    injection uses ``seed + index``, so that shards are not in lockstep.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides when to stop
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(name)s[shard {index}] %(levelname)s %(message)s",
    )
    shard_seed = None if seed is None else seed + index
    coro = _shard_serve(index, count, sock, conn, config, faults, shard_seed)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


# ----------------------------------------------------------------------------- main side
class ShardLink:
    """The main process's end of one shard: its process, its pipe, its pending requests."""

    def __init__(
        self,
        index: int,
        port: int,
        process: Any,
        conn: Any,
        loop: asyncio.AbstractEventLoop,
        on_lost: Callable[[ShardLink], None],
    ) -> None:
        self.index = index
        self.port = port
        self.process = process
        self.conn = conn
        self.loop = loop
        self.on_lost = on_lost
        self.pid: int | None = None
        self.ready: asyncio.Future = loop.create_future()
        self.closed = False
        self._seq = 0
        self._pending: dict[int, asyncio.Future] = {0: self.ready}
        loop.add_reader(conn.fileno(), self._on_readable)

    def request(self, op: str, *args: Any) -> asyncio.Future:
        """Send one request; the future resolves to the shard's answer (ShardError)."""
        fut = self.loop.create_future()
        if self.closed:
            fut.set_exception(ShardError(f"data-plane shard {self.index} is gone"))
            return fut
        self._seq += 1
        self._pending[self._seq] = fut
        try:
            self.conn.send((self._seq, op, args))
        except OSError:
            self._lost()
        return fut

    def _on_readable(self) -> None:
        try:
            while self.conn.poll():
                seq, ok, value = self.conn.recv()
                fut = self._pending.pop(seq, None)
                if fut is None or fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(ShardError(value))
        except (EOFError, OSError):
            self._lost()

    def _lost(self) -> None:
        if self.closed:
            return
        self.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ShardError(f"data-plane shard {self.index} is gone"))
        self._pending.clear()
        self.on_lost(self)

    def close(self) -> None:
        """Stop reading the pipe and close it (the shard sees EOF and exits)."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.conn.fileno())
            self.conn.close()


async def _answers(futures: list[asyncio.Future], timeout: float) -> list[Any]:
    """Every future's result or exception (a ShardError on timeout), in order."""
    if not futures:
        return []
    done, _ = await asyncio.wait(futures, timeout=timeout)
    out: list[Any] = []
    for fut in futures:
        if fut in done:
            out.append(fut.exception() or fut.result())
        else:
            fut.cancel()
            out.append(ShardError(f"a data-plane shard did not answer within {timeout:g} s"))
    return out


@dataclass
class ShardedJob:
    """The main process's record of a job every shard holds a part of."""

    session_id: int
    index: int
    params: JobParams
    workers: dict[int, WorkerAddress] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        """The whole job's pool: the shards' parts add up to one unsharded pool."""
        from swemu.core.engine import pool_bytes

        return pool_bytes(self.params.pool_size, self.params.size_code)


class ShardedTarget:
    """A :class:`swemu.core.controller.Target` over S data-plane shards.

    It keeps the bookkeeping the controller's questions need (jobs, memory, free
    job entries, addresses) in the main process and sends every write to every
    shard; :meth:`commit` waits for their acknowledgements. Job indices follow
    the engine's free list, so they match the shards' own.
    """

    def __init__(self, config: EngineConfig, links: list[ShardLink]) -> None:
        self.config = config
        self.links = links
        self.jobs: dict[int, ShardedJob] = {}
        self._free = list(range(config.max_jobs - 1, -1, -1))
        from swemu.core.engine import RELEASE_REASONS

        self.released: dict[str, int] = dict.fromkeys(RELEASE_REASONS, 0)
        # the controller's clock at each job's last known activity: registrations
        # here, packets as the idle poll (_idle_loop) learns them from the shards
        self.active: dict[int, float] = {}
        self.switch_address: SwitchAddress | None = None
        self.drops = DropSimulation()
        self._hooks: list[Callable[[Any], None]] = []
        self._inflight: list[asyncio.Future] = []

    # -------------------------------------------------------------- plumbing
    def _send(self, op: str, *args: Any) -> None:
        still = []
        for fut in self._inflight:
            if not fut.done():
                still.append(fut)
            elif fut.exception() is not None:  # nobody committed: say it here
                log.error("a data-plane shard failed a table write: %s", fut.exception())
        self._inflight = still + [link.request(op, *args) for link in self.links]

    async def commit(self, timeout: float = REQUEST_TIMEOUT) -> None:
        """Wait until every shard applied every write sent so far; ShardError if
        one failed or did not answer in ``timeout`` seconds."""
        futures, self._inflight = self._inflight, []
        for answer in await _answers(futures, timeout):
            if isinstance(answer, BaseException):
                raise ShardError(str(answer))

    # ------------------------------------------------------ Target protocol
    @property
    def limits(self) -> TargetLimits:
        return emulator_limits(self.config)

    @property
    def memory_in_use(self) -> int:
        return sum(job.memory for job in self.jobs.values())

    def set_switch_address(self, address: SwitchAddress) -> None:
        self.switch_address = address

    def room_for_job(
        self, job: JobParams, replacing: ShardedJob | None
    ) -> RegistrationError | None:
        return self.room_after(job, [] if replacing is None else [replacing])

    def room_after(self, job: JobParams, freeing: list[ShardedJob]) -> RegistrationError | None:
        return emulator_room(job, freeing, self.config, self.memory_in_use, len(self._free))

    def last_active(self, handle: ShardedJob) -> float | None:
        """The last activity the main process knows of (at most one idle-poll
        period old: eviction may see a job a little idler than it is)."""
        return self.active.get(handle.session_id)

    def check_worker(self, worker: WorkerAddress) -> RegistrationError | None:
        return None  # the emulator answers any address the sockets can reach

    def create_job(self, job: JobParams, *, now: float) -> ShardedJob:
        handle = ShardedJob(job.session_id, self._free.pop(), job)
        self.jobs[job.session_id] = handle
        self.active[job.session_id] = now
        self._send("create_job", job.session_id, job.num_workers, job.size_code, job.pool_size)
        return handle

    def delete_job(self, handle: ShardedJob, *, why: str) -> None:
        if self.jobs.get(handle.session_id) is not handle:
            return
        del self.jobs[handle.session_id]
        self.active.pop(handle.session_id, None)
        self._free.append(handle.index)
        self.released[why] += 1
        self._send("delete_job", handle.session_id, why)

    def set_worker(
        self, handle: ShardedJob, rank: int, worker: WorkerAddress, *, now: float
    ) -> None:
        handle.workers[rank] = worker
        self.active[handle.session_id] = now
        self._send("set_worker", handle.session_id, rank, worker.ipv4, worker.udp_port, worker.mac)

    def remove_worker(self, handle: ShardedJob, rank: int) -> None:
        del handle.workers[rank]
        self._send("remove_worker", handle.session_id, rank)

    def broadcast_port(self, handle: ShardedJob) -> int:
        return 0  # S data-plane processes: results stay per worker

    def set_drop_simulation(self, drops: DropSimulation) -> None:
        self.drops = drops
        self._send("drops", drops.ingress, drops.egress)

    def watch_releases(self, callback: Callable[[Any], None]) -> None:
        self._hooks.append(callback)

    def read_state(self) -> dict[str, Any]:
        """The main process's bookkeeping, which every shard mirrors."""
        jobs = {sid: job.params for sid, job in self.jobs.items()}
        workers, destinations, multicast = [], [], {}
        for sid, job in self.jobs.items():
            multicast[sid] = sorted(job.workers)
            for rank, a in job.workers.items():
                workers.append((a.ipv4, a.udp_port, sid, rank))
                destinations.append((sid, rank, a))
        return table_state(
            switch=self.switch_address,
            drops=self.drops,
            jobs=jobs,
            workers=workers,
            destinations=destinations,
            multicast=multicast,
            target={
                "kind": "sharded-emulator",
                "shards": len(self.links),
                "job_index": {sid: job.index for sid, job in sorted(self.jobs.items())},
                "memory_in_use": self.memory_in_use,
            },
        )

    # ------------------------------------------------------------ idle release
    def release_idle(self, session_id: int) -> None:
        """Free a job that every shard found idle, and tell the controller."""
        job = self.jobs.get(session_id)
        if job is None:
            return
        self.delete_job(job, why="idle")
        for hook in self._hooks:
            hook(job)


# ----------------------------------------------------------------------------- snapshots
def _add(into: dict[str, int], more: dict[str, int] | None) -> None:
    for k, v in (more or {}).items():
        into[k] = into.get(k, 0) + int(v)


def merge_snapshots(parts: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Sum shard snapshots (``op_snapshot`` answers) into one engine snapshot.

    Counters add up (switch-wide, per job, per worker, faults, socket layer);
    a job's slots in use and memory add up over its parts; ``last_seen`` is
    ``now`` minus the least idle time of any shard (the shards' clocks are their
    own). ``data_plane`` also gets ``shard<i>_pkts_in`` per shard.
    """
    counters: dict[str, int] = {}
    data_plane: dict[str, int] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for i, part in enumerate(parts):
        _add(counters, part["counters"])
        _add(data_plane, part.get("data_plane"))
        data_plane[f"shard{i}_pkts_in"] = int(part["counters"].get("pkts_in", 0))
        for pj in part["jobs"]:
            job = jobs.get(pj["session_id"])
            if job is None:
                job = copy.deepcopy(pj)
                job["last_seen"] = now - job.pop("idle")
                jobs[pj["session_id"]] = job
                continue
            job["last_seen"] = max(job["last_seen"], now - pj["idle"])
            job["memory_bytes"] += pj["memory_bytes"]
            for key in ("slots_pending", "slots_holding"):
                job[key] = [a + b for a, b in zip(job[key], pj[key])]
            _add(job["counters"], pj["counters"])
            _add(job["faults"], pj.get("faults"))
            for w, pw in zip(job["workers"], pj["workers"]):
                for k, v in pw.items():
                    if k not in ("rank", "ip", "udp_port"):
                        w[k] += v
    return {
        "counters": counters,
        "jobs": sorted(jobs.values(), key=lambda j: j["index"]),
        "data_plane": data_plane,
    }


# ----------------------------------------------------------------------------- emulator
class ShardedEmulator:
    """The emulator with S data-plane processes and the control plane here.

    The counterpart of :class:`swemu.serving.server.Emulator` (same addresses, start,
    stop, snapshot — but :meth:`snapshot` is a coroutine: it asks the shards).
    ``faults``/``seed`` are the fault injection every shard starts with (shard i
    seeded ``seed + i``). :attr:`failed` resolves to a message if a shard dies.
    """

    def __init__(
        self,
        *,
        shards: int,
        host: str = "0.0.0.0",
        port: int = DEFAULT_UDP_PORT,
        control_host: str | None = None,
        control_port: int = DEFAULT_CONTROL_PORT,
        config: EngineConfig | None = None,
        advertise_ip: str | None = None,
        switch_mac: int | None = None,
        identify_by: str = "ip-port",
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        faults: FaultConfig | None = None,
        seed: int | None = None,
        log_level: str = "info",
        startup_timeout: float = 120.0,
    ) -> None:
        from swemu.core.engine import EngineConfig
        from swemu.serving.control_plane import SyncService

        check_shards(port, shards)
        self.shards = shards
        self.host = host
        self.requested_port = port
        self.control_host = control_host or host
        self.requested_control_port = control_port
        self.config = config or EngineConfig()
        self.advertise_ip = advertise_ip
        self.switch_mac = switch_mac  # None: interface_mac() of the address given to workers
        self.identify_by = identify_by
        self.faults = faults
        self.seed = seed
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self.ports: list[int] = []
        self.port = 0
        self.control_port = 0
        self.sync_service = SyncService()
        self.metrics: MetricsServer | None = None
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host or self.control_host
        self.links: list[ShardLink] = []
        self.target: ShardedTarget | None = None
        self.controller: SessionController | None = None
        self.started_at = time.monotonic()
        self.failed: asyncio.Future | None = None
        self._stopping = False
        self._serving = False
        self._grpc = None
        self._idle_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --------------------------------------------------------------- addresses
    @staticmethod
    def _reachable(host: str) -> str:
        return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host

    @property
    def data_address(self) -> tuple[str, int]:
        """Shard 0's address (the others are on the next ports, :attr:`ports`)."""
        return (self._reachable(self.host), self.port)

    @property
    def data_addresses(self) -> list[tuple[str, int]]:
        """Every shard's address, shard i at index i."""
        return [(self._reachable(self.host), p) for p in self.ports]

    @property
    def control_address(self) -> tuple[str, int]:
        return (self._reachable(self.control_host), self.control_port)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        if self.metrics is None:
            return None
        return (self._reachable(self._metrics_host), self.metrics.port)

    # ---------------------------------------------------------------- lifetime
    async def start(self) -> None:
        """Bind the ports, start the shards, wait until they serve, then start
        the control plane."""
        from swemu.observe.metrics import MetricsServer
        from swemu.observe.stats import EmulatorControlService, add_to_server
        from swemu.serving.control_plane import SessionService, start_control_server

        loop = self._loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        socks = bind_shard_sockets(self.host, self.requested_port, self.shards)
        advice = buffer_advice(receive_buffer(socks[0]), SWITCH_BUFFER_BYTES, "the emulator")
        if advice:
            log.warning(advice)
        self.ports = [s.getsockname()[1] for s in socks]
        self.port = self.ports[0]
        self.started_at = time.monotonic()
        try:
            self._spawn(socks)
        finally:
            for s in socks:  # the shards have their own copies
                s.close()
        try:
            await self._wait_ready()
            self.target = ShardedTarget(self.config, self.links)
            self.controller = SessionController(self.target)
            ip = self.advertise_ip or self.data_address[0]
            switch_ipv4 = int(ipaddress.IPv4Address(ip))
            if self.switch_mac is None:
                self.switch_mac = interface_mac(self.host, self.advertise_ip)
            session = SessionService(
                self.controller,
                switch_ipv4=switch_ipv4,
                switch_mac=self.switch_mac,
                data_ports=self.ports,
                clock=loop.time,
                commit=self.target.commit,
                identify_by=self.identify_by,
            )
            control = EmulatorControlService(self.snapshot, self.set_faults)
            self._grpc, self.control_port = await start_control_server(
                self.control_host,
                self.requested_control_port,
                (session, self.sync_service),
                extra=[lambda server: add_to_server(control, server)],
            )
            if self._metrics_port is not None:
                self.metrics = MetricsServer(self.snapshot, self._metrics_host, self._metrics_port)
                await self.metrics.start()
        except BaseException:
            await self._shutdown()
            raise
        if self.config.idle_timeout is not None or self.config.evict_after is not None:
            self._idle_task = asyncio.ensure_future(
                self._idle_loop(self.config.idle_timeout, self.config.evict_after)
            )
        self._serving = True
        for link in self.links:
            if link.closed:  # died between its ready message and now
                self._lost(link)
        log.info(
            "data plane on udp %s:%d-%d (%d shards), control plane on grpc %s:%d",
            self.host,
            self.ports[0],
            self.ports[-1],
            self.shards,
            self.control_host,
            self.control_port,
        )

    def _spawn(self, socks: list[socket.socket]) -> None:
        mp = multiprocessing.get_context("spawn")
        assert self._loop is not None
        for i, sock in enumerate(socks):
            here, there = mp.Pipe()
            proc = mp.Process(
                target=shard_main,
                args=(i, self.shards, sock, there, self.config, self.faults, self.seed),
                kwargs={"log_level": self.log_level},
                name=f"swemu-shard-{i}",
                daemon=True,  # a main process that exits without stop() takes them along
            )
            proc.start()
            there.close()
            self.links.append(ShardLink(i, self.ports[i], proc, here, self._loop, self._lost))

    async def _wait_ready(self) -> None:
        answers = await _answers([link.ready for link in self.links], self.startup_timeout)
        for link, answer in zip(self.links, answers):
            if isinstance(answer, BaseException):
                code = link.process.exitcode
                why = str(answer) if code is None else f"exited with status {code}"
                raise OSError(f"data-plane shard {link.index} did not start: {why}")
            link.pid = answer["pid"]

    def _lost(self, link: ShardLink) -> None:
        if self._stopping or not self._serving:  # at start, start() raises instead
            return
        link.process.join(1.0)
        message = (
            f"data-plane shard {link.index} (udp port {link.port}) exited with status "
            f"{link.process.exitcode}; stopping"
        )
        if self.failed is not None and not self.failed.done():
            log.error("%s", message)
            self.failed.set_result(message)

    async def stop(self) -> None:
        """Stop serving, stop the shards (waiting for them) and log the counters."""
        summary = None
        if not self._stopping and self.target is not None:
            with contextlib.suppress(Exception):
                summary = await asyncio.wait_for(self.snapshot(), 2.0)
        await self._shutdown()
        if summary is not None:
            from swemu.serving.server import summary_line

            log.info("shutdown: %s", summary_line(summary))

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
        self.sync_service.cancel_all("the emulator is shutting down")
        if self.metrics is not None:
            await self.metrics.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        await _answers([link.request("stop") for link in self.links if not link.closed], 5.0)
        for link in self.links:
            link.close()
        deadline = time.monotonic() + 5.0
        for link in self.links:
            while link.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if link.process.is_alive():
                link.process.kill()
            link.process.join()  # reaped: no zombies

    # ------------------------------------------------------------------ observers
    async def _ask_all(self, op: str, *args: Any) -> list[Any]:
        """One request to every shard: the answers, or the exceptions, in shard order."""
        return await _answers([link.request(op, *args) for link in self.links], REQUEST_TIMEOUT)

    async def snapshot(self) -> dict[str, Any]:
        """Every counter, summed over the shards (see :func:`merge_snapshots`),
        in the shape of :meth:`swemu.serving.server.Emulator.snapshot`; a shard that
        does not answer is left out (``shards`` lists who answered)."""
        answers = await self._ask_all("snapshot")
        parts = [a for a in answers if not isinstance(a, BaseException)]
        assert self._loop is not None and self.target is not None
        snap = merge_snapshots(parts, self._loop.time())
        now = time.monotonic()
        snap["data_plane"]["shards"] = self.shards
        snap.update(
            {
                "released": dict(self.target.released),
                "memory_in_use": self.target.memory_in_use,
                "max_pool_memory": self.config.max_pool_memory,
                "time": now,
                "uptime": now - self.started_at,
                "version": __version__,
                "data_address": "%s:%d-%d" % (self.data_address[0], self.ports[0], self.ports[-1]),
                "control_address": "%s:%d" % self.control_address,
                "shards": [
                    {
                        "index": link.index,
                        "port": link.port,
                        "pid": link.pid,
                        "answered": not isinstance(a, BaseException),
                        "pkts_in": 0 if isinstance(a, BaseException) else a["counters"]["pkts_in"],
                    }
                    for link, a in zip(self.links, answers)
                ],
            }
        )
        cfg = self.config
        snap["limits"] = {
            "pool_size": cfg.pool_size,
            "max_workers": cfg.max_workers,
            "max_jobs": cfg.max_jobs,
            "max_pool_memory": cfg.max_pool_memory,
            "idle_timeout": cfg.idle_timeout,
            "evict_after": cfg.evict_after,
        }
        return snap

    async def set_faults(self, msg: Any) -> Any:
        """The ``SetFaults`` handler: checked here, applied in every shard
        (a seed s becomes s + i in shard i)."""
        from swemu.serving.fault_control import FaultError, UnknownSessionError, request_config

        cfg, rank = request_config(msg)
        assert self.target is not None
        if msg.session_id and msg.session_id not in self.target.jobs:
            raise UnknownSessionError(f"no session {msg.session_id} is registered")
        if rank is not None and not 0 <= rank < BITMAP_WORKERS:
            raise FaultError(f"rank {rank} is not a worker id (0..{BITMAP_WORKERS - 1})")
        seed = msg.seed or None
        answers = await _answers(
            [
                link.request(
                    "faults", cfg, msg.session_id, rank, None if seed is None else seed + link.index
                )
                for link in self.links
            ],
            REQUEST_TIMEOUT,
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                raise ShardError(str(answer))
        return msg

    async def _idle_loop(self, timeout: float | None, evict_after: float | None) -> None:
        """Learn when each job was last active on any shard (for eviction) and
        release jobs every shard has been idle on for ``timeout`` seconds."""
        assert self.target is not None and self.controller is not None and self._loop
        limits = [t for t in (timeout, evict_after) if t]
        period = min(max(min(limits, default=1.0) / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(period)
            if not self.target.jobs:
                continue
            answers = await self._ask_all("idle")
            if any(isinstance(a, BaseException) for a in answers):
                continue  # a shard is gone or slow: decide next time
            now = self._loop.time()
            for sid in list(self.target.jobs):
                idle = [a[sid] for a in answers if sid in a]
                if len(idle) < len(answers):
                    continue  # created since the shards answered
                active = self.target.active
                active[sid] = max(active.get(sid, 0.0), now - min(idle))
                if timeout is not None and min(idle) >= timeout:
                    self.target.release_idle(sid)
                    log.info("session %d released after %.0f s idle", sid, timeout)
            with contextlib.suppress(ShardError):
                await self.target.commit()
