"""Job lifetime (docs/lifetime.md): jobs are freed when their workers are done,
when they are idle too long, or to make room; a worker learns the switch's kind.

* the rules in memory, on the emulator and Tofino targets (``SessionController``);
* real ``switchml-emu serve`` processes (one data plane and ``--shards 2``) with
  real ``switchml run`` launches, hostlib workers and raw gRPC clients that never
  release (as p4app-switchML's C++ client);
* a worker whose emulator stops while it joins gets a ControlPlaneError naming
  the controller, not gRPC's ``UNKNOWN``.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import numpy as np
import pytest
from conftest import LOCALHOST, UdpPeer, packet
from test_cli import EMU, SWITCHML, run
from test_controller import emulator_controller, ip, reg, tables, tofino_controller
from test_identity import free_port

import swemu
from hostlib import AsyncContext, ControlPlaneError, Options
from hostlib.control import ControlClient
from swemu.core.controller import RegistrationError
from swemu.core.engine import EngineConfig
from swemu.launch import EmulatorProcess
from swemu.observe.stats import fetch_stats
from swemu.protocol import wire
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.serving.control_plane import SessionService, SyncService, start_control_server

STARTUP_TIMEOUT = 180.0  # a cold Numba cache compiles in every shard at once


# ----------------------------------------------------------------------------- in memory
@pytest.mark.parametrize("make", [emulator_controller, lambda: tofino_controller()[0]])
def test_the_last_ranks_release_frees_the_job(make):
    """Rank 0's release does not free the job (another rank may still need the
    shadow copies); a release from an address the rank does not hold changes
    nothing; the last rank's release frees the job and its table entries, on
    the emulator and on the Tofino alike."""
    c = make()
    reg(c, 7, 0, 3, "10.0.0.1:1")
    reg(c, 7, 1, 3, "10.0.0.2:2")
    reg(c, 7, 2, 3, "10.0.0.3:3")
    assert c.release_rank(7, 0, ip("10.0.0.1"), 1) == (True, False, 2)
    assert c.release_rank(7, 0, ip("10.0.0.1"), 1) == (True, False, 2)  # counted once
    assert c.release_rank(7, 1, ip("10.0.0.9"), 2) == (False, False, 2)  # not its address
    assert c.release_rank(8, 1, ip("10.0.0.2"), 2) == (False, False, 0)  # no such session
    assert c.release_rank(7, 1, ip("10.0.0.2"), 2) == (True, False, 1)
    reg(c, 7, 2, 3, "10.0.0.3:3")  # registering again: rank 2 is not done after all
    assert c.release_rank(7, 2, ip("10.0.0.3"), 3) == (True, True, 0)
    state = tables(c)
    assert state["jobs"] == {} and state["workers"] == [] and state["destinations"] == []
    assert not c.sessions and c.owner_of(ip("10.0.0.1"), 1) is None
    with pytest.raises(RegistrationError, match="rank 0 registers first"):
        reg(c, 7, 1, 3, "10.0.0.2:2")


def test_tofino_release_deletes_its_entries():
    """On hardware the release frees the job's BF Runtime entries and its pool range."""
    tof, _ = tofino_controller()
    reg(tof, 5, 0, 1, "10.0.0.1:1", pool=100)
    assert tof.read_state()["target"]["jobs"]
    assert tof.release_rank(5, 0, ip("10.0.0.1"), 1) == (True, True, 0)
    assert tof.read_state()["target"]["jobs"] == {}
    assert tables(tof)["workers"] == [] and tables(tof)["multicast"] == {}
    reg(tof, 6, 0, 1, "10.0.0.2:1", pool=100)  # the range is free again: from slot 0
    assert tof.read_state()["target"]["jobs"][6]["pool_base"] == 0


