"""Smoke tests of the benchmark harness (the benchmarks themselves never run in CI)."""

from __future__ import annotations

import json

import pytest

from swemu import fastio


@pytest.mark.skipif(not fastio.AVAILABLE, reason="needs recvmmsg/sendmmsg (64-bit Linux)")
def test_switch_benchmark_smoke():
    from bench.switch import run

    res = run(workers=2, size_code=0, window=8, reps=1, seconds=0.2)
    assert res["agg_pps"] > 0 and res["echo_pps"] > 0 and res["ratio"] > 0


def test_allreduce_benchmark_smoke(tmp_path):
    pytest.importorskip("torch")
    from bench.allreduce import run, write_outputs

    data = run([2], [64 << 10], [3], reps=1, log=lambda m: None)
    methods = {r["method"] for r in data["results"]}
    assert methods == {"switchml-3", "gloo", "ps"}
    assert all(r["median_s"] > 0 for r in data["results"])
    gloo = next(r for r in data["results"] if r["method"] == "gloo")
    assert gloo["ratio_to_gloo"] == 1.0
    paths = write_outputs(data, tmp_path)
    assert json.loads(paths[0].read_text())["results"]
    assert "| switchml-3 |" in paths[1].read_text()
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
