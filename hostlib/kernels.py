"""Numba kernels of the worker data path: quantization and the windowed protocol.

All per-packet work of an allreduce runs here in batches: building packets
(quantizing a chunk straight into a big-endian row), matching a batch of
received results, storing them (dequantizing), advancing each slot to its
next chunk, and finding the slots whose timers expired. :mod:`hostlib.protocol`
owns the arrays and is the only caller; :mod:`hostlib.quant` holds the numpy
twins used as test oracles for the quantization rules.

Slot state (arrays of length K, one entry per slot of the window):

``chunk[s]``   what slot s waits for: ``-1`` its exponent packet (float32),
               ``i >= 0`` the result of chunk i, ``DONE`` nothing (finished)
``cur_set[s]`` the shadow set of the outstanding packet
``next_set[s]`` the set the slot uses next; belongs to the session, because
               the parity continues across allreduce calls (docs/protocol.md §3)
``deadline[s]``, ``rto[s]``, ``tries[s]`` retransmission timer state
``rows[s]``    the outstanding packet itself: a retransmission resends it unchanged
"""

from __future__ import annotations

import math

import numpy as np

from swemu.protocol.header import (
    pool_set,
    pool_slot,
    read_e0,
    read_pool_index,
    read_tsi,
    type_size_byte,
    write_header,
)
from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import bswap32, bytes_at, words_at
from swemu.protocol.wire import EXP_NONE, EXP_TSI_BASE, HEADER_LEN

from . import stream

DONE = -2
INT32_MAX = 2147483647

# counters (columns of the ``counters`` array)
K_RESULTS = 0  # results accepted
K_IGNORED = 1  # datagrams ignored: stale, duplicate, foreign or malformed
K_RETRANSMISSIONS = 2  # packets resent on timeout
K_SENT = 3  # packets sent, first transmissions and retransmissions
K_SPURIOUS = 4  # duplicate results: a retransmission turned out to be needless
N_COUNTERS = 5

# the retransmission timer's learned state (``rtt``, one per session)
R_SRTT = 0  # smoothed round-trip time
R_VAR = 1  # round-trip time variance
R_SAMPLES = 2  # samples taken
R_FLOOR = 3  # timeout floor raised by spurious timeouts (0: the configured one)
R_RAISED = 4  # when the floor was last raised
N_RTT = 5
FLOOR_DECAY = 1.0 / 8192  # per RTT sample, the raised floor's way back down


@kernel
def _chunk_exponents(x, nvals, out):
    """``out[c]`` = frexp exponent of max|x| over chunk c, -128 for an all-zero
    chunk; returns 1 if any value is NaN/Inf, 2 if max|x| >= 2^127, else 0.

    Works on the bit patterns: with the sign bit cleared, the order of float32
    values is the order of their int32 patterns, and NaN/Inf are the patterns
    from 0x7F800000 up. So the chunk's maximum is an integer max reduction over
    the chunk's own slice, which LLVM vectorizes (a float max with NaN checks it
    does not), and the exponent comes from the maximum's bits."""
    n = x.shape[0]
    bits = x.view(np.int32)
    nchunks = out.shape[0]
    status = 0
    for c in range(nchunks):
        lo = c * nvals
        b = bits[lo : min(lo + nvals, n)]
        m = np.int32(0)
        for i in range(b.shape[0]):
            a = b[i] & np.int32(0x7FFFFFFF)
            m = a if a > m else m
        if m >= np.int32(0x7F800000):  # NaN or Inf
            return 1
        if m == 0:
            out[c] = EXP_NONE
            continue
        e = _frexp_exponent(m)
        if e > 127:
            status = 2
            e = 127
        out[c] = max(e, -128)
    return status


@kernel(inline=True)
def _frexp_exponent(m):
    """``math.frexp(v)[1]`` of the positive float32 v whose bit pattern is ``m``:
    a normal number 1.f * 2^(E-127) is 0.1f * 2^(E-126); a subnormal m * 2^-149
    has the exponent bit_length(m) - 149."""
    if m >= np.int32(0x00800000):
        return np.int64((m >> 23) & 0xFF) - 126
    e = np.int64(-149)
    while m:
        m >>= 1
        e += 1
    return e


@kernel(inline=True)
def _scale(exp, num_workers):
    """(2^31 - 1) / (W * 2^e), in float64: finite even for e = -128."""
    return INT32_MAX / (num_workers * math.ldexp(1.0, np.int64(exp)))


@kernel(inline=True)
def _payload(row, nvals):
    """The payload of a packet row as ``nvals`` big-endian words (a uint32 view;
    unaligned, which x86 and arm64 load and store at full speed; made by
    :func:`swemu.protocol.rawmem.words_at`, without reference counting)."""
    return words_at(row.ctypes.data + HEADER_LEN, nvals)


