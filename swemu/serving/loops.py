"""The data plane's compiled loops: receive, switch and send a socket's datagrams
without returning to Python.

:class:`swemu.serving.dataplane.DataPlane` calls

* :func:`drain`: ``recvmmsg`` -> the switch -> ``sendmmsg``, batch after batch,
  then a serve slice (the fast path);
* :func:`step`: one received batch through the switch, from Python (the
  stepwise path: a capture's tap sees each batch, or no compiled I/O);
* :func:`echo_drain`: every datagram straight back to its sender (``bench
  switch``'s baseline, the cost of moving packets without the switch);

which share :func:`switch_batch` (one batch through injected duplicates, the §2
kernel and the faults on the way out) and :func:`send_due` (delayed packets
whose time has come).

They take records (NamedTuples; Numba passes their fields as separate
arguments): the socket's vectors (:class:`swemu.protocol.fastio.GroVec`,
:class:`~swemu.protocol.fastio.TxVec`), the switch's tables
(:class:`swemu.core.state.SwitchState`), and two declared here:
:class:`BatchIO` (the batch and what it leaves through) and :class:`Serve`
(the loop's counters and its serve slice).
"""

from __future__ import annotations

import inspect
import os
from enum import IntEnum
from typing import NamedTuple

import numpy as np
from numba import typeof, types
from numba.core.dispatcher import Dispatcher

from swemu.core import faults as faults_mod
from swemu.core.faults import Queue
from swemu.core.kernels import process_batch, uplink_batch
from swemu.core.state import FaultFlag, Packets
from swemu.protocol import fastio
from swemu.protocol.fastio import Sends
from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import bytes_at, unowned


class LoopStat(IntEnum):
    """Columns of ``Serve.stats``, the compiled loops' counters."""

    BATCHES = 0
    PACKETS = 1  # datagrams received
    SENT = 2  # datagrams the kernel accepted
    SEND_DROPS = 3  # datagrams it refused (a full buffer)
    POLLS = 4  # waits within serve slices that found a datagram


# A serve slice (see _slice_next): after draining the socket, the compiled loop
# waits up to SERVE_IDLE_MS for the next datagram itself instead of returning to
# the event loop, for at most SERVE_SLICE_MS in all. SWEMU_SLICE_MS=0 turns it off.
SERVE_SLICE_MS = float(os.environ.get("SWEMU_SLICE_MS", "5"))
SERVE_IDLE_MS = 1


class BatchIO(NamedTuple):
    """A batch and the way out of the switch: the batch itself (its rows are
    where datagrams are received), the send list it leaves through, and the
    fault stages' state (the delay queue, and when each (job, rank)'s link is
    free again: ``link_free[j, d]``, float64). A child switch's partial
    aggregates leave through ``up_sends`` from the socket ``up_fd[j]`` of
    their job (int32, -1: none; docs/protocol.md §7)."""

    packets: Packets
    sends: Sends
    queue: Queue
    link_free: np.ndarray
    up_sends: Sends
    up_fd: np.ndarray


class Serve(NamedTuple):
    """A drain loop's own state: its counters (``stats``, :class:`LoopStat`),
    its serve slice in seconds (0.0: none) and longest idle wait within it, the
    ``struct timespec`` (int64[2]) and the ``struct pollfd`` array it waits with
    (int32[2 * (1 + U)]: the data-plane socket's entry, then one per uplink
    socket of a child switch, whose parent's results end the slice), the
    datagrams it receives per batch (``cap``) and the batches it handles before
    the event loop gets a turn (``max_batches``)."""

    stats: np.ndarray
    slice_s: float
    idle_ms: int
    ts: np.ndarray
    pollfd: np.ndarray
    cap: int
    max_batches: int


