"""Block floating point: the Numba kernels against their numpy twins, and the bound."""

from __future__ import annotations

import numpy as np
import pytest

from swemu.protocol.worker import kernels as K
from swemu.protocol.worker import quant


def kernel_exponents(x, nvals):
    out = np.zeros(-(-x.size // nvals), np.int8)
    status = K.chunk_exponents(x, nvals, out)
    return status, out


@pytest.mark.parametrize("nvals", [1, 32, 64, 2048])
def test_chunk_exponents_match_numpy_twin(nvals):
    rng = np.random.default_rng(nvals)
    x = (rng.standard_normal(5000) * 2.0 ** rng.integers(-140, 120, 5000)).astype(np.float32)
    x[100:300] = 0
    x[7] = np.float32(1.4e-45)  # the smallest subnormal
    status, got = kernel_exponents(x, nvals)
    assert status == 0
    np.testing.assert_array_equal(got, quant.chunk_exponents(x, nvals))
    # 2^e > max|x| for every non-empty chunk, and -128 marks all-zero chunks
    for c, e in enumerate(got):
        m = np.abs(x[c * nvals : (c + 1) * nvals].astype(np.float64)).max()
        if m == 0:
            assert e == -128
        else:  # 2^e > m, and tight unless clamped at the int8 floor
            assert 2.0 ** int(e) > m and (m >= 2.0 ** (int(e) - 1) or e == -128)


def test_exponents_from_bits_equal_frexp_over_the_whole_float32_range():
    """The kernel reads the exponent off the maximum's bits; every binade (the
    subnormal ones too) at its bottom, middle and top gives frexp's answer."""
    k = np.arange(-149, 127)
    low = (2.0**k).astype(np.float32)
    top = np.nextafter((2.0 ** (k + 1)).astype(np.float32), np.float32(0))
    v = np.concatenate([low, (1.5 * 2.0**k).astype(np.float32), top])
    v = v[v > 0]
    status, got = kernel_exponents(v, 1)
    assert status == 0
    np.testing.assert_array_equal(got, np.maximum(np.frexp(v.astype(np.float64))[1], -128))


def test_exponent_edge_cases():
    assert kernel_exponents(np.array([np.nan], np.float32), 4)[0] == 1
    assert kernel_exponents(np.array([0, -np.inf], np.float32), 4)[0] == 1
    assert kernel_exponents(np.array([2.0**127], np.float32), 4)[0] == 2
    assert (
        kernel_exponents(np.array([np.float32(2.0**127) * np.float32(0.99)], np.float32), 4)[1][0]
        == 127
    )
    assert kernel_exponents(np.zeros(3, np.float32), 4)[1][0] == -128
    with pytest.raises(ValueError, match="NaN"):
        quant.chunk_exponents(np.array([np.nan]), 4)
    with pytest.raises(ValueError, match="2\\^127"):
        quant.chunk_exponents(np.array([2.0**127]), 4)


@pytest.mark.parametrize("w", [1, 2, 3, 7, 32])
def test_quantization_kernel_matches_twin_and_never_overflows(w):
    """_fill_data writes exactly quant.quantize's values, clamped so W of them fit int32."""
    rng = np.random.default_rng(w)
    nv = 64
    x = (rng.uniform(-1, 1, nv) * 2.0**5).astype(np.float32)
    x[0] = np.float32(2.0**5) * np.float32(1 - 2**-24)  # largest magnitude below 2^e
    x[1] = -x[0]
    e = int(quant.chunk_exponents(x, nv)[0])
    row = np.zeros(10 + 4 * nv, np.uint8)
    shared = np.array([e], np.int8)
    K._fill_data(row, np.zeros(0, np.int32), x, True, 0, nv, shared, w, float(quant.INT32_MAX // w))
    got = row[10:].view(">i4").astype(np.int64)
    want = quant.quantize(x, e, w).astype(np.int64)
    np.testing.assert_array_equal(got, want)
    assert np.abs(got).max() * w <= quant.INT32_MAX


@pytest.mark.parametrize("w", [1, 2, 4, 8, 32])
def test_error_bound_holds_on_mixed_magnitudes(w):
    rng = np.random.default_rng(100 + w)
    n, nv = 20000, 256
    xs = []
    for _ in range(w):
        mags = 2.0 ** rng.integers(-60, 60, size=n // 100 + 1).repeat(100)[:n]
        x = (rng.standard_normal(n) * mags).astype(np.float32)
        x[512:1024] = 0  # all-zero chunks
        x[2000:2256] = rng.standard_normal(256).astype(np.float32) * np.float32(1e-40)  # subnormal
        xs.append(x)
    y = quant.simulate_allreduce(xs, nv)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for c in range(0, n, nv):
        m = max(np.abs(x[c : c + nv]).max() for x in xs)
        err = np.abs(y[c : c + nv] - exact[c : c + nv])
        assert np.all(err <= quant.error_bound(m, w)), c
    np.testing.assert_array_equal(y[512:1024], 0)


def test_all_zero_chunk_scale_is_finite():
    assert np.isfinite(quant.scale(-128, 32))
    assert quant.dequantize(np.zeros(4, np.int32), -128, 3).tolist() == [0, 0, 0, 0]
