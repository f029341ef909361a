"""Block floating point of docs/protocol.md §4, in plain numpy.

These are the reference rules (and the test oracle) for the compiled versions
in :mod:`swemu.protocol.worker.kernels`; they are also handy for a user who wants to predict
what the switch will return.

For a chunk with shared exponent e (the maximum over workers of each worker's
``frexp`` exponent of max|x|) every worker sends ``round(x * scale)`` with
``scale = (2^31 - 1) / (W * 2^e)``, and the result is ``sum / scale``. The
rounded value is clamped to ``±floor((2^31 - 1) / W)``: rounding to nearest can
step up to half a unit past ``(2^31 - 1) / W``, and W such values could then
overflow the int32 sum. The clamp moves a value by less than one unit, so the
error bound below still holds.

The 16-bit format of docs/protocol.md §4.2 has its twins below the float32 ones
(``quantize16``, ``dequantize16``, ``error_bound16``, ``simulate_allreduce16``).
"""

from __future__ import annotations

import numpy as np

from swemu.protocol.wire import EXP_NONE

INT32_MAX = 2**31 - 1


def chunk_exponents(x: np.ndarray, nvals: int) -> np.ndarray:
    """int8 exponent per chunk of ``nvals``: frexp exponent of max|x| (-128 if all zero)."""
    x = np.asarray(x, np.float64).reshape(-1)
    nchunks = -(-x.size // nvals)
    padded = np.zeros(nchunks * nvals)
    padded[: x.size] = np.abs(x)
    m = padded.reshape(nchunks, nvals).max(axis=1) if nchunks else padded
    if not np.all(np.isfinite(m)):
        raise ValueError("NaN or Inf in the input")
    _, e = np.frexp(m)
    e = np.where(m == 0, EXP_NONE, e)
    if np.any(e > 127):
        raise ValueError("|x| >= 2^127 cannot be represented")
    return np.clip(e, -128, 127).astype(np.int8)


def scale(exp: np.ndarray | int, num_workers: int) -> np.ndarray:
    """``(2^31 - 1) / (W * 2^e)`` in float64 (finite for e = -128)."""
    return INT32_MAX / (num_workers * np.ldexp(1.0, np.asarray(exp, np.int64)))


def quantize(x: np.ndarray, exp: int, num_workers: int) -> np.ndarray:
    """One worker's int32 payload for a chunk with shared exponent ``exp``."""
    limit = INT32_MAX // num_workers
    q = np.rint(np.asarray(x, np.float64) * scale(exp, num_workers))
    return np.clip(q, -limit, limit).astype(np.int32)


def dequantize(total: np.ndarray, exp: int, num_workers: int) -> np.ndarray:
    """The float32 result of a chunk from the switch's int32 sum."""
    return (np.asarray(total, np.float64) / scale(exp, num_workers)).astype(np.float32)


def error_bound(max_abs: np.ndarray | float, num_workers: int) -> np.ndarray:
    """Per-element bound on |result - exact sum| for a chunk whose max|x| over all
    workers is ``max_abs``: ``W·M·(W / (2^31 - 1) + 2^-24)`` (docs/protocol.md §4)."""
    m = np.asarray(max_abs, np.float64)
    return num_workers * m * (num_workers / INT32_MAX + 2.0**-24)


def simulate_allreduce(inputs: list[np.ndarray], nvals: int) -> np.ndarray:
    """What a float32 allreduce of ``inputs`` (one array a worker) returns, chunk by chunk."""
    w = len(inputs)
    flat = [np.asarray(x, np.float32).reshape(-1) for x in inputs]
    n = flat[0].size
    exps = np.max([chunk_exponents(x, nvals) for x in flat], axis=0) if n else []
    out = np.empty(n, np.float32)
    for c, e in enumerate(exps):
        lo, hi = c * nvals, min((c + 1) * nvals, n)
        total = np.zeros(hi - lo, np.int64)
        for x in flat:
            total += quantize(x[lo:hi], int(e), w)
        out[lo:hi] = dequantize(total.astype(np.int32), int(e), w)
    return out.reshape(np.shape(inputs[0]))


# ----------------------------------------------------------------- 16-bit values
# docs/protocol.md §4.2: the same chunks and shared exponents, but 16-bit values in
# offset binary, two to each 32-bit word of the packet, bounded so that W of them
# never carry out of their 16 bits (the switch adds the words as it adds int32).

LANE_MAX = 2**16 - 1
#: the largest |result| rounding error of float32, float16 and bfloat16 relative to
#: |y| (half an ulp of a normal number), and the absolute one below their normal range
_ULP_HALF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_SUBNORMAL_HALF = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}


def offset16(num_workers: int) -> int:
    """L = ⌊(2^16 − 1) / 2W⌋: a worker's value q is in [−L, L] and goes on the wire
    as q + L in [0, 2L], so that W of them sum to at most 2^16 − 1."""
    return LANE_MAX // (2 * num_workers)


def scale16(exp: np.ndarray | int, num_workers: int) -> np.ndarray:
    """``L / 2^e`` in float64: |x| < 2^e maps into (−L, L)."""
    return offset16(num_workers) / np.ldexp(1.0, np.asarray(exp, np.int64))


