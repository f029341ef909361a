"""The 16-bit format of docs/protocol.md §4.2: its kernels against their numpy twins,
its error bound, and whole allreduces through the switch engine in memory."""

from __future__ import annotations

import numpy as np
import pytest
from fabric import Fabric, Faults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

from swemu.protocol import wire
from swemu.protocol.worker import block16 as B
from swemu.protocol.worker import quant
from swemu.protocol.worker.protocol import WorkerProtocol

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


# ----------------------------------------------------------------- conversions
@njit
def _to_f32(h, half):
    out = np.empty(h.shape[0], np.float32)
    for i in range(h.shape[0]):
        out[i] = B.to_f32(h[i], half)
    return out


@njit
def _from_f32(f, half):
    out = np.empty(f.shape[0], np.uint16)
    for i in range(f.shape[0]):
        out[i] = B.from_f32(f[i], half)
    return out


def finite16(half: int) -> np.ndarray:
    top = 0x7C00 if half == B.HALF_FLOAT16 else 0x7F80
    return ALL16[(ALL16 & 0x7FFF).astype(np.int64) < top]


def test_every_float16_and_bfloat16_pattern_converts_exactly() -> None:
    """Each finite 16-bit pattern, normal or subnormal, reads as its value."""
    h = finite16(B.HALF_FLOAT16)
    np.testing.assert_array_equal(
        _to_f32(h, B.HALF_FLOAT16).view(np.uint32),
        h.view(np.float16).astype(np.float32).view(np.uint32),
    )
    b = finite16(B.HALF_BFLOAT16)
    np.testing.assert_array_equal(_to_f32(b, B.HALF_BFLOAT16), quant.bfloat16_values(b))


