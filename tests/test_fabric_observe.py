"""Seeing a fabric (docs/protocol.md §7): ``stats``/``top`` show a switch's parent,
its children and each level's counters."""

from __future__ import annotations

import asyncio

import numpy as np
from rich.console import Console

import hostlib
import swemu
from swemu.core.engine import EngineConfig
from swemu.observe.stats import afetch_stats
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
    assert up["up_sent"] == up["up_results"] == 2 * CHUNKS and up["up_ignored"] == 0
    assert cjob["counters"]["aggregated"] == W * 2 * CHUNKS
    assert rjob["counters"]["aggregated"] == rjob["counters"]["multicast"] == 2 * CHUNKS

    child_view = text_of(render(c))
    assert f"child of {root_ctl}" in child_view and "every job goes up" in child_view
    assert f"up to {r['data_address']} from {cjob['uplink']}" in child_view
    assert f"sent {2 * CHUNKS}   resent 0   results {2 * CHUNKS}   ignored 0" in child_view
    assert f"from workers {W * 2 * CHUNKS}   from child switches 0" in child_view
    root_view = text_of(render(r))
    assert "fabric: root" in root_view and f"children {child_ctl}" in root_view
    assert f"child switch {child_ctl} ({cjob['uplink']})" in root_view
    assert "top of the tree 1 child switches, 0 workers" in root_view
    assert f"from workers 0   from child switches {2 * CHUNKS}" in root_view
