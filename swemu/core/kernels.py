"""Numba kernels of the switch data plane: one call handles a whole batch.

The kernels take the state records of :mod:`swemu.core.state` (the engine's
tables, :class:`~swemu.core.state.SwitchState`, and a batch,
:class:`~swemu.core.state.Packets`) and scalars, and mutate the arrays in
place; :mod:`swemu.core.engine` validates and owns the arrays. Every rule here
has a plain-Python twin in :mod:`swemu.core.reference` (the test oracle); a
change to one is a change to both.

Per-job state lives in four arrays per job entry j, which the kernels reach
by address, row j of ``SwitchState.pool_at`` (columns
:class:`~swemu.core.state.PoolArray`): no typed List to compile or count
references of, and slices of the values by address too.
"""

from __future__ import annotations

import numpy as np

from swemu.core.state import (
    BROADCAST_IP,
    Action,
    FaultCounter,
    FaultParam,
    GlobalCounter,
    JobCounter,
    PoolArray,
    UpState,
    UpTime,
    UpTiming,
    WorkerCounter,
)
from swemu.protocol.header import (
    pool_set,
    pool_slot,
    read_e0,
    read_e1,
    read_format,
    read_msg_type,
    read_pool_index,
    read_size_code,
    read_tsi,
    set_format,
    write_header,
)
from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import (
    bswap32,
    bytes_at,
    float64s_at,
    int8s_at,
    int32s_at,
    int64s_at,
    unowned,
    words_at,
)
from swemu.protocol.wire import HEADER_LEN, MSG_TYPE
from swemu.protocol.worker.kernels import backoff, rtt_sample, spurious, timeout

NO_ADDRESSES = np.zeros(0, np.int64)  # process_batch's row_addr: datagrams are rows
NT = len(UpTime)  # columns of a job's UP_TIMES array
NS = len(UpState)  # and of its UP_STATE array


@kernel
def write_words(dst, src):
    """``dst[i] = bswap(src[i])``: a payload into a slot (network to host order)
    or a slot into a result (host to network). A function of its own, on plain
    1-D arrays, so that LLVM vectorizes it (inside the big kernel it did not)."""
    for i in range(dst.shape[0]):
        dst[i] = bswap32(src[i])


@kernel
def add_words(acc, src):
    """``acc[i] += bswap(src[i])`` modulo 2^32 (§2: the registers wrap)."""
    for i in range(acc.shape[0]):
        acc[i] = np.uint32((np.uint64(acc[i]) + bswap32(src[i])) & np.uint64(0xFFFFFFFF))


@kernel(inline=True)
def lookup(addr_keys, addr_vals, key):
    """Binary search of ``key`` in the sorted address table; -1 if absent.

    Written out, not ``np.searchsorted`` (a call that takes the arrays and
    counts references to them); the per-packet caller passes the tables
    without owners (:func:`swemu.protocol.rawmem.unowned`)."""
    lo = 0
    hi = addr_keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if addr_keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < addr_keys.shape[0] and addr_keys[lo] == key:
        return addr_vals[lo]
    return -1


@kernel
def egress_faults(faults, j, nw):
    """Whether any fault acts on what job ``j`` sends to one of its ``nw`` workers
    (those need one datagram per worker, so no broadcast)."""
    for d in range(nw):
        for p in range(FaultParam.LOSS_OUT, FaultParam.LINK_BPS + 1):
            if faults[j, d, p] != 0.0:
                return True
    return False


@kernel(inline=True)
def find_worker(addr_keys, addr_vals, ip, port):
    """The job entry and rank of the worker at ``(ip, port)``, or at ``(ip, 0)``
    (a worker registered by IP only), in the address table
    (``SwitchState.addr_keys``/``addr_vals``): ``j * 32 + d``, or -1 if unknown."""
    ip = np.uint64(ip)
    ent = lookup(addr_keys, addr_vals, (ip << np.uint64(16)) | np.uint64(port))
    if ent < 0:
        ent = lookup(addr_keys, addr_vals, ip << np.uint64(16))
    return ent


