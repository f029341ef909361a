"""The emulator's ``EmulatorControl`` gRPC service: snapshots out, fault settings in.

A snapshot is the plain-Python dict of :meth:`swemu.serving.server.Emulator.snapshot`
(the engine's :meth:`~swemu.core.engine.SwitchEngine.snapshot` plus the socket
layer, the clock and the addresses). This module converts it to the ``Stats``
message of ``swemu/protocol/proto/emulator.proto`` and back, so that a client of
``GetStats`` gets the very dict the emulator built, whatever side of the wire
it reads it on: the TUI, ``switchml-emu stats`` and the Prometheus endpoint
all take that one shape.

Counters travel as ``map<string, uint64>`` keyed by the engine's names: a
counter the engine adds reaches every client without a change to the proto.
A switch of a fabric (docs/protocol.md §7) adds its place in it: the snapshot's
``fabric`` (its parent, its children), each job's ``parent`` and ``uplink``
below the top of the job's tree, and ``child`` on a member that is a child
switch; keys that are unset are absent, on both sides of the wire.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from swemu.protocol.proto import emulator_pb2 as pb
from swemu.protocol.proto import emulator_pb2_grpc as pb_grpc

Snapshot = dict[str, Any]
#: Where a snapshot comes from: a function returning one (an emulator in this
#: process) or a coroutine function (a sharded emulator asks its data-plane
#: processes).
SnapshotSource = Callable[[], "Snapshot | Awaitable[Snapshot]"]
FaultHandler = Callable[[pb.FaultConfig], "pb.FaultConfig | Awaitable[pb.FaultConfig]"]

#: Keys of a worker's entry in a snapshot that are not counters.
_WORKER_FIELDS = ("rank", "ip", "udp_port", "child")
#: Keys of a job's entry that a fabric adds (addresses; absent when unset).
_JOB_FABRIC = ("parent", "uplink")
#: Keys of a job's entry in a snapshot that map one-to-one to ``JobStats`` scalars.
_JOB_SCALARS = ("session_id", "index", "num_workers", "size_code", "pool_size", "memory_bytes")
_LIMITS = (
    "pool_size",
    "max_workers",
    "max_jobs",
    "max_pool_memory",
    "idle_timeout",
    "evict_after",
)
_FAULT_FIELDS = (
    "session_id",
    "loss_in",
    "loss_out",
    "duplicate",
    "reorder_ms",
    "delay_ms",
    "seed",
    "link_gbps",
)


def _counts(d: dict[str, Any] | None) -> dict[str, int]:
    """A counter map for the wire: non-negative integers only (uint64)."""
    return {str(k): max(int(v), 0) for k, v in (d or {}).items()}


def fault_config_to_dict(msg: pb.FaultConfig) -> dict[str, Any]:
    """A ``FaultConfig`` as a dict; ``worker`` is -1 when unset (every worker)."""
    d: dict[str, Any] = {f: getattr(msg, f) for f in _FAULT_FIELDS}
    d["worker"] = msg.worker if msg.HasField("worker") else -1
    return d


def fault_config_from_dict(d: dict[str, Any]) -> pb.FaultConfig:
    """The inverse of :func:`fault_config_to_dict` (missing keys are defaults)."""
    msg = pb.FaultConfig(**{f: d[f] for f in _FAULT_FIELDS if d.get(f) is not None})
    if d.get("worker", -1) not in (-1, None):
        msg.worker = int(d["worker"])
    return msg


def snapshot_to_proto(snap: Snapshot) -> pb.Stats:
    """Encode a snapshot dict as a ``Stats`` message."""
    msg = pb.Stats(
        timestamp=float(snap.get("time", 0.0)),
        uptime=float(snap.get("uptime", 0.0)),
        counters=_counts(snap.get("counters")),
        released=_counts(snap.get("released")),
        memory_in_use=int(snap.get("memory_in_use", 0)),
        max_pool_memory=int(snap.get("max_pool_memory", 0)),
        data_plane=_counts(snap.get("data_plane")),
        data_address=snap.get("data_address") or "",
        control_address=snap.get("control_address") or "",
        faults=_counts(snap.get("faults")),
        capture=_counts(snap.get("capture")),
        version=snap.get("version") or "",
    )
    limits = snap.get("limits")
    if limits:
        fields = {k: (limits.get(k) or 0) for k in _LIMITS if k in limits}
        if limits.get("evict_after") is None:  # unset on the wire: never
            fields.pop("evict_after", None)
        msg.limits.CopyFrom(pb.Limits(**fields))
    for fc in snap.get("fault_configs") or ():
        msg.fault_configs.append(fault_config_from_dict(fc))
    for job in snap["jobs"]:
        jm = msg.jobs.add(
            slots_pending=job["slots_pending"],
            slots_holding=job["slots_holding"],
            last_seen=float(job["last_seen"]),
            counters=_counts(job["counters"]),
            faults=_counts(job.get("faults")),
            **{k: int(job[k]) for k in _JOB_SCALARS},
            **{k: job.get(k) or "" for k in _JOB_FABRIC},
        )
        for w in job["workers"]:
            jm.workers.add(
                rank=w["rank"],
                registered=w["ip"] is not None,
                ip=w["ip"] or "",
                udp_port=w["udp_port"] or 0,
                child=w.get("child") or "",
                counters=_counts({k: v for k, v in w.items() if k not in _WORKER_FIELDS}),
            )
    fabric = snap.get("fabric")
    if fabric is not None:
        msg.fabric.CopyFrom(
            pb.FabricStats(
                instance=int(fabric.get("instance") or 0),
                parent=fabric.get("parent") or "",
                parent_instance=int(fabric.get("parent_instance") or 0),
                always_up=bool(fabric.get("always_up")),
                children=fabric.get("children") or (),
                jobs_up=fabric.get("jobs_up") or (),
            )
        )
    return msg


def proto_to_snapshot(msg: pb.Stats) -> Snapshot:
    """Decode a ``Stats`` message into the snapshot dict it was made from.

    The keys the engine's snapshot has come back with the same values; the
    optional ones (``faults``, ``capture``, ``limits``…) are present only when
    the emulator sent them, as in the emulator's own dict.
    """
    jobs = []
    for jm in msg.jobs:
        workers = [
            {
                "rank": w.rank,
                "ip": w.ip if w.registered else None,
                "udp_port": w.udp_port if w.registered else None,
                **dict(w.counters),
                **({"child": w.child} if w.child else {}),
            }
            for w in jm.workers
        ]
        job = {
            **{k: getattr(jm, k) for k in _JOB_SCALARS},
            "slots_pending": list(jm.slots_pending),
            "slots_holding": list(jm.slots_holding),
            "last_seen": jm.last_seen,
            "counters": dict(jm.counters),
        }
        if jm.faults:
            job["faults"] = dict(jm.faults)
        job.update({k: getattr(jm, k) for k in _JOB_FABRIC if getattr(jm, k)})
        job["workers"] = workers
        jobs.append(job)
    snap: Snapshot = {
        "counters": dict(msg.counters),
        "released": dict(msg.released),
        "memory_in_use": msg.memory_in_use,
        "max_pool_memory": msg.max_pool_memory,
        "jobs": jobs,
        "time": msg.timestamp,
        "uptime": msg.uptime,
        "data_plane": dict(msg.data_plane),
    }
    if msg.data_address:
        snap["data_address"] = msg.data_address
    if msg.control_address:
        snap["control_address"] = msg.control_address
    if msg.version:
        snap["version"] = msg.version
    if msg.HasField("limits"):
        lim = {k: getattr(msg.limits, k) for k in _LIMITS}
        lim["idle_timeout"] = lim["idle_timeout"] or None
        lim["evict_after"] = lim["evict_after"] if msg.limits.HasField("evict_after") else None
        snap["limits"] = lim
    if msg.faults:
        snap["faults"] = dict(msg.faults)
    if msg.fault_configs:
        snap["fault_configs"] = [fault_config_to_dict(f) for f in msg.fault_configs]
    if msg.capture:
        snap["capture"] = dict(msg.capture)
    if msg.HasField("fabric"):
        f = msg.fabric
        snap["fabric"] = {
            "instance": f.instance,
            "parent": f.parent or None,
            "parent_instance": f.parent_instance,
            "always_up": f.always_up,
            "children": list(f.children),
            "jobs_up": list(f.jobs_up),
        }
    return snap


def check_fault_config(msg: pb.FaultConfig) -> None:
    """Raise ValueError naming the first field out of range (a caller's mistake)."""
    for name in ("loss_in", "loss_out", "duplicate"):
        p = getattr(msg, name)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} {p} must be a probability in [0, 1]")
    for name in ("reorder_ms", "delay_ms", "link_gbps"):
        v = getattr(msg, name)
        if not (v >= 0.0 and math.isfinite(v)):
            raise ValueError(f"{name} {v} must be a finite number >= 0")
    if msg.HasField("worker") and msg.worker < -1:
        raise ValueError(f"worker {msg.worker} must be a rank, or -1 for every worker")


