"""bench/compression.py: the Top-k and QSGD compressors against plain-numpy twins
(Top-k keeps exactly the k largest, error feedback loses nothing, QSGD is unbiased),
the byte formulas, and a tiny real run of ``python -m bench compression --quick``
(loopback, 2 workers, 8 steps, all six methods: a real emulator and real gloo).

Skipped without torch. The tiny run takes about half a minute; nothing is timed.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bench import compression as bc  # noqa: E402


# ------------------------------------------------------------------- numpy twins
def naive_topk(x: np.ndarray, k: int) -> set[int]:
    """The indices of the k largest magnitudes, by sorting."""
    return {int(i) for i in np.argsort(-np.abs(x), kind="stable")[:k]}


def naive_qsgd(x: np.ndarray, u: np.ndarray, levels: int, bucket: int) -> np.ndarray:
    """QSGD's levels with obvious loops: per bucket its L2 norm, per value
    floor(levels·|x|/norm) + (u < remainder), with x's sign."""
    q = np.zeros(len(x), dtype=np.int64)
    for start in range(0, len(x), bucket):
        chunk = x[start : start + bucket]
        norm = np.sqrt(np.sum(chunk.astype(np.float64) ** 2))
        for i, v in enumerate(chunk):
            if norm == 0:
                continue
            r = levels * abs(float(v)) / norm
            level = math.floor(r) + (u[start + i] < r - math.floor(r))
            q[start + i] = int(np.sign(v)) * min(level, levels)
    return q


# -------------------------------------------------------------------- top-k
@pytest.mark.parametrize("n,k", [(1, 1), (10, 3), (1000, 10), (4097, 41)])
def test_topk_keeps_exactly_the_k_largest(n, k):
    rng = np.random.default_rng(n)
    x = (rng.permutation(np.arange(1, n + 1)) * rng.choice([-1, 1], n)).astype(np.float32)
    idx, vals = bc.topk_compress(torch.from_numpy(x), k)
    assert idx.dtype == torch.int32 and vals.dtype == torch.float32 and len(idx) == k
    assert set(idx.tolist()) == naive_topk(x, k)
    assert np.array_equal(vals.numpy(), x[idx.numpy()])
    dense = bc.topk_decompress(idx, vals, n).numpy()
    expect = np.where(np.isin(np.arange(n), idx.numpy()), x, 0)
    assert np.array_equal(dense, expect)


def test_topk_rejects_bad_k():
    with pytest.raises(ValueError, match="k must be"):
        bc.topk_compress(torch.ones(4), 5)
    with pytest.raises(ValueError, match="1-D"):
        bc.topk_compress(torch.ones(2, 2), 1)


def test_error_feedback_sends_everything_eventually():
    """What was sent plus the residual is the sum of all gradients, at every
    step; the residual is zero where the step sent; a constant gradient has
    every entry sent within n/k steps."""
    rng = np.random.default_rng(0)
    n, k = 200, 7
    fb = bc.ErrorFeedback()
    total = np.zeros(n, dtype=np.float64)
    sent = np.zeros(n, dtype=np.float64)
    for _ in range(5):
        g = rng.standard_normal(n).astype(np.float32)
        total += g
        idx, vals = fb.compress(3, torch.from_numpy(g.copy()), k)
        assert set(idx.tolist()) == naive_topk((total - sent).astype(np.float32), k)
        sent[idx.numpy()] += vals.numpy()
        residual = fb.residual[3].numpy()
        assert np.all(residual[idx.numpy()] == 0)
        np.testing.assert_allclose(sent + residual, total, rtol=1e-5, atol=1e-5)
    fb = bc.ErrorFeedback()
    ever: set[int] = set()
    for _ in range(math.ceil(n / k)):
        idx, _ = fb.compress(0, torch.ones(n), k)
        ever |= set(idx.tolist())
    assert ever == set(range(n))


