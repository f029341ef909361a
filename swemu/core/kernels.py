"""Numba kernels of the switch data plane: one call handles a whole batch.

Private ``_kernel`` functions take arrays and scalars only and mutate them in
place; :mod:`swemu.core.engine` validates and owns the arrays. Every rule here has
a plain-Python twin in :mod:`swemu.core.reference` (the test oracle); a change to one
is a change to both.

Batch interface (shaped for a later recvmmsg/sendmmsg loop in compiled code):
``buf[B, L]`` uint8 rows, ``lens[B]``, source ``ip[B]`` (uint32) and
``port[B]``; results go into preallocated ``out_buf[B, L]`` rows (at most one
result per received packet) plus a destination list ``(dest_row, dest_ip,
dest_port)`` that a multicast fills with one entry per worker.

Per-job state lives in four arrays per job entry j (the engine's job table),
which the kernels reach by address, row j of ``pool_at`` (columns ``POOL_*``):
values uint32 ``[2 * P * N]`` (index ``(set * P + slot) * N + i``; uint32 so that
addition wraps as on Tofino registers), exponents int8 ``[2 * P * 2]``, bitmap
uint32 ``[2 * P]`` and count int32 ``[2 * P]``. The engine owns the arrays and
replaces a row only between kernel calls.
"""

from __future__ import annotations

import numpy as np

from swemu.protocol.header import (
    pool_set,
    pool_slot,
    read_e0,
    read_e1,
    read_msg_type,
    read_pool_index,
    read_size_code,
    read_tsi,
    write_header,
)
from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import bswap32, bytes_at, int8s_at, int32s_at, unowned, words_at
from swemu.protocol.wire import HEADER_LEN, MSG_TYPE

# --- per-packet actions: what the switch did with row r, and why -------------
# (the §2 decision table; swemu.core.engine.Action mirrors these values)
A_DROP_UNKNOWN_SOURCE = 0
A_DROP_MALFORMED = 1
A_DROP_WRONG_SIZE = 2
A_DROP_SLOT_RANGE = 3
A_AGGREGATED = 4  # new contribution, slot not complete: nothing sent
A_MULTICAST = 5  # new contribution completed the slot: result to every worker
A_RETRANSMIT_PENDING = 6  # retransmission, slot incomplete: nothing sent
A_UNICAST = 7  # retransmission, slot complete: result to that worker only
A_INJECTED_LOSS = 8  # dropped by fault injection on the way in (never reached the switch)
A_DROP_WRONG_SHARD = 9  # sharded emulator: the slot belongs to another data-plane process

# --- per-job counters (columns of job_counters) ------------------------------
C_PKTS_IN = 0
C_BYTES_IN = 1
C_AGGREGATED = 2
C_MULTICAST = 3
C_UNICAST = 4
C_RETRANSMISSIONS = 5
C_PKTS_OUT = 6
C_BYTES_OUT = 7
C_DROP_MALFORMED = 8
C_DROP_WRONG_SIZE = 9
C_DROP_SLOT_RANGE = 10
C_DROP_WRONG_SHARD = 11
C_BROADCAST = 12  # multicasts sent once to 127.255.255.255 (loopback broadcast)
N_JOB_COUNTERS = 13

# --- per-worker counters (last axis of worker_counters) ----------------------
W_PKTS_IN = 0
W_RETRANSMISSIONS = 1
W_LAST = 2  # completions this worker triggered: the slowest worker has the most
W_DROPS = 3
N_WORKER_COUNTERS = 4

# --- per-job injected faults (columns of fault_counters) ---------------------
# counted apart from real drops: they are what the user asked the emulator to do
F_LOSS_IN = 0
F_LOSS_OUT = 1
F_DUPLICATED = 2
F_DELAYED = 3
F_QUEUE_DROPS = 4  # delay/link queue full
N_FAULT_COUNTERS = 5

# --- per (job, worker) fault settings (last axis of faults) ------------------
P_LOSS_IN = 0
P_LOSS_OUT = 1
P_DUPLICATE = 2
P_DELAY = 3  # seconds, fixed extra delay of what the switch sends
P_REORDER = 4  # seconds, max random extra delay of what the switch sends
P_LINK_BPS = 5  # bits/s of the switch -> worker link (0 = unlimited)
N_FAULT_PARAMS = 6

# --- switch-wide counters ----------------------------------------------------
G_PKTS_IN = 0
G_DROP_UNKNOWN_SOURCE = 1
N_GLOBAL_COUNTERS = 2

# --- the engine's place among the data-plane shards (swemu.serving.shards) -----------
SH_COUNT = 0  # data-plane processes S (1: not sharded)
SH_INDEX = 1  # this one's index i: it owns the slots s with s % S == i

NO_ADDRESSES = np.zeros(0, np.int64)  # process_batch's row_addr: datagrams are rows