class EmulatorControlService(pb_grpc.EmulatorControlServicer):
    """``GetStats`` from a snapshot function; ``SetFaults`` through an optional handler.

    ``snapshot`` is called once per request on the event loop (never per
    packet); it may return the dict or an awaitable of it. ``set_faults``
    receives a validated ``FaultConfig`` and returns (or resolves to) the
    configuration in force; without one the call answers
    UNIMPLEMENTED. A handler raises ValueError for a request it refuses
    (INVALID_ARGUMENT) or LookupError for an unknown session (NOT_FOUND).
    """

    def __init__(self, snapshot: SnapshotSource, set_faults: FaultHandler | None = None) -> None:
        self.snapshot = snapshot
        self.set_faults = set_faults

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.Stats:
        return snapshot_to_proto(await take_snapshot(self.snapshot))

    async def SetFaults(
        self, request: pb.FaultConfig, context: grpc.aio.ServicerContext
    ) -> pb.FaultConfig:
        if self.set_faults is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this emulator has no fault injection"
            )
        try:
            check_fault_config(request)
            result = self.set_faults(request)
            if inspect.isawaitable(result):
                result = await result
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except LookupError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc.args[0] if exc.args else exc))
        return result


async def take_snapshot(source: SnapshotSource) -> Snapshot:
    """Call a snapshot source and await its result if it is awaitable."""
    snap = source()
    if inspect.isawaitable(snap):
        snap = await snap
    return snap


