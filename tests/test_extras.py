"""cli.extras: a missing optional package is named, with its extra, before a long
command starts; results are written before any plot is tried.

A package is made missing by ``sys.modules[name] = None``: ``find_spec`` then
finds nothing and ``import name`` raises ImportError, as on a machine without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.extras import MissingExtra, available, explain, require
from cli.main import switchml


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_the_extra(monkeypatch):
    hide(monkeypatch, "matplotlib")
    assert not available("matplotlib") and available("numpy")
    with pytest.raises(MissingExtra) as info:
        require("matplotlib", "plotting")
    assert info.value.format_message() == (
        'plotting needs matplotlib: pip install "switchml-emu[bench]"'
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        assert explain(exc, "plotting") == info.value.format_message()
    else:
        pytest.fail("matplotlib imported although hidden")


def refuse_to_start(monkeypatch):
    """Fail the test instead of building a rack, should the check let the run start."""
    import swemu.rack as bc

    def no(*args, **kwargs):
        raise AssertionError("the run started although a package it needs is missing")

    monkeypatch.setattr(bc, "run_benchmark", no)
    monkeypatch.setattr("cli.cluster._need_root", no)


@pytest.mark.parametrize(
    ("hidden", "words"),
    [
        (("torch",), 'needs torch: pip install "switchml-emu[torch]"'),
        (("matplotlib",), "needs matplotlib: pip install \"switchml-emu[bench]\" (or --plot ''"),
    ],
)
def test_cluster_run_checks_before_it_starts(monkeypatch, hidden, words):
    if "torch" not in hidden and not available("torch"):
        pytest.skip("the matplotlib check comes after the torch check")
    refuse_to_start(monkeypatch)
    hide(monkeypatch, *hidden)
    r = CliRunner(catch_exceptions=False).invoke(switchml, ["cluster", "run"])
    assert r.exit_code == 1, r.output
    assert words in r.output


def test_cluster_run_without_a_plot_needs_no_matplotlib(monkeypatch):
    if not available("torch"):
        pytest.skip("needs torch to get past the first check")
    started = []
    import swemu.rack as bc

    def stop(*args, **kwargs):
        started.append(True)
        raise bc.ClusterError("stopped by the test")

    monkeypatch.setattr(bc, "run_benchmark", stop)
    monkeypatch.setattr("cli.cluster._need_root", lambda: None)
    hide(monkeypatch, "matplotlib")
    r = CliRunner(catch_exceptions=False).invoke(switchml, ["cluster", "run", "--plot", ""])
    assert started and "stopped by the test" in r.output


def allreduce_data() -> dict:
    row = {
        "workers": 2,
        "bytes": 1 << 20,
        "method": "gloo",
        "median_s": 0.01,
        "goodput_gbps": 0.8,
        "ratio_to_gloo": 1.0,
        "cpu_s": 0.02,
        "cpu_ratio_to_gloo": 1.0,
        "verified": True,
    }
    return {
        "dtype": "float32",
        "cpus": 2,
        "reps": 1,
        "results": [row],
        "memory": {
            "emulator_rss_start": 1 << 20,
            "emulator_rss_end": 1 << 20,
            "largest_tensor_bytes": 1 << 20,
            "worker_peak_0": 1 << 20,
        },
    }


def test_bench_results_are_written_before_the_plot(monkeypatch, tmp_path: Path, capsys):
    from bench.allreduce import write_outputs

    hide(monkeypatch, "matplotlib")
    paths = write_outputs(allreduce_data(), tmp_path)
    assert [p.name for p in paths] == ["allreduce.json", "allreduce.md"]
    assert json.loads(paths[0].read_text())["results"][0]["method"] == "gloo"
    assert "| gloo |" in paths[1].read_text()
    assert not (tmp_path / "allreduce.png").exists()
    err = capsys.readouterr().err
    assert 'warning: no plot: plotting needs matplotlib: pip install "switchml-emu[bench]"' in err
