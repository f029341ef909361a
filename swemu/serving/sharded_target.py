"""The sharded emulator's target of the control model, in the main process.

:class:`ShardedTarget` writes every table change to every shard over its
:class:`ShardLink` and waits for them in :meth:`ShardedTarget.commit`;
:func:`merge_snapshots` sums the shards' counters into one snapshot. The whole
design: :mod:`swemu.serving.shards`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swemu.core.controller import (
    DropSimulation,
    JobParams,
    RegistrationError,
    SwitchAddress,
    TargetLimits,
    WorkerAddress,
    table_state,
)
from swemu.core.engine import emulator_limits, emulator_room
from swemu.serving.shard_process import ShardError

if TYPE_CHECKING:
    from swemu.core.engine import EngineConfig

log = logging.getLogger("swemu.shards")

#: Seconds the main process waits for a shard's answer before giving up on it.
REQUEST_TIMEOUT = 10.0


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
        self._send(
            "create_job",
            job.session_id,
            job.num_workers,
            job.size_code,
            job.pool_size,
            job.value_formats,
        )
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
