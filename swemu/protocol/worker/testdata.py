"""Deterministic allreduce inputs whose exact sums have a closed form.

Worker r of W contributes ``(r + 1) * base(i)``, so the exact sum is
``W (W + 1) / 2 * base(i)`` — every worker can check its result without seeing
the others' inputs. ``base`` mixes magnitudes (float32: blocks spanning 2^-8 ..
2^6, exactly representable) and includes all-zero blocks, so block floating
point is exercised across exponents and on all-zero chunks.

The generators and the checker are Numba loops: ``switchml run`` and the
benchmarks use them on tensors of tens of millions of elements.
"""

from __future__ import annotations

import math

import numpy as np

from swemu.protocol.jit import kernel, max2, min2

from .quant import INT32_MAX, LANE_MAX

MAG_BLOCK = 4096  # elements per magnitude block
# 2^(blk-8) for the 16 magnitude blocks: a constant table (a libm ldexp call per
# element made generating and checking 64 MiB tensors cost more than the allreduce)
_BLOCK_SCALE = np.array([math.ldexp(1.0, blk - 8) for blk in range(16)], np.float64)


#: what ``kind`` the kernels below generate and check
INT32, FLOAT32, FLOAT16 = 0, 1, 2
#: the most workers whose float16 inputs (rank r sends (r + 1) * base) stay exact
FLOAT16_WORKERS = 8


@kernel
def _base_value(i, iteration, kind):
    if kind == FLOAT16:
        # 9 significant bits: (r + 1) * b is exact in float16 for r < 8, and every
        # value above float16's subnormal step (2^-24)
        b = (i * 7919 + iteration * 31) % 511 - 255
        scale = 1.0 / 256.0
    else:
        b = (i * 7919 + iteration * 31) % 20011 - 10005
        scale = 1.0 / 1024.0
    if kind == INT32:
        return float(b)
    blk = (i // MAG_BLOCK) % 16
    if blk == 15:
        return 0.0  # an all-zero block
    return b * scale * _BLOCK_SCALE[blk]


@kernel
def _fill(out, factor, iteration, kind):
    for i in range(out.shape[0]):
        out[i] = factor * _base_value(i, iteration, kind)


@kernel
def _check(y, world_size, iteration, kind, nvals):
    """Returns (number of bad elements, worst error / bound). float16 results
    (given as float32) are judged by the 16-bit format's bound for a float16
    result plus W - 1 float16 roundings of a partial sum (what a ring that sums
    in float16 adds), so both a switch's and a ring's results pass."""
    n = y.shape[0]
    tri = world_size * (world_size + 1) // 2
    bad = 0
    worst = 0.0
    for lo in range(0, n, nvals):
        hi = min2(lo + nvals, n)
        bound = 0.0
        if kind != INT32:
            m = 0.0
            for i in range(lo, hi):
                m = max2(m, abs(_base_value(i, iteration, kind)))
            m *= world_size  # max|x| over the workers: rank W-1 contributes W * base
            if kind == FLOAT32:
                bound = world_size * m * (world_size / INT32_MAX + 2.0**-24)
            else:
                lanes = LANE_MAX // (2 * world_size)  # quant.offset16
                y_max = world_size * m * (1.0 + 1.0 / lanes)
                bound = world_size * m / lanes + y_max * (2.0**-10) * world_size + 2.0**-24
        for i in range(lo, hi):
            err = abs(float(y[i]) - tri * _base_value(i, iteration, kind))
            if err > bound:
                bad += 1
            if bound > 0:
                worst = max2(worst, err / bound)
            elif err > 0:
                worst = max2(worst, math.inf)
    return bad, worst


def _kind(dtype: np.dtype | type) -> int:
    dt = np.dtype(dtype)
    kinds = {np.dtype(np.int32): INT32, np.dtype(np.float32): FLOAT32}
    kinds[np.dtype(np.float16)] = FLOAT16
    if dt not in kinds:
        raise TypeError(f"test data is int32, float32 or float16, not {dt}")
    return kinds[dt]


def base(n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """The shared pattern of iteration ``iteration`` as float64 (exact)."""
    out = np.empty(n, np.float64)
    _fill(out, 1.0, iteration, _kind(dtype))
    return out


def worker_input(rank: int, n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """Worker ``rank``'s contribution (exact in int32 / float32; in float16 for
    ranks below :data:`FLOAT16_WORKERS`)."""
    kind = _kind(dtype)
    if kind != FLOAT16:
        out = np.empty(n, dtype)
        _fill(out, float(rank + 1), iteration, kind)
        return out
    if rank >= FLOAT16_WORKERS:
        raise ValueError(f"float16 test data is exact for ranks below {FLOAT16_WORKERS}")
    out = np.empty(n, np.float32)  # Numba has no float16: exact values, then cast
    _fill(out, float(rank + 1), iteration, kind)
    return out.astype(np.float16)


def expected_sum(world_size: int, n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """The exact sum over all workers, as float64."""
    return world_size * (world_size + 1) // 2 * base(n, iteration, dtype)


def check_result(y: np.ndarray, world_size: int, iteration: int, nvals: int) -> tuple[bool, float]:
    """Is ``y`` the allreduce of :func:`worker_input` over ``world_size`` workers?

    int32 must be exact; float32 must be within the block floating point bound of
    docs/protocol.md §4 (:func:`swemu.protocol.worker.quant.error_bound`), computed per chunk of
    ``nvals`` from the largest input; float16 within the 16-bit format's (§4.2)
    plus a float16 ring's roundings (see ``_check``). Returns (ok, worst error /
    bound; for int32 the number of wrong elements).
    """
    kind = _kind(y.dtype)
    flat = y.reshape(-1)
    if kind == FLOAT16:
        flat = flat.astype(np.float32)  # exact; Numba has no float16
    bad, worst = _check(flat, world_size, iteration, kind, nvals)
    return bad == 0, float(bad) if kind == INT32 else float(worst)
