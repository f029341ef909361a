"""hostlib.tensorflow (Horovod's API on SwitchML) under the real ``switchml run``.

One ``switchml run --workers 3 -- python tests/tensorflow_worker.py OUT`` launch
(the CLI starts a real emulator; TensorFlow's import dominates the time, so one
launch does every check) writes each rank's report; the tests below read them.
Rank 0 also trains the single-process references with plain Keras.

Tolerance of the training comparisons: weights within ``ATOL`` of one process
trained on the concatenated batches. Per step, the averaged gradient differs
from the single process's by at most the switch's bound over W,
``M·(W/(2^31−1) + 2^−24)`` ≈ 6·10^−8·M (docs/protocol.md §4, M the largest
|gradient| of a chunk, here below 1), plus float32 rounding of summing one batch
of W·B rows against W batches of B rows (a few ulp of the gradient); times the
learning rate (0.1), over 8 steps, plus one rounding of each update (an ulp of
|w| < 1, 6·10^−8), that is a few 10^−7. ``ATOL = 1e-5`` leaves room for the
network to amplify it over the steps; the fit test also checks that rank 0
trained on its own batches alone lands more than 100·ATOL away, so that a
reduction that did nothing would fail.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="needs the tensorflow extra (pip install .[tensorflow])")

from swemu.launch import child_env, run

pytestmark = pytest.mark.tensorflow
HERE = Path(__file__).resolve().parent
WORKER = HERE / "tensorflow_worker.py"
W = 3
ATOL = 1e-5
SWITCHML = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf")
    cmd = [*SWITCHML, "run", "--workers", str(W), "--", sys.executable, str(WORKER), str(out)]
    proc = subprocess.run(
        cmd,
        env=child_env(TF_CPP_MIN_LOG_LEVEL="2"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE.parent,
    )
    assert proc.returncode == 0, f"switchml run exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(W)]


def weights(blobs: list[str]) -> np.ndarray:
    return np.concatenate([np.frombuffer(base64.b64decode(b), np.float32) for b in blobs])


def test_import_hostlib_does_not_import_tensorflow():
    code = "import sys, hostlib; sys.exit('tensorflow' in sys.modules or 'keras' in sys.modules)"
    run([sys.executable, "-c", code], env=child_env(), timeout=120)


def test_use_before_init_is_a_clear_error(ranks):
    for r in ranks:
        assert r["before_init"]["type"] == "NotInitializedError"  # a ValueError, as Horovod's
        assert "hvd.init()" in r["before_init"]["message"]
        assert r["initialized_before"] is False


def test_init_reads_the_job_from_switchml_run(ranks):
    assert [r["hvd_rank"] for r in ranks] == list(range(W))
    for r in ranks:
        assert r["initialized"] and r["size"] == W
        assert r["local_size"] == W and r["local_rank"] == r["hvd_rank"]
        assert r["initialized_after_shutdown"] is False


def test_float32_sum_and_average_within_the_switch_bound(ranks):
    for r in ranks:
        f = r["float32"]
        assert f["sum_dtype"] == "float32"
        assert f["sum_excess"] <= 1.0 and f["avg_excess"] <= 1.0, f
        # inside a tf.function: the same call, the same bytes
        assert f["function_digest"] == f["sum_digest"]
    assert len({r["float32"]["sum_digest"] for r in ranks}) == 1


def test_int32_sum_and_average_are_exact(ranks):
    for r in ranks:
        assert r["int32"]["sum_exact"] and r["int32"]["avg_exact"]
    assert len({r["int32"]["digest"] for r in ranks}) == 1


def test_grouped_allreduce_keeps_each_tensors_type(ranks):
    for r in ranks:
        g = r["grouped"]
        assert g["dtypes"] == ["float16", "int32", "float64"]
        assert g["int32_exact"]
        assert g["switch_calls"] == 3  # one a wire type: float32 (float64), float16, int32
        assert g["switch_dtypes"] == ["float16", "float32", "int32"]
        assert g["float16_excess"] <= 1.0 and g["float64_excess"] <= 1.0, g
        assert "int32" in r["int64_error"] and "int64" in r["int64_error"]


def test_horovod_fp16_compression_sends_16_bit_values(ranks):
    """compression=hvd.Compression.fp16: one switch call of float16 values (16 bits
    a value on the wire, docs/protocol.md §4.2), the twin's sum, back in float32;
    a bfloat16 tensor likewise."""
    for r in ranks:
        c = r["compression_fp16"]
        assert c["dtype"] == "float32" and c["twin"], c
        assert c["switch_dtypes"] == ["float16", "bfloat16"], c
        assert c["bfloat16_dtype"] == "bfloat16" and c["bfloat16_twin"], c


def test_broadcast_is_bit_exact(ranks):
    """NaN, −0.0, ±Inf and subnormal float32, 6 bytes of float16, int64 beyond
    2^32, bool and float64: the root's bytes on every rank, eagerly and inside a
    tf.function."""
    for r in ranks:
        assert r["broadcast_variables"] == r["broadcast_variables_root"]
        assert r["broadcast_variables_calls"] == 1  # five variables, four dtypes: fused
        assert r["broadcast"] == [r["broadcast_root"]] * 2


def test_fit_matches_one_process_on_the_concatenated_batches(ranks):
    fits = [r["fit"] for r in ranks]
    ref = ranks[0]["reference"]
    # the replicas are bit-identical, though each rank built its model from another seed
    assert len({f["digest"] for f in fits}) == 1
    for f in fits:
        assert f["optimizer"] == "SGD" and f["iterations"] == 8
        # one broadcast, one fused call per step (4 gradient tensors), one per epoch's logs
        assert f["switch_calls"] == 1 + 8 + 2
        assert f["jit_compile"] is False  # compiled with True: the callbacks turned XLA off
        # MetricAverageCallback: the epoch losses are the ranks' average, which is
        # the loss of the concatenated batches
        np.testing.assert_allclose(f["loss"], ref["loss"], rtol=1e-5)
    got, want = weights(fits[0]["weights"]), weights(ref["weights"])
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    # the comparison has power: training on rank 0's batches alone lands far away
    assert np.abs(weights(ref["alone"]) - want).max() > 100 * ATOL


def test_distributed_gradient_tape_in_a_custom_loop(ranks):
    tapes = [r["tape"] for r in ranks]
    assert all(t["switch_calls"] == 4 for t in tapes)  # one fused call per step
    assert len({t["digest"] for t in tapes}) == 1
    want = weights(ranks[0]["reference"]["tape"])
    np.testing.assert_allclose(weights(tapes[0]["weights"]), want, rtol=0, atol=ATOL)


def test_the_horovod_keras_example_checks_its_replicas_and_says_so():
    """``examples/horovod_keras.py --check`` under ``switchml run``: rank 0
    prints the verdict; TensorFlow's early absl lines (oneDNN's notice, which
    TF_CPP_MIN_LOG_LEVEL does not reach) are not passed on when the user did
    not ask for TensorFlow's INFO lines."""
    env = child_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    example = HERE.parent / "examples" / "horovod_keras.py"
    cmd = [*SWITCHML, "run", "--workers", "2", "--", sys.executable, str(example)]
    proc = subprocess.run(
        [*cmd, "--epochs", "1", "--check"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "[rank0]: check passed: all 2 ranks hold the same weights, bit for bit" in proc.stdout
    assert "absl::InitializeLog" not in proc.stderr and "oneDNN" not in proc.stderr, proc.stderr
