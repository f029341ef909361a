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

from swemu.protocol.jit import kernel

from .quant import INT32_MAX

MAG_BLOCK = 4096  # elements per magnitude block
# 2^(blk-8) for the 16 magnitude blocks: a constant table (a libm ldexp call per
# element made generating and checking 64 MiB tensors cost more than the allreduce)
_BLOCK_SCALE = np.array([math.ldexp(1.0, blk - 8) for blk in range(16)], np.float64)


@kernel
def _base_value(i, iteration, is_float):
    b = (i * 7919 + iteration * 31) % 20011 - 10005
    if not is_float:
        return float(b)
    blk = (i // MAG_BLOCK) % 16
    if blk == 15:
        return 0.0  # an all-zero block
    return b / 1024.0 * _BLOCK_SCALE[blk]


@kernel
def _fill(out, factor, iteration, is_float):
    for i in range(out.shape[0]):
        out[i] = factor * _base_value(i, iteration, is_float)


@kernel
def _check(y, world_size, iteration, is_float, nvals):
    """Returns (number of bad elements, worst error / bound)."""
    n = y.shape[0]
    tri = world_size * (world_size + 1) // 2
    bad = 0
    worst = 0.0
    for lo in range(0, n, nvals):
        hi = min(lo + nvals, n)
        bound = 0.0
        if is_float:
            m = 0.0
            for i in range(lo, hi):
                m = max(m, abs(_base_value(i, iteration, is_float)))
            m *= world_size  # max|x| over the workers: rank W-1 contributes W * base
            bound = world_size * m * (world_size / INT32_MAX + 2.0**-24)
        for i in range(lo, hi):
            err = abs(float(y[i]) - tri * _base_value(i, iteration, is_float))
            if err > bound:
                bad += 1
            if bound > 0:
                worst = max(worst, err / bound)
            elif err > 0:
                worst = max(worst, math.inf)
    return bad, worst


def _is_float(dtype: np.dtype | type) -> bool:
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.float32)):
        raise TypeError(f"test data is int32 or float32, not {dt}")
    return dt == np.float32


def base(n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """The shared pattern of iteration ``iteration`` as float64 (exact)."""
    out = np.empty(n, np.float64)
    _fill(out, 1.0, iteration, _is_float(dtype))
    return out


def worker_input(rank: int, n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """Worker ``rank``'s contribution (exact in int32 / float32)."""
    out = np.empty(n, dtype)
    _fill(out, float(rank + 1), iteration, _is_float(dtype))
    return out


def expected_sum(world_size: int, n: int, iteration: int, dtype: np.dtype | type) -> np.ndarray:
    """The exact sum over all workers, as float64."""
    return world_size * (world_size + 1) // 2 * base(n, iteration, dtype)


def check_result(y: np.ndarray, world_size: int, iteration: int, nvals: int) -> tuple[bool, float]:
    """Is ``y`` the allreduce of :func:`worker_input` over ``world_size`` workers?

    int32 must be exact; float32 must be within the block floating point bound of
    docs/protocol.md §4 (:func:`swemu.protocol.worker.quant.error_bound`), computed per chunk of
    ``nvals`` from the largest input. Returns (ok, worst error / bound; for
    int32 the number of wrong elements).
    """
    is_float = _is_float(y.dtype)
    bad, worst = _check(y.reshape(-1), world_size, iteration, is_float, nvals)
    return bad == 0, float(bad) if not is_float else float(worst)
