"""Restart recovery's one rule: which results each rank lacks, and from whom.

After a switch restart (or a fabric's rebuild of a job) the switch's slots are
gone, and with them the shadow copies that answer a lost result. What they held
is still at the workers: every rank reports, per slot, how many results it has
accepted (``rounds``) and the last one it holds (:class:`SlotResult`: the chunk's
output as it stored it). :func:`plan_repairs` decides who gets which, from those
reports alone; the switch's control plane runs it once every rank has reported
(the ``Resume`` RPC, docs/protocol.md §5), and the workers apply what it says
(:meth:`swemu.protocol.worker.protocol.Allreduce.apply_repairs`).

Plain Python (no numpy): a controller runs it beside the session rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class RecoveryError(ValueError):
    """Reports that cannot come from one job's ranks."""


@dataclass(frozen=True)
class SlotResult:
    """A slot's last result as a worker holds it: the slot's ``round`` (its
    results counted from 1 over the session), the header fields that identify it
    (``tsi``, ``set``, ``job_number``), the exponent it carried and the chunk's
    stored output (native byte order, the call's dtype; empty for the result of
    an exponent packet)."""

    slot: int
    round: int
    tsi: int
    set: int
    job_number: int
    e0: int
    values: bytes = b""

    def message(self) -> Any:
        """As the control plane carries it (``switchml.proto``'s ``SlotResult``)."""
        from swemu.protocol.proto import switchml_pb2 as pb

        return pb.SlotResult(
            slot=self.slot,
            round=self.round,
            tsi=self.tsi,
            set=self.set,
            job_number=self.job_number,
            e0=self.e0,
            values=self.values,
        )

    @classmethod
    def from_message(cls, m: Any) -> SlotResult:
        """From the control plane's ``SlotResult`` message."""
        return cls(m.slot, m.round, m.tsi, m.set, m.job_number, m.e0, bytes(m.values))


@dataclass(frozen=True)
class Progress:
    """What a rank reports when it resumes: results accepted per slot
    (``rounds[s]``) and its last result of each slot it has one of."""

    rounds: tuple[int, ...]
    last: dict[int, SlotResult] = field(default_factory=dict)


def plan_repairs(progress: dict[int, Progress]) -> dict[int, list[SlotResult]]:
    """The results each rank lacks after a restart: ``{rank: [SlotResult, ...]}``.

    Per slot, no rank is more than one round ahead of another: a slot's next
    round needs every rank's packet, and a rank sends it only once it has the
    slot's previous result. So the ranks one round behind the slot's furthest
    lost exactly the result the furthest hold as their last one of the slot,
    and get it; then every rank resends the packet it has outstanding, to a
    switch whose slots are fresh. Raise :class:`RecoveryError` when the reports
    cannot come from one job: windows of different sizes, ranks two rounds
    apart, or ranks ahead that do not hold the result they are ahead by."""
    windows = {len(p.rounds) for p in progress.values()}
    if len(windows) > 1:
        raise RecoveryError(f"the ranks report windows of {sorted(windows)} slots")
    repairs: dict[int, list[SlotResult]] = {rank: [] for rank in progress}
    for s in range(windows.pop() if windows else 0):
        top = max(p.rounds[s] for p in progress.values())
        holder = None
        for rank in sorted(progress):
            held = progress[rank].last.get(s)
            if progress[rank].rounds[s] == top and held is not None and held.round == top:
                holder = held
                break
        for rank, p in sorted(progress.items()):
            behind = top - p.rounds[s]
            if behind == 0:
                continue
            if behind > 1 or holder is None:
                raise RecoveryError(
                    f"slot {s}: rank {rank} has {p.rounds[s]} results, another {top}"
                    + ("" if behind > 1 else " but none of those holds the last one")
                    + ": these ranks cannot be resumed together"
                )
            repairs[rank].append(holder)
    return repairs
