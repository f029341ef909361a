"""The scale model (swemu.model): closed forms, monotonicity, topology, overlap,
the fast SwitchML model against the packet-level reference on our real engines,
the loopback model, calibration files and the command line.

Closed forms used below (S bytes per worker, n workers, B bytes/s per link):

* SwitchML, one switch, no loss, a window that fills the link: every worker's
  uplink carries ``S · (1 + h)`` bytes, h = (10 + 28 + 38) / payload (SwitchML
  header, IPv4 + UDP, Ethernet framing); downlinks carry the same multicast
  stream in parallel, so ``T ≈ S · (1 + h) / B + RTT`` (plus one packet time).
* Ring: 2(n − 1) steps of one ``S / n`` segment each: ``T = 2(n − 1)/n · S · f / B
  + 2(n − 1) · α``, f the TCP framing factor.
* Parameter server, unchunked, servers ≤ n: the push round keeps each server's
  downlink busy with ``n · S / servers`` bytes, then the pull round its uplink:
  ``T = 2 · n · S · f / (servers · B) + 2 · (α + RTT / 2)``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import switchml
from swemu import model as sim
from swemu.model import calibrate

MiB = 1 << 20


def lossless(values: int = 64, window: int | None = None, **kw) -> sim.SwitchMLConfig:
    return sim.SwitchMLConfig(values_per_packet=values, window=window, **kw)


# ------------------------------------------------------------ closed forms
@pytest.mark.parametrize(("gbps", "values"), [(10, 64), (100, 64), (100, 256), (400, 1024)])
def test_switchml_lossless_is_bandwidth_plus_rtt(gbps, values):
    net = sim.Network(gbps=gbps, rtt=10e-6)
    nbytes = 64 * MiB
    r = sim.switchml_allreduce(nbytes, 8, net, lossless(values), is_float=False)
    h = sim.switchml_overhead(values)
    expected = nbytes * (1 + h) / net.bytes_per_s + net.rtt
    assert r.time == pytest.approx(expected, rel=2e-3)
    assert h == pytest.approx((10 + 28 + 38) / (4 * values))


def test_wire_bytes_account_for_every_header():
    assert sim.switchml_wire_bytes(64) == 256 + 10 + 8 + 20 + 14 + 4 + 8 + 12
    assert sim.tcp_wire_factor(1500) == pytest.approx(1538 / 1448)


def test_float32_adds_one_exponent_window():
    net = sim.Network(gbps=100)
    cfg = lossless(64, window=100)
    f = sim.switchml_allreduce(MiB, 4, net, cfg, is_float=True).detail["packets_per_worker"]
    i = sim.switchml_allreduce(MiB, 4, net, cfg, is_float=False).detail["packets_per_worker"]
    assert (i, f) == (MiB // 256, MiB // 256 + 100)


@pytest.mark.parametrize("n", [2, 8, 64])
def test_ring_closed_form(n):
    net = sim.Network(gbps=25)
    cfg = sim.RingConfig(alpha=30e-6)
    nbytes = 100 * MiB
    r = sim.ring_allreduce(nbytes, n, net, cfg)
    f = sim.tcp_wire_factor(cfg.mtu)
    expected = 2 * (n - 1) / n * nbytes * f / net.bytes_per_s + 2 * (n - 1) * cfg.alpha
    assert r.time == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("n", "servers"), [(8, 1), (8, 4), (16, 16)])
def test_ps_unchunked_closed_form(n, servers):
    net = sim.Network(gbps=10, rtt=20e-6)
    cfg = sim.PSConfig(servers=servers, alpha=15e-6)
    nbytes = 32 * MiB
    r = sim.ps_allreduce(nbytes, n, net, cfg)
    f = sim.tcp_wire_factor(cfg.mtu)
    expected = 2 * n * nbytes * f / (servers * net.bytes_per_s) + 2 * (cfg.alpha + net.rtt / 2)
    assert r.time == pytest.approx(expected, rel=1e-9)


def test_ps_chunking_overlaps_push_and_pull():
    net = sim.Network(gbps=10)
    nbytes, n = 32 * MiB, 8
    whole = sim.ps_allreduce(nbytes, n, net, sim.PSConfig(servers=1)).time
    chunked = sim.ps_allreduce(nbytes, n, net, sim.PSConfig(servers=1, chunk=256 << 10)).time
    one_way = n * nbytes * sim.tcp_wire_factor() / net.bytes_per_s
    assert whole == pytest.approx(2 * one_way, rel=1e-3)
    assert one_way < chunked < 1.02 * one_way


# ------------------------------------------------------------ monotonicity
def test_more_loss_is_never_faster():
    net = sim.Network(gbps=100)
    times = [
        sim.switchml_allreduce(
            16 * MiB, 16, net, lossless(64, loss=p, timeout=1e-3, seed=7), is_float=False
        ).time
        for p in (0.0, 1e-5, 1e-4, 1e-3, 1e-2)
    ]
    assert all(a <= b for a, b in itertools.pairwise(times)), times
    assert times[-1] > 2 * times[0]


def test_bigger_window_is_not_slower_until_the_link_is_full():
    net = sim.Network(gbps=100, rtt=10e-6)
    cfg = lossless(64)
    fill = sim.pool_to_fill(8, net, cfg)
    windows = [1, 2, 4, 8, 16, 32, 64, 128, 256, fill, 2 * fill, 4 * fill]
    times = [
        sim.switchml_allreduce(4 * MiB, 8, net, lossless(64, window=k), is_float=False).time
        for k in sorted(windows)
    ]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(times)), times
    full = times[-1]
    assert times[sorted(windows).index(fill)] == pytest.approx(full, rel=1e-3)
    # window-bound below: one packet per slot per round trip
    assert times[0] > 50 * full


def test_slow_host_or_switch_becomes_the_bottleneck():
    net = sim.Network(gbps=100)
    nbytes, n = 8 * MiB, 8
    pkts = nbytes // 256
    host = sim.switchml_allreduce(nbytes, n, net, lossless(64, host_cost=2e-6), is_float=False)
    assert host.time == pytest.approx(pkts * 2e-6, rel=0.01)
    sw = sim.switchml_allreduce(nbytes, n, net, lossless(64, switch_pps=1e6), is_float=False)
    assert sw.time == pytest.approx(pkts * n / 1e6, rel=0.01)


# -------------------------------------------------------------- topology
@pytest.mark.parametrize("n", [1, 5, 32])
def test_tree_with_one_rack_is_the_single_switch(n):
    single = sim.Network(gbps=100, rtt=8e-6)
    tree = sim.Network(gbps=100, rtt=8e-6, rack_size=n, spine_rtt=5e-6)
    assert tree.racks(n) == 1
    for cfg in (lossless(64), lossless(256, switch_pps=5e7, host_cost=1e-7)):
        a = sim.switchml_allreduce(2 * MiB, n, single, cfg).time
        b = sim.switchml_allreduce(2 * MiB, n, tree, cfg).time
        assert a == b
    assert sim.ring_allreduce(MiB, n, single).time == sim.ring_allreduce(MiB, n, tree).time
    assert sim.ps_allreduce(MiB, n, single).time == sim.ps_allreduce(MiB, n, tree).time


def test_switchml_time_is_constant_as_workers_are_added():
    cfg = lossless(256)
    base = sim.switchml_allreduce(32 * MiB, 2, sim.Network(gbps=100), cfg).time
    for n in (8, 64, 1024):
        net = sim.Network(gbps=100, rack_size=32 if n > 32 else None)
        t = sim.switchml_allreduce(32 * MiB, n, net, cfg).time
        assert t == pytest.approx(base, rel=0.01)
    ring = [sim.ring_allreduce(32 * MiB, n, sim.Network(gbps=100)).time for n in (2, 8, 64)]
    assert ring[0] < ring[1] < ring[2]


def test_framing_is_what_the_link_counts():
    """tbf counts an IP packet and its Ethernet header only: 14 bytes of framing."""
    assert sim.switchml_wire_bytes(2048, framing=14) == 8192 + 10 + 28 + 14
    net = sim.Network(gbps=1, framing=14)
    r = sim.switchml_allreduce(64 * MiB, 8, net, lossless(2048, window=64), is_float=False)
    assert r.detail["wire_bytes_per_packet"] == 8244
    assert r.time == pytest.approx(64 * MiB / 8192 * 8244 / net.bytes_per_s, rel=2e-3)
    with pytest.raises(ValueError, match="framing"):
        sim.Network(framing=-1)


def test_racks_prediction_is_calibrated_on_the_one_switch():
    """swemu.model.racks: the host cost fitted on the one switch's measurement
    reproduces it; a tree whose uplinks keep up (1:1, 4:1 with racks of 4) then
    predicts the one switch's time, a slower uplink (8:1) twice it, and the ring
    its 2(W-1)/W over links that carry the same headers."""
    from swemu.model.racks import RackRun, fit_host_cost, predict

    run = RackRun(0.25, 8, 4, 1.0, 64 * MiB, 2048, 47)
    links = run.switchml(0.0, two_level=False)
    assert fit_host_cost(run, 0.9 * links) == 0.0  # faster than the links: nothing to fit
    measured = 1.2 * links
    p = predict(run, measured)
    assert p.host_cost > 0 and p.one_switch == pytest.approx(measured, rel=1e-6)
    assert p.fabric == pytest.approx(measured, rel=0.01)
    assert p.links_only == pytest.approx(links, rel=0.01)
    four = predict(replace(run, oversubscription=4.0), measured)
    assert four.fabric == pytest.approx(measured, rel=0.01)
    eight = predict(replace(run, oversubscription=8.0), links)
    assert eight.fabric == pytest.approx(2 * links, rel=0.02)
    assert p.ring / p.links_only == pytest.approx(1.75 * (9014 / 8948) / (8244 / 8192), rel=0.01)


def test_racks_command_predicts_beside_a_cluster_json(tmp_path):
    """`switchml simulate racks FILE`: the prediction beside a saved
    `switchml cluster run --racks` JSON (here made from records, no namespaces)."""
    from swemu import rack as bc

    s, rate = 64 * MiB, 0.25
    recs = [
        bc.Record(
            0, rate, 8, s, m, t, 1.0, True, 0.0, 0, {"rackup0_bytes": b, "rackdown0_bytes": b}, o
        )
        for o in (1.0, 4.0)
        for m, t, b in (("switchml", 2.3, 1.01 * s), ("ring", 4.0, 1.77 * s), ("flat", 2.25, 0))
    ]
    config = bc.BenchConfig(
        rates_gbps=(rate,), workers=(8,), racks=2, oversubscriptions=(1.0, 4.0), sizes=(s,)
    )
    path = tmp_path / "racks.json"
    bc.write_json(path, config, recs, bc.summarize(recs))
    r = CliRunner().invoke(switchml, ["simulate", "racks", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "| 0.25 Gb/s | 0.25 Gb/s (4:1) | 8 | 64 MiB | 2300 (1000) |" in r.output
    assert "| 1.01 / 1.01 | 1.77 / 1.77 | 2250 (-2%) / " in r.output  # calibrated on the flat 2250
    one = tmp_path / "one.json"
    bc.write_json(one, bc.BenchConfig(), recs[:1], bc.summarize(recs[:1]))
    r = CliRunner().invoke(switchml, ["simulate", "racks", str(one)])
    assert r.exit_code != 0 and "one rack" in r.output


# --------------------------------------------------------------- overlap
def test_compute_bound_iteration_is_the_compute_time():
    model = sim.resnet50()
    it = sim.iteration_time(model, lambda nbytes: 0.0)
    assert it.time == pytest.approx(model.compute, rel=1e-12)
    assert it.exposed == pytest.approx(0.0, abs=1e-12)


def test_overlap_hides_communication_behind_backward():
    model = sim.vgg19()
    plan = sim.buckets(model, 25 << 20)
    assert sum(b for b, _ in plan) == model.nbytes
    small = sim.iteration_time(model, lambda nbytes: 1e-6)
    # only the last bucket (the first layers, ready at the very end) is exposed
    assert model.compute < small.time <= model.compute + 1e-6 * (1 + 1e-9)
    # communication-bound: the channel is busy from the first bucket to the end
    slow = sim.iteration_time(model, lambda nbytes: nbytes / 1e8)
    fwd = model.compute / 3
    first_ready = fwd + model.compute * 2 / 3 * sum(
        x.flops for x in model.layers[plan[0][1] :]
    ) / sum(x.flops for x in model.layers)
    assert slow.time == pytest.approx(first_ready + model.nbytes / 1e8, rel=1e-9)


def test_paper_model_sizes():
    sizes = {m.name: m.params for m in sim.paper_models()}
    assert sizes["ResNet-50"] == pytest.approx(25.6e6, rel=0.005)
    assert sizes["VGG-19"] == pytest.approx(143.7e6, rel=0.001)
    assert sizes["BERT-base"] == pytest.approx(110e6, rel=0.01)
    assert 300e6 < sizes["LSTM-LM"] < 900e6


# ------------------------------------------ fast model vs packet-level model
@pytest.mark.parametrize(
    ("workers", "window", "host_cost", "switch_pps"),
    [(4, 8, 0.0, math.inf), (3, 32, 2e-6, 2e6), (2, 4, 0.0, 1e6)],
)
def test_fast_model_equals_packet_level_reference_without_loss(
    workers, window, host_cost, switch_pps
):
    net = sim.Network(gbps=10, rtt=10e-6)
    cfg = lossless(256, window=window, host_cost=host_cost, switch_pps=switch_pps)
    ref = sim.switchml_reference(64 << 10, workers, net, cfg)
    fast = sim.switchml_allreduce(64 << 10, workers, net, cfg, is_float=False)
    assert ref.detail["retransmissions"] == 0
    assert fast.time == pytest.approx(ref.time, rel=1e-9)


def test_fast_model_tracks_the_reference_under_loss():
    net = sim.Network(gbps=10, rtt=10e-6)
    ref, fast = [], []
    for seed in range(5):
        cfg = lossless(256, window=16, loss=0.02, timeout=300e-6, seed=seed)
        r = sim.switchml_reference(64 << 10, 4, net, cfg, seed=seed)
        assert r.detail["retransmissions"] > 0
        ref.append(r.time)
        fast.append(sim.switchml_allreduce(64 << 10, 4, net, cfg, is_float=False).time)
    base = sim.switchml_allreduce(64 << 10, 4, net, lossless(256, window=16), is_float=False)
    assert np.mean(fast) > base.time
    assert np.mean(fast) == pytest.approx(np.mean(ref), rel=0.25)


# ------------------------------------------------------------- loopback
CAL = calibrate.Calibration(
    switch_kernel=2e-6,
    switch_call=10e-6,
    host_kernel=10e-6,
    host_call=8e-6,
    send=6e-6,
    recv=4e-6,
    wakeup=10e-6,
)


def test_loopback_is_cpu_bound_and_slows_with_background_load():
    kw = {"nbytes": 4 * MiB, "size_code": 6, "window": 128}
    one = sim.simulate_loopback(CAL, workers=1, cores=2, **kw)
    pkts = one.detail["packets_per_worker"]
    # the worker's own CPU is a lower bound; one core for everything an upper one
    assert one.time >= one.detail["cpu_worker"]
    assert one.time <= one.detail["cpu_worker"] + one.detail["cpu_switch"] + 1e-3
    assert one.detail["cpu_worker"] >= pkts * (CAL.host_kernel + CAL.send + CAL.recv)
    two = sim.simulate_loopback(CAL, workers=2, cores=2, **kw)
    busy = sim.simulate_loopback(CAL, workers=2, cores=2, background=3, **kw)
    assert one.time < two.time < busy.time
    # with W + 1 processes on fewer cores, total CPU / cores bounds the time
    total = two.detail["cpu_switch"] + 2 * two.detail["cpu_worker"]
    assert two.time >= total / 2 * 0.99


def test_loopback_retransmits_when_round_trips_exceed_the_timeout():
    kw = {"nbytes": 2 * MiB, "size_code": 6, "window": 128, "workers": 4, "cores": 1}
    calm = sim.simulate_loopback(CAL, **kw)
    short = sim.simulate_loopback(CAL, timing=sim.LoopbackTiming(timeout=2e-3), **kw)
    assert calm.detail["retransmissions"] == calm.detail["first_call_retransmissions"] == 0
    # the first call resends needlessly and is slower; its duplicate results raise
    # the timeout floor (hostlib's spurious-timeout rule), so the next call is calm
    assert short.detail["first_call_retransmissions"] > 0
    assert short.detail["first_call"] > calm.detail["first_call"]
    assert short.detail["retransmissions"] < short.detail["first_call_retransmissions"] / 10
    assert short.time < short.detail["first_call"]
    # no backoff and a timeout far below the round trip: a retransmission storm
    with pytest.raises(RuntimeError, match="no end"):
        sim.simulate_loopback(CAL, timing=sim.LoopbackTiming(timeout=1e-4, max_timeout=1e-4), **kw)


# ------------------------------------------------------------ calibration
def test_calibration_file_round_trip(tmp_path, monkeypatch):
    monkeypatch.delenv("SWITCHML_CALIBRATION", raising=False)
    assert calibrate.load(tmp_path / "missing.json") is calibrate.DEFAULT
    path = calibrate.save(CAL, tmp_path / "sub" / "cal.json")
    assert calibrate.load(path) == CAL
    monkeypatch.setenv("SWITCHML_CALIBRATION", str(path))
    assert calibrate.load() == CAL
    assert CAL.shard_pps == pytest.approx(1 / CAL.switch_packet)
    assert CAL.shard_pps_kernel_only > CAL.shard_pps


def test_per_call_and_per_packet_costs_are_split_from_two_runs():
    call, pkt = 2e-6, 1e-7
    runs = [(c * call + n * pkt, c, n) for c, n in ((10, 640), (640, 640))]
    assert calibrate._split(runs) == (pytest.approx(call), pytest.approx(pkt))
    # noise that would make a cost negative is attributed to the other one
    assert calibrate._split([(1e-3, 10, 640), (0.5e-3, 640, 640)]) == (0.0, 0.5e-3 / 640)
    assert calibrate._split([(1e-5, 10, 640), (1e-3, 640, 640)]) == (pytest.approx(1e-6), 0.0)


def test_calibrate_measures_our_kernels():
    # the default repeats: one pair of runs is a differential measurement that a
    # noisy moment may push to the documented zero (a per-packet cost of 0.1 µs
    # against 7 µs per call at this size); the best of three is what users get
    cal = calibrate.calibrate(workers=2, size_code=3, window=16, nbytes=1 << 18, in_situ=False)
    for name in ("switch_kernel", "host_kernel", "send", "recv"):
        assert getattr(cal, name) > 0, name  # CPU was spent; how much is bench's business
    for name in ("switch_call", "host_call", "wakeup"):
        assert math.isfinite(getattr(cal, name)), name
    assert cal.extra["packets_per_worker"] == (1 << 18) // 1024 + 16


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_in_situ_factors_come_from_a_real_run():
    # 8 MiB: enough of the emulator's CPU to span several clock ticks of /proc (10 ms)
    fs, fh = calibrate.measure_in_situ(CAL, workers=2, nbytes=8 << 20, iters=2)
    # measured CPU over the model's charge: positive and finite (their size is a
    # measurement, reported by `switchml simulate check`, not asserted here)
    assert all(0 < f < math.inf for f in (fs, fh)), (fs, fh)
    faster = replace(CAL, switch_in_situ=2.0, host_in_situ=2.0)
    kw = {"workers": 2, "nbytes": MiB}
    assert sim.simulate_loopback(faster, **kw).time > sim.simulate_loopback(CAL, **kw).time


# --------------------------------------------------------- command line
def test_what_if_command(tmp_path):
    out = tmp_path / "w.json"
    cal = tmp_path / "cal.json"
    calibrate.save(CAL, cal)
    r = CliRunner().invoke(
        switchml,
        ["simulate", "--calibration", str(cal), "what-if", "--params", "25.6M",
         "--gbps", "10,100", "--workers", "8", "--json", str(out)],
        catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert [row["gbps"] for row in rows] == [10.0, 100.0]
    for row in rows:
        assert set(row["times_ms"]) == {"switchml", "ring", "ps"}
        assert row["pool_to_fill"] >= 1
        assert row["shards"] == math.ceil(row["switch_pps"] / CAL.shard_pps)
    assert rows[1]["pool_to_fill"] > rows[0]["pool_to_fill"]


def test_allreduce_command_and_bad_params():
    r = CliRunner().invoke(
        switchml,
        ["simulate", "allreduce", "--params", "resnet50", "--gbps", "100"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0 and "switchml" in r.output and "ring" in r.output
    r = CliRunner().invoke(switchml, ["simulate", "allreduce", "--params", "lots"])
    assert r.exit_code == 2 and "not a parameter count" in r.output


def test_speedup_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    rows = sim.reproduction(gbps=(10.0,), models=[sim.resnet50()])
    assert 1.0 < rows[0]["sml64_speedup"] < rows[0]["sml256_speedup"] < 2 * 7 / 8 + 1e-9
    path = tmp_path / "speedup.png"
    sim.plot_speedup(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ResNet-50" in sim.reproduction_markdown(rows)


def test_check_command_compares_a_report(tmp_path):
    report = {
        "workers": 2,
        "size": 1 << 20,
        "dtype": "float32",
        "packet_size": 6,
        "window": 128,
        "iters": [{"time": t, "retransmissions": 0} for t in (0.010, 0.012, 0.011)],
    }
    src, out, cal = tmp_path / "run.json", tmp_path / "check.json", tmp_path / "cal.json"
    src.write_text(json.dumps(report))
    calibrate.save(CAL, cal)
    r = CliRunner().invoke(
        switchml,
        ["simulate", "--calibration", str(cal), "check", "--from-json", str(src),
         "--json", str(out)],
        catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    assert res["measured"] == 0.011 and res["background"] == 0.0
    assert res["error_idle"] == pytest.approx(res["predicted_idle"] / 0.011 - 1)
    assert "predicted" in r.output