def quantize16(x: np.ndarray, exp: int, num_workers: int) -> np.ndarray:
    """One worker's 16-bit wire values for a chunk with shared exponent ``exp``:
    ``round_half_even(x · L / 2^e) + L`` (no clamp: |x| < 2^e keeps |q| ≤ L)."""
    q = np.rint(np.asarray(x, np.float64) * scale16(exp, num_workers))
    return (q + offset16(num_workers)).astype(np.uint16)


def bfloat16_bits(y: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as uint16 bit
    patterns: the upper half of the nearer of the two float32 values that end in
    16 zero bits (written independently of the kernels' integer trick)."""
    y = np.asarray(y, np.float32)
    u = y.view(np.uint32).astype(np.uint64)
    low = u & 0xFFFF0000
    high = low + 0x10000
    lo_v = low.astype(np.uint32).view(np.float32).astype(np.float64)
    with np.errstate(over="ignore"):
        hi_v = high.astype(np.uint32).view(np.float32).astype(np.float64)
    # past the largest finite bfloat16 the next one up is inf, which rounding treats
    # as 2^128 (IEEE 754's rule for overflow with round to nearest)
    hi_v = np.where(np.isinf(hi_v), np.copysign(2.0**128, hi_v), hi_v)
    yv = y.astype(np.float64)
    d_lo, d_hi = np.abs(yv - lo_v), np.abs(hi_v - yv)
    even_lo = ((low >> 16) & 1) == 0
    pick_low = (d_lo < d_hi) | ((d_lo == d_hi) & even_lo)
    return (np.where(pick_low, low, high) >> 16).astype(np.uint16)


def bfloat16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def dequantize16(total: np.ndarray, exp: int, num_workers: int, dtype: str = "float32"):
    """The result of a chunk from the switch's 16-bit lane sums ``total`` (W values
    of ``q + L`` each): ``(total − W·L) · 2^e / L`` in float64, rounded to float32,
    then, for ``dtype`` float16 or bfloat16, to the nearest of those (ties to even;
    bfloat16 comes back as its uint16 bit patterns, numpy having no such type)."""
    w, lanes = num_workers, offset16(num_workers)
    s = np.asarray(total, np.int64) - w * lanes
    with np.errstate(over="ignore"):  # past a type's range the result is ±inf, as meant
        y = (s.astype(np.float64) * (np.ldexp(1.0, exp) / lanes)).astype(np.float32)
        if dtype == "float16":
            return y.astype(np.float16)
    if dtype == "float32":
        return y
    if dtype == "bfloat16":
        return bfloat16_bits(y)
    raise ValueError(f"dtype must be float32, float16 or bfloat16, not {dtype!r}")


def error_bound16(
    max_abs: np.ndarray | float, num_workers: int, dtype: str = "float32"
) -> np.ndarray:
    """Per-element bound on |result − exact sum| of the 16-bit format (docs/protocol.md
    §4.2), for a chunk whose max|x| over all workers is ``max_abs`` and a result of
    ``dtype``: ``W·M′/L`` (each worker's rounding is at most half a step,
    2^e / 2L ≤ M′/L, with M′ = max(M, 2^−129) since an exponent is at least −128)
    plus the rounding of |y| ≤ W·M + W·M′/L to float32 and then to ``dtype``."""
    m = np.asarray(max_abs, np.float64)
    w, lanes = num_workers, offset16(num_workers)
    quant = w * np.maximum(m, 2.0**-129) / lanes
    y = w * m + quant
    bound = quant + y * _ULP_HALF["float32"] + _SUBNORMAL_HALF["float32"]
    if dtype != "float32":
        y = y * (1 + _ULP_HALF["float32"])
        bound = bound + y * _ULP_HALF[dtype] + _SUBNORMAL_HALF[dtype]
    return bound


def simulate_allreduce16(
    inputs: list[np.ndarray], nvals: int, dtype: str | None = None, *, bfloat16: bool = False
) -> np.ndarray:
    """What an allreduce of ``inputs`` (one array a worker: float32, float16, or with
    ``bfloat16`` uint16 bfloat16 patterns) on the 16-bit wire returns, chunk by
    chunk of ``nvals`` values (``values16_per_packet`` of the size code); the
    result is of the input's type unless ``dtype`` says otherwise."""
    w = len(inputs)
    if bfloat16:
        flat = [bfloat16_values(x).reshape(-1) for x in inputs]
        dtype = dtype or "bfloat16"
    else:
        flat = [np.asarray(x).reshape(-1) for x in inputs]
        dtype = dtype or str(flat[0].dtype)
    n = flat[0].size
    exps = np.max([chunk_exponents(x, nvals) for x in flat], axis=0) if n else []
    out = np.empty(n, np.uint16 if dtype == "bfloat16" else dtype)
    for c, e in enumerate(exps):
        lo, hi = c * nvals, min((c + 1) * nvals, n)
        total = np.zeros(hi - lo, np.int64)
        for x in flat:
            total += quantize16(x[lo:hi], int(e), w)
        out[lo:hi] = dequantize16(total, int(e), w, dtype)
    return out.reshape(np.shape(inputs[0]))
