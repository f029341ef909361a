"""hostlib.torch: DDP gradients through a real emulator, checked against gloo.

Everything runs in real processes: an emulator (``EmulatorProcess``), worker
processes that join it and a gloo process group, and ``examples/train_digits.py``
started as ``switchml run`` starts it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hostlib.pytest_plugin import run_workers  # noqa: E402
from hostlib.quant import error_bound, error_bound16  # noqa: E402
from swemu.launch import EmulatorProcess, Watched, child_env, run  # noqa: E402
from swemu.protocol import wire  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parent.parent
PACKET_SIZE = 3  # 256 values a chunk: the 10k-value buckets below span many chunks
F32_EPS = 2.0**-24  # unit roundoff of float32 (round to nearest)
SMALLEST = float(np.finfo(np.float32).smallest_subnormal)


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess() as emu:
        yield emu


@pytest.fixture(scope="module")
def hook_results(emulator, tmp_path_factory):
    import torch_workers

    store = tmp_path_factory.mktemp("gloo") / "store"
    return run_workers(
        emulator.switch,
        emulator.control,
        2,
        torch_workers.hook_vs_gloo,
        str(store),
        packet_size=PACKET_SIZE,
        timeout=240,  # generous: only a hang should fail here
    )


def _chunk_max(inputs: list[np.ndarray], nvals: int) -> np.ndarray:
    """Per element: max|x| over its chunk and over all workers (the M of error_bound)."""
    m = np.max([np.abs(x) for x in inputs], axis=0)
    starts = np.arange(0, m.size, nvals)
    return np.repeat(np.maximum.reduceat(m, starts), nvals)[: m.size].astype(np.float64)


def _buckets(results: list[dict], dtype: str, kind: str) -> list[list[dict]]:
    """Bucket logs of each rank (rank-major) for one dtype and one hook."""
    return [r[dtype][kind] for r in results]


def test_import_hostlib_does_not_import_torch():
    code = "import sys, hostlib; assert 'torch' not in sys.modules, 'torch was imported'"
    run([sys.executable, "-c", code], env=child_env(), timeout=60)


def test_hook_matches_gloo_within_the_quantization_bound(hook_results):
    """float32 buckets: the hook's average equals gloo's within, per element,
    ``error_bound(M, W) / W + 2^-24·M`` with M the max|g| of the element's chunk
    (256 values of the bucket, docs/protocol.md §4) over both workers: the switch's
    sum is within ``error_bound`` of the exact sum, halving is exact (W = 2), and
    gloo's own float32 average is within ``2^-24·M`` of the exact one."""
    w, nvals = 2, wire.values_per_packet(PACKET_SIZE)
    gloo, sw = (
        _buckets(hook_results, "float32", "gloo"),
        _buckets(hook_results, "float32", "switchml"),
    )
    assert len(sw[0]) >= 1 and len(sw[0]) == len(gloo[0])
    assert hook_results[0]["float32"]["stats"]["calls"] == len(sw[0])
    worst = 0.0
    for b in range(len(sw[0])):
        inputs = [sw[r][b]["input"] for r in range(w)]
        for r in range(w):  # both runs saw the same local gradients: the comparison is fair
            np.testing.assert_array_equal(gloo[r][b]["input"], inputs[r])
        assert inputs[0].size > 20 * nvals
        assert not np.array_equal(inputs[0], inputs[1])
        m = _chunk_max(inputs, nvals)
        tol = error_bound(m, w) / w + F32_EPS * m + SMALLEST
        exact = (inputs[0].astype(np.float64) + inputs[1]) / w
        h, g = sw[0][b]["output"], gloo[0][b]["output"]
        assert np.all(np.abs(h - g) <= tol), f"bucket {b}: max excess {np.max(np.abs(h - g) - tol)}"
        assert np.all(np.abs(h - exact) <= error_bound(m, w) / w + SMALLEST)
        worst = max(worst, float(np.max(np.abs(h - g) / np.maximum(tol, SMALLEST))))
        # every rank gets the very same bytes, so the replicas stay identical
        assert sw[1][b]["output"].tobytes() == h.tobytes()
    assert worst <= 1.0
    # DDP wrote the hook's averages into .grad: the same on both ranks, close to gloo's
    g0, g1 = (r["float32"]["switchml_grads"] for r in hook_results)
    assert g0.tobytes() == g1.tobytes()
    gg = hook_results[0]["float32"]["gloo_grads"]
    assert np.allclose(g0, gg, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(
        np.sort(np.concatenate([e["output"] for e in sw[0]])), np.sort(g0)
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_buckets_round_trip(hook_results, dtype):
    """fp16/bf16 buckets go through the hook from their own memory as 16-bit values
    (docs/protocol.md §4.2) and come back in their own type: each value is within
    the 16-bit format's bound for that type, halved with the average (plus half a
    float16 subnormal step for the division)."""
    w, nvals = 2, wire.values16_per_packet(PACKET_SIZE)
    res = hook_results[0][dtype]
    assert res["grad_dtype"] == f"torch.{dtype}"
    assert res["stats"]["bytes"] == 2 * sum(e["input"].size for e in res["switchml"])
    sw = _buckets(hook_results, dtype, "switchml")
    for b in range(len(sw[0])):
        inputs = [sw[r][b]["input"] for r in range(w)]
        m = _chunk_max(inputs, nvals)
        exact = (inputs[0].astype(np.float64) + inputs[1]) / w
        h = sw[0][b]["output"]
        tol = error_bound16(m, w, dtype) / w + 2.0**-25
        assert np.all(np.abs(h - exact) <= tol)
        assert np.count_nonzero(h) > 0.9 * h.size
        # the result is representable in the half type (it was converted back)
        back = torch.from_numpy(h).to(getattr(torch, dtype)).float().numpy()
        np.testing.assert_array_equal(back, h)
        assert sw[1][b]["output"].tobytes() == h.tobytes()
    assert hook_results[0][dtype]["switchml_grads"].tobytes() == (
        hook_results[1][dtype]["switchml_grads"].tobytes()
    )


def test_nonfinite_on_one_rank_reaches_every_rank(hook_results):
    for r in hook_results:
        assert np.isnan(r["nonfinite"]["overflowed"]).all()
        np.testing.assert_array_equal(r["nonfinite"]["finite"], np.full(300, 0.375, np.float32))


def test_allreduce_tensor_staging_paths(emulator):
    """Tensors that cannot be viewed as a contiguous float32 array (a transposed
    view, float64) go through a staging copy and land back in place, in their
    own dtype; non-floating tensors are refused before anything is sent."""
    import hostlib
    from hostlib.torch import allreduce_tensor_

    base = torch.arange(96 * 3, dtype=torch.float64).reshape(96, 3) / 7 - 20
    m = float(base.abs().max())
    tol = float(error_bound(m, 1)) + F32_EPS * m  # float64 -> float32 costs 2^-24·M
    with hostlib.connect(emulator.switch, emulator.control, world_size=1, packet_size=0) as ctx:
        t = base.float().t()
        assert not t.is_contiguous()
        assert allreduce_tensor_(ctx, t) is t
        assert float((t - base.t()).abs().max()) <= tol
        d = base.clone()
        allreduce_tensor_(ctx, d, average=False)
        assert d.dtype == torch.float64
        assert float((d - base).abs().max()) <= tol
        with pytest.raises(TypeError, match="floating"):
            allreduce_tensor_(ctx, torch.ones(3, dtype=torch.int32))


def test_allreduce_tensor_16_bit_paths(emulator):
    """float32 with values16, float16 and bfloat16 tensors: from their own memory onto
    the 16-bit wire (docs/protocol.md §4.2), the twin's result, in place."""
    import hostlib
    from hostlib.quant import bfloat16_bits, simulate_allreduce16
    from hostlib.torch import allreduce_tensor_

    x = (torch.linspace(-3, 3, 5000) ** 3).contiguous()
    nvals = wire.values16_per_packet(0)
    with hostlib.connect(emulator.switch, emulator.control, world_size=1, packet_size=0) as ctx:
        t = x.clone()
        allreduce_tensor_(ctx, t, values16=True)
        assert ctx.last_stats["values16"] == 1
        np.testing.assert_array_equal(t.numpy(), simulate_allreduce16([x.numpy()], nvals))
        h = x.half()
        allreduce_tensor_(ctx, h, average=False)
        assert h.dtype == torch.float16 and ctx.last_stats["values16"] == 1
        want = simulate_allreduce16([x.half().numpy()], nvals)
        np.testing.assert_array_equal(h.numpy(), want)
        b = x.bfloat16()
        allreduce_tensor_(ctx, b)
        bits = x.bfloat16().view(torch.int16).numpy().view(np.uint16)
        want = simulate_allreduce16([bits], nvals, bfloat16=True)
        np.testing.assert_array_equal(b.view(torch.int16).numpy().view(np.uint16), want)
        np.testing.assert_array_equal(bits, bfloat16_bits(x.bfloat16().float().numpy()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(emulator, out: Path, steps: int, timeout: float) -> dict:
    """``examples/train_digits.py --comm switchml,gloo`` as 2 ranks, with the
    environment ``switchml run`` sets; its JSON report."""
    port = _free_port()
    session = int.from_bytes(os.urandom(7), "little") | 1
    procs = []
    for rank in range(2):
        env = child_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            SWITCHML_SWITCH=emulator.switch,
            SWITCHML_CONTROL=emulator.control,
            SWITCHML_SESSION_ID=str(session),
            SWITCHML_PACKET_SIZE="6",
            SWITCHML_WINDOW="128",
            SWITCHML_NO_PROGRESS="20",
        )
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "train_digits.py"),
            *("--comm", "switchml,gloo", "--steps", str(steps), "--hidden", "128"),
            *("--master-port", str(port), "--json", str(out)),
        ]
        procs.append(Watched(cmd, name=f"rank {rank}", stdout=subprocess.STDOUT, env=env))
    try:
        # a rank that fails ends the wait at once (its peer would wait for it)
        Watched.wait_all(procs, timeout, "the two ranks to train")
    finally:
        for p in procs:
            p.close()
    return json.loads(out.read_text())


def test_training_through_switchml_matches_gloo(emulator, tmp_path):
    pytest.importorskip("sklearn")  # the example's data set (the torch extra brings it)
    """300 DDP steps of the digits MLP (hidden width 128) with W = 2, gradients
    averaged through the emulator and then through gloo (same processes, same seeds
    and batches): the final test accuracies differ by at most 2 percentage points
    (9 of the 450 test images), and both reach 90 %. The SwitchML average differs
    from gloo's by about float32 rounding (block floating point with 31-bit
    mantissas), far below the noise of SGD, so the two runs may drift apart slowly
    but must not diverge."""
    steps = 300
    results = _train(emulator, tmp_path / "digits.json", steps, timeout=300)
    sw, gl = results["switchml"], results["gloo"]
    assert sw["steps"] == gl["steps"] == steps and sw["workers"] == gl["workers"] == 2
    # the gradients really went through the switch: one hook call per bucket per step
    assert sw["hook_calls_per_step"] >= 1 and sw["hook_bytes_per_step"] >= 4 * sw["params"]
    assert sw["switchml"]["session_id"] is not None
    assert sw["replica_max_diff"] == 0.0 and gl["replica_max_diff"] == 0.0
    assert sw["test_accuracy"] >= 0.9 and gl["test_accuracy"] >= 0.9
    assert abs(sw["test_accuracy"] - gl["test_accuracy"]) <= 0.02
    assert 0 < sw["comm_share"] < 1 and 0 < gl["comm_share"] < 1