@kernel(inline=True)
def _fill_data(row, xi, xf, is_float, chunk, nvals, shared_exp, num_workers, limit):
    """Quantize chunk ``chunk`` into the payload of ``row`` (zero-padded).

    The loops run over the chunk's own slice, indexed like the payload: with
    ``xf[i]``/``p[i - lo]`` they took 16 ms per 64 MiB instead of 11."""
    n = xf.shape[0] if is_float else xi.shape[0]
    lo = chunk * nvals
    hi = min(lo + nvals, n)
    m = hi - lo
    p = _payload(row, nvals)
    if is_float:
        scale = _scale(shared_exp[chunk], num_workers)
        xs = xf[lo:hi]
        for i in range(m):
            q = np.rint(np.float64(xs[i]) * scale)
            # rounding can step past (2^31-1)/W by < 1; clamp so W terms never overflow
            q = min(max(q, -limit), limit)
            # float64 -> int32 (q is in range): AVX2 converts four at a time, it
            # has no packed float64 -> int64 conversion (that loop ran scalar)
            p[i] = bswap32(np.uint32(np.int32(q)))
    else:
        xs = xi[lo:hi]
        for i in range(m):
            p[i] = bswap32(np.uint32(np.int64(xs[i]) & 0xFFFFFFFF))
    for i in range(m, nvals):
        p[i] = 0


@kernel(inline=True)
def _streamed_part(o, src, inv, is_float, on):
    """With ``on``, store the 64-byte-aligned middle of the output chunk ``o``
    from the big-endian words at address ``src`` with streaming stores
    (:mod:`hostlib.stream`); returns ``(a, b)``, the streamed range, which the
    caller's scalar loops skip (``(len, len)`` when nothing was streamed)."""
    m = o.shape[0]
    if not on:
        return m, m
    oa = o.ctypes.data
    a = stream.aligned_head(oa, m)
    b = a + (m - a) // stream.LANES * stream.LANES
    for i in range(a, b, stream.LANES):
        if is_float:
            stream.dequantize16(oa + 4 * i, src + 4 * i, inv)
        else:
            stream.swap16(oa + 4 * i, src + 4 * i)
    return a, b


@kernel
def _timeout(rtt, rto_min, rto_max):
    """A new packet's timeout: ``srtt + 4 rttvar`` (RFC 6298) within
    ``[floor, rto_max]``; the floor is ``rto_min`` unless spurious timeouts
    raised it. Before the first sample, the floor itself."""
    floor = max(rto_min, rtt[R_FLOOR])
    if rtt[R_SAMPLES] == 0:
        return min(floor, rto_max)
    return min(max(floor, rtt[R_SRTT] + 4.0 * rtt[R_VAR]), rto_max)


@kernel
def _spurious(rtt, now, rto0, rto_max):
    """A duplicate result came in: the switch answered a retransmission of a
    packet whose result had arrived, so the timer fired although nothing was
    lost (TCP's D-SACK signal, RFC 3708). On a link whose queue holds about a
    timeout's worth of packets this repeats every window and the resends
    lengthen the queue further; so the floor becomes twice the timeout in use,
    at most once per timeout (one timer event gives a burst of duplicates), and
    decays again slowly."""
    if now - rtt[R_RAISED] >= rto0:
        rtt[R_FLOOR] = min(2.0 * rto0, rto_max)
        rtt[R_RAISED] = now


@kernel(inline=True)
def _advance(
    s,
    now,
    rows,
    xi,
    xf,
    is_float,
    nchunks,
    nvals,
    nslots,
    num_workers,
    code,
    job_number,
    chunk,
    cur_set,
    next_set,
    deadline,
    rto,
    tries,
    my_exp,
    shared_exp,
    rto0,
    limit,
):
    """Move slot s to its next chunk and build that packet; return False if done."""
    c = chunk[s]
    nxt = s if c == -1 else c + nslots
    if nxt >= nchunks:
        chunk[s] = DONE
        return False
    chunk[s] = nxt
    st = next_set[s]
    cur_set[s] = st
    next_set[s] = 1 - st
    e0 = 0
    if is_float:
        e0 = my_exp[nxt + nslots] if nxt + nslots < nchunks else EXP_NONE
    row = rows[s]
    write_header(row, code, job_number, nxt, st, s, e0, 0)
    _fill_data(row, xi, xf, is_float, nxt, nvals, shared_exp, num_workers, limit)
    deadline[s] = now + rto0
    rto[s] = rto0
    tries[s] = 0
    return True


