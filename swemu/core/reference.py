"""docs/protocol.md §2 in plain Python: the test oracle for :mod:`swemu.core.kernels`.

Written for obviousness, not speed: dicts of per-slot records, Python ints,
``wire.decode`` for parsing. The property tests feed the same packet streams
to this and to :class:`swemu.core.engine.SwitchEngine` and compare every action
and every byte sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swemu.core.engine import Action
from swemu.protocol import wire


@dataclass
class _Slot:
    values: list[int]
    e0: int = 0
    e1: int = 0
    count: int = 0
    bitmap: int = 0


@dataclass
class RefJob:
    """A job as the reference sees it: parameters and worker addresses."""

    num_workers: int
    size_code: int
    pool_size: int
    value_formats: int = 0  # 1: results echo the triggering packet's format bit (§4.2)
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (ip, port)
    slots: dict[tuple[int, int], _Slot] = field(default_factory=dict)  # (set, slot)
    # a child switch's job (docs/protocol.md §7): where partial aggregates go up, and
    # per slot the one up there: (set, tsi, job_number, source port of its last packet)
    parent: tuple[int, int] | None = None
    up: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)


def _wrap32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


class ReferenceSwitch:
    """Several jobs, each a dict of slots; workers found by (ip, port) then (ip, 0).

    ``shard=(i, S)``: data-plane shard i of S (``serve --shards``), which answers
    only for the slots s with ``s % S == i`` and drops the others."""

    def __init__(self, shard: tuple[int, int] = (0, 1)) -> None:
        self.shard = shard
        self.jobs: dict[int, RefJob] = {}
        self.addresses: dict[tuple[int, int], tuple[int, int]] = {}  # addr -> (session, rank)

    def add_job(
        self,
        session_id: int,
        num_workers: int,
        size_code: int,
        pool_size: int,
        value_formats: int = 0,
    ) -> None:
        self.remove_job(session_id)
        self.jobs[session_id] = RefJob(num_workers, size_code, pool_size, value_formats)

    def remove_job(self, session_id: int) -> None:
        if session_id in self.jobs:
            for addr in list(self.jobs[session_id].workers.values()):
                self.addresses.pop(addr, None)
            del self.jobs[session_id]

    def add_worker(self, session_id: int, rank: int, ip: int, port: int) -> None:
        addr = (ip, port)
        old = self.addresses.get(addr)
        if old is not None and old != (session_id, rank):
            self.jobs[old[0]].workers.pop(old[1], None)
        job = self.jobs[session_id]
        prev = job.workers.get(rank)
        if prev is not None:
            self.addresses.pop(prev, None)
        job.workers[rank] = addr
        self.addresses[addr] = (session_id, rank)

    def receive(
        self, data: bytes, src: tuple[int, int]
    ) -> tuple[Action, list[tuple[bytes, tuple[int, int]]]]:
        """Apply §2 to one datagram: the action taken and the packets sent."""
        owner = self.addresses.get(src) or self.addresses.get((src[0], 0))
        if owner is None:
            return Action.DROP_UNKNOWN_SOURCE, []
        session_id, w = owner
        job = self.jobs[session_id]
        try:
            pkt = wire.decode(data)
        except wire.PacketError:
            return Action.DROP_MALFORMED, []
        if pkt.size_code != job.size_code:
            return Action.DROP_WRONG_SIZE, []
        if pkt.slot >= job.pool_size:
            return Action.DROP_SLOT_RANGE, []
        index, count = self.shard
        if pkt.slot % count != index:
            return Action.DROP_WRONG_SHARD, []

        n = wire.values_per_packet(job.size_code)
        here = job.slots.setdefault((pkt.set, pkt.slot), _Slot([0] * n))
        other = job.slots.setdefault((1 - pkt.set, pkt.slot), _Slot([0] * n))
        me = 1 << w
        before = here.bitmap
        here.bitmap |= me
        other.bitmap &= ~me
        retransmission = bool(before & me)

        last = False
        if not retransmission:
            if here.count == 0:
                here.count = job.num_workers - 1
                last = job.num_workers == 1
            else:
                last = here.count == 1
                here.count -= 1

        if not retransmission:
            incoming = [int(v) for v in pkt.values]
            if before == 0:
                here.values = incoming
                here.e0, here.e1 = pkt.e0, pkt.e1
            else:
                here.values = [_wrap32(a + b) for a, b in zip(here.values, incoming)]
                here.e0, here.e1 = max(here.e0, pkt.e0), max(here.e1, pkt.e1)

        if not retransmission and not last:
            return Action.AGGREGATED, []
        pending_up = job.up.get(pkt.slot)
        if retransmission and (
            here.count != 0 or (pending_up is not None and pending_up[0] == pkt.set)
        ):
            return Action.RETRANSMIT_PENDING, []
        result = bytearray(
            wire.encode(
                size_code=job.size_code,
                job_number=pkt.job_number,
                tsi=pkt.tsi,
                set=pkt.set,
                slot=pkt.slot,
                e0=here.e0,
                e1=here.e1,
                values=np.array(here.values, dtype=np.int32),
            )
        )
        # §4.2: the switch adds the payload as 32-bit words in either format; a
        # job registered for the 16-bit format echoes the packet's format bit
        if pkt.format and job.value_formats:
            result[0] |= wire.FORMAT_BIT
        result = bytes(result)
        if retransmission:
            return Action.UNICAST, [(result, src)]
        if job.parent is not None:  # the partial aggregate goes up (no reorder guard here)
            job.up[pkt.slot] = (pkt.set, pkt.tsi, pkt.job_number, src[1])
            return Action.UPWARD, [(result, job.parent)]
        out = []
        for rank in range(job.num_workers):
            addr = job.workers.get(rank)
            if addr is not None:
                out.append((result, (addr[0], addr[1] or src[1])))
        return Action.MULTICAST, out

    def receive_from_parent(
        self, session_id: int, data: bytes
    ) -> list[tuple[bytes, tuple[int, int]]]:
        """A datagram from a child switch's parent: the result of a slot's partial
        aggregate (same set, tsi and job number) replaces the slot's sums and
        goes down, byte for byte, to every member; anything else is ignored."""
        job = self.jobs[session_id]
        try:
            pkt = wire.decode(data)
        except wire.PacketError:
            return []
        up = job.up.get(pkt.slot)
        if (
            pkt.size_code != job.size_code
            or up is None
            or (up[0], up[1], up[2]) != (pkt.set, pkt.tsi, pkt.job_number)
        ):
            return []
        del job.up[pkt.slot]
        here = job.slots[(pkt.set, pkt.slot)]
        here.values = [int(v) for v in pkt.values]
        here.e0, here.e1 = pkt.e0, pkt.e1
        return [
            (bytes(data), (addr[0], addr[1] or up[3]))
            for rank in range(job.num_workers)
            if (addr := job.workers.get(rank)) is not None
        ]
