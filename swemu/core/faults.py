"""Fault injection: loss, duplication, delay, reordering and link rate, seeded.

What a user asks the emulator to do to its traffic, to watch the protocol cope:

* ``loss_in``: packets from a worker vanish before the switch sees them
  (applied inside the switch kernel, after the worker lookup);
* ``duplicate``: packets from a worker arrive twice (the copy is processed right
  after the original: a retransmission for the switch);
* ``loss_out``: results to a worker vanish;
* ``delay`` / ``reorder``: results to a worker leave after a fixed delay plus a
  uniform random one in ``[0, reorder]`` (so they overtake each other);
* ``link_bps``: results to a worker leave no faster than the link rate (a token
  bucket per worker: each packet departs when the previous one has been
  serialized), queueing as on a slower network.

Settings live in the engine's ``faults[job, worker, param]`` array (columns
:class:`~swemu.core.state.FaultParam`; the switch defaults apply to jobs
registered later); counters in ``fault_counters``
(:class:`~swemu.core.state.FaultCounter`), apart from real drops. All
randomness comes from the kernels' generator, seeded by
:func:`swemu.core.kernels.seed`, so a run is reproducible for a given seed and
packet order. Delayed packets wait in a bounded :class:`DelayQueue`;
when it is full they are dropped and counted (``queue_drops``), as a switch's
queue would.

Reordering is injected on what the switch sends only: a worker ignores stale
or reordered results by their (slot, set, tsi, job_number), so exactly-once
holds. Reordering *towards* the switch can defeat docs/protocol.md §2 itself (a late
copy of an old packet looks like a new contribution); the host library's
``reorder_guard`` exists for networks that do that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from swemu.core.kernels import find_worker
from swemu.core.state import FaultCounter, FaultParam
from swemu.protocol.jit import kernel
from swemu.protocol.wire import MAX_PACKET_LEN


@dataclass(frozen=True)
class FaultConfig:
    """Fault settings; probabilities in [0, 1], times in milliseconds."""

    loss_in: float = 0.0
    loss_out: float = 0.0
    duplicate: float = 0.0
    reorder_ms: float = 0.0
    delay_ms: float = 0.0
    link_gbps: float = 0.0  # 0 = unlimited

    def __post_init__(self) -> None:
        for name in ("loss_in", "loss_out", "duplicate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {v}")
        for name in ("reorder_ms", "delay_ms", "link_gbps"):
            v = getattr(self, name)
            if not 0.0 <= v < 1e9:
                raise ValueError(f"{name} must be a non-negative number, got {v}")

    def params(self) -> np.ndarray:
        """The kernel's per-(job, worker) parameter vector."""
        p = np.zeros(len(FaultParam))
        p[FaultParam.LOSS_IN] = self.loss_in
        p[FaultParam.LOSS_OUT] = self.loss_out
        p[FaultParam.DUPLICATE] = self.duplicate
        p[FaultParam.DELAY] = self.delay_ms / 1e3
        p[FaultParam.REORDER] = self.reorder_ms / 1e3
        p[FaultParam.LINK_BPS] = self.link_gbps * 1e9
        return p

    @property
    def delays(self) -> bool:
        """Does this configuration hold packets back (needs a delay queue)?"""
        return self.delay_ms > 0 or self.reorder_ms > 0 or self.link_gbps > 0


class Queue(NamedTuple):
    """A :class:`DelayQueue` as the kernels take it: entry i holds ``len[i]``
    bytes (0: free) in row i of ``buf``, to leave at ``due[i]`` for
    ``(ip[i], port[i])``."""

    buf: np.ndarray
    len: np.ndarray
    due: np.ndarray
    ip: np.ndarray
    port: np.ndarray


class DelayQueue:
    """A bounded set of packets waiting for their departure time."""

    def __init__(self, capacity: int = 4096, max_len: int = MAX_PACKET_LEN) -> None:
        self.buf = np.zeros((capacity, max_len), np.uint8)
        self.len = np.zeros(capacity, np.int32)  # 0 = free entry
        self.due = np.zeros(capacity, np.float64)
        self.ip = np.zeros(capacity, np.uint32)
        self.port = np.zeros(capacity, np.int32)
        self.arrays = Queue(self.buf, self.len, self.due, self.ip, self.port)

    def __len__(self) -> int:
        return int(np.count_nonzero(self.len))

    def next_due(self) -> float | None:
        busy = self.len > 0
        return float(self.due[busy].min()) if busy.any() else None


@kernel(inline=True)
def _copy_row(dst, src, n):
    """The first ``n`` bytes of ``src`` into ``dst``. A loop rather than
    ``dst[:n] = src[:n]``: a slice assignment brings Numba's shape-mismatch
    error path (string formatting), some two seconds of first-run compile."""
    for b in range(n):
        dst[b] = src[b]


