"""Smoke tests of the benchmark harness (the benchmarks themselves never run in CI)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from swemu.protocol import fastio


@pytest.mark.skipif(not fastio.AVAILABLE, reason="needs recvmmsg/sendmmsg (64-bit Linux)")
def test_switch_benchmark_smoke():
    from bench.switch import run

    res = run(workers=2, size_code=0, window=8, reps=1, seconds=0.2)
    assert res["agg_pps"] > 0 and res["echo_pps"] > 0 and res["ratio"] > 0


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_allreduce_benchmark_smoke(tmp_path, dtype):
    pytest.importorskip("torch")
    from bench.allreduce import run, write_outputs

    data = run([2], [64 << 10], [3], reps=2, log=lambda m: None, dtype=dtype)
    assert data["dtype"] == dtype
    methods = {r["method"] for r in data["results"]}
    assert methods == {"switchml-3", "switchml-3-new", "gloo", "ps"}
    assert all(r["median_s"] > 0 for r in data["results"])
    # every method's first call was checked against the exact sum, and was right
    assert all(r["verified"] is True for r in data["results"])
    # CPU per call: the workers always use some; the switch only serves SwitchML
    for r in data["results"]:
        assert r["cpu_workers_s"] > 0
        assert r["cpu_s"] >= r["cpu_workers_s"]
    sw = next(r for r in data["results"] if r["method"] == "switchml-3")
    assert sw["cpu_switch_s"] > 0
    gloo = next(r for r in data["results"] if r["method"] == "gloo")
    assert gloo["ratio_to_gloo"] == 1.0 and gloo["cpu_ratio_to_gloo"] == 1.0
    assert gloo["paired_ratio_to_gloo"] == 1.0
    assert all(r["paired_ratio_to_gloo"] > 0 for r in data["results"])
    paths = write_outputs(data, tmp_path)
    assert json.loads(paths[0].read_text())["results"]
    table = paths[1].read_text()
    assert "| switchml-3 |" in table and "| ok |" in table and f"dtype {dtype}" in table
    if importlib.util.find_spec("matplotlib") is None:
        assert len(paths) == 2  # the plot is skipped, the results are written
    else:
        assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_allreduce_benchmark_compares_windows_side_by_side():
    """``windows``: each code's job once per window (0: the library's default),
    each a method of its own, each with its own window, all checked."""
    pytest.importorskip("torch")
    from bench.allreduce import run

    data = run([2], [64 << 10], [3], reps=1, log=lambda m: None, forms=["out"], windows=[0, 8])
    methods = {r["method"] for r in data["results"]}
    assert methods == {"switchml-3", "switchml-3w8", "gloo", "ps"}
    assert data["windows"] == [0, 8]
    assert all(r["verified"] is True for r in data["results"])
    with pytest.raises(ValueError, match="windows"):
        run([2], [64 << 10], [3], reps=1, windows=[-1])


def test_calls_benchmark_times_the_entry_points_of_each_tree(tmp_path):
    """``bench calls``: per tree (here this one, and this one again as a
    ``--tree``, each in a process of its own) the µs of each entry point, and
    the compiled functions with the most parameters (the records keep them few)."""
    from bench.calls import ROOT, markdown, run

    data = run(rounds=1, trees=[ROOT], calls=20)
    assert [r["tree"] for r in data["results"]] == [str(ROOT), str(ROOT)]
    for r in data["results"]:
        assert set(r["per_call_us"]) == {
            "emulator drain",
            "worker pump",
            "worker wait",
            "worker call",
        }
        assert all(v > 0 for v in r["per_call_us"].values())
        most = r["signatures"][0][1]
        assert most <= 10 and r["kernels"] > 30, r["signatures"]
    assert "| `swemu.serving.loops.drain` |" in markdown(data)


def test_allreduce_benchmark_quiet_and_loaded(tmp_path):
    """``neighbour="both"``: every method measured quiet and with the CPU-bound
    neighbour, each checked in both, with the loaded/quiet ratio in the report;
    gloo's calls leave the emulator stopped (no switch CPU)."""
    pytest.importorskip("torch")
    from bench.allreduce import markdown, run

    data = run([2], [64 << 10], [6], reps=2, log=lambda m: None, neighbour="both", forms=["out"])
    rows = {(r["load"], r["method"]): r for r in data["results"]}
    assert set(rows) == {
        (ld, m) for ld in ("quiet", "loaded") for m in ("switchml-6", "gloo", "ps")
    }
    assert all(r["verified"] is True for r in rows.values())
    assert rows[("loaded", "switchml-6")]["loaded_over_quiet"] > 0
    assert rows[("quiet", "gloo")]["cpu_switch_s"] == pytest.approx(0.0, abs=2e-3)
    assert len(data["loadavg_start"]) == 3
    table = markdown(data)
    assert "| loaded / quiet |" in table and "| loaded |" in table and "neighbour: both" in table