@kernel(linked=False)
def process_batch(pk, n, now, sw, row_addr, up):
    """Apply docs/protocol.md §2 to rows ``0..n-1`` of the batch ``pk``
    (:class:`~swemu.core.state.Packets`) on the switch ``sw``
    (:class:`~swemu.core.state.SwitchState`); return the destination count.

    Datagram r is row r of ``pk.rows.buf``, or, with a non-empty ``row_addr``,
    the ``lens[r]`` bytes at address ``row_addr[r]`` (where the kernel landed a
    coalesced message: ``fastio.GroRx``, zero copy); the rows are not read then.

    ``faults[j, w, LOSS_IN]`` > 0 drops packets of worker w of job j before
    the switch sees them (seeded: :func:`seed`); the other faults act on what
    the switch sends and are applied by the I/O layer using ``dest_worker``.

    With ``sw.shard_count`` S > 1 this engine is one of S data-plane
    processes and holds only the slots s with ``s % S == sw.shard_index``, at
    local index ``s // S`` (so its pools are ~P/S slots); a packet for another
    shard's slot is a counted drop (``DROP_WRONG_SHARD``), never aggregated."""
    rows = pk.rows
    action, out_len, out_job = pk.action, pk.out_len, pk.out_job
    dest_row, dest_ip, dest_port, dest_worker = (
        pk.dest_row,
        pk.dest_ip,
        pk.dest_port,
        pk.dest_worker,
    )
    job_counters, worker_counters, faults = sw.job_counters, sw.worker_counters, sw.faults
    job_workers = sw.job_workers
    n_dest = 0
    n_up = 0
    sh_n = sw.shard_count
    sh_i = sw.shard_index
    # the arrays of the job of the previous packet, made once per change of job
    cur_j = -1
    upj = False  # the job has a parent (a child switch's, with up not None)
    up_t = float64s_at(sw.pool_at.ctypes.data, 0)
    up_s = int64s_at(sw.pool_at.ctypes.data, 0)
    # payload views by address (swemu.protocol.rawmem): no reference counting per packet
    buf_addr = rows.buf.ctypes.data
    buf_stride = rows.buf.strides[0]
    by_addr = row_addr.shape[0] > 0
    out_addr = pk.out_buf.ctypes.data
    out_stride = pk.out_buf.strides[0]
    # the address table without owners: looked up twice per packet
    keys = unowned(sw.addr_keys)
    ents = unowned(sw.addr_vals)
    for r in range(n):
        out_len[r] = 0
        out_job[r] = -1
        length = rows.lens[r]
        at = row_addr[r] if by_addr else buf_addr + r * buf_stride
        row = bytes_at(at, HEADER_LEN)  # read only once length >= HEADER_LEN
        sw.global_counters[GlobalCounter.PKTS_IN] += 1
        # 1. who sent it: (ip, port) first, then (ip, 0) for IP-only workers
        ent = find_worker(keys, ents, rows.ip[r], rows.port[r])
        if ent < 0:
            sw.global_counters[GlobalCounter.DROP_UNKNOWN_SOURCE] += 1
            action[r] = Action.DROP_UNKNOWN_SOURCE
            continue
        j = ent >> 5
        w = ent & 31
        p_in = faults[j, w, FaultParam.LOSS_IN]
        if p_in > 0.0 and np.random.random() < p_in:
            sw.fault_counters[j, FaultCounter.LOSS_IN] += 1
            action[r] = Action.INJECTED_LOSS
            continue
        out_job[r] = j
        job_counters[j, JobCounter.PKTS_IN] += 1
        job_counters[j, JobCounter.BYTES_IN] += length
        worker_counters[j, w, WorkerCounter.PKTS_IN] += 1
        sw.job_last_seen[j] = now
        # 2. is it well formed
        if length < HEADER_LEN:
            job_counters[j, JobCounter.DROP_MALFORMED] += 1
            worker_counters[j, w, WorkerCounter.DROPS] += 1
            action[r] = Action.DROP_MALFORMED
            continue
        code = read_size_code(row)
        nvals = 32 << code
        if read_msg_type(row) != MSG_TYPE or length != HEADER_LEN + 4 * nvals:
            job_counters[j, JobCounter.DROP_MALFORMED] += 1
            worker_counters[j, w, WorkerCounter.DROPS] += 1
            action[r] = Action.DROP_MALFORMED
            continue
        if code != sw.job_code[j]:
            job_counters[j, JobCounter.DROP_WRONG_SIZE] += 1
            worker_counters[j, w, WorkerCounter.DROPS] += 1
            action[r] = Action.DROP_WRONG_SIZE
            continue
        # 3. which slot
        pi = read_pool_index(row)
        s = pool_set(pi)
        slot = pool_slot(pi)
        pool = sw.job_pool[j]
        if slot >= pool:
            job_counters[j, JobCounter.DROP_SLOT_RANGE] += 1
            worker_counters[j, w, WorkerCounter.DROPS] += 1
            action[r] = Action.DROP_SLOT_RANGE
            continue
        local = slot
        if sh_n > 1:
            if slot % sh_n != sh_i:
                job_counters[j, JobCounter.DROP_WRONG_SHARD] += 1
                worker_counters[j, w, WorkerCounter.DROPS] += 1
                action[r] = Action.DROP_WRONG_SHARD
                continue
            local = slot // sh_n
            pool = (pool - sh_i + sh_n - 1) // sh_n  # the slots this shard holds
        # 4. bitmap update and retransmission check
        if j != cur_j:
            cur_j = j
            pool_at = sw.pool_at
            vals_addr = pool_at[j, PoolArray.VALUES]
            ex = int8s_at(pool_at[j, PoolArray.EXPS], 4 * pool)
            bm = words_at(pool_at[j, PoolArray.BITMAP], 2 * pool)
            cnt = int32s_at(pool_at[j, PoolArray.COUNT], 2 * pool)
            if up is not None:
                upj = up.job_up_port[j] > 0  # partial aggregates go up
                held = pool if upj else 0
                up_t = float64s_at(pool_at[j, PoolArray.UP_TIMES], NT * held)
                up_s = int64s_at(pool_at[j, PoolArray.UP_STATE], NS * held)
        me = np.uint32(1) << np.uint32(w)
        k = s * pool + local
        k_other = (1 - s) * pool + local
        before = bm[k]
        bm[k] = before | me
        bm[k_other] = bm[k_other] & ~me
        retrans = (before & me) != 0
        # 5. worker count
        last = False
        if not retrans:
            c = cnt[k]
            if c == 0:
                cnt[k] = job_workers[j] - 1
                last = job_workers[j] == 1
            else:
                last = c == 1
                cnt[k] = c - 1
        # 6. aggregation: write after release, add otherwise, nothing on retransmission
        acc = words_at(vals_addr + 4 * k * nvals, nvals)
        e0 = read_e0(row)
        e1 = read_e1(row)
        if not retrans:
            words = words_at(at + HEADER_LEN, nvals)
            if before == 0:
                write_words(acc, words)
                ex[2 * k] = e0
                ex[2 * k + 1] = e1
            else:
                add_words(acc, words)
                if e0 > ex[2 * k]:
                    ex[2 * k] = e0
                if e1 > ex[2 * k + 1]:
                    ex[2 * k + 1] = e1
            job_counters[j, JobCounter.AGGREGATED] += 1
        else:
            job_counters[j, JobCounter.RETRANSMISSIONS] += 1
            worker_counters[j, w, WorkerCounter.RETRANSMISSIONS] += 1
        # 7. next step
        if not retrans and not last:
            action[r] = Action.AGGREGATED
            continue
        if retrans and cnt[k] != 0:
            action[r] = Action.RETRANSMIT_PENDING
            continue
        if up is not None and retrans and upj and up_s[NS * local + UpState.SET] == s:
            # the partial aggregate is up at the parent: the result will come
            # (the uplink's timer resends toward the parent)
            action[r] = Action.RETRANSMIT_PENDING
            continue
        # build the result: header of the triggering packet, slot maxima and sums
        # (a child switch's partial aggregate going up has the same form)
        plen = HEADER_LEN + 4 * nvals
        out_at = out_addr + r * out_stride
        out_row = bytes_at(out_at, HEADER_LEN)
        write_header(out_row, code, row[1], read_tsi(row), s, slot, ex[2 * k], ex[2 * k + 1])
        if sw.job_formats[j] != 0:
            # a job registered for the 16-bit format (§4.2): the result says the
            # format of the packet that triggered it; otherwise the bit stays 0
            set_format(out_row, read_format(row))
        write_words(words_at(out_at + HEADER_LEN, nvals), acc)
        out_len[r] = plen
        if retrans:
            action[r] = Action.UNICAST
            job_counters[j, JobCounter.UNICAST] += 1
            dest_row[n_dest] = r
            dest_ip[n_dest] = rows.ip[r]
            dest_port[n_dest] = rows.port[r]
            dest_worker[n_dest] = w
            n_dest += 1
            job_counters[j, JobCounter.PKTS_OUT] += 1
            job_counters[j, JobCounter.BYTES_OUT] += plen
            continue
        worker_counters[j, w, WorkerCounter.LAST] += 1
        if up is not None and upj:
            action[r] = Action.UPWARD
            if _up_start(now, up, j, up_t, up_s, local, s, read_tsi(row), row[1], rows.port[r]):
                pk.up_row[n_up] = r
                n_up += 1
                job_counters[j, JobCounter.UP_SENT] += 1
            continue
        action[r] = Action.MULTICAST
        job_counters[j, JobCounter.MULTICAST] += 1
        nw = job_workers[j]
        if sw.job_bcast[j] > 0 and not egress_faults(faults, j, nw):
            # every worker takes results at 127.255.255.255:port: one datagram
            # (counted as the copies it stands for)
            dest_row[n_dest] = r
            dest_ip[n_dest] = BROADCAST_IP
            dest_port[n_dest] = sw.job_bcast[j]
            dest_worker[n_dest] = 0
            n_dest += 1
            job_counters[j, JobCounter.PKTS_OUT] += nw
            job_counters[j, JobCounter.BYTES_OUT] += plen * nw
            job_counters[j, JobCounter.BROADCAST] += 1
            continue
        for d in range(nw):
            p = sw.dst_port[j, d]
            if p < 0:
                continue  # rank not registered (any more): nobody to send to
            dest_row[n_dest] = r
            dest_ip[n_dest] = sw.dst_ip[j, d]
            dest_port[n_dest] = p if p > 0 else rows.port[r]
            dest_worker[n_dest] = d
            n_dest += 1
            job_counters[j, JobCounter.PKTS_OUT] += 1
            job_counters[j, JobCounter.BYTES_OUT] += plen
    pk.n_up[0] = n_up
    return n_dest


