"""Seeing a fabric (docs/protocol.md §7): ``stats``/``top`` show a switch's parent,
its children and each level's counters, and a capture at either level decodes
(a child switch's partial aggregates are labelled as the contributions they
are, and a child's own capture holds both of its levels)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import hostlib
import swemu
from cli.main import emu as emu_cli
from swemu.core.engine import EngineConfig
from swemu.launch import EmulatorProcess
from swemu.observe.decode import (
    CONTRIBUTION,
    FROM_SWITCH,
    MULTICAST,
    RETRANSMISSION,
    TO_SWITCH,
    UNICAST,
    format_addr,
    summary,
    timeline,
)
from swemu.observe.pcap import read_pcap
from swemu.observe.stats import afetch_stats, fetch_stats
from swemu.observe.tui import render

W = 2
LENGTH = 5000
CODE = 1  # 64 values a packet
CHUNKS = -(-LENGTH // (32 << CODE))
CONFIG = EngineConfig(pool_size=64, max_pool_memory=1 << 22)


def without_clock(snap: dict) -> dict:
    return {k: v for k, v in snap.items() if k not in ("time", "uptime")}


def text_of(renderable) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


async def test_stats_of_both_levels_travel_as_the_switch_built_them():
    """A root and a child (``always_up``: its job crosses both levels) in this
    loop, a job of two workers at the child: GetStats gives each switch's very
    snapshot, fabric included; the view names the parent, the children, the
    job's level and its uplink counters."""
    async with swemu.serve(config=CONFIG) as root:
        root_ctl = "%s:%d" % root.control_address
        async with swemu.serve(config=CONFIG, parent=root_ctl, always_up=True) as child:
            child_ctl = "%s:%d" % child.control_address

            async def one(rank: int) -> None:
                async with hostlib.aconnect(
                    control=child_ctl,
                    rank=rank,
                    world_size=W,
                    packet_size=CODE,
                    window=16,
                    session_id=31,
                    no_progress=60,
                    release=False,
                ) as ctx:
                    for call in range(2):
                        y = await ctx.allreduce(np.full(LENGTH, rank * 10 + call, np.int32))
                        assert (y == sum(r * 10 + call for r in range(W))).all()

            await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(W))), 120)
            got = {"root": await afetch_stats(root_ctl), "child": await afetch_stats(child_ctl)}
            local = {"root": root.snapshot(), "child": child.snapshot()}
    for name in got:
        assert without_clock(got[name]) == without_clock(local[name]), name

    r, c = got["root"], got["child"]
    assert r["fabric"]["parent"] is None and r["fabric"]["children"] == [child_ctl]
    assert c["fabric"]["parent"] == root_ctl and c["fabric"]["always_up"]
    assert c["fabric"]["parent_instance"] == r["fabric"]["instance"] != 0
    assert c["fabric"]["children"] == [] and c["fabric"]["jobs_up"] == [31]
    (rjob,) = r["jobs"]
    (cjob,) = c["jobs"]
    # the root's one member is the child's uplink; the child's job goes up to the root
    assert [w.get("child") for w in rjob["workers"]] == [child_ctl]
    assert cjob["parent"] == r["data_address"]
    assert cjob["uplink"] == "%s:%d" % (rjob["workers"][0]["ip"], rjob["workers"][0]["udp_port"])
    assert "parent" not in rjob and all("child" not in w for w in cjob["workers"])
    up = cjob["counters"]
    # the uplink's 20 ms timer may fire while this one loop is busy: a resend, whose
    # duplicate result is ignored; first sends and results are exact regardless
    resent, ignored = up["up_retransmissions"], up["up_ignored"]
    assert up["up_sent"] == up["up_results"] == 2 * CHUNKS and 0 <= ignored <= resent
    assert cjob["counters"]["aggregated"] == W * 2 * CHUNKS
    assert rjob["counters"]["aggregated"] == rjob["counters"]["multicast"] == 2 * CHUNKS

    child_view = text_of(render(c))
    assert f"child of {root_ctl}" in child_view and "every job goes up" in child_view
    assert f"up to {r['data_address']} from {cjob['uplink']}" in child_view
    assert f"sent {2 * CHUNKS}   resent {resent}   results {2 * CHUNKS}   ignored {ignored}" in (
        child_view
    )
    assert f"from workers {W * 2 * CHUNKS}   from child switches 0" in child_view
    root_view = text_of(render(r))
    assert "fabric: root" in root_view and f"children {child_ctl}" in root_view
    assert f"child switch {child_ctl} ({cjob['uplink']})" in root_view
    assert "top of the tree 1 child switches, 0 workers" in root_view
    assert f"from workers 0   from child switches {2 * CHUNKS}" in root_view