def float32_probes(rng: np.random.Generator) -> np.ndarray:
    """float32 values around every float16 and bfloat16 value (the ties between
    neighbours, a float32 ulp either side of them), across both ranges, and random."""
    out = []
    for half in (B.HALF_FLOAT16, B.HALF_BFLOAT16):
        v = _to_f32(finite16(half), half).astype(np.float64)
        v = np.sort(v)
        mid = ((v[1:] + v[:-1]) / 2).astype(np.float32)  # exact ties (float32 holds them)
        out += [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    out.append(
        (rng.standard_normal(100_000) * 2.0 ** rng.integers(-30, 18, 100_000)).astype(np.float32)
    )
    out.append(
        np.array([65504, 65519.99, 65520, 65536, 1e30, 3.4e38, -3.4e38, 0.0, -0.0], np.float32)
    )
    return np.concatenate(out)


def test_rounding_to_float16_is_numpys_and_to_bfloat16_the_twins() -> None:
    """Round to nearest, ties to even, overflow to ±inf: float16 as numpy's astype,
    bfloat16 as quant.bfloat16_bits (an independent formulation)."""
    f = float32_probes(np.random.default_rng(3))
    with np.errstate(over="ignore"):  # the values past float16's range become ±inf
        want16 = f.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(_from_f32(f, B.HALF_FLOAT16), want16)
    np.testing.assert_array_equal(_from_f32(f, B.HALF_BFLOAT16), quant.bfloat16_bits(f))


# ----------------------------------------------------------------- exponents
@pytest.mark.parametrize("half", [B.HALF_FLOAT16, B.HALF_BFLOAT16])
@pytest.mark.parametrize("nvals", [1, 64, 4096])
def test_half_exponents_match_numpy_twin(half: int, nvals: int) -> None:
    rng = np.random.default_rng(nvals + half)
    pool = finite16(half)
    pool = pool[(pool & 0x7FFF) < 0x7F00]  # below 2^127 (a bfloat16 beyond is refused)
    h = pool[rng.integers(0, pool.size, 20_000)]
    h[1000:5200] = 0  # all-zero chunks
    out = np.zeros(-(-h.size // nvals), np.int8)
    assert B.half_exponents(h, nvals, out, half) == 0
    values = _to_f32(h, half)
    np.testing.assert_array_equal(out, quant.chunk_exponents(values, nvals))


def test_half_exponents_refuse_nan_inf_and_huge() -> None:
    out = np.zeros(1, np.int8)
    assert B.half_exponents(np.array([0x7C00], np.uint16), 4, out, B.HALF_FLOAT16) == 1
    assert B.half_exponents(np.array([0xFE00], np.uint16), 4, out, B.HALF_FLOAT16) == 1
    assert B.half_exponents(np.array([0x7F80], np.uint16), 4, out, B.HALF_BFLOAT16) == 1
    assert B.half_exponents(np.array([0x7F00], np.uint16), 4, out, B.HALF_BFLOAT16) == 2  # 2^127
    assert B.half_exponents(np.array([0x7BFF], np.uint16), 4, out, B.HALF_FLOAT16) == 0
    assert out[0] == 16  # 65504 < 2^16
    proto = WorkerProtocol(num_workers=2, size_code=0)
    with pytest.raises(ValueError, match="float16 input contains NaN or Inf"):
        proto.allreduce(np.array([1.0, np.inf], np.float16), None, 0.0, values16=True)


# ----------------------------------------------------------------- the bound
def test_lanes_never_carry() -> None:
    """W values of at most 2L sum to at most 2^16 − 1 for every W, and an input just
    below 2^e quantizes to L: the switch's word sums are the lane sums."""
    for w in range(1, wire.MAX_WORKERS + 1):
        lanes = quant.offset16(w)
        assert w * 2 * lanes <= 0xFFFF and lanes == B.offset16(w)
        x = np.array([np.nextafter(np.float32(2.0**5), np.float32(0)), -(2.0**4.999)], np.float32)
        u = quant.quantize16(x, 5, w)
        assert u[0] == 2 * lanes and 0 <= u[1] <= 2 * lanes


def chunk_values(draw: st.DrawFn, n: int, dtype: str) -> np.ndarray:
    """One worker's chunk: random magnitudes over a random range (subnormals of the
    type included), a few zeros and extremes of the type."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo, hi = {"float32": (-149, 127), "float16": (-24, 16), "bfloat16": (-133, 127)}[dtype]
    top = draw(st.integers(lo + 1, hi))
    span = draw(st.integers(0, 40))
    mags = 2.0 ** rng.uniform(max(lo, top - span), top, n)
    x = rng.choice([-1.0, 1.0], n) * mags * rng.uniform(0.5, 1.0, n)
    x[rng.random(n) < 0.1] = 0.0
    if dtype == "bfloat16":
        bits = quant.bfloat16_bits(x.astype(np.float32))
        # rounding to bfloat16 may carry a value just below 2^127 up to it: the
        # largest below 2^127 instead (the format takes |x| < 2^127, §4)
        big = (bits & 0x7FFF) >= 0x7F00
        bits[big] = (bits[big] & 0x8000) | 0x7EFF
        return bits
    return np.clip(x, -np.finfo(dtype).max, np.finfo(dtype).max).astype(dtype)


# the largest finite value of each result type
_LARGEST = {
    "float32": float(np.finfo(np.float32).max),
    "float16": float(np.finfo(np.float16).max),
    "bfloat16": float(quant.bfloat16_values(np.array([0x7F7F], np.uint16))[0]),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 32),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    out=st.sampled_from([None, "float32"]),
    data=st.data(),
)
def test_error_bound_holds(w: int, dtype: str, out: str | None, data: st.DataObject) -> None:
    """|result − exact sum| ≤ quant.error_bound16 for every element, W up to 32, every
    input type, the result in the input's type or in float32; results past the
    result type's range are ±inf and only those."""
    n = 256
    xs = [chunk_values(data.draw, n, dtype) for _ in range(w)]
    bf = dtype == "bfloat16"
    y = quant.simulate_allreduce16(xs, n, out, bfloat16=bf)
    values = [quant.bfloat16_values(x) if bf else x for x in xs]
    exact = np.sum([v.astype(np.float64) for v in values], axis=0)
    m = max(float(np.abs(v.astype(np.float64)).max()) for v in values)
    result_type = out or dtype
    got = (
        quant.bfloat16_values(y).astype(np.float64)
        if result_type == "bfloat16"
        else y.astype(np.float64)
    )
    bound = quant.error_bound16(m, w, result_type)
    finite = np.isfinite(got)
    assert np.all(finite | (np.abs(exact) > _LARGEST[result_type] - bound)), "inf only past range"
    assert np.all(np.abs(got - exact)[finite] <= bound)


def test_bound_against_float16_and_bfloat16_rounding() -> None:
    """The format's quantization step, relative to the largest possible sum W·M, is
    1/L: below float16's half-ulp 2^-11 up to W = 15, and below bfloat16's 2^-8 for
    every W (docs/protocol.md §4.2's comparison)."""
    for w in range(1, 33):
        rel = quant.error_bound16(1.0, w, "float32") / w
        assert rel < 2.0**-8
        assert (rel < 2.0**-11) == (w <= 15)


# ----------------------------------------------------------------- kernels, end to end
def inputs(rng: np.random.Generator, w: int, n: int, dtype: str) -> list[np.ndarray]:
    xs = []
    for _ in range(w):
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-12, 12, n // 64 + 1).repeat(64)[:n]
        x[: n // 10] = 0
        if dtype == "bfloat16":
            xs.append(quant.bfloat16_bits(x.astype(np.float32)))
        else:
            xs.append(x.astype(dtype))
    return xs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 6),
    n=st.integers(0, 700),
    window=st.integers(1, 5),
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    loss=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernels_equal_their_twin_through_the_switch(w, n, window, dtype, loss, seed) -> None:
    """Whole allreduces on the 16-bit wire (size code 0: 64 values a packet), under
    loss: every worker's result is bit for bit quant.simulate_allreduce16's."""
    fab = Fabric(
        w, size_code=0, window=window, seed=seed, faults=Faults(loss_up=loss, loss_down=loss)
    )
    rng = np.random.default_rng(seed)
    for _ in range(2):  # the set parity continues over calls
        xs = inputs(rng, w, n, dtype)
        bf = dtype == "bfloat16"
        want = quant.simulate_allreduce16(xs, wire.values16_per_packet(0), bfloat16=bf)
        for y in fab.allreduce(xs, values16=True, bfloat16=bf):
            np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_32_workers(dtype: str) -> None:
    """The most workers a job has (L = 1023): the kernels still equal the twin."""
    w, n = 32, 300
    xs = inputs(np.random.default_rng(32), w, n, dtype)
    bf = dtype == "bfloat16"
    want = quant.simulate_allreduce16(xs, wire.values16_per_packet(0), bfloat16=bf)
    for y in Fabric(w, size_code=0, window=2).allreduce(xs, values16=True, bfloat16=bf):
        np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_tensors_on_the_32_bit_wire(dtype: str) -> None:
    """A float16/bfloat16 tensor without values16 travels as float32 does (§4): its
    result is the float32 call's, rounded to its type, and within §4's bound."""
    w, n = 3, 1000
    rng = np.random.default_rng(7)
    xs = inputs(rng, w, n, dtype)
    bf = dtype == "bfloat16"
    as32 = [quant.bfloat16_values(x) if bf else x.astype(np.float32) for x in xs]
    fab = Fabric(w, size_code=1, window=3)
    ys = fab.allreduce(xs, bfloat16=bf)
    ref = Fabric(w, size_code=1, window=3).allreduce(as32)[0]
    want = quant.bfloat16_bits(ref) if bf else ref.astype(np.float16)
    for y in ys:
        np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    # and the packets were 32-bit ones: 64 values each, no format bit
    assert fab.engine.job_counters_of(1)["aggregated"] == w * (-(-n // 64) + 3)


def test_a_16_bit_call_sets_the_format_bit_and_halves_the_packets() -> None:
    w, n = 2, 4096
    fab = Fabric(w, size_code=1, window=4)
    xs = inputs(np.random.default_rng(1), w, n, "float16")
    fab.allreduce(xs, values16=True)
    counters = fab.engine.job_counters_of(1)
    chunks = n // wire.values16_per_packet(1)  # 32 packets of 128 values each
    assert counters["aggregated"] == w * (chunks + 4)  # + the exponent window
    payload = counters["bytes_in"] - 10 * counters["pkts_in"]
    assert payload == 2 * w * (n + 4 * 128)  # 2 bytes a value


def test_a_switch_without_the_format_gets_no_progress() -> None:
    """Against a job registered without the 16-bit format the results come back with
    the format bit clear, and a 16-bit call ignores them (it must not read them as
    its own): hostlib asks for the format and falls back when it is refused."""
    fab = Fabric(1, size_code=0, window=2, value_formats=0)
    with pytest.raises(Exception, match="no result"):
        fab.allreduce([np.ones(10, np.float16)], values16=True, max_time=60.0)