@kernel(entry=False)
def switch_batch(now, n, io, sw, row_addr, faulty, up):
    """One received batch through the switch: injected duplicates, the §2
    kernel, then loss/delay/link rate on the way out. Returns ``(m, rows,
    dests)``: the packets that leave now (the first ``m`` of ``io.sends``), the
    rows processed (with duplicates) and the kernel's destination count.

    The datagrams are the batch's rows, or where ``row_addr`` says (zero-copy
    GRO, see :func:`swemu.core.kernels.process_batch`).

    ``faulty`` is :attr:`SwitchEngine.fault_flags`, or None when no fault acts
    on the way through the switch (:meth:`DataPlane._faulty`). None is a type of
    its own: Numba compiles a variant without the fault stages (the branches on
    it are pruned before typing), and the variant with them only when faults
    are first configured (:func:`compile_fault_stages`); a first run compiles
    a third less. Loss on the way in is the kernel's own, in both. ``up``: a
    child switch's uplinks, or None (see :func:`swemu.core.kernels.process_batch`)."""
    pk = io.packets
    if faulty is not None and faulty[FaultFlag.DUPLICATE]:
        if row_addr.shape[0] > 0:
            # duplicates are made among the rows: copy the datagrams in first
            buf, lens = pk.rows.buf, pk.rows.lens
            for r in range(n):
                dst = buf[r, : lens[r]]
                src = bytes_at(row_addr[r], lens[r])
                for b in range(lens[r]):
                    dst[b] = src[b]
            row_addr = row_addr[:0]
        n = faults_mod.duplicate_rows(pk.rows, n, sw)
    nd = process_batch(pk, n, now, sw, row_addr, up)
    if faulty is None:
        return faults_mod.leave_now(nd, pk, io.sends), n, nd
    m = faults_mod.egress(
        now, nd, pk, sw, io.link_free, io.queue, io.sends, faulty[FaultFlag.EGRESS]
    )
    return m, n, nd


@kernel
def send_up(tx, io, up, stats):
    """Send the batch's partial aggregates going up (``io.packets.up_row``),
    each from its job's uplink socket to its job's parent, grouped by job.
    Returns how many the kernel took."""
    pk = io.packets
    n = pk.n_up[0]
    ups = io.up_sends
    base = pk.out_buf.ctypes.data
    stride = pk.out_buf.strides[0]
    sent = 0
    first = 0
    while first < n:
        j = pk.out_job[pk.up_row[first]]
        m = 0
        nxt = n
        for k in range(first, n):
            r = pk.up_row[k]
            if r < 0:
                continue
            if pk.out_job[r] != j:
                nxt = min(nxt, k)
                continue
            ups.ptr[m] = base + stride * r
            ups.len[m] = pk.out_len[r]
            ups.ip[m] = up.job_up_ip[j]
            ups.port[m] = up.job_up_port[j]
            pk.up_row[k] = -1
            m += 1
        if io.up_fd[j] >= 0:
            got = fastio.send_batch_gso(io.up_fd[j], tx, m, ups)
            sent += got
            stats[LoopStat.SENT] += got
            stats[LoopStat.SEND_DROPS] += m - got
        first = nxt
    pk.n_up[0] = 0
    return sent


@kernel
def uplink_drain(up_fd, fd, now, rx, tx, io, sw, j, faulty, up):
    """A child switch's uplink socket ``up_fd`` of job ``j``: receive what its
    parent sent (``rx``, into ``io``'s rows), take the results
    (:func:`swemu.core.kernels.uplink_batch`) and send them down to the
    members from the data-plane socket ``fd`` (through the same fault stages
    as the results of :func:`drain`), until the socket is empty. Returns the
    datagrams received."""
    rx, tx, io, sw, up = unowned((rx, tx, io, sw, up))
    pk = io.packets
    cap = pk.rows.buf.shape[0] // 2  # (the other half of the rows: injected duplicates)
    total = 0
    while True:
        n, more = fastio.receive(up_fd, cap, pk.rows, rx)
        if n == 0:
            return total
        total += n
        nd = uplink_batch(pk, n, now, sw, up, j)
        if faulty is None:
            m = faults_mod.leave_now(nd, pk, io.sends)
        else:
            m = faults_mod.egress(
                now, nd, pk, sw, io.link_free, io.queue, io.sends, faulty[FaultFlag.EGRESS]
            )
        fastio.send_batch_gso(fd, tx, m, io.sends)
        if not more:
            return total


