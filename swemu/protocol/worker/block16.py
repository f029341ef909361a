"""The worker's kernels for 16-bit data: the 16-bit wire and float16/bfloat16 tensors.

docs/protocol.md §4.2: a packet whose byte 0 has the format bit set carries 2N
values of 16 bits where a 32-bit packet carries N, in offset binary
``u = q + L`` with ``L = (2^16 − 1) // 2W`` and ``q = round(x · L / 2^e)``, so
that the W lanes of a word sum to at most 2^16 − 1 and the switch's 32-bit word
sums are the lane sums. Exponents work as for float32 (§4).

Tensors of float16 and bfloat16 go onto either wire without a float32 copy:
the kernels read their bit patterns (uint16 arrays: Numba has no half types)
and convert each value as they quantize it, and convert each result into the
output's type as they store it. The conversions are exact to float32 on the
way in, and round to nearest, ties to even, on the way out (the result in
float64, rounded to float32, then to the 16-bit type): what numpy's
``astype(np.float16)`` does, which :mod:`swemu.protocol.worker.quant` (the test
oracle) uses.

Everything here is called from :mod:`swemu.protocol.worker.kernels` (the
``WorkerState`` record's ``half`` and ``wire16`` fields choose) and inlined
into its kernels; :func:`half_exponents` is the exponent pass over 16-bit inputs.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from swemu.protocol.jit import kernel
from swemu.protocol.rawmem import bswap16, bswap32, halves_at, words_at
from swemu.protocol.wire import EXP_NONE, HEADER_LEN

#: ``WorkerState.half``: what the 16-bit arrays ``xh``/``oh`` hold
HALF_NONE = 0  # no 16-bit tensor (int32 or float32 in xi/xf)
HALF_FLOAT16 = 1
HALF_BFLOAT16 = 2
LANE_MAX = 0xFFFF
INT32_MAX = 2147483647


def offset16(num_workers: int) -> int:
    """L of docs/protocol.md §4.2 (``quant.offset16``)."""
    return LANE_MAX // (2 * num_workers)


# ----------------------------------------------------------------- bit casts
@intrinsic
def f32_from_bits(typingctx, u):
    """The float32 whose bit pattern is the low 32 bits of ``u``."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.bitcast(v, ir.FloatType())

    return types.float32(u), codegen


@intrinsic
def bits_from_f32(typingctx, f):
    """The bit pattern of the float32 ``f``, as a uint32."""
    if not isinstance(f, types.Float):
        return None

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.float32)
        return builder.bitcast(v, ir.IntType(32))

    return types.uint32(f), codegen


# ----------------------------------------------------------------- conversions
_TWO_112 = np.float32(2.0**112)  # float16's exponent bias below float32's, as a factor


@kernel(inline=True)
def half_to_f32(h):
    """The float32 value of the float16 bit pattern ``h`` (finite): its exponent
    and fraction, moved into float32's fields, times 2^112, which is exact for
    normal and subnormal halves alike; then the sign bit. No branch: the loops
    over a tensor vectorize."""
    mag = f32_from_bits(np.uint32(h & 0x7FFF) << np.uint32(13)) * _TWO_112
    sign = np.uint32(h & 0x8000) << np.uint32(16)
    return f32_from_bits(bits_from_f32(mag) | sign)


@kernel(inline=True)
def bf16_to_f32(h):
    """The float32 value of the bfloat16 bit pattern ``h``: its upper half."""
    return f32_from_bits(np.uint32(h) << np.uint32(16))


@kernel(inline=True)
def to_f32(h, half):
    """The float32 value of a 16-bit pattern of ``half`` (float16 or bfloat16)."""
    return half_to_f32(h) if half == HALF_FLOAT16 else bf16_to_f32(h)


@kernel(inline=True)
def f32_to_half(f):
    """``f`` (finite float32) rounded to the nearest float16, ties to even, as its
    bit pattern; beyond float16's range, ±inf. Normal results: the fraction's
    rounding bit added in integers (a carry moves into the exponent, up to inf);
    subnormal ones: a float add of 0.5, whose ulp is float16's subnormal step,
    lets the FPU round. All three are computed and one selected (no branch: the
    loops vectorize)."""
    u = bits_from_f32(f)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    # |f| < 2^-14: a subnormal float16, or 0
    sub = bits_from_f32(f32_from_bits(a) + np.float32(0.5)) - np.uint32(0x3F000000)
    odd = (a >> np.uint32(13)) & np.uint32(1)
    normal = (a - np.uint32(112 << 23) + np.uint32(0xFFF) + odd) >> np.uint32(13)
    h = sub if a < np.uint32(0x38800000) else normal
    h = np.uint32(0x7C00) if a >= np.uint32(0x47800000) else h  # >= 65536: inf
    return np.uint16(h | sign)


@kernel(inline=True)
def f32_to_bf16(f):
    """``f`` (finite float32) rounded to the nearest bfloat16, ties to even, as its
    bit pattern (the rounding bit added below the kept half)."""
    u = bits_from_f32(f)
    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return np.uint16(u >> np.uint32(16))


@kernel(inline=True)
def from_f32(f, half):
    """``f`` as the 16-bit pattern of ``half`` (float16 or bfloat16)."""
    return f32_to_half(f) if half == HALF_FLOAT16 else f32_to_bf16(f)


# ----------------------------------------------------------------- exponents
@kernel(inline=True)
def _bit_length(m):
    n = 0
    while m:
        m >>= 1
        n += 1
    return n