def test_neighbour_and_stopped_processes():
    """The neighbour burns CPU only while loaded; ``stopped`` freezes a process."""
    import os
    import time

    from bench.allreduce import Neighbour, _cpu_seconds, stopped

    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc")
    with Neighbour() as nb:
        time.sleep(0.3)  # started stopped: the interpreter's start-up at most
        a = nb.cpu_seconds()
        time.sleep(0.2)
        assert nb.cpu_seconds() == a
        nb.load(True)
        time.sleep(0.3)
        b = nb.cpu_seconds()
        assert b > a
        with stopped([nb.proc.pid]):
            c = nb.cpu_seconds()
            time.sleep(0.2)
            assert nb.cpu_seconds() - c < 0.01
        time.sleep(0.2)
        assert nb.cpu_seconds() > c
        pid = nb.proc.pid
    assert _cpu_seconds([pid]) is None  # gone


def test_gloo_baseline_smoke():
    """`python -m bench gloo-baseline` at a tiny size: every variant measured."""
    pytest.importorskip("torch")
    from bench.gloo_baseline import VARIANTS, markdown, run

    data = run(workers=2, nbytes=64 << 10, code=3, rounds=2, log=lambda m: None, matrix=False)
    names = [r["variant"] for r in data["rows"]]
    assert names == [*VARIANTS, "switchml-3"]
    assert all(r["median_s"] > 0 for r in data["rows"])
    assert data["inplace_max_abs"] > 0
    assert "| own+fresh+stopped |" in markdown(data)


def test_benchmark_worker_flags_a_wrong_result():
    """The check the benchmark workers run is the one that fails on a wrong sum."""
    from swemu.protocol.worker import testdata

    n = 3 * 4096
    y = 3 * testdata.worker_input(0, n, 0, "int32")  # W = 2: 1 * base + 2 * base
    assert testdata.check_result(y, 2, 0, 256)[0]
    y[5] += 1
    assert not testdata.check_result(y, 2, 0, 256)[0]


def test_cpu_accounting_reads_proc():
    import os

    from bench.allreduce import _cpu_seconds, _descendants

    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc")
    assert os.getpid() in _descendants(os.getpid())
    a = _cpu_seconds([os.getpid()])
    sum(i * i for i in range(300_000))
    b = _cpu_seconds([os.getpid()])
    assert a is not None and b > a
    assert _cpu_seconds([2**22 + 12345]) is None  # no such process