def test_eviction_takes_the_longest_idle_jobs_and_no_more():
    """A rank 0 that finds no room evicts the jobs idle longest, as few as make
    room, only those idle ``evict_after`` seconds; if that cannot make room,
    nothing is evicted and the refusal says why."""
    c = emulator_controller(max_jobs=3, pool_size=64, evict_after=5.0)
    engine = c.target.engine
    for sid, now in ((1, 0.0), (2, 1.0), (3, 2.0)):
        reg(c, sid, 0, 1, f"10.0.0.{sid}:1", now=now)
    engine.touch(engine.jobs[1], 4.0)  # job 1 sent a packet at t=4: job 2 is idle longest
    with pytest.raises(RegistrationError, match="no job can be evicted") as info:
        reg(c, 4, 0, 1, "10.0.0.4:1", now=5.5)  # idle: 1.5, 4.5, 3.5 s -- none for 5 s
    assert info.value.code == "RESOURCE_EXHAUSTED" and set(c.sessions) == {1, 2, 3}
    reg(c, 4, 0, 1, "10.0.0.4:1", now=7.5)  # job 2 (6.5 s) and job 3 (5.5 s) may go
    assert set(c.sessions) == {1, 3, 4} and engine.released["evicted"] == 1
    # memory: a job needing two jobs' room evicts the two idle longest
    m = emulator_controller(pool_size=64, max_pool_memory=3 * 70_000, evict_after=0.0)
    for sid in (1, 2, 3):
        reg(m, sid, 0, 1, f"10.0.1.{sid}:1", code=4, pool=16, now=float(sid))  # 64 KiB each
    reg(m, 9, 0, 1, "10.0.1.9:1", code=5, pool=16, now=10.0)  # 128 KiB: 1 and 2 go
    assert set(m.sessions) == {3, 9} and m.target.engine.released["evicted"] == 2
    with pytest.raises(RegistrationError, match="--max-pool-memory"):
        reg(m, 10, 0, 1, "10.0.1.10:1", code=7, pool=8, now=20.0)  # more than the budget
    assert set(m.sessions) == {3, 9}  # nothing evicted for a job that cannot fit anyway


def test_the_eviction_log_says_which_job_why_and_for_whom(caplog):
    """The log line of an eviction names the job evicted, how long it was idle
    (against --evict-after), why there was no room and the job it makes room for
    (a job last active at t=0 is idle for ``now`` seconds, not 0)."""
    c = emulator_controller(max_jobs=1, pool_size=64, evict_after=5.0)
    reg(c, 1, 0, 1, "10.0.0.1:1", now=0.0)
    with caplog.at_level("INFO", logger="swemu.controller"):
        reg(c, 2, 0, 1, "10.0.0.2:1", now=7.5)
    lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    assert lines == [
        "evicted session 1 (idle for 7.5 s, --evict-after 5 s) to make room for session 2: "
        "all 1 job entries of the switch are in use (--max-jobs)"
    ]


def test_without_evict_after_a_full_switch_refuses():
    c = emulator_controller(max_jobs=1)
    reg(c, 1, 0, 1, "10.0.0.1:1", now=0.0)
    with pytest.raises(RegistrationError, match="all 1 job entries"):
        reg(c, 2, 0, 1, "10.0.0.2:1", now=1e6)
    tof, _ = tofino_controller()  # hardware has no idle clock: never evicts
    reg(tof, 1, 0, 1, "10.0.0.1:1", pool=5000)
    with pytest.raises(RegistrationError, match="no free range"):
        reg(tof, 2, 0, 1, "10.0.0.2:1", pool=5000, now=1e6)