def add_to_server(service: EmulatorControlService, server: grpc.aio.Server) -> None:
    """Register the service on a gRPC server (the control plane's)."""
    pb_grpc.add_EmulatorControlServicer_to_server(service, server)


# ------------------------------------------------------------------- clients
class StatsClient:
    """A blocking ``GetStats`` client that keeps its channel (for ``top``).

    ``control`` is the emulator's ``HOST:PORT`` control address. Errors are
    ``OSError`` naming the address, so a command line prints one clear line.
    """

    def __init__(self, control: str, timeout: float = 5.0) -> None:
        self.control = control
        self.timeout = timeout
        self._channel = grpc.insecure_channel(control)
        self._stub = pb_grpc.EmulatorControlStub(self._channel)

    def get(self) -> Snapshot:
        """One snapshot of the emulator."""
        try:
            msg = self._stub.GetStats(pb.GetStatsRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _rpc_error(self.control, exc) from None
        return proto_to_snapshot(msg)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> StatsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rpc_error(control: str, exc: grpc.RpcError) -> OSError:
    code = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return OSError(f"no emulator answers on {control} ({detail})")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return OSError(f"{control} is a SwitchML controller without the emulator's stats service")
    name = code.name if code is not None else "error"
    return OSError(f"GetStats on {control} failed: {name}: {detail}")


def fetch_stats(control: str, timeout: float = 5.0) -> Snapshot:
    """One snapshot of the emulator whose control plane is at ``HOST:PORT``.

    Blocking; do not call it from the event loop that runs the emulator (use
    :func:`afetch_stats` there).
    """
    with StatsClient(control, timeout) as client:
        return client.get()


async def afetch_stats(control: str, timeout: float = 5.0) -> Snapshot:
    """:func:`fetch_stats` for asyncio code."""
    async with grpc.aio.insecure_channel(control) as channel:
        stub = pb_grpc.EmulatorControlStub(channel)
        try:
            msg = await stub.GetStats(pb.GetStatsRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            raise _rpc_error(control, exc) from None
    return proto_to_snapshot(msg)
