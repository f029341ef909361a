"""The data plane's compiled loops: receive, switch and send a socket's datagrams
without returning to Python.

:class:`swemu.serving.dataplane.DataPlane` calls these with its arrays: ``_drain``
(``recvmmsg`` -> the switch -> ``sendmmsg``, batch after batch, then a serve slice),
``_echo_drain`` (the same with a capture tap), ``_step`` (one batch; the
pure-Python fallback calls it too), ``_switch_batch`` (one batch through injected
duplicates, the §2 kernel and the faults on the way out) and ``_send_due_fast``
(delayed packets whose time has come). The constants they share with the
data plane (fault flags, the stats array's columns, the serve slice) live here.
"""

from __future__ import annotations

import os

import numpy as np

from swemu.core import faults as faults_mod
from swemu.core.kernels import process_batch
from swemu.protocol import fastio
from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import bytes_at, unowned

# SwitchEngine.fault_flags: any duplication configured / any fault on the way out
FLAG_DUPLICATE, FLAG_EGRESS = 0, 1

# columns of the compiled loop's stats array
S_BATCHES, S_PACKETS, S_SENT, S_SEND_DROPS, S_POLLS = 0, 1, 2, 3, 4
N_STATS = 5

# A serve slice (see _slice_next): after draining the socket, the compiled loop
# waits up to IDLE_MS for the next datagram itself instead of returning to the
# event loop, for at most SLICE_MS in all. SWEMU_SLICE_MS=0 turns it off.
SLICE_MS = float(os.environ.get("SWEMU_SLICE_MS", "5"))
IDLE_MS = 1