@kernel(inline=True)
def _up_start(now, up, j, up_t, up_s, local, s, tsi, job_number, src_port):
    """Slot ``local`` of job ``j`` completed set ``s`` here: its partial
    aggregate goes up. Record what it is and start its timer (the worker's:
    the learned timeout, :func:`swemu.protocol.worker.kernels.timeout`); return
    True to send it now, False while the uplink's reorder guard holds it (its
    timer sends it, :func:`uplink_due`)."""
    st = NS * local
    tm = NT * local
    up_s[st + UpState.SET] = s
    up_s[st + UpState.TSI] = tsi
    up_s[st + UpState.JOB_NUMBER] = job_number
    up_s[st + UpState.TRIES] = 0
    up_s[st + UpState.SRC_PORT] = src_port
    timing = up.up_timing
    rto0 = timeout(up.up_rtt[j], timing[UpTiming.RTO_MIN], timing[UpTiming.RTO_MAX])
    up_t[tm + UpTime.RTO] = rto0
    if now < up_t[tm + UpTime.QUIET]:
        up_s[st + UpState.HELD] = 1
        up_t[tm + UpTime.DEADLINE] = up_t[tm + UpTime.QUIET]
        return False
    up_s[st + UpState.HELD] = 0
    up_t[tm + UpTime.DEADLINE] = now + rto0
    up_t[tm + UpTime.QUIET] = now + timing[UpTiming.GUARD]
    return True


