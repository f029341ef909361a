"""Numba kernels of the worker data path: quantization and the windowed protocol.

All per-packet work of an allreduce runs here in batches: building packets
(quantizing a chunk straight into a big-endian row), matching a batch of
received results, storing them (dequantizing), advancing each slot to its
next chunk, and finding the slots whose timers expired. The kernels take one
call's state as one record, :class:`WorkerState`; :mod:`swemu.protocol.worker.protocol`
owns the arrays (:attr:`swemu.protocol.worker.protocol.Allreduce.state`), and it and the
compiled I/O loop (``hostlib.fastpath``) are the callers. :mod:`swemu.protocol.worker.quant`
holds the numpy twins used as test oracles for the quantization rules.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import NamedTuple

import numpy as np
from numba import types
from numba.extending import overload

from swemu.protocol.header import (
    pool_set,
    pool_slot,
    read_e0,
    read_pool_index,
    read_tsi,
    set_format,
    type_size_byte,
    write_header,
)
from swemu.protocol.jit import kernel, max2, min2
from swemu.protocol.rawmem import bswap32, bytes_at, int32s_at, words_at
from swemu.protocol.wire import EXP_NONE, EXP_TSI_BASE, FORMAT_BIT, HEADER_LEN

from . import block16, stream

DONE = -2  # WorkerState.chunk[s]: the slot has nothing more to do in this call
INT32_MAX = 2147483647
FLOOR_DECAY = 1.0 / 8192  # per RTT sample, the raised floor's way back down


class Counter(IntEnum):
    """Entries of ``WorkerState.counters`` (one call's)."""

    RESULTS = 0  # results accepted
    IGNORED = 1  # datagrams ignored: stale, duplicate, foreign or malformed
    RETRANSMISSIONS = 2  # packets resent on timeout
    SENT = 3  # packets sent, first transmissions and retransmissions
    SPURIOUS = 4  # duplicate results: a retransmission turned out to be needless


class Rtt(IntEnum):
    """Entries of ``WorkerState.rtt``: the retransmission timer's learned state
    (one per session: it carries over to the next call)."""

    SRTT = 0  # smoothed round-trip time
    VAR = 1  # round-trip time variance
    SAMPLES = 2  # samples taken
    FLOOR = 3  # timeout floor raised by spurious timeouts (0: the configured one)
    RAISED = 4  # when the floor was last raised


class WorkerState(NamedTuple):
    """One allreduce call as the kernels see it. The window has K slots (the
    job's pool size); slot s carries chunks s, s + K, s + 2K, ... of ``nvals``
    values each. :class:`swemu.protocol.worker.protocol.Allreduce` owns the per-call arrays,
    :class:`swemu.protocol.worker.protocol.WorkerProtocol` those that outlive a call."""

    # --- the data: int32 calls use xi/oi, float32 calls xf/of (the other pair is empty)
    xi: np.ndarray  # int32[n]: the input
    xf: np.ndarray  # float32[n]
    oi: np.ndarray  # int32[n]: the output
    of: np.ndarray  # float32[n]
    is_float: bool
    my_exp: np.ndarray  # int8[nchunks]: this worker's exponent of each chunk (float32)
    shared_exp: np.ndarray  # int8[nchunks]: the job's, from the switch's results
    limit: float  # the largest |quantized value|: (2^31 - 1) / W, so W terms never
    #               overflow; on the 16-bit wire L = (2^16 - 1) // 2W (docs/protocol.md §4.2)
    # --- 16-bit data (swemu.protocol.worker.block16): float16/bfloat16 tensors use
    #     xh/oh (their bit patterns; empty otherwise), and a call on the 16-bit wire
    #     sends 2N values of 16 bits per packet (nvals = 2N), its format bit set.
    #     A call with neither has xh = oh = None: the state's Numba type then
    #     differs, and the kernels' version for it compiles no 16-bit code (see
    #     _fill_payload); a 16-bit call's state has arrays here (uint16, empty for
    #     float32 on the 16-bit wire), and its version only the 16-bit code
    xh: np.ndarray | None  # uint16[n]: the input
    oh: np.ndarray | None  # uint16[n]: the output
    half: int  # block16.HALF_*: what xh/oh hold (HALF_NONE: no 16-bit tensor)
    wire16: bool
    # --- the call
    nchunks: int
    nvals: int  # values per packet
    nslots: int  # K
    num_workers: int
    code: int  # size code
    job_number: int  # the call's number modulo 256
    # --- the window: one entry per slot
    rows: np.ndarray  # uint8[K, packet_len]: the outstanding packet (a retransmission resends it)
    chunk: np.ndarray  # int64[K]: what the slot waits for: -1 its exponent packet, i >= 0
    #                   the result of chunk i, DONE nothing
    cur_set: np.ndarray  # uint8[K]: the shadow set of the outstanding packet
    next_set: np.ndarray  # uint8[K]: the set it uses next (session-long: docs/protocol.md §3)
    deadline: np.ndarray  # float64[K]: when it is resent (or first sent, if waiting)
    rto: np.ndarray  # float64[K]: its timeout
    tries: np.ndarray  # int32[K]: retransmissions of the outstanding packet
    quiet: np.ndarray  # float64[K]: last transmission + reorder guard (session-long)
    rounds: np.ndarray  # int64[K]: results accepted on the slot (session-long; restart recovery)
    waiting: np.ndarray  # uint8[K]: 1 while a new packet waits for the quiet time to end
    send: np.ndarray  # int32[K]: the kernels' answer: the slots whose packet to send
    # --- the timer
    rto_min: float  # the first packets' timeout and the floor of the adaptive one
    rto_max: float
    guard: float  # the reorder guard (seconds; 0: links keep order)
    rtt: np.ndarray  # float64[Rtt]: the timer's learned state (session-long)
    counters: np.ndarray  # int64[Counter]


@kernel
def chunk_exponents(x, nvals, out):
    """``out[c]`` = frexp exponent of max|x| over chunk c, -128 for an all-zero
    chunk; returns 1 if any value is NaN/Inf, 2 if max|x| >= 2^127, else 0.

    Works on the bit patterns: with the sign bit cleared, the order of float32
    values is the order of their int32 patterns, and NaN/Inf are the patterns
    from 0x7F800000 up. So the chunk's maximum is an integer max reduction over
    the chunk's own slice, which LLVM vectorizes (a float max with NaN checks it
    does not), and the exponent comes from the maximum's bits."""
    n = x.shape[0]
    bits = int32s_at(x.ctypes.data, n)  # (x.view: a library of its own to compile)
    nchunks = out.shape[0]
    status = 0
    for c in range(nchunks):
        lo = c * nvals
        b = bits[lo : min2(lo + nvals, n)]
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
        out[c] = max2(e, -128)
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

    The loops run over the chunk's own slice, indexed like the payload (with
    ``xf[i]``/``p[i - lo]`` LLVM vectorizes them less well)."""
    n = xf.shape[0] if is_float else xi.shape[0]
    lo = chunk * nvals
    hi = min2(lo + nvals, n)
    m = hi - lo
    p = _payload(row, nvals)
    if is_float:
        scale = _scale(shared_exp[chunk], num_workers)
        xs = xf[lo:hi]
        for i in range(m):
            q = np.rint(np.float64(xs[i]) * scale)
            # rounding can step past (2^31-1)/W by < 1; clamp so W terms never overflow
            q = min2(max2(q, -limit), limit)
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
    (:mod:`swemu.protocol.worker.stream`); returns ``(a, b)``, the streamed range, which the
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


# ------------------------------------------------- the 32-bit and 16-bit halves
# A call's packets are built and its results stored by the 32-bit code (int32 and
# float32 on the 32-bit wire) or by block16's (a 16-bit wire or a 16-bit tensor).
# Which one is a choice of the state's Numba type, not of a run-time test: the
# state of a call without 16-bit data has ``xh = oh = None``, and the generic
# helpers below resolve, as each kernel's version for that type is typed, to
# the one half that type needs. So a float32 or int32 run compiles none of the
# 16-bit code (it was a third of a worker's first-run compile), and a 16-bit
# call's version (compiled on the first one, or warmed ahead: protocol.warmup16)
# none of the 32-bit code. Their Python bodies decide the same at run time. (The
# halves are plain functions: an overload returns one, and Numba compiles and
# inlines it into the kernel being compiled.)
_XH = WorkerState._fields.index("xh")


def has16(ws) -> bool:
    """Whether the Numba type ``ws`` of a :class:`WorkerState` is a 16-bit call's."""
    return not isinstance(ws.types[_XH], types.NoneType)


