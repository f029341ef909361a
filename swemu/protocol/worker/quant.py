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