@kernel
def uplink_batch(pk, n, now, sw, up, j):
    """A child switch's uplink (docs/protocol.md §7): rows ``0..n-1`` of the
    batch ``pk`` are datagrams that came to job ``j``'s uplink socket. The
    parent's (from ``up.job_up_ip[j]:up.job_up_port[j]``) result of a slot's partial
    aggregate -- the same set, ``tsi`` and ``job_number``, a well-formed packet
    of the job's size -- is taken: its sums and exponents replace the partial ones in the slot (the
    shadow copy that answers later retransmissions here), and the datagram
    itself, unchanged, goes down to every local member as the slot's result
    (row r of ``out_buf``, destinations as a multicast's). Anything else is
    ignored and counted (``UP_IGNORED``); a duplicate result of the slot's
    previous packet proves its last timeout spurious and raises the uplink's
    timeout floor, as the worker's protocol does. Returns the destinations."""
    rows = pk.rows
    job_counters = sw.job_counters
    pool_at = sw.pool_at
    code = sw.job_code[j]
    nvals = 32 << code
    plen = HEADER_LEN + 4 * nvals
    pool = sw.job_pool[j]
    if sw.shard_count > 1:
        pool = (pool - sw.shard_index + sw.shard_count - 1) // sw.shard_count
    ex = int8s_at(pool_at[j, PoolArray.EXPS], 4 * pool)
    vals_addr = pool_at[j, PoolArray.VALUES]
    up_t = float64s_at(pool_at[j, PoolArray.UP_TIMES], NT * pool)
    up_s = int64s_at(pool_at[j, PoolArray.UP_STATE], NS * pool)
    rtt = up.up_rtt[j]
    timing = up.up_timing
    buf_addr = rows.buf.ctypes.data
    buf_stride = rows.buf.strides[0]
    out_addr = pk.out_buf.ctypes.data
    out_stride = pk.out_buf.strides[0]
    n_dest = 0
    pk.n_up[0] = 0
    for r in range(n):
        pk.out_len[r] = 0
        pk.out_job[r] = -1
        at = buf_addr + r * buf_stride
        row = bytes_at(at, HEADER_LEN)
        if (
            rows.ip[r] != up.job_up_ip[j]
            or rows.port[r] != up.job_up_port[j]
            or rows.lens[r] != plen
            or row[0] != (MSG_TYPE << 4 | code)
            or pool == 0
        ):
            job_counters[j, JobCounter.UP_IGNORED] += 1
            continue
        pi = read_pool_index(row)
        s = pool_set(pi)
        slot = pool_slot(pi)
        if slot >= pool:
            job_counters[j, JobCounter.UP_IGNORED] += 1
            continue
        st = NS * slot
        tm = NT * slot
        tsi = read_tsi(row)
        if (
            up_s[st + UpState.SET] != s
            or up_s[st + UpState.HELD] != 0
            or up_s[st + UpState.TSI] != tsi
            or up_s[st + UpState.JOB_NUMBER] != row[1]
        ):
            if up_s[st + UpState.SET] != s and up_s[st + UpState.TSI] == tsi:
                # the result of this slot's packet once more: a spurious timeout
                rto0 = timeout(rtt, timing[UpTiming.RTO_MIN], timing[UpTiming.RTO_MAX])
                spurious(rtt, now, rto0, timing[UpTiming.RTO_MAX])
            job_counters[j, JobCounter.UP_IGNORED] += 1
            continue
        sw.job_last_seen[j] = now
        if up_s[st + UpState.TRIES] == 0:  # Karn: no sample from a resent packet
            sent = up_t[tm + UpTime.DEADLINE] - up_t[tm + UpTime.RTO]
            rtt_sample(rtt, now - sent, timing[UpTiming.RTO_MIN], timing[UpTiming.RTO_MAX])
        up_s[st + UpState.SET] = -1
        k = s * pool + slot
        write_words(words_at(vals_addr + 4 * k * nvals, nvals), words_at(at + HEADER_LEN, nvals))
        ex[2 * k] = read_e0(row)
        ex[2 * k + 1] = read_e1(row)
        job_counters[j, JobCounter.UP_RESULTS] += 1
        job_counters[j, JobCounter.MULTICAST] += 1
        # the parent's datagram is the result, byte for byte: it goes down as it came
        out = bytes_at(out_addr + r * out_stride, plen)
        src = bytes_at(at, plen)
        for b in range(plen):
            out[b] = src[b]
        pk.out_len[r] = plen
        pk.out_job[r] = j
        pk.action[r] = Action.MULTICAST
        n_dest = _down(pk, sw, j, r, plen, up_s[st + UpState.SRC_PORT], n_dest)
    return n_dest