def _fill32(row, ws, chunk):
    _fill_data(
        row, ws.xi, ws.xf, ws.is_float, chunk, ws.nvals, ws.shared_exp, ws.num_workers, ws.limit
    )


def _fill16(row, ws, chunk):
    block16.fill_chunk(row, ws, chunk)


def _fill_payload(row, ws, chunk):
    """Quantize chunk ``chunk`` of the call ``ws`` into the payload of ``row``:
    :func:`_fill_data`, or :func:`block16.fill_chunk` for a 16-bit call."""
    (_fill16 if ws.xh is not None else _fill32)(row, ws, chunk)


@overload(_fill_payload)
def _fill_payload_typed(row, ws, chunk):
    return _fill16 if has16(ws) else _fill32


def _store32(ws, c, row, src, streaming):
    """Store the result of chunk ``c`` (the packet ``row``, its payload at address
    ``src``) into the int32 or float32 output of ``ws``; with ``streaming``, its
    aligned middle with streaming stores. Returns ``streaming``.

    The output chunk is its own slice: the loops index both sides alike and
    vectorize (with ``of[i]``/``p[i - lo]`` they took twice as long); they
    store what the streaming stores left (all without streaming)."""
    nvals = ws.nvals
    lo = c * nvals
    p = _payload(row, nvals)
    if ws.is_float:
        inv = 1.0 / _scale(ws.shared_exp[c], ws.num_workers)
        o = ws.of[lo : min2(lo + nvals, ws.of.shape[0])]
        a, b = _streamed_part(o, src, inv, True, streaming)
        for i in range(a):
            o[i] = np.float32(np.float64(np.int32(bswap32(p[i]))) * inv)
        for i in range(b, o.shape[0]):
            o[i] = np.float32(np.float64(np.int32(bswap32(p[i]))) * inv)
    else:
        o = ws.oi[lo : min2(lo + nvals, ws.oi.shape[0])]
        a, b = _streamed_part(o, src, 1.0, False, streaming)
        for i in range(a):
            o[i] = np.int32(bswap32(p[i]))
        for i in range(b, o.shape[0]):
            o[i] = np.int32(bswap32(p[i]))
    return streaming


