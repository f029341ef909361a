"""Fault control of a running emulator: apply a :class:`~swemu.core.faults.FaultConfig`
to the engine's fault arrays, per job and worker, and answer ``EmulatorControl.SetFaults``.

The fault model itself (settings, delay queue, the kernels the data plane calls)
is :mod:`swemu.core.faults`; this is its control side, which needs a running data
plane to switch the delay queue on (docs/protocol.md §5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swemu.core import kernels as K
from swemu.core.faults import FaultConfig
from swemu.core.state import FaultParam

if TYPE_CHECKING:
    from swemu.core.engine import SwitchEngine
    from swemu.serving.dataplane import DataPlane


class FaultError(ValueError):
    """A fault configuration that cannot be applied (a bad rank)."""


class UnknownSessionError(LookupError):
    """Faults asked for a session the switch does not have (gRPC NOT_FOUND)."""


def configure(
    engine: SwitchEngine,
    dataplane: DataPlane | None,
    config: FaultConfig,
    *,
    session_id: int = 0,
    rank: int | None = None,
    seed: int | None = None,
) -> None:
    """Apply ``config`` to one job (``session_id``) or to all jobs, present and
    future (0); to one worker (``rank``) or all. ``seed`` reseeds the generator."""
    params = config.params()
    if session_id == 0:
        targets = [job.index for job in engine.jobs.values()]
        if rank is None:
            engine.fault_defaults[:] = params
    else:
        job = engine.jobs.get(session_id)
        if job is None:
            raise UnknownSessionError(f"no session {session_id} is registered")
        targets = [job.index]
    if rank is not None and not 0 <= rank < engine.faults.shape[1]:
        raise FaultError(f"rank {rank} is not a worker id (0..{engine.faults.shape[1] - 1})")
    for j in targets:
        if rank is None:
            engine.faults[j, :, :] = params
        else:
            engine.faults[j, rank, :] = params
    if config.delays and dataplane is not None:
        dataplane.enable_delay_queue()
    engine.refresh_fault_flags()
    if seed is not None:
        K.seed(seed)


def config_of(engine: SwitchEngine, session_id: int = 0, rank: int | None = None) -> FaultConfig:
    """The configuration in force for a job/worker (the defaults for session 0)."""
    if session_id == 0:
        p = engine.fault_defaults
    else:
        job = engine.jobs.get(session_id)
        if job is None:
            raise UnknownSessionError(f"no session {session_id} is registered")
        p = engine.faults[job.index, rank or 0]
    return FaultConfig(
        loss_in=float(p[FaultParam.LOSS_IN]),
        loss_out=float(p[FaultParam.LOSS_OUT]),
        duplicate=float(p[FaultParam.DUPLICATE]),
        delay_ms=float(p[FaultParam.DELAY] * 1e3),
        reorder_ms=float(p[FaultParam.REORDER] * 1e3),
        link_gbps=float(p[FaultParam.LINK_BPS] / 1e9),
    )


def request_config(msg: Any) -> tuple[FaultConfig, int | None]:
    """The fault settings of a ``SetFaults`` request and the rank it targets
    (None: every worker of the job)."""
    cfg = FaultConfig(
        loss_in=msg.loss_in,
        loss_out=msg.loss_out,
        duplicate=msg.duplicate,
        reorder_ms=msg.reorder_ms,
        delay_ms=msg.delay_ms,
        link_gbps=msg.link_gbps,
    )
    rank = msg.worker if msg.HasField("worker") and msg.worker >= 0 else None
    return cfg, rank


class FaultControl:
    """The ``EmulatorControl.SetFaults`` handler: message in, configuration in force out."""

    def __init__(self, engine: SwitchEngine, dataplane: DataPlane | None) -> None:
        self.engine = engine
        self.dataplane = dataplane

    def __call__(self, msg: Any) -> Any:
        cfg, rank = request_config(msg)
        configure(
            self.engine,
            self.dataplane,
            cfg,
            session_id=msg.session_id,
            rank=rank,
            seed=msg.seed or None,
        )
        return msg