@kernel(inline=True)
def _down(pk, sw, j, r, plen, src_port, n_dest):
    """Destinations of row r's result for every local member of job ``j``
    (once, to 127.255.255.255, under loopback broadcast); a member known by IP
    alone gets it on ``src_port``. Returns the new destination count."""
    job_counters = sw.job_counters
    nw = sw.job_workers[j]
    if sw.job_bcast[j] > 0 and not egress_faults(sw.faults, j, nw):
        pk.dest_row[n_dest] = r
        pk.dest_ip[n_dest] = BROADCAST_IP
        pk.dest_port[n_dest] = sw.job_bcast[j]
        pk.dest_worker[n_dest] = 0
        job_counters[j, JobCounter.PKTS_OUT] += nw
        job_counters[j, JobCounter.BYTES_OUT] += plen * nw
        job_counters[j, JobCounter.BROADCAST] += 1
        return n_dest + 1
    for d in range(nw):
        p = sw.dst_port[j, d]
        if p < 0:
            continue
        pk.dest_row[n_dest] = r
        pk.dest_ip[n_dest] = sw.dst_ip[j, d]
        pk.dest_port[n_dest] = p if p > 0 else src_port
        pk.dest_worker[n_dest] = d
        n_dest += 1
        job_counters[j, JobCounter.PKTS_OUT] += 1
        job_counters[j, JobCounter.BYTES_OUT] += plen
    return n_dest