def _store16(ws, c, row, src, streaming):
    block16.store_chunk(ws, c, src)
    return False


def _store_payload(ws, c, row, src, streaming):
    """Store the result of chunk ``c`` into the output of ``ws``: :func:`_store32`,
    or :func:`block16.store_chunk` for a 16-bit call (no streaming stores).
    Returns whether streaming stores were used."""
    return (_store16 if ws.xh is not None else _store32)(ws, c, row, src, streaming)


@overload(_store_payload)
def _store_payload_typed(ws, c, row, src, streaming):
    return _store16 if has16(ws) else _store32


@kernel(inline=True)
def _copy(dst, lo, src):
    """``dst[lo : lo + len(src)] = src``."""
    d = dst[lo : lo + src.shape[0]]
    for i in range(src.shape[0]):
        d[i] = src[i]


def _values32(ws, lo, values_i, values_f, values_h):
    if ws.is_float:
        _copy(ws.of, lo, values_f)
    else:
        _copy(ws.oi, lo, values_i)


def _values16(ws, lo, values_i, values_f, values_h):
    if ws.half != block16.HALF_NONE:
        _copy(ws.oh, lo, values_h)
    else:  # float32 on the 16-bit wire
        _copy(ws.of, lo, values_f)


def _store_values(ws, lo, values_i, values_f, values_h):
    """Copy a chunk's output from elsewhere (:func:`apply_result`) into the output
    of ``ws`` at ``lo``: ``values_h`` for a 16-bit tensor, else ``values_f``
    (float32) or ``values_i`` (int32)."""
    (_values16 if ws.xh is not None else _values32)(ws, lo, values_i, values_f, values_h)