@kernel
def duplicate_rows(rows, n, sw):
    """Duplicate received rows (:class:`~swemu.protocol.fastio.Rows`) whose
    worker has ``duplicate`` > 0 in ``sw.faults`` and whose coin says so; each
    copy is placed right after its original (up to the rows' capacity).
    Returns the new row count.

    Right after, not at the end of the batch: a late copy behind a newer packet
    of the same worker and slot is *reordering*, which §2 does not survive (a
    retransmission of a set's old round would be taken as a new contribution
    once the newer packet released the set)."""
    buf, lens, ip, port = rows.buf, rows.lens, rows.ip, rows.port
    cap = buf.shape[0]
    dup = np.zeros(n, np.uint8)
    extra = 0
    for r in range(n):
        if n + extra >= cap:
            break
        ent = find_worker(sw.addr_keys, sw.addr_vals, ip[r], port[r])
        if ent < 0:
            continue
        j, w = ent >> 5, ent & 31
        p = sw.faults[j, w, FaultParam.DUPLICATE]
        if p > 0.0 and np.random.random() < p:
            dup[r] = 1
            extra += 1
            sw.fault_counters[j, FaultCounter.DUPLICATED] += 1
    if extra == 0:
        return n
    # spread the rows out from the back, so that no row is overwritten before it moves
    width = buf.shape[1]
    pos = n + extra
    for r in range(n - 1, -1, -1):
        for _ in range(1 + dup[r]):
            pos -= 1
            if pos != r:
                ln = min(max(lens[r], 0), width)
                _copy_row(buf[pos], buf[r], ln)
                lens[pos] = lens[r]
                ip[pos] = ip[r]
                port[pos] = port[r]
    return n + extra


@kernel(inline=True)
def leave_now(nd, pk, out):
    """:func:`egress` where no fault acts on the way out: the ``nd``
    destinations of the batch ``pk`` (:class:`~swemu.core.state.Packets`) all
    leave now, in order, in the send list ``out``
    (:class:`~swemu.protocol.fastio.Sends`). Returns ``nd``. (The data plane's
    variant without fault stages calls this.)"""
    base = pk.out_buf.ctypes.data
    stride = pk.out_buf.strides[0]
    for d in range(nd):
        r = pk.dest_row[d]
        out.ptr[d] = base + stride * r
        out.len[d] = pk.out_len[r]
        out.ip[d] = pk.dest_ip[d]
        out.port[d] = pk.dest_port[d]
    return nd


@kernel
def egress(now, nd, pk, sw, link_free, q, out, any_fault):
    """Apply loss/delay/reorder/link rate (``sw.faults``) to the ``nd``
    destinations of the batch ``pk``.

    Packets that leave now are written (compacted) to the send list ``out``;
    delayed ones are copied into the queue ``q`` (:class:`Queue`), and
    ``link_free[j, w]`` is when the link to rank w of job j is free again.
    Returns the number that leave now. With ``any_fault`` false (no fault on
    the way out is configured anywhere) every packet leaves now without a look
    at ``faults``."""
    if not any_fault:
        return leave_now(nd, pk, out)
    faults, fault_counters = sw.faults, sw.fault_counters
    base = pk.out_buf.ctypes.data
    stride = pk.out_buf.strides[0]
    m = 0
    qcap = q.len.shape[0]
    qpos = 0
    for d in range(nd):
        r = pk.dest_row[d]
        plen = pk.out_len[r]
        j = pk.out_job[r]
        w = pk.dest_worker[d]
        p_out = faults[j, w, FaultParam.LOSS_OUT]
        if p_out > 0.0 and np.random.random() < p_out:
            fault_counters[j, FaultCounter.LOSS_OUT] += 1
            continue
        delay = faults[j, w, FaultParam.DELAY]
        reorder = faults[j, w, FaultParam.REORDER]
        bps = faults[j, w, FaultParam.LINK_BPS]
        if delay <= 0.0 and reorder <= 0.0 and bps <= 0.0:
            out.ptr[m] = base + stride * r
            out.len[m] = plen
            out.ip[m] = pk.dest_ip[d]
            out.port[m] = pk.dest_port[d]
            m += 1
            continue
        due = now
        if bps > 0.0:
            start = max(now, link_free[j, w])
            due = start + plen * 8.0 / bps
            link_free[j, w] = due
        due += delay
        if reorder > 0.0:
            due += np.random.random() * reorder
        while qpos < qcap and q.len[qpos] != 0:
            qpos += 1
        if qpos == qcap:
            fault_counters[j, FaultCounter.QUEUE_DROPS] += 1
            continue
        _copy_row(q.buf[qpos], pk.out_buf[r], min(plen, q.buf.shape[1]))
        q.len[qpos] = plen
        q.due[qpos] = due
        q.ip[qpos] = pk.dest_ip[d]
        q.port[qpos] = pk.dest_port[d]
        fault_counters[j, FaultCounter.DELAYED] += 1
    return m


@kernel
def due_packets(now, q, out, limit):
    """Collect up to ``limit`` packets of the queue ``q`` whose time has come
    into the send list ``out``; returns how many. (They must be sent before
    the queue is touched again: their entries are freed here.)"""
    base = q.buf.ctypes.data
    stride = q.buf.strides[0]
    m = 0
    for i in range(q.len.shape[0]):
        if m >= limit:
            break
        if q.len[i] != 0 and q.due[i] <= now:
            out.ptr[m] = base + stride * i
            out.len[m] = q.len[i]
            out.ip[m] = q.ip[i]
            out.port[m] = q.port[i]
            q.len[i] = 0
            m += 1
    return m