@kernel
def uplink_due(now, sw, up, j, out_buf, out_len, first):
    """A child switch's uplink timer for job ``j`` (the worker's rules,
    ``swemu.protocol.worker.kernels``): from slot ``first`` on, build into the
    rows of ``out_buf`` (``out_len`` bytes each) the upward packets whose time
    has come -- a held first transmission whose reorder guard is over, or a
    partial aggregate the parent has not answered within its timeout, resent as
    it was (backing off after every ``BACKOFF_AFTER`` timeouts in a row).
    Returns ``(count, next slot to look at)``: the rows are full when count is
    ``out_buf.shape[0]``, and the next call goes on from that slot."""
    pool_at = sw.pool_at
    code = sw.job_code[j]
    nvals = 32 << code
    plen = HEADER_LEN + 4 * nvals
    pool = sw.job_pool[j]
    if sw.shard_count > 1:
        pool = (pool - sw.shard_index + sw.shard_count - 1) // sw.shard_count
    ex = int8s_at(pool_at[j, PoolArray.EXPS], 4 * pool)
    vals_addr = pool_at[j, PoolArray.VALUES]
    up_t = float64s_at(pool_at[j, PoolArray.UP_TIMES], NT * pool)
    up_s = int64s_at(pool_at[j, PoolArray.UP_STATE], NS * pool)
    timing = up.up_timing
    guard = timing[UpTiming.GUARD]
    count = 0
    cap = out_buf.shape[0]
    out_addr = out_buf.ctypes.data
    out_stride = out_buf.strides[0]
    slot = first
    while slot < pool and count < cap:
        st = NS * slot
        tm = NT * slot
        s = up_s[st + UpState.SET]
        if s < 0 or up_t[tm + UpTime.DEADLINE] > now:
            slot += 1
            continue
        if up_s[st + UpState.HELD] != 0:  # the guard is over: its first transmission
            up_s[st + UpState.HELD] = 0
            sw.job_counters[j, JobCounter.UP_SENT] += 1
        else:
            tries = up_s[st + UpState.TRIES] + 1
            up_s[st + UpState.TRIES] = tries
            up_t[tm + UpTime.RTO] = backoff(
                tries,
                up_t[tm + UpTime.RTO],
                np.int64(timing[UpTiming.BACKOFF_AFTER]),
                timing[UpTiming.RTO_MAX],
            )
            sw.job_counters[j, JobCounter.UP_RETRANSMISSIONS] += 1
        up_t[tm + UpTime.DEADLINE] = now + up_t[tm + UpTime.RTO]
        up_t[tm + UpTime.QUIET] = now + guard
        k = s * pool + slot
        out_at = out_addr + count * out_stride
        write_header(
            bytes_at(out_at, HEADER_LEN),
            code,
            up_s[st + UpState.JOB_NUMBER],
            up_s[st + UpState.TSI],
            s,
            slot,
            ex[2 * k],
            ex[2 * k + 1],
        )
        write_words(
            words_at(out_at + HEADER_LEN, nvals), words_at(vals_addr + 4 * k * nvals, nvals)
        )
        out_len[count] = plen
        count += 1
        slot += 1
    return count, slot


@kernel
def uplink_deadline(sw, up, j):
    """The earliest time :func:`uplink_due` has work for job ``j`` (inf: none)."""
    pool = sw.job_pool[j]
    if sw.shard_count > 1:
        pool = (pool - sw.shard_index + sw.shard_count - 1) // sw.shard_count
    up_t = float64s_at(sw.pool_at[j, PoolArray.UP_TIMES], NT * pool)
    up_s = int64s_at(sw.pool_at[j, PoolArray.UP_STATE], NS * pool)
    t = np.inf
    for slot in range(pool):
        if up_s[NS * slot + UpState.SET] >= 0 and up_t[NT * slot + UpTime.DEADLINE] < t:
            t = up_t[NT * slot + UpTime.DEADLINE]
    return t


@kernel
def seed(value):
    """Seed the kernels' random generator (fault injection is reproducible)."""
    np.random.seed(value)