@overload(_store_values)
def _store_values_typed(ws, lo, values_i, values_f, values_h):
    return _values16 if has16(ws) else _values32


@kernel
def timeout(rtt, rto_min, rto_max):
    """A new packet's timeout: ``srtt + 4 rttvar`` (RFC 6298) within
    ``[floor, rto_max]``; the floor is ``rto_min`` unless spurious timeouts
    raised it. Before the first sample, the floor itself."""
    floor = max2(rto_min, rtt[Rtt.FLOOR])
    if rtt[Rtt.SAMPLES] == 0:
        return min2(floor, rto_max)
    return min2(max2(floor, rtt[Rtt.SRTT] + 4.0 * rtt[Rtt.VAR]), rto_max)


@kernel
def spurious(rtt, now, rto0, rto_max):
    """A duplicate result came in: the switch answered a retransmission of a
    packet whose result had arrived, so the timer fired although nothing was
    lost (TCP's D-SACK signal, RFC 3708). On a link whose queue holds about a
    timeout's worth of packets this repeats every window and the resends
    lengthen the queue further; so the floor becomes twice the timeout in use,
    at most once per timeout (one timer event gives a burst of duplicates), and
    decays again slowly."""
    if now - rtt[Rtt.RAISED] >= rto0:
        rtt[Rtt.FLOOR] = min2(2.0 * rto0, rto_max)
        rtt[Rtt.RAISED] = now


@kernel(inline=True)
def rtt_sample(rtt, sample, rto_min, rto_max):
    """Take one round-trip time ``sample`` into the timer's state ``rtt``
    (RFC 6298 smoothing; a raised floor decays a little), and return the new
    packets' timeout (:func:`timeout`). A child switch's uplink calls it too."""
    if rtt[Rtt.SAMPLES] == 0:
        rtt[Rtt.SRTT] = sample
        rtt[Rtt.VAR] = sample / 2
    else:
        rtt[Rtt.VAR] = 0.75 * rtt[Rtt.VAR] + 0.25 * abs(rtt[Rtt.SRTT] - sample)
        rtt[Rtt.SRTT] = 0.875 * rtt[Rtt.SRTT] + 0.125 * sample
    rtt[Rtt.SAMPLES] += 1
    if rtt[Rtt.FLOOR] > rto_min:
        rtt[Rtt.FLOOR] -= (rtt[Rtt.FLOOR] - rto_min) * FLOOR_DECAY
    return timeout(rtt, rto_min, rto_max)


@kernel(inline=True)
def backoff(tries, rto, backoff_after, rto_max):
    """A packet timed out for the ``tries``-th time in a row: its timeout
    doubles, up to ``rto_max``, after every ``backoff_after`` of them
    (p4app-switchML doubles after 100). Returns the new timeout."""
    if tries % backoff_after == 0:
        return min2(rto * 2.0, rto_max)
    return rto


@kernel(inline=True)
def _advance(s, now, ws, rto0):
    """Move slot s to its next chunk and build that packet; return False if done."""
    c = ws.chunk[s]
    nxt = s if c == -1 else c + ws.nslots
    if nxt >= ws.nchunks:
        ws.chunk[s] = DONE
        return False
    ws.chunk[s] = nxt
    st = ws.next_set[s]
    ws.cur_set[s] = st
    ws.next_set[s] = 1 - st
    e0 = 0
    if ws.is_float:
        e0 = ws.my_exp[nxt + ws.nslots] if nxt + ws.nslots < ws.nchunks else EXP_NONE
    row = ws.rows[s]
    write_header(row, ws.code, ws.job_number, nxt, st, s, e0, 0)
    if ws.wire16:
        set_format(row, 1)
    _fill_payload(row, ws, nxt)
    ws.deadline[s] = now + rto0
    ws.rto[s] = rto0
    ws.tries[s] = 0
    return True