def _job_at(control: str, session_id: int, calls: int) -> None:
    """``W`` worker threads of one job at the switch ``control``; int32 sums checked."""
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            with hostlib.connect(
                control=control,
                rank=rank,
                world_size=W,
                packet_size=CODE,
                window=16,
                session_id=session_id,
                no_progress=60,
                release=False,
            ) as ctx:
                for call in range(calls):
                    x = np.arange(LENGTH, dtype=np.int32) * (rank + 1) + call
                    y = ctx.allreduce(x)
                    want = np.arange(LENGTH, dtype=np.int32) * (W * (W + 1) // 2) + W * call
                    assert np.array_equal(y, want), f"rank {rank} call {call}"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a worker did not finish"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A root and a child (``always_up``) as processes, each capturing; the root
    loses 10 % of its results on the way out (after its capture saw them), so
    that the child resends partial aggregates and the root answers them with
    unicasts. The stats of both
    while the job exists, what ``stats`` and ``top`` print, both captures."""
    d: Path = tmp_path_factory.mktemp("fabric-pcap")
    loss = ("--loss-out", "0.1", "--seed", "3")
    with (
        EmulatorProcess("--pcap", str(d / "root.pcap"), *loss) as root,
        EmulatorProcess(
            "--parent", root.control, "--always-up", "--pcap", str(d / "child.pcap")
        ) as child,
    ):
        _job_at(child.control, 41, calls=3)
        stats = {"root": fetch_stats(root.control), "child": fetch_stats(child.control)}
        runner = CliRunner(catch_exceptions=False)
        shown = {
            "stats": runner.invoke(emu_cli, ["stats", "--control", child.control]).output,
            "top": runner.invoke(
                emu_cli, ["top", "--control", root.control, "--count", "1"]
            ).output,
        }
    # the emulators stopped: their captures are complete
    events = {name: timeline(read_pcap(d / f"{name}.pcap"), values_shown=64) for name in stats}
    return {"stats": stats, "shown": shown, "events": events, "root": root, "child": child}


def test_stats_and_top_name_the_tree(captured):
    child, root = captured["child"], captured["root"]
    assert f"child of {root.control}" in captured["shown"]["stats"]
    assert "up to" in captured["shown"]["stats"]
    top = captured["shown"]["top"]
    assert "fabric: root" in top and f"children {child.control}" in top
    assert f"child switch {child.control}" in top


def test_a_capture_at_the_root_labels_the_childs_contributions(captured):
    """At the root every SwitchML packet is between the root and the child's
    uplink: the child's partial aggregates are contributions (resent ones
    retransmissions), marked as a child's; the root's answers are results to it."""
    cjob = captured["stats"]["child"]["jobs"][0]
    rjob = captured["stats"]["root"]["jobs"][0]
    events = captured["events"]["root"]
    uplink = cjob["uplink"]
    assert events and all(e.child and format_addr(e.worker) == uplink for e in events)
    assert summary(events)["children"] == [uplink]
    kinds = [e.kind for e in events]
    up = [e for e in events if e.direction == TO_SWITCH]
    assert len(up) == rjob["counters"]["pkts_in"]
    assert kinds.count(CONTRIBUTION) == rjob["counters"]["aggregated"] == 3 * CHUNKS
    assert kinds.count(RETRANSMISSION) == rjob["counters"]["retransmissions"] > 0
    assert {e.kind for e in events if e.direction == FROM_SWITCH} <= {MULTICAST, UNICAST}
    assert all("a child switch's partial aggregate" in e.note for e in up)


def test_a_capture_at_the_child_holds_both_levels(captured):
    """At the child: its workers' contributions at its port and the results it
    multicasts to them; its partial aggregates going up to the root (each the
    sum of its workers' contributions to the round) and the root's results
    coming back to its uplink, all marked as the child's."""
    cjob = captured["stats"]["child"]["jobs"][0]
    root_data = captured["stats"]["root"]["data_address"]
    events = captured["events"]["child"]
    c = cjob["counters"]
    mine = [e for e in events if not e.child]
    up = [e for e in events if e.child and e.direction == TO_SWITCH]
    down = [e for e in events if e.child and e.direction == FROM_SWITCH]
    assert {format_addr(e.switch) for e in up + down} == {root_data}
    assert {format_addr(e.worker) for e in up + down} == {cjob["uplink"]}
    assert sum(e.kind == CONTRIBUTION for e in up) == c["up_sent"] == 3 * CHUNKS
    assert sum(e.kind == RETRANSMISSION for e in up) == c["up_retransmissions"] > 0
    assert len(down) == c["up_results"] + c["up_ignored"]
    # the workers' side: every contribution aggregated here, every result passed down
    assert sum(e.kind == CONTRIBUTION for e in mine) == c["aggregated"] == W * 3 * CHUNKS
    results = [e for e in mine if e.kind == MULTICAST]
    assert len(results) == W * 3 * CHUNKS and all(e.fanout == W for e in results)
    # each partial aggregate is the sum of the contributions to its slot's round
    for agg in (e for e in up if e.kind == CONTRIBUTION):
        last = {}  # worker -> its latest contribution to the round before the aggregate
        for e in mine:
            if e.frame > agg.frame:
                break
            if e.kind == CONTRIBUTION and (e.slot, e.set, e.tsi) == (agg.slot, agg.set, agg.tsi):
                last[e.worker] = e
        assert len(last) == W, agg
        total = np.sum([np.array(e.values, np.int64) for e in last.values()], axis=0)
        assert np.array_equal(total.astype(np.int32), np.array(agg.values, np.int32)), agg