@kernel(entry=False)
def send_due(now, fd, tx, io, stats):
    """Send the delayed packets whose time has come; returns how many."""
    m = faults_mod.due_packets(now, io.queue, io.sends, io.sends.ptr.shape[0])
    if m > 0:
        sent = fastio.send_batch_gso(fd, tx, m, io.sends)
        stats[LoopStat.SENT] += sent
        stats[LoopStat.SEND_DROPS] += m - sent
    return m


@kernel
def step(now, n, io, sw, faulty, up):
    """:func:`switch_batch` for rows ``0..n-1`` of ``io``'s batch, from Python
    (the stepwise path); returns ``(m, rows, dests)`` as it does."""
    return switch_batch(now, n, io, sw, np.zeros(0, np.int64), faulty, up)


def compile_fault_stages(dispatcher: Dispatcher, flags: np.ndarray) -> None:
    """Compile (or load from the cache) the variant with fault stages of every
    signature ``dispatcher`` (:func:`drain` or :func:`step`) has compiled so
    far without them: its ``faulty`` parameter typed as ``flags`` instead of
    None."""
    i = list(inspect.signature(dispatcher.py_func).parameters).index("faulty")
    for sig in list(dispatcher.signatures):
        if isinstance(sig[i], types.NoneType):
            dispatcher.compile((*sig[:i], typeof(flags), *sig[i + 1 :]))


@kernel(inline=True)
def _slice_end(slice_s, ts):
    """When a serve slice of ``slice_s`` seconds that starts now ends (0.0: no
    slice), on the clock :func:`_slice_next` reads."""
    return fastio.monotonic(ts) + slice_s if slice_s > 0.0 else 0.0


@kernel(entry=False)
def _slice_next(fd, more, t_end, serve):
    """Whether a drain loop goes on after a pass: the clock if so, -1.0 to
    return to the event loop.

    A readiness callback from the event loop costs tens of microseconds of
    interpreter work, and under traffic the socket is readable again
    microseconds after it was drained: returning to the loop after every drain
    was a fifth of the emulator's CPU. So within a slice (``t_end`` > 0, a
    clock value) the loop polls the socket itself, up to ``serve.idle_ms`` per
    wait: it returns when the socket stayed idle that long, when the slice is
    over, or when a signal interrupted the wait, and the event loop (control
    plane, timers) waits at most the slice.

    A child switch's uplink sockets (``serve.pollfd``'s entries after the
    first) are watched too: a parent's result waiting there ends the slice, so
    that the event loop passes it down at once (:meth:`DataPlane._on_uplink`)
    instead of after the slice -- the members wait for it, and every slice's
    worth of delay is a slice longer round trip through the tree."""
    if t_end <= 0.0:
        return -1.0
    now = fastio.monotonic(serve.ts)
    if now >= t_end:
        return -1.0
    pollfd = serve.pollfd
    nfds = pollfd.shape[0] // 2
    if more and nfds == 1:  # the pass ended on its batch limit: more is waiting
        return now
    pollfd[0] = fd
    for k in range(nfds):
        pollfd[2 * k + 1] = fastio.POLLIN  # events; revents (the high half) cleared
    r = fastio.c_poll(pollfd.ctypes.data, nfds, 0 if more else serve.idle_ms)
    for k in range(1, nfds):
        if pollfd[2 * k + 1] >> 16 != 0:  # a parent's result (or an error) on an uplink
            return -1.0
    if more:
        return now
    if r <= 0 or ((pollfd[1] >> 16) & fastio.POLLNVAL) != 0:  # idle, EINTR, closed
        return -1.0
    serve.stats[LoopStat.POLLS] += 1
    return fastio.monotonic(serve.ts)