@kernel
def start(now, ws):
    """Build the first packet of every slot in use (of ``ws``, a
    :class:`WorkerState`); return how many to send now (the first of
    ``ws.send``; slots still quiet after their last transmission wait for the
    timer). The first packets' timeout is the one learned so far
    (:func:`timeout`)."""
    rto0 = timeout(ws.rtt, ws.rto_min, ws.rto_max)
    nslots = ws.nslots
    used = min2(nslots, ws.nchunks)
    n_send = 0
    for s in range(used):
        if ws.is_float:
            # exponent packet: values zero, e0 = exponent of chunk s
            st = ws.next_set[s]
            ws.cur_set[s] = st
            ws.next_set[s] = 1 - st
            ws.chunk[s] = -1
            row = ws.rows[s]
            write_header(row, ws.code, ws.job_number, EXP_TSI_BASE + s, st, s, ws.my_exp[s], 0)
            if ws.wire16:
                set_format(row, 1)  # every packet of a 16-bit call says so (§4.2)
            for i in range(HEADER_LEN, row.shape[0]):
                row[i] = 0
            ws.deadline[s] = now + rto0
            ws.rto[s] = rto0
            ws.tries[s] = 0
        else:
            ws.chunk[s] = s - nslots  # so that _advance moves it to chunk s
            _advance(s, now, ws, rto0)
        n_send = _send_or_wait(s, now, ws, n_send)
    for s in range(used, nslots):
        ws.chunk[s] = DONE
        ws.waiting[s] = 0
    return n_send


@kernel(entry=False)
def _send_or_wait(s, now, ws, n_send):
    """Queue slot s's new packet (as the ``n_send``-th of ``ws.send``; returns
    the new count), or hold it until the slot's quiet time ends.

    ``quiet[s]`` is the last transmission on slot s plus the reorder guard: a
    new packet must not overtake stale copies of the previous one (the switch
    would take a late copy of an old round for a new contribution)."""
    if now < ws.quiet[s]:
        ws.waiting[s] = 1
        ws.deadline[s] = ws.quiet[s]
        return n_send
    ws.waiting[s] = 0
    ws.quiet[s] = now + ws.guard
    ws.send[n_send] = s
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


@kernel(linked=False)
def on_results(addrs, lens, ok, n, now, ws):
    """Match a batch of received datagrams; store results, advance slots.

    Datagram r is ``lens[r]`` bytes at address ``addrs[r]`` (a row of the
    caller's batch, or where the kernel landed it: ``fastio.GroRx``, zero copy).
    ``ok[r]`` is 0 for datagrams that did not come from the switch. Returns the
    number of slots in ``ws.send`` whose (new) packet must be sent. A new
    packet's timeout is ``srtt + 4 rttvar`` within ``[floor, rto_max]``
    (:func:`timeout`, ``ws.rtt``), so a loaded machine or a long link queue
    does not turn slow results into a retransmission storm; duplicate results
    raise the floor (:func:`spurious`)."""
    rtt, counters, chunk = ws.rtt, ws.counters, ws.chunk
    nslots, is_float = ws.nslots, ws.is_float
    n_send = 0
    plen = ws.rows.shape[1]  # HEADER_LEN + 4N: nvals = N values of 32 bits, or 2N of 16
    first = type_size_byte(ws.code) | (FORMAT_BIT if ws.wire16 else 0)  # byte 0 of a result
    rto0 = timeout(rtt, ws.rto_min, ws.rto_max)
    n_total = ws.of.shape[0] if is_float else ws.oi.shape[0]  # (a 16-bit tensor: 0)
    streaming = 4 * n_total >= stream.MIN_BYTES  # a large output: streaming stores
    streamed = False
    for r in range(n):
        if ok[r] == 0 or lens[r] != plen:
            counters[Counter.IGNORED] += 1
            continue
        row = bytes_at(addrs[r], plen)
        if row[0] != first or row[1] != ws.job_number:
            counters[Counter.IGNORED] += 1
            continue
        pi = read_pool_index(row)
        st = pool_set(pi)
        s = pool_slot(pi)
        if s >= nslots:
            counters[Counter.IGNORED] += 1
            continue
        c = chunk[s]
        tsi = read_tsi(row)
        if c == DONE or ws.waiting[s] != 0 or st != ws.cur_set[s]:
            # the result of the slot's previous packet once more?
            if c >= 0 and st != ws.cur_set[s] and tsi == _previous(s, c, nslots, is_float):
                counters[Counter.SPURIOUS] += 1
                spurious(rtt, now, rto0, ws.rto_max)
            counters[Counter.IGNORED] += 1
            continue
        expect = EXP_TSI_BASE + s if c == -1 else c
        if tsi != expect:
            counters[Counter.IGNORED] += 1
            continue
        e0 = read_e0(row)
        counters[Counter.RESULTS] += 1
        ws.rounds[s] += 1
        if ws.tries[s] == 0:  # Karn: never a sample from a retransmitted packet
            rto0 = rtt_sample(rtt, now - (ws.deadline[s] - ws.rto[s]), ws.rto_min, ws.rto_max)
        if c == -1:
            ws.shared_exp[s] = e0
        else:
            if _store_payload(ws, c, row, addrs[r] + HEADER_LEN, streaming):
                streamed = True
            if is_float and c + nslots < ws.nchunks:
                ws.shared_exp[c + nslots] = e0
        if _advance(s, now, ws, rto0):
            n_send = _send_or_wait(s, now, ws, n_send)
    if streamed:
        stream.fence()  # the results are visible to every thread before they count as in
    return n_send