@kernel(entry=False)
def _switch_batch(now, n, counts, io, state, row_addr, faulty):
    """One received batch through the switch: injected duplicates, the §2
    kernel, then loss/delay/link rate on the way out.

    ``io`` is :meth:`DataPlane._io` (the batch, the delay queue and the send
    list), ``state`` is :meth:`SwitchEngine.kernel_state`. The datagrams are the
    batch's rows, or where ``row_addr`` says (zero-copy GRO, see
    :func:`swemu.core.kernels.process_batch`). Returns how many packets leave now
    (in the send list); ``counts`` gets the rows processed (with duplicates) and
    the kernel's destination count.

    ``faulty`` is :attr:`SwitchEngine.fault_flags`, or None when no fault acts
    on the way through the switch (:meth:`DataPlane._faulty`). None is a type of
    its own: Numba compiles a variant without the fault stages (the branches on
    it are pruned before typing), and the variant with them only when faults
    are first configured (:meth:`DataPlane._on_fault_flags`); a first run
    compiles a third less. Loss on the way in is the kernel's own, in both."""
    (
        buf,
        lens,
        ip,
        port,
        action,
        out_buf,
        out_len,
        out_job,
        dest_row,
        dest_ip,
        dest_port,
        dest_worker,
        link_free,
        q_buf,
        q_len,
        q_due,
        q_ip,
        q_port,
        row_ptr,
        row_len,
        send_ip,
        send_port,
        out_base,
        out_stride,
        _q_base,
        _q_stride,
        _fault_flags,
    ) = io
    addr_keys, addr_vals, faults, fault_counters = state[0], state[1], state[12], state[13]
    if faulty is not None and faulty[FLAG_DUPLICATE]:
        if row_addr.shape[0] > 0:
            # duplicates are made among the rows: copy the datagrams in first
            for r in range(n):
                dst = buf[r, : lens[r]]
                src = bytes_at(row_addr[r], lens[r])
                for b in range(lens[r]):
                    dst[b] = src[b]
            row_addr = row_addr[:0]
        n = faults_mod.duplicate_rows(
            buf, lens, ip, port, n, buf.shape[0], addr_keys, addr_vals, faults, fault_counters
        )
    nd = process_batch(
        buf,
        lens,
        ip,
        port,
        n,
        now,
        *state,
        action,
        out_buf,
        out_len,
        out_job,
        dest_row,
        dest_ip,
        dest_port,
        dest_worker,
        row_addr,
    )
    counts[0] = n
    counts[1] = nd
    if faulty is None:
        return faults_mod.leave_now(
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
    return faults_mod.egress(
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
        faulty[FLAG_EGRESS],
    )


@kernel
def _send_due_fast(now, fd, tx, io, stats):
    """Send the delayed packets whose time has come; returns how many."""
    q_buf, q_len, q_due, q_ip, q_port = io[13], io[14], io[15], io[16], io[17]
    row_ptr, row_len, send_ip, send_port = io[18], io[19], io[20], io[21]
    m = faults_mod.due_packets(
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
        io[24],
        io[25],
        row_ptr.shape[0],
    )
    if m > 0:
        sent = fastio.send_batch_gso(
            fd,
            tx[0],
            tx[1],
            tx[2],
            tx[3],
            tx[4],
            tx[5],
            m,
            row_ptr,
            row_len,
            send_ip,
            send_port,
            tx[6],
        )
        stats[S_SENT] += sent
        stats[S_SEND_DROPS] += m - sent
    return m


@kernel
def _step(
    now,
    n,
    counts,
    buf,
    lens,
    ip,
    port,
    action,
    out_buf,
    out_len,
    out_job,
    dest_row,
    dest_ip,
    dest_port,
    dest_worker,
    link_free,
    q_buf,
    q_len,
    q_due,
    q_ip,
    q_port,
    row_ptr,
    row_len,
    send_ip,
    send_port,
    out_base,
    out_stride,
    q_base,
    q_stride,
    fault_flags,
    addr_keys,
    addr_vals,
    job_workers,
    job_pool,
    job_code,
    job_last_seen,
    pool_at,
    dst_ip,
    dst_port,
    job_counters,
    worker_counters,
    global_counters,
    faults,
    fault_counters,
    shard,
    job_bcast,
    faulty,
):
    """:func:`_switch_batch` with its arrays as separate arguments: the form to
    call from Python (Numba types separate array arguments much faster than
    tuples of them)."""
    io = (
        buf,
        lens,
        ip,
        port,
        action,
        out_buf,
        out_len,
        out_job,
        dest_row,
        dest_ip,
        dest_port,
        dest_worker,
        link_free,
        q_buf,
        q_len,
        q_due,
        q_ip,
        q_port,
        row_ptr,
        row_len,
        send_ip,
        send_port,
        out_base,
        out_stride,
        q_base,
        q_stride,
        fault_flags,
    )
    state = (
        addr_keys,
        addr_vals,
        job_workers,
        job_pool,
        job_code,
        job_last_seen,
        pool_at,
        dst_ip,
        dst_port,
        job_counters,
        worker_counters,
        global_counters,
        faults,
        fault_counters,
        shard,
        job_bcast,
    )
    return _switch_batch(now, n, counts, io, state, np.zeros(0, np.int64), faulty)


@kernel(inline=True)
def _slice_end(slice_s, ts):
    """When a serve slice of ``slice_s`` seconds that starts now ends (0.0: no
    slice), on the clock :func:`_slice_next` reads."""
    return fastio.monotonic(ts) + slice_s if slice_s > 0.0 else 0.0


@kernel(entry=False)
def _slice_next(fd, more, t_end, idle_ms, ts, pollfd, stats):
    """Whether a drain loop goes on after a pass: the clock if so, -1.0 to
    return to the event loop.

    A readiness callback from the event loop costs tens of microseconds of
    interpreter work (the dispatcher unboxes some sixty arrays), and under
    traffic the socket is readable again microseconds after it was drained:
    returning to the loop after every drain was a fifth of the emulator's CPU.
    So within a slice (``t_end`` > 0, a clock value) the loop polls the socket
    itself, up to ``idle_ms`` per wait: it returns when the socket stayed idle
    that long, when the slice is over, or when a signal interrupted the wait,
    and the event loop (control plane, timers) waits at most the slice.
    ``pollfd`` is one ``struct pollfd`` as int32[2], ``ts`` a timespec."""
    if t_end <= 0.0:
        return -1.0
    now = fastio.monotonic(ts)
    if now >= t_end:
        return -1.0
    if more:  # the pass ended on its batch limit: more is waiting, no need to poll
        return now
    pollfd[0] = fd
    pollfd[1] = fastio.POLLIN
    r = fastio.c_poll(pollfd.ctypes.data, 1, idle_ms)
    if r <= 0 or ((pollfd[1] >> 16) & fastio.POLLNVAL) != 0:  # idle, EINTR, closed
        return -1.0
    stats[S_POLLS] += 1
    return fastio.monotonic(ts)


@kernel
def _drain(
    fd,
    max_batches,
    now,
    cap,
    rx_hdr,
    rx_ptr,
    rx_names,
    gro,
    g_hdr,
    g_hdr_ptr,
    g_names,
    g_cmsg,
    g_cmsg_ptr,
    g_land,
    g_mlens,
    g_gso,
    g_mip,
    g_mport,
    g_cursor,
    g_addr,
    tx_hdr,
    tx_ptr,
    tx_iov,
    tx_names,
    tx_cmsg,
    tx_cmsg_ptr,
    seg_max,
    stats,
    counts,
    slice_s,
    idle_ms,
    ts,
    pollfd,
    buf,
    lens,
    ip,
    port,
    action,
    out_buf,
    out_len,
    out_job,
    dest_row,
    dest_ip,
    dest_port,
    dest_worker,
    link_free,
    q_buf,
    q_len,
    q_due,
    q_ip,
    q_port,
    row_ptr,
    row_len,
    send_ip,
    send_port,
    out_base,
    out_stride,
    q_base,
    q_stride,
    fault_flags,
    addr_keys,
    addr_vals,
    job_workers,
    job_pool,
    job_code,
    job_last_seen,
    pool_at,
    dst_ip,
    dst_port,
    job_counters,
    worker_counters,
    global_counters,
    faults,
    fault_counters,
    shard,
    job_bcast,
    faulty,
):
    """The whole per-packet path in compiled code: send what the delay queue
    holds that is due, then repeatedly recvmmsg a batch, run it through the
    switch (:func:`_switch_batch`) and sendmmsg the results, until the socket is
    empty or after ``max_batches`` (to let the event loop breathe). Returns the
    packets received. Arguments: the message vectors, then :meth:`DataPlane._io`
    and :meth:`SwitchEngine.kernel_state`, unpacked, then ``faulty`` (see
    :func:`_switch_batch`: without faults there is no delay queue either).

    The arrays go on as owner-less views (:func:`swemu.protocol.rawmem.unowned`): every
    compiled callee takes its array arguments (tuples of them included) as new
    references, two atomic count updates each, per batch."""
    rx_hdr = unowned(rx_hdr)
    rx_ptr = unowned(rx_ptr)
    rx_names = unowned(rx_names)
    g_hdr = unowned(g_hdr)
    g_hdr_ptr = unowned(g_hdr_ptr)
    g_names = unowned(g_names)
    g_cmsg = unowned(g_cmsg)
    g_cmsg_ptr = unowned(g_cmsg_ptr)
    g_land = unowned(g_land)
    g_mlens = unowned(g_mlens)
    g_gso = unowned(g_gso)
    g_mip = unowned(g_mip)
    g_mport = unowned(g_mport)
    g_cursor = unowned(g_cursor)
    g_addr = unowned(g_addr)
    tx_hdr = unowned(tx_hdr)
    tx_ptr = unowned(tx_ptr)
    tx_iov = unowned(tx_iov)
    tx_names = unowned(tx_names)
    tx_cmsg = unowned(tx_cmsg)
    tx_cmsg_ptr = unowned(tx_cmsg_ptr)
    stats = unowned(stats)
    counts = unowned(counts)
    ts = unowned(ts)
    pollfd = unowned(pollfd)
    buf = unowned(buf)
    lens = unowned(lens)
    ip = unowned(ip)
    port = unowned(port)
    action = unowned(action)
    out_buf = unowned(out_buf)
    out_len = unowned(out_len)
    out_job = unowned(out_job)
    dest_row = unowned(dest_row)
    dest_ip = unowned(dest_ip)
    dest_port = unowned(dest_port)
    dest_worker = unowned(dest_worker)
    link_free = unowned(link_free)
    q_buf = unowned(q_buf)
    q_len = unowned(q_len)
    q_due = unowned(q_due)
    q_ip = unowned(q_ip)
    q_port = unowned(q_port)
    row_ptr = unowned(row_ptr)
    row_len = unowned(row_len)
    send_ip = unowned(send_ip)
    send_port = unowned(send_port)
    fault_flags = unowned(fault_flags)
    addr_keys = unowned(addr_keys)
    addr_vals = unowned(addr_vals)
    job_workers = unowned(job_workers)
    job_pool = unowned(job_pool)
    job_code = unowned(job_code)
    job_last_seen = unowned(job_last_seen)
    dst_ip = unowned(dst_ip)
    dst_port = unowned(dst_port)
    job_counters = unowned(job_counters)
    worker_counters = unowned(worker_counters)
    global_counters = unowned(global_counters)
    faults = unowned(faults)
    fault_counters = unowned(fault_counters)
    shard = unowned(shard)
    job_bcast = unowned(job_bcast)
    io = (
        buf,
        lens,
        ip,
        port,
        action,
        out_buf,
        out_len,
        out_job,
        dest_row,
        dest_ip,
        dest_port,
        dest_worker,
        link_free,
        q_buf,
        q_len,
        q_due,
        q_ip,
        q_port,
        row_ptr,
        row_len,
        send_ip,
        send_port,
        out_base,
        out_stride,
        q_base,
        q_stride,
        fault_flags,
    )
    state = (
        addr_keys,
        addr_vals,
        job_workers,
        job_pool,
        job_code,
        job_last_seen,
        pool_at,
        dst_ip,
        dst_port,
        job_counters,
        worker_counters,
        global_counters,
        faults,
        fault_counters,
        shard,
        job_bcast,
    )
    tx = (tx_hdr, tx_ptr, tx_iov, tx_names, tx_cmsg, tx_cmsg_ptr, seg_max)
    total = 0
    t_end = _slice_end(slice_s, ts)
    while True:
        if faulty is not None:
            _send_due_fast(now, fd, tx, io, stats)
        more = False
        for _ in range(max_batches):
            n, more = fastio.receive(
                fd,
                cap,
                buf,
                lens,
                ip,
                port,
                rx_hdr,
                rx_ptr,
                rx_names,
                gro,
                g_hdr,
                g_hdr_ptr,
                g_names,
                g_cmsg,
                g_cmsg_ptr,
                g_land,
                g_mlens,
                g_gso,
                g_mip,
                g_mport,
                g_cursor,
                g_addr,
            )
            if n == 0:
                break
            # with GRO in zero-copy mode (g_addr not empty) the datagrams stay where
            # the kernel landed them; otherwise they are the rows of buf
            m = _switch_batch(
                now, n, counts, io, state, g_addr if gro else g_addr[:0], unowned(faulty)
            )
            sent = fastio.send_batch_gso(
                fd,
                tx_hdr,
                tx_ptr,
                tx_iov,
                tx_names,
                tx_cmsg,
                tx_cmsg_ptr,
                m,
                row_ptr,
                row_len,
                send_ip,
                send_port,
                seg_max,
            )
            stats[S_BATCHES] += 1
            stats[S_PACKETS] += n
            stats[S_SENT] += sent
            stats[S_SEND_DROPS] += m - sent
            total += n
            if not more:
                break
        now = _slice_next(fd, more, t_end, idle_ms, ts, pollfd, stats)
        if now < 0.0:
            return total


@kernel
def _echo_drain(
    fd,
    max_batches,
    rx_hdr,
    rx_ptr,
    rx_names,
    gro,
    g_hdr,
    g_hdr_ptr,
    g_names,
    g_cmsg,
    g_cmsg_ptr,
    g_land,
    g_mlens,
    g_gso,
    g_mip,
    g_mport,
    g_cursor,
    g_addr,
    tx_hdr,
    tx_ptr,
    tx_iov,
    tx_names,
    tx_cmsg,
    tx_cmsg_ptr,
    seg_max,
    cap,
    buf,
    lens,
    ip,
    port,
    row_ptr,
    row_len,
    base,
    stride,
    stats,
    slice_s,
    idle_ms,
    ts,
    pollfd,
):
    """The same I/O path as :func:`_drain` (serve slices included) with the
    switch replaced by an echo: every datagram goes back to its sender. The
    baseline of ``bench`` that isolates the cost of aggregation from the cost
    of moving packets (with the same owner-less views)."""
    rx_hdr = unowned(rx_hdr)
    rx_ptr = unowned(rx_ptr)
    rx_names = unowned(rx_names)
    g_hdr = unowned(g_hdr)
    g_hdr_ptr = unowned(g_hdr_ptr)
    g_names = unowned(g_names)
    g_cmsg = unowned(g_cmsg)
    g_cmsg_ptr = unowned(g_cmsg_ptr)
    g_land = unowned(g_land)
    g_mlens = unowned(g_mlens)
    g_gso = unowned(g_gso)
    g_mip = unowned(g_mip)
    g_mport = unowned(g_mport)
    g_cursor = unowned(g_cursor)
    g_addr = unowned(g_addr)
    tx_hdr = unowned(tx_hdr)
    tx_ptr = unowned(tx_ptr)
    tx_iov = unowned(tx_iov)
    tx_names = unowned(tx_names)
    tx_cmsg = unowned(tx_cmsg)
    tx_cmsg_ptr = unowned(tx_cmsg_ptr)
    buf = unowned(buf)
    lens = unowned(lens)
    ip = unowned(ip)
    port = unowned(port)
    row_ptr = unowned(row_ptr)
    row_len = unowned(row_len)
    stats = unowned(stats)
    ts = unowned(ts)
    pollfd = unowned(pollfd)
    total = 0
    t_end = _slice_end(slice_s, ts)
    while True:
        more = False
        for _ in range(max_batches):
            n, more = fastio.receive(
                fd,
                cap,
                buf,
                lens,
                ip,
                port,
                rx_hdr,
                rx_ptr,
                rx_names,
                gro,
                g_hdr,
                g_hdr_ptr,
                g_names,
                g_cmsg,
                g_cmsg_ptr,
                g_land,
                g_mlens,
                g_gso,
                g_mip,
                g_mport,
                g_cursor,
                g_addr,
            )
            if n == 0:
                break
            for r in range(n):
                row_ptr[r] = base + stride * r
                row_len[r] = lens[r]
            sent = fastio.send_batch_gso(
                fd,
                tx_hdr,
                tx_ptr,
                tx_iov,
                tx_names,
                tx_cmsg,
                tx_cmsg_ptr,
                n,
                row_ptr,
                row_len,
                ip,
                port,
                seg_max,
            )
            stats[S_BATCHES] += 1
            stats[S_PACKETS] += n
            stats[S_SENT] += sent
            stats[S_SEND_DROPS] += n - sent
            total += n
            if not more:
                break
        if _slice_next(fd, more, t_end, idle_ms, ts, pollfd, stats) < 0.0:
            return total
