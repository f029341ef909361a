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

Settings live in the engine's ``faults[job, worker, param]`` array (the switch
defaults apply to jobs registered later); counters in ``fault_counters``,
apart from real drops. All randomness comes from the kernels' generator,
seeded by :func:`swemu.core.kernels.seed`, so a run is reproducible for a given
seed and packet order. Delayed packets wait in a bounded :class:`DelayQueue`;
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

import numpy as np

from swemu.core import kernels as K
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
        p = np.zeros(K.N_FAULT_PARAMS)
        p[K.P_LOSS_IN] = self.loss_in
        p[K.P_LOSS_OUT] = self.loss_out
        p[K.P_DUPLICATE] = self.duplicate
        p[K.P_DELAY] = self.delay_ms / 1e3
        p[K.P_REORDER] = self.reorder_ms / 1e3
        p[K.P_LINK_BPS] = self.link_gbps * 1e9
        return p

    @property
    def delays(self) -> bool:
        """Does this configuration hold packets back (needs a delay queue)?"""
        return self.delay_ms > 0 or self.reorder_ms > 0 or self.link_gbps > 0


class DelayQueue:
    """A bounded set of packets waiting for their departure time."""

    def __init__(self, capacity: int = 4096, max_len: int = MAX_PACKET_LEN) -> None:
        self.buf = np.zeros((capacity, max_len), np.uint8)
        self.len = np.zeros(capacity, np.int32)  # 0 = free entry
        self.due = np.zeros(capacity, np.float64)
        self.ip = np.zeros(capacity, np.uint32)
        self.port = np.zeros(capacity, np.int32)

    def arrays(self) -> tuple:
        return self.buf, self.len, self.due, self.ip, self.port

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
def duplicate_rows(buf, lens, ip, port, n, cap, addr_keys, addr_vals, faults, fault_counters):
    """Duplicate received rows whose worker has ``duplicate`` > 0 and whose coin
    says so; each copy is placed right after its original (up to ``cap`` rows in
    all). Returns the new row count.

    Right after, not at the end of the batch: a late copy behind a newer packet
    of the same worker and slot is *reordering*, which §2 does not survive (a
    retransmission of a set's old round would be taken as a new contribution
    once the newer packet released the set)."""
    dup = np.zeros(n, np.uint8)
    extra = 0
    for r in range(n):
        if n + extra >= cap:
            break
        key = (np.uint64(ip[r]) << np.uint64(16)) | np.uint64(port[r])
        ent = K._lookup(addr_keys, addr_vals, key)
        if ent < 0:
            ent = K._lookup(addr_keys, addr_vals, np.uint64(ip[r]) << np.uint64(16))
        if ent < 0:
            continue
        j, w = ent >> 5, ent & 31
        p = faults[j, w, K.P_DUPLICATE]
        if p > 0.0 and np.random.random() < p:
            dup[r] = 1
            extra += 1
            fault_counters[j, K.F_DUPLICATED] += 1
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
def leave_now(
    nd,
    out_len,
    dest_row,
    dest_ip,
    dest_port,
    out_base,
    out_stride,
    row_ptr,
    row_len,
    send_ip,
    send_port,
):
    """:func:`egress` where no fault acts on the way out: the ``nd``
    destinations of a batch all leave now, in order, in the send list. Returns
    ``nd``. (The data plane's variant without fault stages calls this.)"""
    for d in range(nd):
        r = dest_row[d]
        row_ptr[d] = out_base + out_stride * r
        row_len[d] = out_len[r]
        send_ip[d] = dest_ip[d]
        send_port[d] = dest_port[d]
    return nd


@kernel
def egress(
    now,
    nd,
    out_buf,
    out_len,
    out_job,
    dest_row,
    dest_ip,
    dest_port,
    dest_worker,
    faults,
    fault_counters,
    link_free,
    q_buf,
    q_len,
    q_due,
    q_ip,
    q_port,
    out_base,
    out_stride,
    row_ptr,
    row_len,
    send_ip,
    send_port,
    any_fault,
):
    """Apply loss/delay/reorder/link rate to the ``nd`` destinations of a batch.

    Packets that leave now are written (compacted) to ``row_ptr/row_len/
    send_ip/send_port``; delayed ones are copied into the queue. Returns the
    number that leave now. With ``any_fault`` false (no fault on the way out is
    configured anywhere) every packet leaves now without a look at ``faults``."""
    if not any_fault:
        return leave_now(
            nd,
            out_len,
            dest_row,
            dest_ip,
            dest_port,
            out_base,
            out_stride,
            row_ptr,
            row_len,
            send_ip,
            send_port,
        )
    m = 0
    qcap = q_len.shape[0]
    qpos = 0
    for d in range(nd):
        r = dest_row[d]
        plen = out_len[r]
        j = out_job[r]
        w = dest_worker[d]
        p_out = faults[j, w, K.P_LOSS_OUT]
        if p_out > 0.0 and np.random.random() < p_out:
            fault_counters[j, K.F_LOSS_OUT] += 1
            continue
        delay = faults[j, w, K.P_DELAY]
        reorder = faults[j, w, K.P_REORDER]
        bps = faults[j, w, K.P_LINK_BPS]
        if delay <= 0.0 and reorder <= 0.0 and bps <= 0.0:
            row_ptr[m] = out_base + out_stride * r
            row_len[m] = plen
            send_ip[m] = dest_ip[d]
            send_port[m] = dest_port[d]
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
        while qpos < qcap and q_len[qpos] != 0:
            qpos += 1
        if qpos == qcap:
            fault_counters[j, K.F_QUEUE_DROPS] += 1
            continue
        _copy_row(q_buf[qpos], out_buf[r], min(plen, q_buf.shape[1]))
        q_len[qpos] = plen
        q_due[qpos] = due
        q_ip[qpos] = dest_ip[d]
        q_port[qpos] = dest_port[d]
        fault_counters[j, K.F_DELAYED] += 1
    return m


@kernel
def due_packets(
    now,
    q_buf,
    q_len,
    q_due,
    q_ip,
    q_port,
    row_ptr,
    row_len,
    send_ip,
    send_port,
    q_base,
    q_stride,
    limit,
):
    """Collect up to ``limit`` queued packets whose time has come (they must be
    sent before the queue is touched again: their entries are freed here)."""
    m = 0
    for i in range(q_len.shape[0]):
        if m >= limit:
            break
        if q_len[i] != 0 and q_due[i] <= now:
            row_ptr[m] = q_base + q_stride * i
            row_len[m] = q_len[i]
            send_ip[m] = q_ip[i]
            send_port[m] = q_port[i]
            q_len[i] = 0
            m += 1
    return m