@kernel
def drain(fd, now, rx, tx, io, sw, serve, faulty, up):
    """The whole per-packet path in compiled code: send what the delay queue
    holds that is due, then repeatedly receive a batch of up to ``cap``
    datagrams (``rx``, :class:`~swemu.protocol.fastio.GroVec`: read where
    they landed, or copied into ``io``'s rows), run it through the switch
    ``sw`` (:func:`switch_batch`) and send the results (``tx``; a child
    switch's partial aggregates from their uplinks, :func:`send_up`, when
    ``up`` is not None), until the socket is empty or after ``serve.max_batches``
    (to let the event loop breathe);
    then the same again within a serve slice (:func:`_slice_next`). Returns the
    datagrams received. ``faulty``: see :func:`switch_batch` (without faults
    there is no delay queue either).

    The records go on as owner-less views (:func:`swemu.protocol.rawmem.unowned`):
    every compiled callee takes the arrays in its arguments as new references,
    two atomic count updates each, per batch."""
    rx, tx, io, sw, serve = unowned((rx, tx, io, sw, serve))
    stats = serve.stats
    cap = serve.cap
    rows = io.packets.rows
    # in zero-copy mode the datagrams stay where the kernel landed them
    landed = rx.addr
    total = 0
    t_end = _slice_end(serve.slice_s, serve.ts)
    while True:
        if faulty is not None:
            send_due(now, fd, tx, io, stats)
        more = False
        for _ in range(serve.max_batches):
            n, more = fastio.receive(fd, cap, rows, rx)
            if n == 0:
                break
            m, _, _ = switch_batch(now, n, io, sw, landed, unowned(faulty), unowned(up))
            sent = fastio.send_batch_gso(fd, tx, m, io.sends)
            if up is not None and io.packets.n_up[0] > 0:
                send_up(tx, io, unowned(up), stats)
            stats[LoopStat.BATCHES] += 1
            stats[LoopStat.PACKETS] += n
            stats[LoopStat.SENT] += sent
            stats[LoopStat.SEND_DROPS] += m - sent
            total += n
            if not more:
                break
        now = _slice_next(fd, more, t_end, serve)
        if now < 0.0:
            return total


@kernel
def echo_drain(fd, rx, tx, rows, sends, serve):
    """:func:`drain` with the switch replaced by an echo: every datagram goes
    back to its sender, from the rows it was received (or copied) into
    (``rows``, :class:`~swemu.protocol.fastio.Rows`), through the send list
    ``sends``; serve slices and owner-less views as in :func:`drain`. The
    baseline of ``bench switch``, which isolates the cost of aggregation from
    the cost of moving packets."""
    rx, tx, rows, sends, serve = unowned((rx, tx, rows, sends, serve))
    stats = serve.stats
    cap = serve.cap
    base = rows.buf.ctypes.data
    stride = rows.buf.strides[0]
    back = Sends(sends.ptr, sends.len, rows.ip, rows.port)
    total = 0
    t_end = _slice_end(serve.slice_s, serve.ts)
    while True:
        more = False
        for _ in range(serve.max_batches):
            n, more = fastio.receive(fd, cap, rows, rx)
            if n == 0:
                break
            for r in range(n):
                back.ptr[r] = base + stride * r
                back.len[r] = rows.lens[r]
            sent = fastio.send_batch_gso(fd, tx, n, back)
            stats[LoopStat.BATCHES] += 1
            stats[LoopStat.PACKETS] += n
            stats[LoopStat.SENT] += sent
            stats[LoopStat.SEND_DROPS] += n - sent
            total += n
            if not more:
                break
        if _slice_next(fd, more, t_end, serve) < 0.0:
            return total
