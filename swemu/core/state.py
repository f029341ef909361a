"""The switch's state as its compiled kernels see it, each part named once.

Two records, NamedTuples of arrays and scalars (Numba passes a record's fields
as it would separate arguments and compiled code reads them by name, so a
record costs nothing over a positional argument list and is declared in one
place):

* :class:`SwitchState`: the engine's tables (:attr:`SwitchEngine.state`);
* :class:`Packets`: one batch of received datagrams and the switch's answers
  (:attr:`swemu.core.engine.Batch.packets`);
* :class:`Uplinks`: a child switch's uplinks (:attr:`SwitchEngine.uplinks`).

And the names of the tables' columns, as :class:`~enum.IntEnum` classes:
compiled code uses their members as integer constants (``job_counters[j,
JobCounter.PKTS_IN]``), Python code as indices and names (the counter names
of a snapshot are the members' names in lower case).

May import: numpy, swemu.protocol.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

from swemu.protocol.fastio import Rows


class Action(IntEnum):
    """What the switch did with one received packet, and why (``Packets.action``;
    the §2 decision table, and the P4 program's ``action_code``)."""

    DROP_UNKNOWN_SOURCE = 0
    DROP_MALFORMED = 1
    DROP_WRONG_SIZE = 2
    DROP_SLOT_RANGE = 3
    AGGREGATED = 4  # new contribution, slot not complete: nothing sent
    MULTICAST = 5  # new contribution completed the slot: result to every worker
    RETRANSMIT_PENDING = 6  # retransmission, slot incomplete: nothing sent
    UNICAST = 7  # retransmission, slot complete: result to that worker only
    INJECTED_LOSS = 8  # dropped by fault injection on the way in (never reached the switch)
    DROP_WRONG_SHARD = 9  # sharded emulator: the slot belongs to another data-plane process
    # a child switch of a fabric (docs/protocol.md §7): the contribution completed the
    # slot here, and its partial aggregate goes up to the parent (or waits to, while
    # the uplink's reorder guard holds it) instead of the result going down
    UPWARD = 10


class JobCounter(IntEnum):
    """Columns of ``SwitchState.job_counters`` (per job entry)."""

    PKTS_IN = 0
    BYTES_IN = 1
    AGGREGATED = 2
    MULTICAST = 3
    UNICAST = 4
    RETRANSMISSIONS = 5
    PKTS_OUT = 6
    BYTES_OUT = 7
    DROP_MALFORMED = 8
    DROP_WRONG_SIZE = 9
    DROP_SLOT_RANGE = 10
    DROP_WRONG_SHARD = 11
    BROADCAST = 12  # multicasts sent once to 127.255.255.255 (loopback broadcast)
    # a child switch's uplink (docs/protocol.md §7): partial aggregates sent up (first
    # transmissions), their retransmissions, the parent's results taken (and sent down
    # to the local members), and datagrams from the parent ignored (duplicates, stale)
    UP_SENT = 13
    UP_RETRANSMISSIONS = 14
    UP_RESULTS = 15
    UP_IGNORED = 16


class WorkerCounter(IntEnum):
    """The last axis of ``SwitchState.worker_counters`` (per job entry and rank)."""

    PKTS_IN = 0
    RETRANSMISSIONS = 1
    LAST = 2  # completions this worker triggered: the slowest worker has the most
    DROPS = 3


class GlobalCounter(IntEnum):
    """Entries of ``SwitchState.global_counters`` (the whole switch)."""

    PKTS_IN = 0
    DROP_UNKNOWN_SOURCE = 1


class FaultCounter(IntEnum):
    """Columns of ``SwitchState.fault_counters``: injected faults, counted apart
    from real drops (they are what the user asked the emulator to do)."""

    LOSS_IN = 0
    LOSS_OUT = 1
    DUPLICATED = 2
    DELAYED = 3
    QUEUE_DROPS = 4  # delay/link queue full


class FaultParam(IntEnum):
    """The last axis of ``SwitchState.faults``: one job's settings for one rank."""

    LOSS_IN = 0  # probability
    LOSS_OUT = 1
    DUPLICATE = 2
    DELAY = 3  # seconds, fixed extra delay of what the switch sends
    REORDER = 4  # seconds, max random extra delay of what the switch sends
    LINK_BPS = 5  # bits/s of the switch -> worker link (0 = unlimited)


class FaultFlag(IntEnum):
    """Entries of ``SwitchEngine.fault_flags``: which fault stages act anywhere."""

    DUPLICATE = 0  # some worker's packets are duplicated on the way in
    EGRESS = 1  # some fault acts on what the switch sends (EGRESS_FAULTS)


#: the settings that act on what the switch sends (the data plane's egress stage)
EGRESS_FAULTS = (FaultParam.LOSS_OUT, FaultParam.DELAY, FaultParam.REORDER, FaultParam.LINK_BPS)


class PoolArray(IntEnum):
    """Columns of ``SwitchState.pool_at``: the addresses of a job's four pool
    arrays (the engine keeps the arrays alive and replaces a row only between
    kernel calls). With P the slots this engine holds and N values per packet:"""

    VALUES = 0  # uint32[2 * P * N]: index (set * P + slot) * N + i; wraps as Tofino's registers
    EXPS = 1  # int8[2 * P * 2]: the two exponents of (set, slot)
    BITMAP = 2  # uint32[2 * P]: the ranks that contributed to (set, slot)
    COUNT = 3  # int32[2 * P]: contributions (set, slot) still waits for
    # a job with an uplink (a child switch's, docs/protocol.md §7), else empty:
    UP_TIMES = 4  # float64[P, UpTime]: each slot's upward packet's timer
    UP_STATE = 5  # int64[P, UpState]: and what it is


class UpTime(IntEnum):
    """Columns of a job's ``UP_TIMES`` array: a slot's upward packet as the
    worker's protocol times its packets (``swemu.protocol.worker.kernels``)."""

    DEADLINE = 0  # when it is resent (or first sent, while held)
    RTO = 1  # its timeout
    QUIET = 2  # the slot's last upward transmission + the reorder guard


class UpState(IntEnum):
    """Columns of a job's ``UP_STATE`` array, per slot."""

    SET = 0  # the set whose partial aggregate is up at the parent (-1: none)
    TSI = 1  # the header fields of the packet that completed it here, which
    JOB_NUMBER = 2  # the upward packet and the parent's result carry
    TRIES = 3  # retransmissions of the upward packet
    HELD = 4  # 1 while the reorder guard holds its first transmission
    SRC_PORT = 5  # source port of the completing packet (results to IP-only members go there)


class UpTiming(IntEnum):
    """Entries of ``SwitchState.up_timing``: a child switch's retransmission
    timer toward its parent, the worker's (``swemu.protocol.worker.protocol.Timing``)."""

    RTO_MIN = 0
    RTO_MAX = 1
    GUARD = 2
    BACKOFF_AFTER = 3


#: ``SwitchState.job_bcast``'s destination address: 127.255.255.255, lo's broadcast
BROADCAST_IP = 0x7FFFFFFF


class SwitchState(NamedTuple):
    """The engine's tables, indexed by job entry j (the engine's job table) and
    rank d; :class:`swemu.core.engine.SwitchEngine` owns and fills them."""

    #: uint64[A], sorted: ``ip << 16 | port`` of every registered worker (port 0: any)
    addr_keys: np.ndarray
    #: int32[A]: the job entry and rank of ``addr_keys[a]``, as ``j * 32 + d``
    addr_vals: np.ndarray
    #: int32[J]: the job's workers W (0: a free entry)
    job_workers: np.ndarray
    #: int32[J]: its pool size P, in slots of the whole switch
    job_pool: np.ndarray
    #: int32[J]: its size code (-1: a free entry)
    job_code: np.ndarray
    #: int32[J]: its ValueFormats: 1 = results echo the packet's format bit (0: cleared)
    job_formats: np.ndarray
    #: float64[J]: when a packet of the job last arrived (the idle release's clock)
    job_last_seen: np.ndarray
    #: int64[J, PoolArray]: where the job's pool is
    pool_at: np.ndarray
    #: uint32[J, 32]: where rank d takes its results
    dst_ip: np.ndarray
    #: int32[J, 32]: and on which port (-1: no such rank; 0: the packet's source port)
    dst_port: np.ndarray
    #: int32[J]: the loopback-broadcast port the job's results go to (0: one per rank)
    job_bcast: np.ndarray
    #: int64[J, JobCounter]
    job_counters: np.ndarray
    #: int64[J, 32, WorkerCounter]
    worker_counters: np.ndarray
    #: int64[GlobalCounter]
    global_counters: np.ndarray
    #: float64[J, 32, FaultParam]: injected faults (swemu.core.faults)
    faults: np.ndarray
    #: int64[J, FaultCounter]
    fault_counters: np.ndarray
    #: data-plane processes S (1: not sharded, swemu.serving.shards)
    shard_count: int
    #: this one's index i: it holds the slots s with ``s % S == i``, at local index ``s // S``
    shard_index: int


class Uplinks(NamedTuple):
    """A child switch's uplinks (docs/protocol.md §7), per job entry j. The
    kernels take this record on a switch with a parent, and None elsewhere:
    Numba then compiles their uplink code out (a first run of a switch alone
    compiles none of it)."""

    #: uint32[J]: where the job's partial aggregates go up (its parent's data address)
    job_up_ip: np.ndarray
    #: int32[J]: the parent's data port (0: the job has no uplink, results go down)
    job_up_port: np.ndarray
    #: float64[J, Rtt]: the uplink's learned timer (swemu.protocol.worker.kernels.Rtt)
    up_rtt: np.ndarray
    #: float64[UpTiming]: the uplink's timer settings
    up_timing: np.ndarray


class Packets(NamedTuple):
    """One batch through the switch: the datagrams in ``rows``, and per row r
    what the switch did (``action[r]``), its result (``out_buf[r]``,
    ``out_len[r]`` bytes, 0: none; for job entry ``out_job[r]``) and a list of
    destinations, one entry per copy to send (a multicast has one per rank):
    ``dest_row[k]`` (the result's row), ``dest_ip[k]``, ``dest_port[k]``,
    ``dest_worker[k]`` (the rank, for the faults on the way out). A child
    switch's partial aggregates going up are the rows ``up_row[:n_up[0]]`` of
    ``out_buf`` (to their job's parent, :class:`Uplinks`)."""

    rows: Rows
    action: np.ndarray
    out_buf: np.ndarray
    out_len: np.ndarray
    out_job: np.ndarray
    dest_row: np.ndarray
    dest_ip: np.ndarray
    dest_port: np.ndarray
    dest_worker: np.ndarray
    up_row: np.ndarray
    n_up: np.ndarray


def counter_names(columns: type[IntEnum]) -> tuple[str, ...]:
    """The snapshot names of an enum's members, in column order."""
    return tuple(m.name.lower() for m in columns)