@kernel
def _write_words(dst, src):
    """``dst[i] = bswap(src[i])``: a payload into a slot (network to host order)
    or a slot into a result (host to network). A function of its own, on plain
    1-D arrays, so that LLVM vectorizes it (inside the big kernel it did not)."""
    for i in range(dst.shape[0]):
        dst[i] = bswap32(src[i])


@kernel
def _add_words(acc, src):
    """``acc[i] += bswap(src[i])`` modulo 2^32 (§2: the registers wrap)."""
    for i in range(acc.shape[0]):
        acc[i] = np.uint32((np.uint64(acc[i]) + bswap32(src[i])) & np.uint64(0xFFFFFFFF))


@kernel(inline=True)
def _lookup(addr_keys, addr_vals, key):
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


BROADCAST_IP = 0x7FFFFFFF  # 127.255.255.255, lo's broadcast address (SwitchEngine.job_bcast)


@kernel
def _egress_faults(faults, j, nw):
    """Whether any fault acts on what job ``j`` sends to one of its ``nw`` workers
    (those need one datagram per worker, so no broadcast)."""
    for d in range(nw):
        for p in range(P_LOSS_OUT, P_LINK_BPS + 1):
            if faults[j, d, p] != 0.0:
                return True
    return False


@kernel
def process_batch(
    buf,
    lens,
    src_ip,
    src_port,
    n,
    now,
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
    action,
    out_buf,
    out_len,
    out_job,
    dest_row,
    dest_ip,
    dest_port,
    dest_worker,
    row_addr,
):
    """Apply docs/protocol.md §2 to rows ``0..n-1`` of a batch; return the destination count.

    Datagram r is row r of ``buf``, or, with a non-empty ``row_addr``, the
    ``lens[r]`` bytes at address ``row_addr[r]`` (where the kernel landed a
    coalesced message: ``fastio.GroRx``, zero copy); ``buf`` is not read then.

    ``faults[j, w, P_LOSS_IN]`` > 0 drops packets of worker w of job j before
    the switch sees them (seeded: :func:`seed`); the other faults act on what
    the switch sends and are applied by the I/O layer using ``dest_worker``.

    ``shard`` is ``[S, i]``: with S > 1 this engine is one of S data-plane
    processes and holds only the slots s with ``s % S == i``, at local index
    ``s // S`` (so its pools are ~P/S slots); a packet for another shard's slot
    is a counted drop (``C_DROP_WRONG_SHARD``), never aggregated."""
    n_dest = 0
    sh_n = shard[SH_COUNT]
    sh_i = shard[SH_INDEX]
    # the arrays of the job of the previous packet, made once per change of job
    cur_j = -1
    # payload views by address (swemu.protocol.rawmem): no reference counting per packet
    buf_addr = buf.ctypes.data
    buf_stride = buf.strides[0]
    by_addr = row_addr.shape[0] > 0
    out_addr = out_buf.ctypes.data
    out_stride = out_buf.strides[0]
    # the address table without owners: looked up twice per packet
    keys = unowned(addr_keys)
    ents = unowned(addr_vals)
    for r in range(n):
        out_len[r] = 0
        out_job[r] = -1
        length = lens[r]
        at = row_addr[r] if by_addr else buf_addr + r * buf_stride
        row = bytes_at(at, HEADER_LEN)  # read only once length >= HEADER_LEN
        global_counters[G_PKTS_IN] += 1
        # 1. who sent it: (ip, port) first, then (ip, 0) for IP-only workers
        ip = np.uint64(src_ip[r])
        ent = _lookup(keys, ents, (ip << np.uint64(16)) | np.uint64(src_port[r]))
        if ent < 0:
            ent = _lookup(keys, ents, ip << np.uint64(16))
        if ent < 0:
            global_counters[G_DROP_UNKNOWN_SOURCE] += 1
            action[r] = A_DROP_UNKNOWN_SOURCE
            continue
        j = ent >> 5
        w = ent & 31
        p_in = faults[j, w, P_LOSS_IN]
        if p_in > 0.0 and np.random.random() < p_in:
            fault_counters[j, F_LOSS_IN] += 1
            action[r] = A_INJECTED_LOSS
            continue
        out_job[r] = j
        job_counters[j, C_PKTS_IN] += 1
        job_counters[j, C_BYTES_IN] += length
        worker_counters[j, w, W_PKTS_IN] += 1
        job_last_seen[j] = now
        # 2. is it well formed
        if length < HEADER_LEN:
            job_counters[j, C_DROP_MALFORMED] += 1
            worker_counters[j, w, W_DROPS] += 1
            action[r] = A_DROP_MALFORMED
            continue
        code = read_size_code(row)
        nvals = 32 << code
        if read_msg_type(row) != MSG_TYPE or length != HEADER_LEN + 4 * nvals:
            job_counters[j, C_DROP_MALFORMED] += 1
            worker_counters[j, w, W_DROPS] += 1
            action[r] = A_DROP_MALFORMED
            continue
        if code != job_code[j]:
            job_counters[j, C_DROP_WRONG_SIZE] += 1
            worker_counters[j, w, W_DROPS] += 1
            action[r] = A_DROP_WRONG_SIZE
            continue
        # 3. which slot
        pi = read_pool_index(row)
        s = pool_set(pi)
        slot = pool_slot(pi)
        pool = job_pool[j]
        if slot >= pool:
            job_counters[j, C_DROP_SLOT_RANGE] += 1
            worker_counters[j, w, W_DROPS] += 1
            action[r] = A_DROP_SLOT_RANGE
            continue
        local = slot
        if sh_n > 1:
            if slot % sh_n != sh_i:
                job_counters[j, C_DROP_WRONG_SHARD] += 1
                worker_counters[j, w, W_DROPS] += 1
                action[r] = A_DROP_WRONG_SHARD
                continue
            local = slot // sh_n
            pool = (pool - sh_i + sh_n - 1) // sh_n  # the slots this shard holds
        # 4. bitmap update and retransmission check
        if j != cur_j:
            cur_j = j
            # the job's pool by address (SwitchEngine.pool_at): no typed List to
            # compile or reference-count, and slices of the values by address too
            vals_addr = pool_at[j, POOL_VALUES]
            ex = int8s_at(pool_at[j, POOL_EXPS], 4 * pool)
            bm = words_at(pool_at[j, POOL_BITMAP], 2 * pool)
            cnt = int32s_at(pool_at[j, POOL_COUNT], 2 * pool)
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
                _write_words(acc, words)
                ex[2 * k] = e0
                ex[2 * k + 1] = e1
            else:
                _add_words(acc, words)
                if e0 > ex[2 * k]:
                    ex[2 * k] = e0
                if e1 > ex[2 * k + 1]:
                    ex[2 * k + 1] = e1
            job_counters[j, C_AGGREGATED] += 1
        else:
            job_counters[j, C_RETRANSMISSIONS] += 1
            worker_counters[j, w, W_RETRANSMISSIONS] += 1
        # 7. next step
        if not retrans and not last:
            action[r] = A_AGGREGATED
            continue
        if retrans and cnt[k] != 0:
            action[r] = A_RETRANSMIT_PENDING
            continue
        # build the result: header of the triggering packet, slot maxima and sums
        plen = HEADER_LEN + 4 * nvals
        out_at = out_addr + r * out_stride
        write_header(
            bytes_at(out_at, HEADER_LEN),
            code,
            row[1],
            read_tsi(row),
            s,
            slot,
            ex[2 * k],
            ex[2 * k + 1],
        )
        _write_words(words_at(out_at + HEADER_LEN, nvals), acc)
        out_len[r] = plen
        if retrans:
            action[r] = A_UNICAST
            job_counters[j, C_UNICAST] += 1
            dest_row[n_dest] = r
            dest_ip[n_dest] = src_ip[r]
            dest_port[n_dest] = src_port[r]
            dest_worker[n_dest] = w
            n_dest += 1
            job_counters[j, C_PKTS_OUT] += 1
            job_counters[j, C_BYTES_OUT] += plen
        else:
            action[r] = A_MULTICAST
            job_counters[j, C_MULTICAST] += 1
            worker_counters[j, w, W_LAST] += 1
            if job_bcast[j] > 0 and not _egress_faults(faults, j, job_workers[j]):
                # every worker takes results at 127.255.255.255:port: one datagram
                # (counted as the copies it stands for)
                dest_row[n_dest] = r
                dest_ip[n_dest] = BROADCAST_IP
                dest_port[n_dest] = job_bcast[j]
                dest_worker[n_dest] = 0
                n_dest += 1
                job_counters[j, C_PKTS_OUT] += job_workers[j]
                job_counters[j, C_BYTES_OUT] += plen * job_workers[j]
                job_counters[j, C_BROADCAST] += 1
                continue
            for d in range(job_workers[j]):
                if dst_port[j, d] < 0:
                    continue  # rank not registered (any more): nobody to send to
                dest_row[n_dest] = r
                dest_ip[n_dest] = dst_ip[j, d]
                p = dst_port[j, d]
                dest_port[n_dest] = p if p > 0 else src_port[r]
                dest_worker[n_dest] = d
                n_dest += 1
                job_counters[j, C_PKTS_OUT] += 1
                job_counters[j, C_BYTES_OUT] += plen
    return n_dest


@kernel
def seed(value):
    """Seed the kernels' random generator (fault injection is reproducible)."""
    np.random.seed(value)


# Where a job's pool is: row j of SwitchEngine.pool_at holds the addresses of
# its four arrays, in this order (the engine keeps the arrays alive)
POOL_VALUES = 0
POOL_EXPS = 1
POOL_BITMAP = 2
POOL_COUNT = 3
N_POOL_ARRAYS = 4