@kernel
def _start(
    now,
    rows,
    xi,
    xf,
    oi,
    of,
    is_float,
    nchunks,
    nvals,
    nslots,
    num_workers,
    code,
    job_number,
    chunk,
    cur_set,
    next_set,
    deadline,
    rto,
    tries,
    my_exp,
    shared_exp,
    rto_min,
    rto_max,
    rtt,
    limit,
    send,
    counters,
    quiet,
    waiting,
    guard,
):
    """Build the first packet of every slot in use; return how many to send now
    (slots still quiet after their last transmission wait for the timer). Takes
    the arguments of :func:`_on_results`; the first packets' timeout is the one
    learned so far (:func:`_timeout`)."""
    rto0 = _timeout(rtt, rto_min, rto_max)
    used = min(nslots, nchunks)
    n_send = 0
    for s in range(used):
        if is_float:
            # exponent packet: values zero, e0 = exponent of chunk s
            st = next_set[s]
            cur_set[s] = st
            next_set[s] = 1 - st
            chunk[s] = -1
            row = rows[s]
            write_header(row, code, job_number, EXP_TSI_BASE + s, st, s, my_exp[s], 0)
            for i in range(HEADER_LEN, HEADER_LEN + 4 * nvals):
                row[i] = 0
            deadline[s] = now + rto0
            rto[s] = rto0
            tries[s] = 0
        else:
            chunk[s] = s - nslots  # so that _advance moves it to chunk s
            _advance(
                s,
                now,
                rows,
                xi,
                xf,
                is_float,
                nchunks,
                nvals,
                nslots,
                num_workers,
                code,
                job_number,
                chunk,
                cur_set,
                next_set,
                deadline,
                rto,
                tries,
                my_exp,
                shared_exp,
                rto0,
                limit,
            )
        n_send = _send_or_wait(s, now, send, n_send, deadline, quiet, waiting, guard)
    for s in range(used, nslots):
        chunk[s] = DONE
        waiting[s] = 0
    return n_send


@kernel
def _send_or_wait(s, now, send, n_send, deadline, quiet, waiting, guard):
    """Queue slot s's new packet, or hold it until the slot's quiet time ends.

    ``quiet[s]`` is the last transmission on slot s plus the reorder guard: a
    new packet must not overtake stale copies of the previous one (the switch
    would take a late copy of an old round for a new contribution)."""
    if now < quiet[s]:
        waiting[s] = 1
        deadline[s] = quiet[s]
        return n_send
    waiting[s] = 0
    quiet[s] = now + guard
    send[n_send] = s
    return n_send + 1


@kernel
def _previous(s, c, nslots, is_float):
    """The TSI of slot s's packet before the one for chunk ``c`` (-1: none in
    this call): chunk ``c - nslots``, or the slot's exponent packet."""
    if c >= nslots:
        return c - nslots
    if is_float:
        return EXP_TSI_BASE + s
    return -1


