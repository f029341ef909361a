"""The switch as a sans-IO state machine: jobs, registrations, batches of packets.

Theory of operation
-------------------
The engine never opens a socket, sleeps or reads the clock: time is a parameter.
A caller (the asyncio server, a test's in-memory fabric, a benchmark) feeds it

* control-plane calls: :meth:`SwitchEngine.register` (docs/protocol.md §5 UdpSession)
  and :meth:`SwitchEngine.release`, which go through :attr:`SwitchEngine.controller`
  (:class:`swemu.core.controller.SessionController`, where the session rules live) and
  come back as table primitives (``create_job``, ``set_worker``, ...);
* data-plane batches: :meth:`SwitchEngine.process` takes a :class:`Batch`
  (rows of received datagrams with their source addresses as integers) and
  fills the batch's output arrays: per row an :class:`Action` (what happened
  and why) and at most one result packet, plus a list of destinations;
* timers: :meth:`SwitchEngine.get_timer` / :meth:`SwitchEngine.handle_timer`
  release jobs idle for longer than ``idle_timeout``.

All per-packet work happens in :func:`swemu.core.kernels.process_batch`, on
arrays this class owns. The switch state is a structure of arrays, the record
:class:`swemu.core.state.SwitchState` (:attr:`SwitchEngine.state`): a job table
indexed by job number ``j`` (workers W, pool size P, size code), per-job pools
(values, exponents, bitmap, count of job j: :meth:`SwitchEngine.pool_arrays`, passed to
the kernels as the addresses in row j of ``pool_at``) and a sorted table of
worker addresses ``(ip << 16 | port) -> j * 32 + worker id``.

The per-packet decision of §2, as the kernel and the P4 ``next_step`` control
encode it (``retx`` = the worker's bit was already set in this set's bitmap)::

    retx  last  count==0 | aggregation      next step         Action
    ----  ----  -------- | ---------------  ----------------  ------------------
    no    no    -        | write or add     nothing           AGGREGATED
    no    yes   -        | write or add     multicast         MULTICAST
    yes   -     no       | nothing          nothing           RETRANSMIT_PENDING
    yes   -     yes      | nothing          unicast to sender UNICAST

"write" when the set's bitmap was empty before this packet (the set was
released), "add" (and max-reduce the exponents) otherwise.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from swemu.core import kernels as K
from swemu.core.controller import (
    BITMAP_WORKERS,
    RESOURCE_EXHAUSTED,
    SIZE_CODES,
    VALUE_FORMATS,
    DropSimulation,
    JobParams,
    SessionController,
    SwitchAddress,
    TargetLimits,
    WorkerAddress,
    table_state,
)
from swemu.core.controller import RegistrationError as RegistrationError  # re-exported
from swemu.core.state import (
    EGRESS_FAULTS,
    FaultCounter,
    FaultFlag,
    FaultParam,
    GlobalCounter,
    JobCounter,
    Packets,
    PoolArray,
    SwitchState,
    Uplinks,
    UpState,
    UpTime,
    UpTiming,
    WorkerCounter,
    counter_names,
)
from swemu.core.state import Action as Action  # re-exported
from swemu.protocol.fastio import Rows
from swemu.protocol.wire import (
    MAX_PACKET_LEN,
    MAX_SLOTS,
    MAX_WORKERS,
    int_to_ipv4,
    packet_len,
    values_per_packet,
)
from swemu.protocol.worker.kernels import Rtt
from swemu.protocol.worker.protocol import Timing

#: Outcomes only the emulator has (not §2 rules, no P4 counterpart): injected
#: loss, a packet sent to the wrong data-plane shard (``serve --shards``) and a
#: child switch's partial aggregate going up to its parent (a fabric, §7).
EMULATOR_ONLY_ACTIONS = frozenset({Action.INJECTED_LOSS, Action.DROP_WRONG_SHARD, Action.UPWARD})


#: Counter names of a snapshot, in column order (the columns' names, lower case).
JOB_COUNTER_NAMES = counter_names(JobCounter)
WORKER_COUNTER_NAMES = counter_names(WorkerCounter)
GLOBAL_COUNTER_NAMES = counter_names(GlobalCounter)
FAULT_COUNTER_NAMES = counter_names(FaultCounter)
#: Why jobs are freed (``released`` of a snapshot; docs/lifetime.md).
RELEASE_REASONS = ("replaced", "idle", "explicit", "evicted")


#: ``switchml-emu serve``'s defaults for a long-lived emulator (docs/lifetime.md):
#: a job nobody released is freed after this many seconds without packets ...
DEFAULT_IDLE_TIMEOUT = 600.0
#: ... and, when the switch is full, a new job may evict one idle this long.
DEFAULT_EVICT_AFTER = 1.0


@dataclass(frozen=True)
class EngineConfig:
    """Limits of the switch; defaults follow docs/protocol.md §6.

    An engine made in code keeps its jobs until they are released (idle_timeout
    and evict_after None); ``switchml-emu serve`` passes DEFAULT_IDLE_TIMEOUT and
    DEFAULT_EVICT_AFTER unless told otherwise.
    """

    pool_size: int = MAX_SLOTS  # the most slots one job may take (also the default)
    max_workers: int = MAX_WORKERS
    max_jobs: int = 256
    max_pool_memory: int = 1 << 30  # bytes of pool state over all jobs
    idle_timeout: float | None = None  # seconds without packets before a job is freed
    evict_after: float | None = None  # a full switch may evict jobs idle this long

    def __post_init__(self) -> None:
        if not 1 <= self.pool_size <= MAX_SLOTS:
            raise ValueError(f"pool size must be in 1..{MAX_SLOTS}, got {self.pool_size}")
        if not 1 <= self.max_workers <= MAX_WORKERS:
            raise ValueError(f"max workers must be in 1..{MAX_WORKERS}, got {self.max_workers}")
        if self.max_jobs < 1:
            raise ValueError("max jobs must be at least 1")
        if self.max_pool_memory < 0:
            raise ValueError("max pool memory must not be negative")
        if self.idle_timeout is not None and self.idle_timeout <= 0:
            raise ValueError("idle timeout must be positive (or None to disable)")
        if self.evict_after is not None and self.evict_after < 0:
            raise ValueError("evict-after must not be negative (or None to disable)")


def pool_bytes(pool_size: int, size_code: int) -> int:
    """Memory a job's pool takes: values, exponents, bitmaps and counts of both sets.

    Linear in ``pool_size``: the pools of S shards, which split a job's slots
    between them, take together exactly what one unsharded pool takes."""
    n = values_per_packet(size_code)
    return 2 * pool_size * (4 * n + 2 + 4 + 4)


def shard_slots(pool_size: int, index: int, count: int) -> int:
    """How many of slots ``0..pool_size-1`` shard ``index`` of ``count`` holds
    (the slots s with ``s % count == index``)."""
    return max(0, (pool_size - index + count - 1) // count)


@dataclass
class Job:
    """A registered session: its parameters and its workers' addresses.

    ``pool_size`` is the job's P (the slot numbers workers use); ``slots`` is how
    many of them this engine holds: P, or about P/S in a shard of a sharded
    emulator (None when made: P)."""

    session_id: int
    index: int
    num_workers: int
    size_code: int
    pool_size: int
    created: float
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (ip, port)
    macs: dict[int, int] = field(default_factory=dict)  # rank -> MAC (kept for the model only)
    slots: int | None = None
    value_formats: int = 0  # ValueFormats: 1 = results echo the format bit
    # loopback broadcast (see SwitchEngine.broadcast): the port this job's results
    # may go to, the socket that holds it, and the ranks that take results there
    broadcast_port: int = 0
    broadcast_holder: Any = None
    broadcast_ranks: set[int] = field(default_factory=set)
    # a child switch's job (docs/protocol.md §7): the parent its partial aggregates
    # go up to, as (ipv4, port), or None
    parent: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.slots is None:
            self.slots = self.pool_size

    @property
    def memory(self) -> int:
        up = self.slots * 8 * (len(UpTime) + len(UpState)) if self.parent else 0
        return pool_bytes(self.slots, self.size_code) + up


class Batch:
    """Preallocated input and output arrays of one data-plane batch.

    Fill rows with :meth:`add` (or write ``buf``/``lens``/``ip``/``port``
    directly and set ``n``), call :meth:`SwitchEngine.process`, then read
    ``action[:n]`` and the results: destination ``d`` gets
    ``out_buf[dest_row[d], :out_len[dest_row[d]]]`` at ``(dest_ip[d], dest_port[d])``.
    """

    def __init__(self, capacity: int = 64, max_len: int = MAX_PACKET_LEN) -> None:
        if capacity < 1:
            raise ValueError("batch capacity must be at least 1")
        self.capacity = capacity
        self.buf = np.zeros((capacity, max_len), np.uint8)
        self.lens = np.zeros(capacity, np.int32)
        self.ip = np.zeros(capacity, np.uint32)
        self.port = np.zeros(capacity, np.int32)
        self.n = 0
        self.action = np.zeros(capacity, np.int32)
        self.out_buf = np.zeros((capacity, max_len), np.uint8)
        self.out_len = np.zeros(capacity, np.int32)
        self.out_job = np.zeros(capacity, np.int32)
        self.dest_row = np.zeros(capacity * MAX_WORKERS, np.int32)
        self.dest_ip = np.zeros(capacity * MAX_WORKERS, np.uint32)
        self.dest_port = np.zeros(capacity * MAX_WORKERS, np.int32)
        self.dest_worker = np.zeros(capacity * MAX_WORKERS, np.int32)
        self.up_row = np.zeros(capacity, np.int32)  # a child switch's partial aggregates
        self.n_up = np.zeros(1, np.int64)
        self.n_dest = 0
        #: the received rows, as a receive fills them (:func:`swemu.protocol.fastio.receive`)
        self.rows = Rows(self.buf, self.lens, self.ip, self.port)
        #: the whole batch, as the switch kernel takes it
        # the record's fields are this class's attributes of the same names
        self.packets = Packets(**{name: getattr(self, name) for name in Packets._fields})

    def add(self, data: bytes | bytearray | memoryview, ip: int, port: int) -> bool:
        """Append one datagram (truncated to the row length); return True when full."""
        r = self.n
        m = min(len(data), self.buf.shape[1])
        self.buf[r, :m] = np.frombuffer(data, np.uint8, count=m)
        # a datagram longer than any packet is malformed whatever it holds
        self.lens[r] = len(data) if len(data) <= self.buf.shape[1] else self.buf.shape[1] + 1
        self.ip[r] = ip
        self.port[r] = port
        self.n = r + 1
        return self.n == self.capacity

    def upward(self, up: Uplinks) -> list[tuple[bytes, tuple[int, int]]]:
        """A child switch's partial aggregates of this batch, as ``(bytes,
        (parent ip, port))`` (tests and slow paths)."""
        out = []
        for k in range(int(self.n_up[0])):
            r = int(self.up_row[k])
            j = int(self.out_job[r])
            parent = (int(up.job_up_ip[j]), int(up.job_up_port[j]))
            out.append((self.out_buf[r, : self.out_len[r]].tobytes(), parent))
        return out

    def results(self) -> list[tuple[bytes, tuple[int, int]]]:
        """The packets to send as ``(bytes, (ip, port))``, for tests and slow paths."""
        out = []
        for d in range(self.n_dest):
            r = int(self.dest_row[d])
            out.append(
                (
                    self.out_buf[r, : self.out_len[r]].tobytes(),
                    (int(self.dest_ip[d]), int(self.dest_port[d])),
                )
            )
        return out


class SwitchEngine:
    """The emulated switch: job table, pools, address table and counters.

    ``shard=(i, S)`` makes it data-plane shard i of S (``swemu.serving.shards``): it
    holds only the slots s with ``s % S == i`` of every job, at local index
    ``s // S``, and drops packets for the other slots as ``drop_wrong_shard``.
    The default ``(0, 1)`` is the whole switch.
    """

    def __init__(
        self, config: EngineConfig | None = None, *, shard: tuple[int, int] = (0, 1)
    ) -> None:
        self.config = config or EngineConfig()
        self.generation = 0  # changes whenever a job is created or dropped
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} must be in 0..{count - 1}")
        # Loopback broadcast, an emulator extension (UdpSession's loopback_broadcast /
        # broadcast_port): when every worker of a job is on 127/8 and asked for it,
        # a multicast result goes out once, to 127.255.255.255:port, where the kernel
        # hands each worker's socket a clone (no copy) instead of one send and one
        # copy per worker. The server turns it on for a data plane bound to loopback
        # (one process: serve --shards 1) by giving ``broadcast_ports`` (which holds
        # a free port: swemu.protocol.netutil.hold_broadcast_port); job_bcast[j] is the port
        # in use, or 0.
        self.broadcast_ports: Callable[[set[int]], tuple[Any, int]] | None = None
        self.job_bcast = np.zeros(self.config.max_jobs, np.int32)
        # ports of freed jobs, not given again soon: a worker of a dropped job may
        # still have a socket on its port and must not receive a new job's results
        self._recent_bcast: collections.deque[int] = collections.deque(maxlen=1024)
        self.shard_index, self.shard_count = index, count
        mj = self.config.max_jobs
        self.job_workers = np.zeros(mj, np.int32)
        self.job_pool = np.zeros(mj, np.int32)
        self.job_code = np.full(mj, -1, np.int32)
        # the job's ValueFormats (docs/protocol.md §4.2): 1 = its results echo the
        # format bit of the packet that triggered them; 0 = the bit is ignored on
        # input and 0 in results, as p4app-switchML
        self.job_formats = np.zeros(mj, np.int32)
        self.job_last_seen = np.zeros(mj, np.float64)
        self.dst_ip = np.zeros((mj, MAX_WORKERS), np.uint32)
        self.dst_port = np.full((mj, MAX_WORKERS), -1, np.int32)
        self.job_counters = np.zeros((mj, len(JobCounter)), np.int64)
        self.worker_counters = np.zeros((mj, MAX_WORKERS, len(WorkerCounter)), np.int64)
        self.global_counters = np.zeros(len(GlobalCounter), np.int64)
        # a child switch's uplinks (docs/protocol.md §7): per job, where partial
        # aggregates go up (port 0: nowhere), the timer's learned state, its settings
        self.job_up_ip = np.zeros(mj, np.uint32)
        self.job_up_port = np.zeros(mj, np.int32)
        self.up_rtt = np.zeros((mj, len(Rtt)), np.float64)
        self.up_timing = np.zeros(len(UpTiming), np.float64)
        self.set_up_timing(Timing())
        #: the uplinks as the kernels take them (fields: the attributes of the same names)
        self.uplinks = Uplinks(**{name: getattr(self, name) for name in Uplinks._fields})
        #: True once a job has had a parent: the kernels get :attr:`uplinks`, not None
        self.is_child = False
        # fault injection: per (job, worker) settings and per-job counters (swemu.core.faults)
        self.faults = np.zeros((mj, MAX_WORKERS, len(FaultParam)), np.float64)
        self.fault_counters = np.zeros((mj, len(FaultCounter)), np.int64)
        self.fault_defaults = np.zeros(len(FaultParam), np.float64)
        # is any duplication / any fault on the way out configured at all (the I/O
        # path skips those stages when not); kept current by refresh_fault_flags()
        self.fault_flags = np.zeros(len(FaultFlag), np.int64)
        # each job entry's pool: its four arrays (kept alive here) and their
        # addresses, which is what the kernels read (state.PoolArray)
        empty = (
            np.zeros(0, np.uint32),
            np.zeros(0, np.int8),
            np.zeros(0, np.uint32),
            np.zeros(0, np.int32),
            np.zeros(0, np.float64),
            np.zeros(0, np.int64),
        )
        self._pools: list[tuple[np.ndarray, ...]] = [empty] * mj
        self.pool_at = np.zeros((mj, len(PoolArray)), np.int64)
        for j in range(mj):
            self._set_pool(j, empty)
        self._addr: dict[int, tuple[int, int]] = {}  # key -> (job index, worker id)
        self._rebuild_addr_table()  # addr_keys, addr_vals and the state record
        self.jobs: dict[int, Job] = {}  # session_id -> Job
        self._by_index: dict[int, Job] = {}
        self._free = list(range(mj - 1, -1, -1))
        # freed jobs by reason: replaced (rank 0 registered again), idle (expired),
        # explicit (released by all its workers), evicted (to make room)
        self.released: dict[str, int] = dict.fromkeys(RELEASE_REASONS, 0)
        # control-plane state the kernel does not read (swemu.core.controller's model)
        self.switch_address: SwitchAddress | None = None
        self.release_hooks: list[Callable[[Job], None]] = []  # called as a job is freed
        # called after refresh_fault_flags (the data plane compiles its fault stages)
        self.fault_hooks: list[Callable[[], None]] = []
        self._controller: SessionController | None = None

    # ------------------------------------------------------------------ control
    # docs/protocol.md §5's rules live in swemu.core.controller.SessionController; the engine
    # holds the tables and offers the primitives its EmulatorTarget writes them with.
    @property
    def controller(self) -> SessionController:
        """The session controller over this engine (one per engine, made on first use)."""
        if self._controller is None:
            self._controller = SessionController(EmulatorTarget(self))
        return self._controller

    @property
    def memory_in_use(self) -> int:
        return sum(job.memory for job in self.jobs.values())

    @property
    def free_job_entries(self) -> int:
        return len(self._free)

    def register(
        self,
        *,
        session_id: int,
        rank: int,
        num_workers: int,
        ipv4: int,
        udp_port: int = 0,
        packet_size: int = 1,
        pool_size: int = 0,
        now: float = 0.0,
        value_formats: int = 0,
    ) -> Job:
        """Register worker ``rank`` of a session (docs/protocol.md §5 UdpSession) through
        :attr:`controller`; return the engine's job. Raises :class:`RegistrationError`.

        A convenience for tests and in-memory fabrics: rank 0 replaces the session
        (fresh pool, parameters fixed), other ranks must agree with rank 0.
        """
        session = self.controller.register(
            session_id=session_id,
            rank=rank,
            num_workers=num_workers,
            ipv4=ipv4,
            udp_port=udp_port,
            packet_size=packet_size,
            pool_size=pool_size,
            now=now,
            value_formats=value_formats,
        )
        return session.handle

    def release(self, session_id: int) -> bool:
        """Free a session's pool and registrations; False if it did not exist."""
        if self.controller.release(session_id):
            return True
        job = self.jobs.get(session_id)  # made with create_job, not through the controller
        if job is None:
            return False
        self.drop_job(job, "explicit")
        return True

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` next has work (idle release), or None."""
        if self.config.idle_timeout is None or not self.jobs:
            return None
        oldest = min(self.job_last_seen[j.index] for j in self.jobs.values())
        return float(oldest) + self.config.idle_timeout

    def handle_timer(self, now: float) -> list[int]:
        """Release jobs idle for longer than ``idle_timeout``; return their session ids."""
        if self.config.idle_timeout is None:
            return []
        idle = [
            j
            for j in self.jobs.values()
            if now - self.job_last_seen[j.index] >= self.config.idle_timeout
        ]
        for job in idle:
            self.drop_job(job, "idle")
        return [job.session_id for job in idle]

    # -------------------------------------------------- table primitives (no rules)
    def _give_pool(self, j: int, held: int, nvals: int) -> None:
        """Job entry ``j`` gets fresh arrays for ``held`` slots of ``nvals``
        values (0 slots frees them). np.empty for the values: they are written
        before they are read (the "write" rule of §2), so untouched slots never
        cost resident memory."""
        arrays = (
            np.empty(2 * held * nvals, np.uint32),
            np.zeros(2 * held * 2, np.int8),
            np.zeros(2 * held, np.uint32),
            np.zeros(2 * held, np.int32),
            np.zeros(0, np.float64),  # the uplink's, once the job has one (set_parent)
            np.zeros(0, np.int64),
        )
        self._set_pool(j, arrays)

    def _set_pool(self, j: int, arrays: tuple) -> None:
        self._pools[j] = arrays
        self.pool_at[j] = [a.ctypes.data for a in arrays]

    def pool_arrays(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(values, exps, bitmap, count)`` of job entry ``j``: views of the
        arrays the kernels update (for snapshots and tests)."""
        return self._pools[j][:4]

    def set_up_timing(self, timing: Timing) -> None:
        """The uplinks' retransmission timer (a child switch toward its parent
        times its packets as a worker does: :class:`Timing`'s timeout, backoff,
        maximum and reorder guard)."""
        t = self.up_timing
        t[UpTiming.RTO_MIN] = timing.timeout
        t[UpTiming.RTO_MAX] = timing.max_timeout
        t[UpTiming.GUARD] = timing.reorder_guard
        t[UpTiming.BACKOFF_AFTER] = timing.backoff_after

    def set_parent(self, job: Job, ipv4: int, port: int) -> None:
        """Make ``job`` a child switch's (docs/protocol.md §7): a slot completed
        here sends its partial aggregate up to ``ipv4:port`` instead of its
        result down, and the parent's result comes down through
        :func:`swemu.core.kernels.uplink_batch`. The job's slots start fresh."""
        if not 0 < port <= 0xFFFF or not 0 < ipv4 < (1 << 32):
            raise ValueError(f"a parent at {int_to_ipv4(ipv4)}:{port} is not an address")
        j = job.index
        held = job.slots
        times = np.zeros(held * len(UpTime), np.float64)
        state = np.zeros((held, len(UpState)), np.int64)
        state[:, UpState.SET] = -1
        self._set_pool(j, (*self._pools[j][:4], times, state.reshape(-1)))
        self.job_up_ip[j] = ipv4
        self.job_up_port[j] = port
        self.up_rtt[j] = 0.0
        job.parent = (ipv4, port)
        self.is_child = True

    @property
    def up(self) -> Uplinks | None:
        """The kernels' ``up`` argument: :attr:`uplinks` on a child switch, else None."""
        return self.uplinks if self.is_child else None

    def create_job(
        self, session_id: int, w: int, code: int, pool: int, now: float, formats: int = 0
    ) -> Job:
        """Take a free job entry and give it a fresh pool of ``pool`` slots (no
        workers); ``formats`` is the job's ValueFormats (docs/protocol.md §5)."""
        if session_id in self.jobs:
            raise ValueError(f"session {session_id} already has a job; drop it first")
        j = self._free.pop()
        n = values_per_packet(code)
        held = shard_slots(pool, self.shard_index, self.shard_count)
        self._give_pool(j, held, n)
        self.job_workers[j] = w
        self.job_pool[j] = pool
        self.job_code[j] = code
        self.job_formats[j] = formats
        self.job_last_seen[j] = now
        self.dst_ip[j] = 0
        self.dst_port[j] = -1
        self.job_counters[j] = 0
        self.fault_counters[j] = 0
        self.faults[j] = self.fault_defaults  # the switch-wide fault settings
        self.worker_counters[j] = 0
        job = Job(session_id, j, w, code, pool, now, slots=held, value_formats=formats)
        if self.broadcast_ports is not None:
            used = {jb.broadcast_port for jb in self.jobs.values()} | set(self._recent_bcast)
            job.broadcast_holder, job.broadcast_port = self.broadcast_ports(used)
        self.job_bcast[j] = 0
        self.job_up_ip[j] = 0
        self.job_up_port[j] = 0
        self.jobs[session_id] = job
        self.generation += 1
        self._by_index[j] = job
        return job

    def drop_job(self, job: Job, why: str) -> None:
        """Free a job's entry, pool and addresses (``why`` is counted in ``released``),
        then tell :attr:`release_hooks`."""
        j = job.index
        for key in [k for k, (jj, _) in self._addr.items() if jj == j]:
            del self._addr[key]
        self._rebuild_addr_table()
        self._give_pool(j, 0, 0)
        self.job_bcast[j] = 0
        self.job_up_ip[j] = 0
        self.job_up_port[j] = 0
        if job.broadcast_holder is not None:
            job.broadcast_holder.close()
            job.broadcast_holder = None
            self._recent_bcast.append(job.broadcast_port)
        self.job_workers[j] = 0
        self.job_pool[j] = 0
        self.job_code[j] = -1
        self.job_formats[j] = 0
        self.dst_port[j] = -1
        del self.jobs[job.session_id]
        self.generation += 1
        del self._by_index[j]
        self._free.append(j)
        self.released[why] += 1
        for hook in self.release_hooks:
            hook(job)

    def set_worker(
        self, job: Job, rank: int, ip: int, port: int, mac: int = 0, *, broadcast: bool = False
    ) -> None:
        """Add worker ``rank`` of ``job`` at ``(ip, port)``: its address-table entry and
        its destination. Both must be free: moving an address or a rank is the
        controller's rule, done as :meth:`remove_worker` first. ``broadcast``: the
        worker also takes results on the job's broadcast port."""
        key = (ip << 16) | port
        if key in self._addr:
            raise ValueError(f"address {int_to_ipv4(ip)}:{port} is already registered")
        if rank in job.workers:
            raise ValueError(f"rank {rank} of session {job.session_id} is already registered")
        job.workers[rank] = (ip, port)
        job.macs[rank] = mac
        self._addr[key] = (job.index, rank)
        self.dst_ip[job.index, rank] = ip
        self.dst_port[job.index, rank] = port
        if broadcast and job.broadcast_port and ip >> 24 == 127:
            job.broadcast_ranks.add(rank)
        self._update_broadcast(job)
        self._rebuild_addr_table()

    def _update_broadcast(self, job: Job) -> None:
        """Broadcast a job's results only while every one of its ranks takes them."""
        every = job.broadcast_ranks == set(range(job.num_workers))
        self.job_bcast[job.index] = job.broadcast_port if every else 0

    def remove_worker(self, job: Job, rank: int) -> None:
        """Undo :meth:`set_worker`: the address becomes unknown, the rank gets no results."""
        ip, port = job.workers.pop(rank)
        job.macs.pop(rank, None)
        del self._addr[(ip << 16) | port]
        self.dst_ip[job.index, rank] = 0
        self.dst_port[job.index, rank] = -1
        job.broadcast_ranks.discard(rank)
        self._update_broadcast(job)
        self._rebuild_addr_table()

    def touch(self, job: Job, now: float) -> None:
        """Count ``now`` as activity of ``job`` for the idle timer."""
        self.job_last_seen[job.index] = now

    def _rebuild_addr_table(self) -> None:
        keys = np.array(sorted(self._addr), dtype=np.uint64)
        self.addr_vals = np.array(
            [self._addr[int(k)][0] * 32 + self._addr[int(k)][1] for k in keys], dtype=np.int32
        )
        self.addr_keys = keys
        # the tables as the kernels take them: replaced with the address table,
        # so read engine.state anew for every kernel call (its fields are the
        # engine's attributes of the same names)
        self.state = SwitchState(**{name: getattr(self, name) for name in SwitchState._fields})

    def job_by_index(self, index: int) -> Job | None:
        return self._by_index.get(index)

    # --------------------------------------------------------------------- data
    def refresh_fault_flags(self) -> None:
        """Recompute :attr:`fault_flags` after fault settings changed."""
        dup = FaultParam.DUPLICATE
        out = list(EGRESS_FAULTS)
        self.fault_flags[FaultFlag.DUPLICATE] = bool(
            self.faults[..., dup].any() or self.fault_defaults[dup] > 0
        )
        self.fault_flags[FaultFlag.EGRESS] = bool(
            self.faults[..., out].any() or self.fault_defaults[out].any()
        )
        for hook in self.fault_hooks:
            hook()

    def process(self, batch: Batch, now: float = 0.0) -> int:
        """Run rows ``0..batch.n-1`` through the switch; return the number of
        destinations written to ``batch.dest_*`` (also kept in ``batch.n_dest``)."""
        batch.n_dest = K.process_batch(
            batch.packets, batch.n, now, self.state, K.NO_ADDRESSES, self.up
        )
        return batch.n_dest

    def receive_datagram(
        self, data: bytes, addr: tuple[int, int], now: float = 0.0
    ) -> tuple[Action, list[tuple[bytes, tuple[int, int]]]]:
        """One packet in, ``(action, [(bytes, (ip, port)), ...])`` out (slow path):
        results going down, and a child switch's partial aggregate going up."""
        batch = self._single
        batch.n = 0
        batch.add(data, addr[0], addr[1])
        self.process(batch, now)
        return Action(int(batch.action[0])), batch.results() + batch.upward(self.uplinks)

    def receive_from_parent(
        self, job: Job, data: bytes, now: float = 0.0
    ) -> list[tuple[bytes, tuple[int, int]]]:
        """One datagram from ``job``'s parent (slow path of
        :func:`swemu.core.kernels.uplink_batch`): the results it sends down."""
        batch = self._single
        batch.n = 0
        batch.add(data, *job.parent)
        batch.n_dest = K.uplink_batch(batch.packets, 1, now, self.state, self.uplinks, job.index)
        return batch.results()

    def uplink_due(self, job: Job, now: float) -> list[tuple[bytes, tuple[int, int]]]:
        """What ``job``'s uplink timer sends now (slow path of
        :func:`swemu.core.kernels.uplink_due`): held and resent partial aggregates."""
        rows = np.zeros((16, packet_len(job.size_code)), np.uint8)
        lens = np.zeros(16, np.int32)
        out, first = [], 0
        while True:
            n, first = K.uplink_due(now, self.state, self.uplinks, job.index, rows, lens, first)
            out += [(rows[i, : lens[i]].tobytes(), job.parent) for i in range(n)]
            if n < rows.shape[0]:
                return out

    def uplink_deadline(self, job: Job) -> float:
        """When ``job``'s uplink timer next has work (inf: nothing up there)."""
        return float(K.uplink_deadline(self.state, self.uplinks, job.index))

    @property
    def _single(self) -> Batch:
        b = self.__dict__.get("_single_batch")
        if b is None:
            b = self.__dict__["_single_batch"] = Batch(1)
        return b

    # -------------------------------------------------------------------- stats
    def snapshot(self) -> dict:
        """All counters and job state as plain Python data (for stats, TUI, logs)."""
        jobs = []
        for job in sorted(self.jobs.values(), key=lambda jb: jb.index):
            j, p = job.index, job.slots
            _, _, bm, cnt = self.pool_arrays(j)
            workers = []
            for rank in range(job.num_workers):
                addr = job.workers.get(rank)
                wc = self.worker_counters[j, rank]
                workers.append(
                    {
                        "rank": rank,
                        "ip": int_to_ipv4(addr[0]) if addr else None,
                        "udp_port": addr[1] if addr else None,
                        **{name: int(wc[i]) for i, name in enumerate(WORKER_COUNTER_NAMES)},
                    }
                )
            jobs.append(
                {
                    "session_id": job.session_id,
                    "index": j,
                    "num_workers": job.num_workers,
                    "size_code": job.size_code,
                    "pool_size": p,
                    "memory_bytes": job.memory,
                    "slots_pending": [
                        int(np.count_nonzero(cnt[:p])),
                        int(np.count_nonzero(cnt[p:])),
                    ],
                    "slots_holding": [int(np.count_nonzero(bm[:p])), int(np.count_nonzero(bm[p:]))],
                    "last_seen": float(self.job_last_seen[j]),
                    "counters": {
                        name: int(self.job_counters[j, i])
                        for i, name in enumerate(JOB_COUNTER_NAMES)
                    },
                    "faults": {
                        name: int(self.fault_counters[j, i])
                        for i, name in enumerate(FAULT_COUNTER_NAMES)
                    },
                    "workers": workers,
                }
            )
        return {
            "counters": {
                name: int(self.global_counters[i]) for i, name in enumerate(GLOBAL_COUNTER_NAMES)
            },
            "released": dict(self.released),
            "memory_in_use": self.memory_in_use,
            "max_pool_memory": self.config.max_pool_memory,
            "jobs": jobs,
        }

    def job_counters_of(self, session_id: int) -> dict[str, int]:
        """The counters of one session, by name."""
        j = self.jobs[session_id].index
        return {name: int(self.job_counters[j, i]) for i, name in enumerate(JOB_COUNTER_NAMES)}


def warmup() -> None:
    """Compile (or load from cache) the kernels before any clock starts."""
    eng = SwitchEngine(EngineConfig(pool_size=4, max_jobs=1))
    eng.register(session_id=1, rank=0, num_workers=1, ipv4=0x7F000001, udp_port=1, pool_size=4)
    from swemu.protocol.wire import encode

    pkt = encode(size_code=1, job_number=0, tsi=0, set=0, slot=0, values=np.zeros(64, np.int32))
    eng.receive_datagram(pkt, (0x7F000001, 1))


# ----------------------------------------------------------------------------- emulator
def emulator_limits(cfg: EngineConfig) -> TargetLimits:
    """What the emulator accepts (one process or sharded: the same limits)."""
    from swemu.protocol.wire import EMULATOR_SIZE_CODE

    return TargetLimits(
        max_workers=cfg.max_workers,
        max_pool_size=cfg.pool_size,
        default_pool_size=cfg.pool_size,
        size_codes=frozenset(SIZE_CODES),
        emulator_size_code=EMULATOR_SIZE_CODE,
        evict_after=cfg.evict_after,
        value_formats=frozenset(VALUE_FORMATS),
    )


def emulator_room(
    job: JobParams,
    freeing: Any | list[Any] | None,
    cfg: EngineConfig,
    in_use: int,
    free_entries: int,
) -> RegistrationError | None:
    """The emulator's admission rule: the pool must fit ``--max-pool-memory`` next
    to the ``in_use`` bytes of the other jobs (jobs being replaced or evicted,
    ``freeing`` -- one handle, a list, or None -- give their memory and their
    entries back), and a job entry must be free."""
    if not isinstance(freeing, list):
        freeing = [] if freeing is None else [freeing]
    need = pool_bytes(job.pool_size, job.size_code)
    in_use -= sum(handle.memory for handle in freeing)
    if in_use + need > cfg.max_pool_memory:
        return RegistrationError(
            RESOURCE_EXHAUSTED,
            f"a pool of {job.pool_size} slots at size code {job.size_code} needs {need} "
            f"bytes; {in_use} of the switch's {cfg.max_pool_memory} bytes are in use "
            f"(--max-pool-memory)",
        )
    if free_entries + len(freeing) == 0:
        return RegistrationError(
            RESOURCE_EXHAUSTED,
            f"all {cfg.max_jobs} job entries of the switch are in use (--max-jobs)",
        )
    return None


class EmulatorTarget:
    """The model's tables in a :class:`swemu.core.engine.SwitchEngine`: each job gets
    arrays of its own, the worker table is the engine's sorted address table, the
    destinations are its ``dst_ip``/``dst_port`` rows (a job's multicast group is
    every rank with a destination)."""

    def __init__(self, engine: SwitchEngine) -> None:
        self.engine = engine

    @property
    def limits(self) -> TargetLimits:
        return emulator_limits(self.engine.config)

    def set_switch_address(self, address: SwitchAddress) -> None:
        self.engine.switch_address = address

    def room_for_job(self, job: JobParams, replacing: Job | None) -> RegistrationError | None:
        return self.room_after(job, [] if replacing is None else [replacing])

    def room_after(self, job: JobParams, freeing: list[Job]) -> RegistrationError | None:
        eng = self.engine
        return emulator_room(job, freeing, eng.config, eng.memory_in_use, eng.free_job_entries)

    def last_active(self, handle: Job) -> float:
        """The engine's clock (the server's loop time) at the job's last packet or
        registration."""
        return float(self.engine.job_last_seen[handle.index])

    def check_worker(self, worker: WorkerAddress) -> RegistrationError | None:
        return None  # the emulator answers any address the socket can reach

    def create_job(self, job: JobParams, *, now: float) -> Job:
        return self.engine.create_job(
            job.session_id, job.num_workers, job.size_code, job.pool_size, now, job.value_formats
        )

    def delete_job(self, handle: Job, *, why: str) -> None:
        self.engine.drop_job(handle, why)

    def set_worker(self, handle: Job, rank: int, worker: WorkerAddress, *, now: float) -> None:
        self.engine.set_worker(
            handle, rank, worker.ipv4, worker.udp_port, worker.mac, broadcast=worker.broadcast
        )
        self.engine.touch(handle, now)  # registering counts as activity for the idle timer

    def remove_worker(self, handle: Job, rank: int) -> None:
        self.engine.remove_worker(handle, rank)

    def broadcast_port(self, handle: Job) -> int:
        return handle.broadcast_port

    def set_drop_simulation(self, drops: DropSimulation) -> None:
        """The emulator's fault injection does it: ``loss_in`` drops a worker's packet
        after the lookup, ``loss_out`` each result copy; switch-wide (every job now
        and later), leaving the other fault settings alone."""
        eng = self.engine
        eng.fault_defaults[FaultParam.LOSS_IN] = drops.ingress
        eng.fault_defaults[FaultParam.LOSS_OUT] = drops.egress
        for job in eng.jobs.values():
            eng.faults[job.index, :, FaultParam.LOSS_IN] = drops.ingress
            eng.faults[job.index, :, FaultParam.LOSS_OUT] = drops.egress
        eng.refresh_fault_flags()

    def watch_releases(self, callback: Callable[[Any], None]) -> None:
        self.engine.release_hooks.append(callback)

    def read_state(self) -> dict[str, Any]:
        """Decoded from the arrays the data-plane kernel reads, not from bookkeeping."""
        eng = self.engine
        by_index = {job.index: job for job in eng.jobs.values()}
        jobs = {
            job.session_id: JobParams(
                job.session_id,
                int(eng.job_workers[j]),
                int(eng.job_code[j]),
                int(eng.job_pool[j]),
                int(eng.job_formats[j]),
            )
            for j, job in by_index.items()
        }
        workers = []
        for key, val in zip(eng.addr_keys.tolist(), eng.addr_vals.tolist()):
            job = by_index[val // BITMAP_WORKERS]
            workers.append((key >> 16, key & 0xFFFF, job.session_id, val % BITMAP_WORKERS))
        destinations, multicast = [], {}
        for j, job in by_index.items():
            ranks = [w for w in range(BITMAP_WORKERS) if eng.dst_port[j, w] >= 0]
            multicast[job.session_id] = ranks
            for w in ranks:
                address = WorkerAddress(
                    int(eng.dst_ip[j, w]), int(eng.dst_port[j, w]), job.macs.get(w, 0)
                )
                destinations.append((job.session_id, w, address))
        defaults = eng.fault_defaults
        drops = DropSimulation(
            float(defaults[FaultParam.LOSS_IN]), float(defaults[FaultParam.LOSS_OUT])
        )
        return table_state(
            switch=eng.switch_address,
            drops=drops,
            jobs=jobs,
            workers=workers,
            destinations=destinations,
            multicast=multicast,
            target={
                "kind": "emulator",
                "job_index": {job.session_id: j for j, job in sorted(by_index.items())},
                "memory_in_use": eng.memory_in_use,
            },
        )