@kernel
def half_exponents(xh, nvals, out, half):
    """``out[c]`` = frexp exponent of max|x| over chunk c of the 16-bit patterns
    ``xh`` (float16 or bfloat16: ``half``), -128 for an all-zero chunk; returns 1
    if a value is NaN/Inf, 2 if max|x| >= 2^127, else 0. As the float32 pass
    (``kernels.chunk_exponents``): with the sign cleared, the patterns are in
    the order of the values, so the maximum is an integer max reduction."""
    n = xh.shape[0]
    top = 0x7C00 if half == HALF_FLOAT16 else 0x7F80  # NaN and Inf from here up
    status = 0
    for c in range(out.shape[0]):
        lo = c * nvals
        b = xh[lo : min(lo + nvals, n)]
        m = np.uint16(0)
        for i in range(b.shape[0]):
            a = b[i] & np.uint16(0x7FFF)
            m = a if a > m else m
        mm = np.int64(m)
        if mm >= top:
            return 1
        if mm == 0:
            out[c] = EXP_NONE
            continue
        if half == HALF_FLOAT16:  # 1.f * 2^(E-15) = 0.1f * 2^(E-14); subnormal m * 2^-24
            e = (mm >> 10) - 14 if mm >= 0x400 else _bit_length(mm) - 24
        else:  # bfloat16: float32's exponent; subnormal m * 2^-133
            e = (mm >> 7) - 126 if mm >= 0x80 else _bit_length(mm) - 133
        if e > 127:
            status = 2
            e = 127
        out[c] = max(e, -128)
    return status


# ----------------------------------------------------------------- packets
@kernel(inline=True)
def fill_chunk(row, ws, chunk):
    """Quantize chunk ``chunk`` of ``ws`` (a ``WorkerState`` whose call has a
    16-bit wire or a 16-bit tensor) into the payload of ``row``, zero-padded.

    16-bit wire: ``q + L`` (offset binary) as big-endian uint16, from float32
    (``xf``) or 16-bit (``xh``) inputs; padding is 0 (``L``). 32-bit wire with a
    16-bit tensor: as float32 does (§4), clamped to ``limit``."""
    e = ws.shared_exp[chunk]
    nvals = ws.nvals
    lo = chunk * nvals
    half = ws.half
    n = ws.xh.shape[0] if half != HALF_NONE else ws.xf.shape[0]
    hi = min(lo + nvals, n)
    m = hi - lo
    at = row.ctypes.data + HEADER_LEN
    if ws.wire16:
        lanes = ws.limit  # L
        scale = lanes / math.ldexp(1.0, np.int64(e))
        off = np.int32(lanes)
        p = halves_at(at, nvals)
        if half == HALF_NONE:
            xs = ws.xf[lo:hi]
            for i in range(m):
                q = np.int32(np.rint(np.float64(xs[i]) * scale))
                p[i] = bswap16(np.uint16(q + off))
        else:
            hs = ws.xh[lo:hi]
            for i in range(m):
                q = np.int32(np.rint(np.float64(to_f32(hs[i], half)) * scale))
                p[i] = bswap16(np.uint16(q + off))
        pad = bswap16(np.uint16(off))
        for i in range(m, nvals):
            p[i] = pad
        return
    scale = INT32_MAX / (ws.num_workers * math.ldexp(1.0, np.int64(e)))
    limit = ws.limit
    w = words_at(at, nvals)
    hs = ws.xh[lo:hi]
    for i in range(m):
        q = np.rint(np.float64(to_f32(hs[i], half)) * scale)
        q = min(max(q, -limit), limit)
        w[i] = bswap32(np.uint32(np.int32(q)))
    for i in range(m, nvals):
        w[i] = 0


@kernel(inline=True)
def store_chunk(ws, c, src):
    """Store the result of chunk ``c`` from the payload at address ``src`` into the
    output of ``ws`` (16-bit wire, or a 16-bit tensor on the 32-bit wire):
    ``y = s · 2^e / L`` with ``s`` the lane sum less ``W·L`` (16-bit wire) or
    ``y = s · W · 2^e / (2^31 − 1)`` with ``s`` the int32 sum, in float64, then
    float32, then the output's type."""
    e = ws.shared_exp[c]
    nvals = ws.nvals
    lo = c * nvals
    half = ws.half
    n = ws.oh.shape[0] if half != HALF_NONE else ws.of.shape[0]
    hi = min(lo + nvals, n)
    m = hi - lo
    if ws.wire16:
        lanes = ws.limit
        inv = math.ldexp(1.0, np.int64(e)) / lanes
        base = np.int32(ws.num_workers) * np.int32(lanes)
        p = halves_at(src, nvals)
        if half == HALF_NONE:
            o = ws.of[lo:hi]
            for i in range(m):
                s = np.int32(bswap16(p[i])) - base
                o[i] = np.float32(np.float64(s) * inv)
        elif half == HALF_FLOAT16:
            oh = ws.oh[lo:hi]
            for i in range(m):
                s = np.int32(bswap16(p[i])) - base
                oh[i] = f32_to_half(np.float32(np.float64(s) * inv))
        else:
            oh = ws.oh[lo:hi]
            for i in range(m):
                s = np.int32(bswap16(p[i])) - base
                oh[i] = f32_to_bf16(np.float32(np.float64(s) * inv))
        return
    # the float32 path's conversion (kernels.on_results), then the 16-bit rounding
    inv = 1.0 / (INT32_MAX / (ws.num_workers * math.ldexp(1.0, np.int64(e))))
    w = words_at(src, nvals)
    oh = ws.oh[lo:hi]
    for i in range(m):
        y = np.float32(np.float64(np.int32(bswap32(w[i]))) * inv)
        oh[i] = from_f32(y, half)
