"""``python -m bench training`` (bench/training.py): a tiny run of the rack
experiment — 2 workers, a small MLP, a few steps, one repetition per backend —
checking the JSON's shape, that the two backends train the same model to the
same loss, and that the rack is gone afterwards. No timing is asserted.

Needs root and ``ip netns`` (the emulated rack of swemu/rack/) and torch;
skipped with the reason otherwise. Takes about half a minute.
"""

from __future__ import annotations

import json

import pytest

from bench import training
from swemu import rack as bc


@pytest.fixture(scope="module")
def netns() -> None:
    """Skip (with the reason) where this process may not create network namespaces."""
    why = bc.namespaces_permitted()
    if why:
        pytest.skip(f"emulated rack unavailable: {why}")


def test_time_to_loss_uses_one_target_per_world_size():
    rows = [
        {"workers": 2, "loss": [3 - 0.2 * i for i in range(10)], "step_s": [0.1] * 10},
        {"workers": 2, "loss": [3 - 0.1 * i for i in range(10)], "step_s": [0.2] * 10},
    ]
    training._time_to_loss(rows, None)  # the slower run's smoothed loss at step 8
    assert rows[0]["target_loss"] == rows[1]["target_loss"] == pytest.approx(2.5)
    assert (rows[0]["steps_to_target"], rows[1]["steps_to_target"]) == (6, 8)
    assert rows[0]["time_to_target_s"] == pytest.approx(0.3)  # steps 4-6, after the warm-up
    training._time_to_loss(rows, 0.5)  # never reached
    assert rows[0]["time_to_target_s"] is None and rows[0]["steps_to_target"] is None


def test_tiny_run_both_backends(netns, tmp_path):
    pytest.importorskip("torch")
    prefix_before = set(bc.list_namespaces())
    data = training.run(
        [2], [1.0], steps=10, hidden=256, layers=2, batch=8, reps=1, log=lambda m: None
    )
    paths = training.write_outputs(data, tmp_path, plot=False)
    assert [p.name for p in paths] == ["training.json", "training.md"]
    doc = json.loads(paths[0].read_text())
    assert set(doc) >= {"config", "code", "machine", "results", "summary"}
    assert {r["backend"] for r in doc["results"]} == {"switchml", "gloo"}
    for r in doc["results"]:
        assert r["workers"] == 2 and r["rate_gbps"] == 1.0
        assert len(r["step_s"]) == len(r["loss"]) == 10
        assert r["median_step_s"] > 0 and r["samples_per_s"] > 0
        assert 0.0 <= r["comm_share"] <= 1.0
        assert r["ideal_comm_s"] > 0 and r["comm_s"] > 0
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["steps_to_target"] is not None
    (point,) = doc["summary"]
    assert {"speedup", "step_theory", "comm_theory", "switchml", "gloo"} <= set(point)
    assert point["comm_theory"] == pytest.approx(1.0)  # 2(W-1)/W at W = 2
    # same model, data and seeds: the two backends' losses differ only by SwitchML's
    # block-floating-point rounding of the gradients (docs/protocol.md §4)
    sw, gl = (next(r for r in doc["results"] if r["backend"] == b) for b in ("switchml", "gloo"))
    assert sw["loss"][0] == pytest.approx(gl["loss"][0], abs=1e-6)  # before any update
    assert sw["final_loss"] == pytest.approx(gl["final_loss"], abs=0.02)
    assert abs(sw["accuracy"] - gl["accuracy"]) <= 0.03
    assert "| 1 | 2 |" in training.markdown(doc)
    assert set(bc.list_namespaces()) <= prefix_before  # the rack is gone
