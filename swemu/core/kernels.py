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
from swemu.protocol.rawmem import bswap32, bytes_at, int8s_at, int32s_at, unowned, words_at
from swemu.protocol.wire import HEADER_LEN, MSG_TYPE

NO_ADDRESSES = np.zeros(0, np.int64)  # process_batch's row_addr: datagrams are rows


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


@kernel
def process_batch(pk, n, now, sw, row_addr):
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
    sh_n = sw.shard_count
    sh_i = sw.shard_index
    # the arrays of the job of the previous packet, made once per change of job
    cur_j = -1
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
        # build the result: header of the triggering packet, slot maxima and sums
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
        action[r] = Action.MULTICAST
        job_counters[j, JobCounter.MULTICAST] += 1
        worker_counters[j, w, WorkerCounter.LAST] += 1
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
    return n_dest


@kernel
def seed(value):
    """Seed the kernels' random generator (fault injection is reproducible)."""
    np.random.seed(value)