def test_decode_benchmark_smoke(tmp_path):
    """`python -m bench decode` on a small capture: every stage saw every packet."""
    from bench.decode import make_capture, markdown, run
    from swemu.observe.decode import MULTICAST, RETRANSMISSION, UNICAST, timeline
    from swemu.observe.pcap import read_pcap

    path = tmp_path / "c.pcap"
    n = make_capture(path, 1 << 20, size_code=0, workers=3, loss_every=10)
    kinds = [e.kind for e in timeline(read_pcap(path))]
    assert len(kinds) == n and {MULTICAST, RETRANSMISSION, UNICAST} <= set(kinds)
    data = run(1 << 20, 0, 3, 10, log=lambda m: None)
    by = {r["what"]: r for r in data["results"]}
    assert by["parse (batches)"]["result"] == by["parse (packets)"]["result"] == data["packets"]
    assert by["decode"]["result"] == data["packets"]
    assert by["first rows (| head)"]["result"] == 11
    assert all(r["mb_per_s"] > 0 for r in data["results"])
    # CPU next to wall time: in this process for the parsers, in the child for the command
    for r in data["results"]:
        assert r["cpu_s"] == pytest.approx(r["cpu_self_s"] + r["cpu_children_s"])
        assert r["cpu_per_wall"] == pytest.approx(r["cpu_s"] / r["seconds"])
    assert by["decode"]["cpu_self_s"] > 0 and by["decode"]["cpu_children_s"] == 0
    assert by["switchml-emu decode > /dev/null"]["cpu_children_s"] > 0
    table = markdown(data)
    assert "| what | seconds | CPU s | CPU / wall |" in table and "| decode |" in table


def test_soak_benchmark_smoke():
    """Consecutive jobs against one emulator with its default options: every job
    is freed by its workers, and the table has every RSS sample."""
    from bench.soak import markdown, run

    data = run(jobs=4, workers=2, size=4096, every=2, log=lambda m: None)
    assert [s["jobs"] for s in data["rss"]] == [0, 2, 4]
    assert all(s["rss"] > 0 for s in data["rss"])
    assert data["live_jobs_at_end"] == 0 and data["released"]["explicit"] == 4
    assert "| 4 |" in markdown(data)


def test_overlap_benchmark_smoke(tmp_path, capsys):
    """``python -m bench overlap`` at toy sizes: every mode timed on every step,
    the table printed, the JSON and markdown written."""
    pytest.importorskip("torch")
    from bench.__main__ import main
    from bench.overlap import MODES

    argv = ["overlap", "--hidden", "64", "--layers", "2", "--batch", "4", "--steps", "1"]
    argv += ["--rounds", "2", "--bucket-mb", "0.01", "--link-gbps", "0", "--out", str(tmp_path)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| overlap on |" in table and "| overlap off |" in table
    assert "overlap off / on:" in table
    data = json.loads((tmp_path / "overlap.json").read_text())
    assert [r["mode"] for r in data["rows"]] == ["forward", *MODES]
    assert all(r["steps"] == 2 and r["median_s"] > 0 for r in data["rows"])
    assert data["buckets"] >= 2 and data["ratio_off_on"] > 0
    assert (tmp_path / "overlap.md").read_text().strip() == table.strip()


def test_the_paired_ratio_cancels_a_drift_that_the_ratio_of_medians_keeps():
    """The machine is slow (1.5x) in repetitions 1-2 and in repetition 3 until
    just after the method's call: the method is 0.9x gloo in every repetition
    but one, and the paired ratio says 0.9, while the ratio of the medians
    takes a slow call of the method against a fast one of gloo's (1.35)."""
    import statistics

    from bench.allreduce import paired_ratio

    gloo = [{"time": 0.100 * f} for f in (1.5, 1.5, 1.0, 1.0, 1.0)]
    method = [{"time": 0.090 * f} for f in (1.5, 1.5, 1.5, 1.0, 1.0)]
    assert paired_ratio(method, gloo) == pytest.approx(0.9)
    medians = statistics.median(c["time"] for c in method) / statistics.median(
        c["time"] for c in gloo
    )
    assert medians == pytest.approx(1.35)
    with pytest.raises(ValueError):
        paired_ratio(method[:4], gloo)


@pytest.mark.slow
def test_restart_benchmark_smoke():
    """``bench restart``: one SIGKILL under a running 2-worker job; the job
    goes on (every result right) and the restart's costs are measured."""
    from bench import restart

    data = restart.run(workers=2, size=1 << 20, rounds=1)
    assert data["wrong"] == 0
    (r,) = data["restarts"]
    assert r["job_lost_s"] is not None and r["job_lost_s"] >= r["emulator_start_s"] > 0
    assert "| 1 |" in restart.markdown(data)