@kernel
def _on_results(
    addrs,
    lens,
    ok,
    n,
    now,
    rows,
    xi,
    xf,
    oi,
    of,
    is_float,
    nchunks,
    nvals,
    nslots,
    num_workers,
    code,
    job_number,
    chunk,
    cur_set,
    next_set,
    deadline,
    rto,
    tries,
    my_exp,
    shared_exp,
    rto_min,
    rto_max,
    rtt,
    limit,
    send,
    counters,
    quiet,
    waiting,
    guard,
):
    """Match a batch of received datagrams; store results, advance slots.

    Datagram r is ``lens[r]`` bytes at address ``addrs[r]`` (a row of the
    caller's batch, or where the kernel landed it: ``fastio.GroRx``, zero copy).
    ``ok[r]`` is 0 for datagrams that did not come from the switch. Returns the
    number of slots in ``send`` whose (new) packet must be sent. ``rtt`` holds
    the timer's learned state (``R_*``); a new packet's timeout is
    ``srtt + 4 rttvar`` within ``[floor, rto_max]`` (:func:`_timeout`), so a
    loaded machine or a long link queue does not turn slow results into a
    retransmission storm; duplicate results raise the floor (:func:`_spurious`)."""
    n_send = 0
    plen = HEADER_LEN + 4 * nvals
    rto0 = _timeout(rtt, rto_min, rto_max)
    n_total = of.shape[0] if is_float else oi.shape[0]
    streaming = 4 * n_total >= stream.MIN_BYTES  # a large output: streaming stores
    streamed = False
    for r in range(n):
        if ok[r] == 0 or lens[r] != plen:
            counters[K_IGNORED] += 1
            continue
        row = bytes_at(addrs[r], plen)
        if row[0] != type_size_byte(code) or row[1] != job_number:
            counters[K_IGNORED] += 1
            continue
        pi = read_pool_index(row)
        st = pool_set(pi)
        s = pool_slot(pi)
        if s >= nslots:
            counters[K_IGNORED] += 1
            continue
        c = chunk[s]
        tsi = read_tsi(row)
        if c == DONE or waiting[s] != 0 or st != cur_set[s]:
            # the result of the slot's previous packet once more?
            if c >= 0 and st != cur_set[s] and tsi == _previous(s, c, nslots, is_float):
                counters[K_SPURIOUS] += 1
                _spurious(rtt, now, rto0, rto_max)
            counters[K_IGNORED] += 1
            continue
        expect = EXP_TSI_BASE + s if c == -1 else c
        if tsi != expect:
            counters[K_IGNORED] += 1
            continue
        e0 = read_e0(row)
        counters[K_RESULTS] += 1
        if tries[s] == 0:
            # RTT sample (Karn: never from a retransmitted packet), RFC 6298 smoothing
            sample = now - (deadline[s] - rto[s])
            if rtt[R_SAMPLES] == 0:
                rtt[R_SRTT] = sample
                rtt[R_VAR] = sample / 2
            else:
                rtt[R_VAR] = 0.75 * rtt[R_VAR] + 0.25 * abs(rtt[R_SRTT] - sample)
                rtt[R_SRTT] = 0.875 * rtt[R_SRTT] + 0.125 * sample
            rtt[R_SAMPLES] += 1
            if rtt[R_FLOOR] > rto_min:
                rtt[R_FLOOR] -= (rtt[R_FLOOR] - rto_min) * FLOOR_DECAY
            rto0 = _timeout(rtt, rto_min, rto_max)
        if c == -1:
            shared_exp[s] = e0
        else:
            lo = c * nvals
            hi = min(lo + nvals, n_total)
            p = _payload(row, nvals)
            src = addrs[r] + HEADER_LEN
            # the output chunk as its own slice: the loops index both sides alike
            # and vectorize (with ``of[i]``/``p[i - lo]`` they took twice as long);
            # they store what the streaming stores left (all without streaming)
            if is_float:
                inv = 1.0 / _scale(shared_exp[c], num_workers)
                o = of[lo:hi]
                a, b = _streamed_part(o, src, inv, True, streaming)
                for i in range(a):
                    o[i] = np.float32(np.float64(np.int32(bswap32(p[i]))) * inv)
                for i in range(b, hi - lo):
                    o[i] = np.float32(np.float64(np.int32(bswap32(p[i]))) * inv)
            else:
                o = oi[lo:hi]
                a, b = _streamed_part(o, src, 1.0, False, streaming)
                for i in range(a):
                    o[i] = np.int32(bswap32(p[i]))
                for i in range(b, hi - lo):
                    o[i] = np.int32(bswap32(p[i]))
            streamed = streamed or streaming
            if is_float and c + nslots < nchunks:
                shared_exp[c + nslots] = e0
        if _advance(
            s,
            now,
            rows,
            xi,
            xf,
            is_float,
            nchunks,
            nvals,
            nslots,
            num_workers,
            code,
            job_number,
            chunk,
            cur_set,
            next_set,
            deadline,
            rto,
            tries,
            my_exp,
            shared_exp,
            rto0,
            limit,
        ):
            n_send = _send_or_wait(s, now, send, n_send, deadline, quiet, waiting, guard)
    if streamed:
        stream.fence()  # the results are visible to every thread before they count as in
    return n_send


@kernel
def _on_timer(
    now, chunk, deadline, rto, tries, rto_max, backoff_after, send, counters, quiet, waiting, guard
):
    """Slots whose timer expired: send held packets, resend (the same packet)
    unanswered ones, and back off after repeated timeouts."""
    n_send = 0
    for s in range(chunk.shape[0]):
        if chunk[s] == DONE or deadline[s] > now:
            continue
        if waiting[s] != 0:  # quiet time over: first transmission
            waiting[s] = 0
        else:
            tries[s] += 1
            if tries[s] % backoff_after == 0:
                rto[s] = min(rto[s] * 2.0, rto_max)
            counters[K_RETRANSMISSIONS] += 1
        deadline[s] = now + rto[s]
        quiet[s] = now + guard
        send[n_send] = s
        n_send += 1
    return n_send


@kernel
def _next_deadline(chunk, deadline):
    """Earliest deadline of an active slot (inf if none)."""
    t = np.inf
    for s in range(chunk.shape[0]):
        if chunk[s] != DONE and deadline[s] < t:
            t = deadline[s]
    return t