# ----------------------------------------------------------------------------- processes
def _stats_json(control: str) -> dict:
    p = run([*EMU, "stats", "--control", control, "--json"], timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


#: ``serve --identify-by``: every test of a real emulator's job lifetime runs in both
IDENTIFY = pytest.mark.parametrize("identify", ["ip-port", "ip"])


def _ips(identify: str, world: int) -> list[str | None]:
    """Where in-process workers bind: anywhere when the switch knows them by (IP,
    port); by IP alone, each needs an address of its own (127.0.0.2, ...)."""
    return [None if identify == "ip-port" else f"127.0.0.{2 + r}" for r in range(world)]


@pytest.mark.slow
@IDENTIFY
def test_more_consecutive_runs_than_max_jobs_are_all_served(identify):
    """``serve --max-jobs 2`` and three ``switchml run --switch --control`` in a
    row: every run is served (the workers release their job when they exit), at
    the emulator's own packet size, and no finished job stays. By IP alone
    (``--identify-by ip``, the workers of a ``switchml run`` share 127.0.0.1: one
    worker each), the release names the worker's own port, which the switch did
    not register: it must still free the job, not leave it to --idle-timeout."""
    workers = "2" if identify == "ip-port" else "1"
    serve = ("--max-jobs", "2", "--identify-by", identify)
    with EmulatorProcess(*serve, startup_timeout=STARTUP_TIMEOUT) as emu:
        for _ in range(3):
            args = ["--workers", workers, "--switch", emu.switch, "--control", emu.control]
            p = run([*SWITCHML, "run", *args, "--size", "64Ki", "--iters", "1"], timeout=300)
            assert p.returncode == 0, p.stdout + p.stderr
            assert "refused" not in p.stderr, p.stderr
            code = int(wire.EMULATOR_SIZE_CODE)
            assert f"size code {code}" in p.stdout  # not 3: the controller said "emulator"
        snap = _stats_json(emu.control)
        assert snap["jobs"] == []
        assert snap["released"]["explicit"] == 3 and snap["released"]["evicted"] == 0
        text = " ".join(run([*EMU, "stats", "--control", emu.control], timeout=60).stdout.split())
        assert "freed 3 (released 3)" in text  # the header
        assert "jobs freed: released 3 expired 0 evicted 0 replaced 0" in text
        assert "idle timeout 600 s, evict after 1 s idle" in text


async def _job(
    switch: str, control: str, world: int, *, close: bool = True, identify: str = "ip-port"
) -> list[int]:
    """One job of ``world`` in-process hostlib workers: join, one allreduce, leave
    (against a switch that knows workers by IP alone, each on its own address and
    all on one free ``worker_port``)."""
    port = free_port("127.0.0.2") if identify == "ip" else None
    ctxs = [
        AsyncContext(
            Options(
                switch=switch,
                control=control,
                rank=r,
                world_size=world,
                bind=ip,
                worker_port=port,
            )
        )
        for r, ip in enumerate(_ips(identify, world))
    ]
    await asyncio.gather(*(c.open() for c in ctxs))
    outs = await asyncio.gather(
        *(c.allreduce(np.full(1000, r + 1, np.int32)) for r, c in enumerate(ctxs))
    )
    assert all((o == world * (world + 1) // 2).all() for o in outs)
    sizes = [c.options.packet_size for c in ctxs]
    if close:
        await asyncio.gather(*(c.aclose() for c in ctxs))
    return sizes


@pytest.mark.slow
@IDENTIFY
def test_sharded_emulator_frees_released_jobs(identify):
    """``serve --shards 2 --max-jobs 1``: consecutive jobs fit one job entry."""
    serve = ("--max-jobs", "1", "--identify-by", identify)
    with EmulatorProcess(*serve, shards=2, startup_timeout=STARTUP_TIMEOUT) as emu:
        for _ in range(3):
            sizes = asyncio.run(_job(emu.switch, emu.control, 2, identify=identify))
            assert sizes == [int(wire.EMULATOR_SIZE_CODE)] * 2
        snap = fetch_stats(emu.control)
        assert snap["jobs"] == [] and snap["released"]["explicit"] == 3


def _register(stub, sid: int, *, port: int = 0, pool: int = 0, code: int = 3):
    """A raw UdpSession as p4app-switchML's client sends it (rank 0 of 1; by IP
    alone unless ``port``; pool 0: the switch's default)."""
    return stub.UdpSession(
        pb.UdpSessionRequest(
            session_id=sid,
            rank=0,
            num_workers=1,
            ipv4=LOCALHOST,
            udp_port=port,
            packet_size=code,
            pool_size=pool,
        ),
        timeout=30,
    )


@pytest.mark.parametrize("shards", [1, 2])
def test_idle_jobs_expire(shards):
    with (
        EmulatorProcess(
            "--idle-timeout", "2", shards=shards, startup_timeout=STARTUP_TIMEOUT
        ) as emu,
        grpc.insecure_channel(emu.control) as channel,
    ):
        _register(pb_grpc.SessionStub(channel), 11, pool=4)
        # seen before it expires: a reply and a GetStats (through every shard) in 2 s
        assert [j["session_id"] for j in fetch_stats(emu.control)["jobs"]] == [11]
        deadline = time.monotonic() + 20
        while (snap := fetch_stats(emu.control))["jobs"]:
            assert time.monotonic() < deadline, "the idle job was never freed"
            time.sleep(0.1)
        assert snap["released"]["idle"] == 1 and snap["limits"]["idle_timeout"] == 2.0


@pytest.mark.parametrize("shards", [1, 2])
def test_a_full_switch_evicts_the_longest_idle_job(shards):
    with (
        EmulatorProcess(
            "--max-jobs", "2", "--evict-after", "3", shards=shards, startup_timeout=STARTUP_TIMEOUT
        ) as emu,
        grpc.insecure_channel(emu.control) as channel,
    ):
        stub = pb_grpc.SessionStub(channel)
        _register(stub, 1, port=1, pool=4)
        time.sleep(3.5)  # job 1 idle for longer than --evict-after
        # jobs 2, 3 and 4 come within the next 3 s: 2 and 3 stay fresh
        _register(stub, 2, port=2, pool=4)
        _register(stub, 3, port=3, pool=4)  # full: job 1 goes
        with pytest.raises(grpc.RpcError) as info:
            _register(stub, 4, port=4, pool=4)  # jobs 2 and 3 are fresh: refused
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--evict-after" in info.value.details()
        snap = fetch_stats(emu.control)
        assert sorted(j["session_id"] for j in snap["jobs"]) == [2, 3]
        assert snap["released"]["evicted"] == 1


def test_a_client_that_never_releases_keeps_working():
    """p4app-switchML's client never releases: job after job registers by IP
    alone with the default pool and sends; with two job entries, each new job
    evicts the one idle longest, and every job aggregates."""
    with (
        EmulatorProcess(
            "--max-jobs", "2", "--evict-after", "0.2", startup_timeout=STARTUP_TIMEOUT
        ) as emu,
        grpc.insecure_channel(emu.control) as channel,
    ):
        stub = pb_grpc.SessionStub(channel)
        peer = UdpPeer()
        for sid in range(1, 9):
            _register(stub, sid, code=0)
            peer.sock.setblocking(True)
            peer.sock.settimeout(10)
            peer.send(packet(slot=sid, values=sid), emu.data)
            data, _ = peer.sock.recvfrom(65536)
            result = wire.decode(data)
            assert result.slot == sid and (result.values == sid).all()
            time.sleep(0.3)
        peer.sock.close()
        snap = fetch_stats(emu.control)
        assert len(snap["jobs"]) == 2 and snap["released"]["evicted"] == 6


# ----------------------------------------------------------------------------- joining
async def test_a_worker_hears_clearly_that_the_emulator_stopped_mid_join():
    async with swemu.serve(config=EngineConfig(pool_size=64)) as emu:
        control = "%s:%d" % emu.control_address
        ctx = AsyncContext(Options(control=control, rank=1, world_size=2, packet_size=1))
        joining = asyncio.ensure_future(ctx.open())  # waits for rank 0's Broadcast
        await asyncio.sleep(0.5)
        assert not joining.done()
    with pytest.raises(ControlPlaneError) as info:
        await joining
    message = str(info.value)
    assert control in message and "shutting down" in message, message
    assert "UNKNOWN" not in message


class _FailingSession(pb_grpc.SessionServicer):
    """A controller that fails each call its own way (Broadcast/Barrier: none)."""

    async def SwitchInfo(self, request, context):
        raise ValueError("a bug in the controller")

    async def Release(self, request, context):
        raise ConnectionAbortedError("the emulator is shutting down")  # gRPC: UNKNOWN

    async def UdpSession(self, request, context):
        await asyncio.sleep(60)  # never answers


async def test_every_control_call_fails_with_a_control_plane_error_naming_the_controller():
    """All of ControlClient's calls go through one mapping: each failure is a
    ControlPlaneError naming the address and the call, in words (never gRPC's
    ``UNKNOWN: Unexpected <class ...>``, never a raw grpc error): a servicer's
    exception, a deadline, a missing method, a controller stopped under a call
    that waits, a controller that is gone, a closed client."""
    server = grpc.aio.server()
    pb_grpc.add_SessionServicer_to_server(_FailingSession(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    ctl = ControlClient(target)
    join = {"world_size": 2, "ipv4": LOCALHOST, "udp_port": 1, "packet_size": 1, "pool_size": 1}

    async def fails(coro) -> str:
        with pytest.raises(ControlPlaneError) as info:
            await coro
        message = str(info.value)
        assert target in message and "Unexpected <class" not in message, message
        return message

    try:
        got = await fails(ctl.switch_info())
        assert got.startswith("SwitchInfo at") and "raised ValueError: a bug" in got
        got = await fails(ctl.release(session_id=1, rank=0, ipv4=LOCALHOST, udp_port=1))
        assert "Release(rank 0)" in got and "went away" in got and "shutting down" in got
        got = await fails(ctl.join(rank=0, timeout=0.3, **join))
        assert "UdpSession(rank 0)" in got and "timed out after 0.3 s" in got
        assert "not every worker" not in got  # that is for the rendezvous calls
        got = await fails(ctl.join(rank=1, timeout=5, **join))
        assert "does not implement Broadcast" in got
        pending = asyncio.ensure_future(ctl.join(rank=0, timeout=30, **join))
        await asyncio.sleep(0.3)
        await server.stop(None)  # the controller stops mid-call
        got = await fails(pending)
        assert "UdpSession(rank 0)" in got and "went away" in got
        got = await fails(ctl.release(session_id=1, rank=0, ipv4=LOCALHOST, udp_port=1))
        assert "no SwitchML controller answers" in got and "UNKNOWN" not in got
    finally:
        await ctl.close()
        await server.stop(None)
    got = await fails(ctl.switch_info())
    assert "connection to the controller is closed" in got


async def test_packet_size_follows_the_kind_of_switch():
    """An emulator's reply names its fastest size code, a hardware controller's
    does not (3), and a controller without SwitchInfo/Release (p4app-switchML)
    is taken as hardware and its missing Release is no error."""
    async with swemu.serve(config=EngineConfig(pool_size=64)) as emu:
        ctl = ControlClient("%s:%d" % emu.control_address)
        assert await ctl.default_packet_size() == wire.EMULATOR_SIZE_CODE
        await ctl.close()
    tof, _ = tofino_controller()
    hw = SessionService(tof, switch_ipv4=ip("10.0.0.254"), clock=time.monotonic)
    server, port = await start_control_server("127.0.0.1", 0, (hw, SyncService()))
    bare = grpc.aio.server()
    pb_grpc.add_SessionServicer_to_server(pb_grpc.SessionServicer(), bare)  # all UNIMPLEMENTED
    bare_port = bare.add_insecure_port("127.0.0.1:0")
    await bare.start()
    try:
        ctl = ControlClient(f"127.0.0.1:{port}")
        assert await ctl.default_packet_size() == 3
        await ctl.close()
        ctl = ControlClient(f"127.0.0.1:{bare_port}")
        assert await ctl.switch_info() is None and await ctl.default_packet_size() == 3
        assert await ctl.release(session_id=1, rank=0, ipv4=LOCALHOST, udp_port=1) is None
        await ctl.close()
    finally:
        await server.stop(None)
        await bare.stop(None)


@IDENTIFY
async def test_emulator_default_packet_size_for_hostlib_workers(identify):
    """hostlib left to its defaults joins an emulator at its fastest size code,
    with the window sized for it, and frees the job when it leaves."""
    async with swemu.serve(config=EngineConfig(pool_size=1024), identify_by=identify) as emu:
        switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address
        sizes = await _job(switch, control, 2, identify=identify)
        assert sizes == [int(wire.EMULATOR_SIZE_CODE)] * 2
        assert emu.engine.jobs == {} and emu.engine.released["explicit"] == 1


@IDENTIFY
async def test_a_stale_release_is_refused_with_a_warning_on_both_sides(identify, caplog):
    """A worker whose session was replaced under it (rank 0 registered again from
    another address) releases: the switch keeps the new incarnation and says
    so as a warning, and so does the worker; nothing is freed. By IP alone the
    port a worker names is not compared (the release of a worker on its own
    port frees its job), but its IP still is."""
    async with swemu.serve(config=EngineConfig(pool_size=64), identify_by=identify) as emu:
        control = "%s:%d" % emu.control_address
        ctx = AsyncContext(Options(control=control, rank=0, world_size=1, packet_size=3, window=8))
        await ctx.open()
        sid = ctx.membership.session_id
        async with grpc.aio.insecure_channel(control) as channel:
            await pb_grpc.SessionStub(channel).UdpSession(
                pb.UdpSessionRequest(
                    session_id=sid,
                    rank=0,
                    num_workers=1,
                    ipv4=ip("127.0.0.9"),
                    udp_port=5,
                    packet_size=3,
                    pool_size=8,
                )
            )
        with caplog.at_level("WARNING"):
            await ctx.aclose()
        assert list(emu.engine.jobs) and emu.engine.released["explicit"] == 0
        said = {r.name: r.getMessage() for r in caplog.records if r.levelname == "WARNING"}
        assert set(said) == {"swemu.control", "hostlib"}, said
        held = "127.0.0.9:5" if identify == "ip-port" else "127.0.0.9:0"
        assert f"refused Release(session={sid} rank=0)" in said["swemu.control"]
        assert f"holds {held}" in said["swemu.control"]
        assert "refused the release" in said["hostlib"] and "idle timeout" in said["hostlib"]
        # the worker of the new incarnation releases from the address it registered
        async with grpc.aio.insecure_channel(control) as channel:
            got = await pb_grpc.SessionStub(channel).Release(
                pb.ReleaseRequest(session_id=sid, rank=0, ipv4=ip("127.0.0.9"), udp_port=6)
            )
        freed = identify == "ip"  # by IP alone another port is the same worker
        assert (got.found, got.freed) == (freed, freed)
        assert emu.engine.released["explicit"] == int(freed)


async def test_release_over_grpc_frees_the_tofino_entries():
    """The hardware controller's gRPC API (the services switchml_ctl.py serves):
    Release by the job's only rank deletes its table entries."""
    tof, _ = tofino_controller()
    hw = SessionService(tof, switch_ipv4=ip("10.0.0.254"), clock=time.monotonic)
    server, port = await start_control_server("127.0.0.1", 0, (hw, SyncService()))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SessionStub(channel)
            worker = {"ipv4": ip("10.0.0.1"), "udp_port": 7}
            resp = await stub.UdpSession(
                pb.UdpSessionRequest(
                    session_id=3, rank=0, num_workers=1, packet_size=1, mac=0x020000000001, **worker
                )
            )
            assert not resp.HasField("emulator")  # hardware: the default stays size code 3
            assert tables(tof)["workers"]
            got = await stub.Release(pb.ReleaseRequest(session_id=3, rank=0, **worker))
            assert (got.found, got.freed, got.remaining) == (True, True, 0)
            assert tables(tof)["workers"] == [] and tof.read_state()["target"]["jobs"] == {}
            again = await stub.Release(pb.ReleaseRequest(session_id=3, rank=0, **worker))
            assert not again.found  # already freed: not an error
    finally:
        await server.stop(None)