@kernel
def apply_result(s, e0, values_i, values_f, values_h, now, ws):
    """Take the result of slot s's outstanding packet from elsewhere than the
    switch (restart recovery: a rank that holds it hands it on, docs/protocol.md
    §5): ``e0`` as the result's exponent and ``values_i``, ``values_f`` or
    ``values_h`` (the output's type: int32, float32, or a 16-bit tensor's bit
    patterns; empty for an exponent packet's result) as the chunk's output,
    exactly as another rank stored it. Then the slot moves on as after any
    result; returns the count of slots in ``ws.send`` to send (0 or 1)."""
    c = ws.chunk[s]
    ws.counters[Counter.RESULTS] += 1
    ws.rounds[s] += 1
    if c == -1:
        ws.shared_exp[s] = e0
    else:
        _store_values(ws, c * ws.nvals, values_i, values_f, values_h)
        if ws.is_float and c + ws.nslots < ws.nchunks:
            ws.shared_exp[c + ws.nslots] = e0
    rto0 = timeout(ws.rtt, ws.rto_min, ws.rto_max)
    if _advance(s, now, ws, rto0):
        return _send_or_wait(s, now, ws, 0)
    return 0


@kernel
def on_timer(now, ws, backoff_after):
    """Slots whose timer expired: send held packets, resend (the same packet)
    unanswered ones, and back off (double the timeout, up to ``rto_max``) after
    every ``backoff_after`` timeouts in a row. Returns the count in ``ws.send``."""
    chunk, deadline, rto, tries = ws.chunk, ws.deadline, ws.rto, ws.tries
    n_send = 0
    for s in range(chunk.shape[0]):
        if chunk[s] == DONE or deadline[s] > now:
            continue
        if ws.waiting[s] != 0:  # quiet time over: first transmission
            ws.waiting[s] = 0
        else:
            tries[s] += 1
            rto[s] = backoff(tries[s], rto[s], backoff_after, ws.rto_max)
            ws.counters[Counter.RETRANSMISSIONS] += 1
        deadline[s] = now + rto[s]
        ws.quiet[s] = now + ws.guard
        ws.send[n_send] = s
        n_send += 1
    return n_send


@kernel
def next_deadline(chunk, deadline):
    """Earliest deadline of an active slot (inf if none)."""
    t = np.inf
    for s in range(chunk.shape[0]):
        if chunk[s] != DONE and deadline[s] < t:
            t = deadline[s]
    return t
