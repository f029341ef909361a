"""The emulated rack (``swemu/rack/``, ``switchml cluster``): a real smoke run
in network namespaces, and proof that every namespace, veth, bridge and process
it creates is gone afterwards — after success, an error, SIGTERM and a kill.

Needs root and ``ip netns``; skipped with the reason otherwise. Bounded: the
whole module takes well under a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import switchml
from cli.terminal import CLIError
from swemu import rack as bc
from swemu.launch import Watched, child_env

SWITCHML = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]


@pytest.fixture(scope="module")
def netns() -> None:
    """Skip (with the reason) where this process may not create network namespaces."""
    why = bc.namespaces_permitted()
    if why:
        pytest.skip(f"emulated rack unavailable: {why}")


def test_cli_help_and_validation_need_no_root():
    r = CliRunner().invoke(switchml, ["cluster", "--help"], catch_exceptions=False)
    assert r.exit_code == 0 and "run" in r.output and "--cleanup" in r.output
    r = CliRunner().invoke(switchml, ["cluster", "run", "--help"], catch_exceptions=False)
    for opt in ("--rates", "--workers", "--sizes", "--reps", "--methods"):
        assert opt in r.output
    r = CliRunner().invoke(switchml, ["cluster", "run", "--mtu", "1500"], standalone_mode=False)
    assert isinstance(r.exception, CLIError) and "MTU" in str(r.exception)
    r = CliRunner().invoke(switchml, ["cluster", "run", "--subnet", "8.8.8"], standalone_mode=False)
    assert isinstance(r.exception, CLIError) and "private" in str(r.exception)


def test_ideal_times_follow_the_traffic_each_link_carries():
    s, b = 64 << 20, 1.0  # 64 MiB over 1 Gbit/s
    t = 8 * s / 1e9
    assert bc.ideal_time("switchml", 4, s, b) == pytest.approx(t)
    assert bc.ideal_time("ring", 4, s, b) == pytest.approx(1.5 * t)
    assert bc.ideal_time("ps", 4, s, b) == pytest.approx(3 * t)
    # the speedup theory of the paper: 2(W-1)/W over ring
    for w in (2, 4, 8):
        ratio = bc.ideal_time("ring", w, s, b) / bc.ideal_time("switchml", w, s, b)
        assert ratio == pytest.approx(2 * (w - 1) / w)


def test_rack_is_removed_after_an_error(netns):
    prefix = bc.default_prefix()
    with pytest.raises(RuntimeError, match="boom"), bc.Rack(2, prefix=prefix) as rack:
        rack.shape(bc.Shaping(0.5))
        assert set(bc.leftovers(prefix)) == {rack.switch_ns, rack.worker_ns(0), rack.worker_ns(1)}
        sleeper = rack.popen(rack.worker_ns(0), ["sleep", "60"])
        raise RuntimeError("boom")
    assert bc.leftovers(prefix) == []
    assert sleeper.poll() is not None


def test_smoke_switchml_and_ring_on_shaped_links(netns):
    """2 workers, 0.5 Gbit/s, 1 MiB, one rep: results exact/within bound, the traffic
    crossed the shaped links at no more than their rate, nothing is left behind."""
    pytest.importorskip("torch")  # the rack's workers use torch.distributed
    prefix = bc.default_prefix()
    config = bc.BenchConfig(
        rates_gbps=(0.5,),
        workers=(2,),
        sizes=(1 << 20,),
        reps=1,
        methods=("switchml", "ring"),
        prefix=prefix,
        step_timeout=30.0,
    )
    records = bc.run_benchmark(config)
    assert bc.leftovers(prefix) == []
    assert sorted(r.method for r in records) == ["ring", "switchml"]
    burst = bc.Shaping(0.5).burst_bytes(config.mtu)
    for r in records:
        assert r.ok, r
        assert r.counters["busiest_link_bytes"] >= 1 << 20  # it really went over the links
        # the token bucket lets at most one bucket through faster than the rate
        assert r.time >= ((1 << 20) - 2 * burst) * 8 / 0.5e9, r
        assert 0.0 <= r.counters["machine_busy"] <= 1.0
    rows = bc.summarize(records)
    assert "| 0.5 Gb/s | 2 | 1 MiB |" in bc.markdown_table(rows)


def _python_pids(ns: str) -> list[int]:
    """The Python processes inside the namespace ``ns`` (none if it is gone)."""
    pids = []
    for pid in bc.netns_pids(ns):
        try:
            if b"python" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:  # exited meanwhile
            pass
    return pids


def test_sigterm_removes_the_rack_and_its_processes(netns, tmp_path):
    pytest.importorskip("torch")  # `switchml cluster run` refuses to start without it
    out = tmp_path / "r.json"
    argv = [*SWITCHML, "cluster", "run", "--rates", "0.5", "--workers", "2", "--sizes", "1Mi"]
    argv += ["--reps", "1000", "--methods", "ring", "--json", str(out), "--plot", ""]
    with Watched(argv, name="switchml cluster run", env=child_env()) as proc:
        prefix = f"swml{proc.pid}-"
        wanted = [f"{prefix}sw", f"{prefix}w0", f"{prefix}w1"]

        def inside() -> list[int]:
            # the emulator is serving and every worker has been started: a Python
            # process in each namespace (not a tc or ip helper run there while the
            # rack is set up, which once ended this wait with one pid)
            running = {ns: _python_pids(ns) for ns in wanted}
            return [p for pids in running.values() for p in pids] if all(running.values()) else []

        try:
            # generous: with a cold Numba cache the rack's emulator compiles first
            pids = proc.wait_until(inside, 120, "the rack's emulator and workers")
            assert len(pids) >= 3, pids
            proc.send_signal(signal.SIGTERM)
            proc.wait(30, "it to stop on SIGTERM")
        finally:
            if proc.poll() is None:
                proc.kill()
                bc.cleanup_leftovers()
        err = proc.stderr()
        assert proc.returncode == 128 + signal.SIGTERM, proc.report()
    assert "Traceback" not in err and "the rack was removed" in err
    assert bc.leftovers(prefix) == []
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


def test_cleanup_removes_only_dead_runs(netns):
    dead = subprocess.Popen(["true"])
    dead.wait()
    dead_prefix = f"swml{dead.pid}-"
    live_prefix = bc.default_prefix()
    subprocess.run(["ip", "netns", "add", f"{dead_prefix}sw"], check=True)
    subprocess.run(["ip", "netns", "add", f"{live_prefix}sw"], check=True)
    logs = tempfile.mkdtemp(prefix=f"swml-cluster-{dead.pid}-")
    try:
        r = CliRunner().invoke(switchml, ["cluster", "--cleanup"], catch_exceptions=False)
        assert r.exit_code == 0
        assert bc.leftovers(dead_prefix) == []
        assert not os.path.exists(logs)
        assert bc.leftovers(live_prefix) == [f"{live_prefix}sw"]  # its owner is alive
    finally:
        subprocess.run(["ip", "netns", "del", f"{live_prefix}sw"], check=False)
        subprocess.run(["ip", "netns", "del", f"{dead_prefix}sw"], capture_output=True)
    assert bc.leftovers(live_prefix) == []


def test_results_json_roundtrip(tmp_path):
    """The artefacts from records alone (no namespaces): JSON, table, plot."""
    recs = [
        bc.Record(0, 1.0, w, 1 << 20, m, t, bc.ideal_time(m, w, 1 << 20, 1.0), True, 0.0, 0)
        for w in (2, 4)
        for m, t in (("switchml", 0.02), ("ring", 0.03), ("ps", 0.05))
    ]
    rows = bc.summarize(recs)
    path = tmp_path / "c.json"
    bc.write_json(path, bc.BenchConfig(), recs, rows)
    doc = json.loads(path.read_text())
    assert len(doc["records"]) == 6
    sp = {s["workers"]: s for s in doc["speedups"]}
    assert sp[4]["vs_ring"] == pytest.approx(1.5) and sp[4]["vs_ring_theory"] == pytest.approx(1.5)
    pytest.importorskip("matplotlib")
    bc.plot_speedup(rows, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_ideal_times_across_racks_follow_the_busiest_uplink():
    s, b = 64 << 20, 0.25
    t = 8 * s / (b * 1e9)
    for over in (1.0, 4.0):  # racks of 4: the uplink at 4B/over carries S (fabric), 1.75 S (ring)
        kw = {"hosts": 4, "oversubscription": over}
        assert bc.ideal_time("switchml", 8, s, b, **kw) == pytest.approx(t)
        assert bc.ideal_time("ring", 8, s, b, **kw) == pytest.approx(1.75 * t)
        assert bc.ideal_time("flat", 8, s, b, **kw) == pytest.approx(t)
    # 8:1, the uplink at B/2: the fabric's S and the ring's 1.75 S take twice as long
    assert bc.ideal_time("switchml", 8, s, b, hosts=4, oversubscription=8) == pytest.approx(2 * t)
    assert bc.ideal_time("ring", 8, s, b, hosts=4, oversubscription=8) == pytest.approx(3.5 * t)
    # rank 0's rack uplink brings the other rack's 4 tensors to the parameter server
    assert bc.ideal_time("ps", 8, s, b, hosts=4, oversubscription=8) == pytest.approx(8 * t)
    # W inside one rack: no uplink on the way
    assert bc.ideal_time("ring", 4, s, b, hosts=4, oversubscription=8) == pytest.approx(1.5 * t)


def test_racks_topology_routes_and_shapes(netns):
    """Two racks of two, a root and the flat switch: the addresses, every host
    reaches the others across the racks and its own switch, the root reaches each
    rack's switch (where a child's uplink socket lives), and each link direction
    is shaped at its rate (the uplinks at hosts × rate / oversubscription)."""
    prefix = bc.default_prefix()

    def reach(ns: str, src: str, dst: str) -> bool:
        code = (
            "import socket\ns = socket.socket()\ns.settimeout(5)\ns.bind((%r, 0))\n"
            "try:\n    s.connect((%r, 9))\nexcept ConnectionRefusedError:\n    pass\n"
        ) % (src, dst)
        return (
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code]).returncode == 0
        )

    def rate(ns: str, dev: str) -> float:
        out = subprocess.run(
            ["tc", "-j", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True
        ).stdout
        (tbf,) = [q for q in json.loads(out) if q["kind"] == "tbf"]
        return tbf["options"]["rate"] * 8 / 1e9  # bytes/s

    with bc.Rack(4, racks=2, flat=True, prefix=prefix) as rack:
        rack.shape(bc.Shaping(0.5), oversubscription=4)
        assert [rack.rack_of(i) for i in range(4)] == [0, 0, 1, 1]
        assert rack.worker_ip(3) == "10.201.1.11" and rack.worker_switch_ip(3) == "10.201.1.1"
        assert rack.switch_ip == "10.201.2.1" and rack.flat_ip == "10.201.3.1"
        assert reach(rack.worker_ns(0), rack.worker_ip(0), rack.worker_ip(3))
        assert reach(rack.worker_ns(3), rack.worker_ip(3), rack.worker_switch_ip(3))
        assert reach(rack.switch_ns, rack.switch_ip, rack.rack_switch_ip(1))
        assert reach(rack.rack_switch_ns(0), rack.rack_switch_ip(0), rack.switch_ip)
        assert reach(rack.worker_ns(2), rack.worker_flat_ip(2), rack.flat_ip)
        assert rate(rack.worker_ns(1), rack.worker_if(1)) == pytest.approx(0.5)
        assert rate(rack.rack_switch_ns(1), rack.switch_port(3)) == pytest.approx(0.5)
        assert rate(rack.flat_ns, rack.flat_port(2)) == pytest.approx(0.5)
        assert rate(rack.rack_switch_ns(1), rack.uplink_if(1)) == pytest.approx(0.25)
        assert rate(rack.switch_ns, rack.root_port(0)) == pytest.approx(0.25)
        rack.shape(bc.Shaping(0.5))  # 1:1, in place
        assert rate(rack.switch_ns, rack.root_port(0)) == pytest.approx(1.0)
        names = set(rack.link_counters())
        assert names == {
            f"{d}{i}" for d in ("up", "down", "flatup", "flatdown") for i in range(4)
        } | {"rackup0", "rackup1", "rackdown0", "rackdown1"}
        assert set(rack.link_counters(2)) == names - {
            f"{d}{i}" for d in ("up", "down", "flatup", "flatdown") for i in (2, 3)
        }
    assert bc.leftovers(prefix) == []


def test_two_racks_fabric_ring_and_one_switch(netns, tmp_path):
    """`switchml cluster run --racks 2`: a root, a child switch per rack and the
    flat switch; W = 4 in racks of 2 at a high rate, uplinks 1:1 and 2:1. Every
    result checks; the fabric's and the ring's traffic crossed both uplinks in both
    directions (the fabric's partial aggregates up, the results down), the flat
    switch's none; the table shows the model's prediction beside each fabric point;
    nothing is left behind. Results, not speed."""
    pytest.importorskip("torch")
    out = tmp_path / "racks.json"
    argv = ["cluster", "run", "--racks", "2", "--workers", "4", "--rates", "2", "--sizes"]
    argv += ["1Mi", "--reps", "1", "--oversubscription", "1,2", "--json", str(out), "--plot", ""]
    r = CliRunner().invoke(switchml, argv, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    recs = doc["records"]
    assert sorted((x["method"], x["oversubscription"]) for x in recs) == sorted(
        (m, o) for m in ("switchml", "ring", "flat") for o in (1.0, 2.0)
    )
    nbytes = 1 << 20
    for x in recs:
        assert x["ok"], x
        c = x["counters"]
        uplinks = [c[f"rack{d}{k}_bytes"] for d in ("up", "down") for k in (0, 1)]
        if x["method"] == "flat":
            assert max(uplinks) < 0.05 * nbytes
        elif x["method"] == "ring":
            assert min(uplinks) >= 1.5 * nbytes  # 2(W-1)/W of the tensor, headers on top
        else:
            assert min(uplinks) >= nbytes
    fabric = [row for row in doc["summary"] if row["method"] == "switchml"]
    assert len(fabric) == 2 and all(row["model_s"] > 0 for row in fabric)
    assert "| 2 Gb/s | 4 Gb/s (1:1) | 4 | 1 MiB |" in r.output
    assert "| 2 Gb/s | 2 Gb/s (2:1) | 4 | 1 MiB |" in r.output
    assert bc.leftovers(bc.default_prefix()) == []
