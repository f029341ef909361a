"""Injected faults over real sockets: exactly-once under loss, duplication, delay."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import LOCALHOST, packet

import hostlib
import swemu
from hostlib.quant import error_bound
from swemu.core.engine import Action, EngineConfig, SwitchEngine
from swemu.core.faults import FaultConfig
from swemu.core.state import FaultParam
from swemu.serving import fault_control as faults
from swemu.serving.fault_control import UnknownSessionError


async def allreduce_all(emu, xs, **kw):
    """Every worker's allreduce of its array, in one event loop."""
    switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address

    async def one(rank):
        async with hostlib.aconnect(  # release=False: the tests read the job's counters after
            switch, control, rank=rank, world_size=len(xs), no_progress=8.0, release=False, **kw
        ) as a:
            return await a.allreduce(xs[rank])

    return await asyncio.gather(*[one(r) for r in range(len(xs))])


def inputs(w, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == np.int32:
        return [rng.integers(-(2**24), 2**24, n).astype(np.int32) for _ in range(w)]
    return [
        (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3)).astype(np.float32) for _ in range(w)
    ]


def check(ys, xs, nvals):
    if xs[0].dtype == np.int32:
        want = np.sum([x.astype(np.int64) for x in xs], axis=0).astype(np.int32)
        for y in ys:
            np.testing.assert_array_equal(y, want)
        return
    n, w = xs[0].size, len(xs)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    m = np.max([np.abs(x) for x in xs], axis=0)
    bound = np.repeat(error_bound(np.maximum.reduceat(m, np.arange(0, n, nvals)), w), nvals)[:n]
    for y in ys:
        assert np.all(np.abs(y - exact) <= bound)
        assert y.tobytes() == ys[0].tobytes()


@pytest.mark.parametrize(
    ("loss", "dtype", "n"),
    [
        (0.01, np.int32, 4 << 20),
        (0.01, np.float32, 1 << 20),
        (0.10, np.int32, 1 << 20),
        (0.10, np.float32, 4 << 20),
    ],
)
async def test_exact_under_loss_in_both_directions(loss, dtype, n):
    async with swemu.serve() as emu:
        faults.configure(
            emu.engine, emu.data_plane, FaultConfig(loss_in=loss, loss_out=loss), seed=7
        )
        xs = inputs(4, n, dtype)
        ys = await allreduce_all(emu, xs, packet_size=6)
        check(ys, xs, 2048)
        snap = emu.engine.snapshot()["jobs"][0]
        f, c = snap["faults"], snap["counters"]
        assert f["loss_in"] > 0 and f["loss_out"] > 0
        # injected faults are not real drops
        assert c["drop_malformed"] == c["drop_slot_range"] == c["drop_wrong_size"] == 0
        assert c["unicast"] > 0  # lost results were recovered from the shadow copies


async def test_duplication_delay_and_reordering():
    async with swemu.serve() as emu:
        cfg = FaultConfig(loss_in=0.02, loss_out=0.02, duplicate=0.2, delay_ms=1.0, reorder_ms=3.0)
        faults.configure(emu.engine, emu.data_plane, cfg, seed=3)
        for call in range(2):
            xs = inputs(3, 300_000, np.int32, seed=call)
            check(await allreduce_all(emu, xs, packet_size=3, window=32), xs, 256)
        f = emu.engine.snapshot()["jobs"][-1]["faults"]
        assert f["duplicated"] > 0 and f["delayed"] > 0 and f["queue_drops"] == 0
        # everything delayed is sent: a duplicate of a last result may still be
        # due (up to delay + reorder = 4 ms) when the workers already have it all
        for _ in range(100):
            if len(emu.data_plane.queue) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(emu.data_plane.queue) == 0


async def test_link_rate_limits_what_the_switch_sends():
    async with swemu.serve() as emu:
        faults.configure(emu.engine, emu.data_plane, FaultConfig(link_gbps=0.05))
        xs = inputs(2, 1 << 18, np.int32)  # 1 MiB each way per worker
        t0 = time.perf_counter()
        check(await allreduce_all(emu, xs, packet_size=6, window=16), xs, 2048)
        took = time.perf_counter() - t0
        # each worker's link carries its 1 MiB of results at 50 Mbit/s: >= 0.16 s
        assert took >= (1 << 20) * 8 / 0.05e9 * 0.95


async def test_faults_for_one_job_do_not_touch_another():
    async with swemu.serve() as emu:
        switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address
        opts = dict(rank=0, world_size=1, packet_size=3)  # 256 values: see "aggregated"
        a = hostlib.aconnect(switch, control, session_id=111, **opts)
        b = hostlib.aconnect(switch, control, session_id=222, **opts)
        async with a, b:
            faults.configure(
                emu.engine, emu.data_plane, FaultConfig(loss_in=0.3), session_id=111, seed=1
            )
            x = np.arange(200_000, dtype=np.int32)
            ya, yb = await asyncio.gather(a.allreduce(x), b.allreduce(x))
            assert (ya == x).all() and (yb == x).all()
            fa = emu.engine.snapshot()["jobs"]
            by_sid = {j["session_id"]: j for j in fa}
            assert by_sid[111]["faults"]["loss_in"] > 0
            assert set(by_sid[222]["faults"].values()) == {0}  # no fault touched job 222
            assert by_sid[222]["counters"]["aggregated"] == len(x) // 256 + 1
        with pytest.raises(UnknownSessionError, match="no session 5"):
            faults.configure(emu.engine, None, FaultConfig(), session_id=5)


def test_injected_loss_is_reproducible_for_a_seed():
    def run(seed):
        eng = SwitchEngine(EngineConfig(pool_size=4))
        eng.register(
            session_id=1,
            rank=0,
            num_workers=1,
            ipv4=LOCALHOST,
            udp_port=1,
            packet_size=0,
            pool_size=4,
        )
        faults.configure(eng, None, FaultConfig(loss_in=0.5), seed=seed)
        return [eng.receive_datagram(packet(set=i % 2), (LOCALHOST, 1))[0] for i in range(64)]

    a, b, c = run(11), run(11), run(12)
    assert a == b and a != c
    assert Action.INJECTED_LOSS in a and Action.MULTICAST in a


def test_fault_config_validation():
    for bad in ({"loss_in": 1.5}, {"loss_out": -0.1}, {"duplicate": 2}, {"reorder_ms": -1}):
        with pytest.raises(ValueError):
            FaultConfig(**bad)
    p = FaultConfig(loss_in=0.1, delay_ms=2, link_gbps=1).params()
    assert (
        p[FaultParam.LOSS_IN] == 0.1
        and p[FaultParam.DELAY] == 0.002
        and p[FaultParam.LINK_BPS] == 1e9
    )