# --------------------------------------------------------------------- QSGD
@pytest.mark.parametrize("n,bucket", [(1000, 512), (512, 512), (7, 512), (3000, 100)])
def test_qsgd_matches_the_numpy_twin(n, bucket):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::5] = 0.0
    u = rng.random(n).astype(np.float32)
    q, norms = bc.qsgd_compress(torch.from_numpy(x), torch.from_numpy(u), 127, bucket)
    assert q.dtype == torch.int8 and len(q) == n
    assert norms.dtype == torch.float32 and len(norms) == math.ceil(n / bucket)
    twin = naive_qsgd(x, u, 127, bucket)
    diff = np.abs(q.numpy().astype(np.int64) - twin)
    # float32 against float64 norms can move a value sitting on a level boundary
    assert diff.max() <= 1 and np.count_nonzero(diff) <= max(1, n // 1000)
    assert np.all(q.numpy()[x == 0] == 0) and np.all(np.abs(q.numpy()) <= 127)
    dec = bc.qsgd_decompress(q, norms, 127, bucket).numpy()
    step = np.repeat(norms.numpy() / 127, bucket)[:n]
    assert np.all(np.abs(dec - x) <= step * (1 + 1e-5))  # within one level


def test_qsgd_zero_bucket_and_levels():
    q, norms = bc.qsgd_compress(torch.zeros(600), torch.rand(600), 15, 512)
    assert not q.any() and not norms.any()
    assert not bc.qsgd_decompress(q, norms, 15, 512).any()
    with pytest.raises(ValueError, match="levels"):
        bc.qsgd_compress(torch.ones(4), torch.rand(4), 128)
    with pytest.raises(ValueError, match="uniform"):
        bc.qsgd_compress(torch.ones(4), torch.rand(5))


@pytest.mark.parametrize("levels", [1, 4, 127])
def test_qsgd_is_unbiased(levels):
    """The mean of the decoded values over many seeds is x, within 5 standard
    errors of a value's rounding (at most a level's width / 2 per draw); a
    round-down or round-to-nearest quantizer is off by up to half a level."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1000, generator=g)
    draws = 2000
    acc = torch.zeros(1000, dtype=torch.float64)
    for _ in range(draws):
        q, norms = bc.qsgd_compress(x, torch.rand(1000, generator=g), levels, 256)
        acc += bc.qsgd_decompress(q, norms, levels, 256).double()
    mean = (acc / draws).numpy()
    width = np.repeat(
        [float(torch.linalg.vector_norm(x[i : i + 256])) / levels for i in range(0, 1000, 256)],
        256,
    )[:1000]
    assert np.all(np.abs(mean - x.double().numpy()) <= 5 * (width / 2) / math.sqrt(draws))
    rounded = np.round(x.numpy() / width) * width  # what a biased quantizer gives
    assert np.abs(rounded - x.numpy()).max() > 10 * (width / 2).max() / math.sqrt(draws)


# ---------------------------------------------------------------- accounting
def test_byte_formulas_and_models():
    assert bc.ring_allreduce_bytes(1000, 4) == 1500  # 2(W-1)/W
    assert bc.ring_allreduce_bytes(1000, 2) == 1000
    assert bc.ring_allgather_bytes(80, 4) == 240  # (W-1)
    m = bc.Model.parse("2048x3@16")
    assert (m.hidden, m.layers, m.batch, m.name) == (2048, 3, 16, "2048x3@16")
    assert m.params == 4_743_178  # bench/TRAINING.md's model
    assert bc.Model.parse("512x4").batch == 16
    for bad in ("2048", "ax3@16", "64x1@8"):
        with pytest.raises(ValueError, match="model"):
            bc.Model.parse(bad)


def test_run_rejects_bad_options():
    with pytest.raises(ValueError, match="unknown method"):
        bc.run(["lo"], [bc.Model(8, 2, 1)], methods=["gzip"])
    with pytest.raises(ValueError, match="steps"):
        bc.run(["lo"], [bc.Model(8, 2, 1)], steps=5)


# ----------------------------------------------------------------- a real run
def test_quick_run_all_methods(tmp_path):
    """``python -m bench compression --quick``: every method trains the same model
    from the same weights, and each sends what its algorithm says."""
    from bench.__main__ import main

    assert main(["compression", "--quick", "--no-plot", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "compression.json").read_text())
    rows = {r["method"]: r for r in doc["results"]}
    assert set(rows) == set(bc.METHODS)
    w = doc["config"]["workers"]
    params = rows["gloo"]["params"]
    grad = 4 * params
    for r in rows.values():
        assert r["site"] == "lo" and r["workers"] == w == 2
        assert r["median_step_s"] > 0 and r["sent_bytes_per_step"] > 0
        assert all(math.isfinite(v) for v in r["loss"]) and math.isfinite(r["final_loss"])
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["wire_tx_bytes_per_step"] is None  # loopback: no per-worker link
        # the same weights and data: the first step's loss is the same everywhere
        assert r["loss"][0] == pytest.approx(rows["gloo"]["loss"][0], abs=1e-6)
    sent = {m: r["sent_bytes_per_step"] for m, r in rows.items()}
    assert sent["gloo"] == bc.ring_allreduce_bytes(grad, w)
    assert sent["fp16"] == pytest.approx(sent["gloo"] / 2)
    k = math.ceil(bc.TOPK_RATIO * params)  # one bucket: the model is 0.27 MB
    assert sent["topk"] == bc.ring_allgather_bytes(k * (4 + 4), w)
    assert sent["qsgd"] == bc.ring_allgather_bytes(params + 4 * math.ceil(params / 512), w)
    assert 0 < sent["powersgd"] < sent["gloo"] / 4
    sw = rows["switchml"]["switch"]
    timed = doc["config"]["steps"] - doc["config"]["timed_from"]
    assert sw["calls"] == timed and sw["bytes"] == grad * timed
    packet = 10 + 4 * 2048  # size code 6 on the emulator
    chunks = math.ceil(params / 2048)
    assert sw["packets"] == timed * (chunks + min(63, chunks))  # + the exponent window

    # every packet once, plus the retransmissions, averaged over the ranks (sw is
    # rank 0's: a loaded machine makes ranks retransmit differently)
    def resent(method: str, packets: int) -> float:
        extra = sent[method] * timed / packet - packets
        assert extra >= 0 and extra * w == pytest.approx(round(extra * w), abs=1e-6), method
        return extra

    resent("switchml", sw["packets"])
    # 16 bits a value (docs/protocol.md §4.2): twice the values a packet, every call
    # a 16-bit one, from float32 buckets (SWITCHML_VALUES16) or fp16's float16 ones
    chunks16 = math.ceil(params / 4096)
    for m in ("switchml16", "switchml-fp16"):
        s16 = rows[m]["switch"]
        assert s16["values16"] == s16["calls"] == timed, m
        assert s16["packets"] == timed * (chunks16 + min(63, chunks16)), m
        resent(m, s16["packets"])
    assert sent["bf16"] == pytest.approx(sent["gloo"] / 2)
    assert rows["qsgd"]["codec_s_per_step"] > 0 and rows["topk"]["codec_s_per_step"] > 0
    table = (tmp_path / "compression.md").read_text()
    assert all(f"| {m} |" in table for m in bc.METHODS)
    merged = bc.merge([doc, doc])
    assert len(merged["results"]) == 2 * len(bc.METHODS)
    assert {s["reps"] for s in merged["summary"]} == {2}
