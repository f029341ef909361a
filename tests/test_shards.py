"""``serve --shards``: S data-plane processes behind one control plane (swemu.serving.shards).

A real ``switchml-emu serve --shards 2`` process, real sockets on 127.0.0.1,
real gRPC and real hostlib workers; plus the sharded engine against the
plain-Python reference, in memory.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import workers
from conftest import LOCALHOST, packet
from test_cli import EMU, one_line_error, run
from workers import rank_input

from hostlib.pytest_plugin import run_workers
from hostlib.quant import error_bound
from swemu.core.engine import Action, SwitchEngine, pool_bytes, shard_slots
from swemu.core.reference import ReferenceSwitch
from swemu.launch import EmulatorProcess
from swemu.observe.metrics import render_metrics
from swemu.observe.stats import fetch_stats
from swemu.protocol import wire
from swemu.protocol.proto import emulator_pb2 as epb
from swemu.protocol.proto import emulator_pb2_grpc as epb_grpc
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc

MAX_POOL_MEMORY = 1 << 20  # --max-pool-memory of the shared emulator
#: With a cold Numba cache every shard compiles the kernels at once.
STARTUP_TIMEOUT = 180.0


def shard_pids(pid: int) -> list[int]:
    """The data-plane shards of emulator process ``pid`` (its spawned children)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmd:
            out.append(int(entry.name))
    return sorted(out)


@pytest.fixture(scope="module")
def emu():
    """One emulator with two data-plane shards for the module; it must stop cleanly."""
    proc = EmulatorProcess(
        "--pool-size",
        "256",
        "--max-pool-memory",
        str(MAX_POOL_MEMORY),
        shards=2,
        startup_timeout=STARTUP_TIMEOUT,
    ).start()
    shards = shard_pids(proc.proc.pid)
    assert len(shards) == 2
    proc.channel = grpc.insecure_channel(proc.control)
    proc.session = pb_grpc.SessionStub(proc.channel)
    yield proc
    proc.channel.close()
    assert proc.stop() == 0  # SIGTERM: every shard stopped, exit status 0
    assert all(not Path(f"/proc/{p}").exists() for p in shards), "a shard outlived the emulator"


def register(emu, sid, ports, *, code=0, pool=4, rank_from=0):
    """Register one worker per UDP port (ranks in order); return the last response."""
    for rank, port in enumerate(ports, start=rank_from):
        resp = emu.session.UdpSession(
            pb.UdpSessionRequest(
                session_id=sid,
                rank=rank,
                num_workers=len(ports),
                ipv4=LOCALHOST,
                udp_port=port,
                packet_size=code,
                pool_size=pool,
            ),
            timeout=10,
        )
    return resp


class Peer:
    """A blocking UDP socket on 127.0.0.1 that sends to one port or another."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(2.0)
        self.port = self.sock.getsockname()[1]

    def send(self, data: bytes, port: int) -> None:
        self.sock.sendto(data, ("127.0.0.1", port))

    def recv(self, timeout: float = 2.0) -> tuple[wire.Packet, int] | None:
        self.sock.settimeout(timeout)
        try:
            data, src = self.sock.recvfrom(65536)
        except TimeoutError:
            return None
        return wire.decode(data), src[1]


@pytest.fixture
def peers():
    made: list[Peer] = []

    def make(n: int) -> list[Peer]:
        made.extend(Peer() for _ in range(n))
        return made[-n:]

    yield make
    for p in made:
        p.sock.close()


def job_of(snap: dict, sid: int) -> dict:
    return next(j for j in snap["jobs"] if j["session_id"] == sid)


# ----------------------------------------------------------------------------- end to end
def test_registration_lists_every_shard_port(emu, peers):
    (a,) = peers(1)
    resp = register(emu, 0x5A1, [a.port])
    assert resp.session_id == 0x5A1 and resp.ipv4 == LOCALHOST
    p = emu.data[1]
    assert list(resp.data_ports) == emu.data_ports == [p, p + 1]


def test_four_workers_int32_exact_and_float32_within_bound(emu):
    w, n, code, nv = 4, 60_000, 1, 64
    before = fetch_stats(emu.control)["data_plane"]
    results = run_workers(
        emu.switch, emu.control, w, workers.int_and_float, n, packet_size=code, window=16
    )
    want = np.sum([rank_input(r, n, 0).astype(np.int64) for r in range(w)], axis=0)
    inputs = [rank_input(r, n, 1, np.float32) for r in range(w)]
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    m = np.max([np.abs(x) for x in inputs], axis=0)
    bound = np.repeat(error_bound(np.maximum.reduceat(m, np.arange(0, n, nv)), w), nv)[:n]
    for yi, yf in results:
        np.testing.assert_array_equal(yi, want)
        assert yf.dtype == np.float32 and np.all(np.abs(yf - exact) <= bound)
        assert yf.tobytes() == results[0][1].tobytes()
    # the window of 16 slots spread the chunks over both shards, evenly
    after = fetch_stats(emu.control)["data_plane"]
    got = [after[f"shard{i}_pkts_in"] - before.get(f"shard{i}_pkts_in", 0) for i in (0, 1)]
    chunks = 2 * -(-n // nv) + 16  # int32, float32 and its exponent window
    assert min(got) >= w * chunks // 2 - w * 8, got


def test_wrong_shard_is_a_counted_drop_and_corrupts_nothing(emu, peers):
    a, b = peers(2)
    sid, p0 = 0x5A2, emu.data_ports[0]
    p1 = p0 + 1
    register(emu, sid, [a.port, b.port], pool=4)
    # slot 1 belongs to shard 1; in shard 0 it would land on slot 0's local index
    a.send(packet(slot=1, set=0, values=1000, tsi=1), p0)
    assert a.recv(0.3) is None
    for peer, v in ((a, 5), (b, 6)):  # slot 0 on shard 0: 11, not 1011
        peer.send(packet(slot=0, set=0, values=v, tsi=0), p0)
    for peer, v in ((a, 1), (b, 2)):  # slot 1 on shard 1: 3
        peer.send(packet(slot=1, set=0, values=v, tsi=1), p1)
    got = {}
    for peer in (a, b):
        for _ in range(2):
            res, port = peer.recv()
            got[(peer.port, res.slot)] = (res.values[0], res.tsi, port)
    for peer in (a, b):
        assert got[(peer.port, 0)] == (11, 0, p0)  # each result from its shard's port
        assert got[(peer.port, 1)] == (3, 1, p1)
    snap = fetch_stats(emu.control)
    job = job_of(snap, sid)
    c = job["counters"]
    assert c["drop_wrong_shard"] == 1 and c["aggregated"] == 4 and c["multicast"] == 2
    assert c["pkts_in"] == 5 and c["pkts_out"] == 4
    assert [wk["drops"] for wk in job["workers"]] == [1, 0]
    assert [wk["pkts_in"] for wk in job["workers"]] == [3, 2]
    assert job["slots_holding"] == [2, 0]  # summed over the shards
    assert job["memory_bytes"] == pool_bytes(4, 0)  # the shards' halves add up to one pool
    dp = snap["data_plane"]
    assert dp["shards"] == 2
    assert snap["counters"]["pkts_in"] == dp["shard0_pkts_in"] + dp["shard1_pkts_in"]
    assert 'reason="wrong_shard"} 1' in render_metrics(snap)


def test_set_faults_reaches_every_shard(emu, peers):
    a, b = peers(2)
    sid, p0 = 0x5A5, emu.data_ports[0]
    register(emu, sid, [a.port, b.port], pool=4)
    faults = epb_grpc.EmulatorControlStub(emu.channel)
    faults.SetFaults(epb.FaultConfig(session_id=sid, loss_in=1.0, seed=3), timeout=10)
    for slot in range(4):  # two slots on each shard, all lost on the way in
        a.send(packet(slot=slot, values=1), p0 + slot % 2)
    deadline = time.monotonic() + 5
    while job_of(fetch_stats(emu.control), sid)["faults"]["loss_in"] < 4:  # shards drain
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(grpc.RpcError) as info:
        faults.SetFaults(epb.FaultConfig(session_id=0x5A6, loss_in=0.5), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    faults.SetFaults(epb.FaultConfig(session_id=sid), timeout=10)  # lossless again
    for peer in (a, b):
        peer.send(packet(slot=3, values=2), p0 + 1)
    assert a.recv()[0].values[0] == 4
    job = job_of(fetch_stats(emu.control), sid)
    assert job["faults"]["loss_in"] == 4 and job["counters"]["aggregated"] == 2


def test_memory_budget_counts_whole_pools(emu, peers):
    (a,) = peers(1)
    need = pool_bytes(256, 3)
    assert need <= MAX_POOL_MEMORY < 2 * need  # one fits, two do not (halves per shard would)
    register(emu, 0x5A3, [a.port], code=3, pool=256)
    with pytest.raises(grpc.RpcError) as info:
        register(emu, 0x5A4, [a.port], code=3, pool=256)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    register(emu, 0x5A3, [a.port], code=0, pool=1)  # replaced: its memory is back
    assert fetch_stats(emu.control)["memory_in_use"] < need


def test_a_dead_shard_stops_the_emulator_with_one_line():
    emu = EmulatorProcess(shards=2, stderr=subprocess.PIPE, startup_timeout=STARTUP_TIMEOUT).start()
    try:
        shards = shard_pids(emu.proc.pid)
        os.kill(shards[1], signal.SIGKILL)
        rc = emu.proc.wait(20)
        err = emu.proc.stderr.read().decode()
    finally:
        emu.stop()
        emu.proc.stderr.close()
    assert rc == 1, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "shard 1" in ln]
    assert len(lines) == 1 and "exited with status -9" in lines[0], err
    for pid in shards:
        assert not Path(f"/proc/{pid}").exists(), "an orphan or a zombie shard"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--shards", "0"], "--shards"),
        (["--shards", "17"], "--shards"),
        (["--port", "48870", "--shards", "16"], "SwitchML range"),
        (["--port", "65535", "--shards", "2"], "65535"),
        (["--shards", "2", "--pcap", "x.pcap"], "--pcap"),
    ],
)
def test_bad_shard_options_are_one_line(args, words):
    p = run([*EMU, "serve", "--control-port", "0", *args], timeout=60, status=2)
    assert words in one_line_error(p)


# ----------------------------------------------------------------------------- in memory
@pytest.mark.parametrize(("index", "count", "pool"), [(0, 2, 7), (1, 2, 7), (2, 3, 5), (3, 4, 2)])
def test_sharded_engine_matches_the_reference(index, count, pool):
    """A shard's engine against the reference on random traffic: same actions, same bytes."""
    rng = random.Random(index * 31 + count)
    eng = SwitchEngine(shard=(index, count))
    ref = ReferenceSwitch(shard=(index, count))
    w = 3
    for r in range(w):
        eng.register(
            session_id=9, rank=r, num_workers=w, ipv4=LOCALHOST, udp_port=r + 1, pool_size=pool
        )
    ref.add_job(9, w, 1, pool)
    for r in range(w):
        ref.add_worker(9, r, LOCALHOST, r + 1)
    assert eng.jobs[9].memory == pool_bytes(shard_slots(pool, index, count), 1)
    seen = set()
    for i in range(2000):
        slot = rng.randrange(pool + 1)
        data = packet(slot=slot, set=rng.randrange(2), values=rng.randrange(-99, 99), code=1, tsi=i)
        src = (LOCALHOST, rng.randrange(1, w + 1))
        got, want = eng.receive_datagram(data, src), ref.receive(data, src)
        assert got == want, (i, slot)
        seen.add(got[0])
    assert {Action.DROP_WRONG_SHARD, Action.DROP_SLOT_RANGE} <= seen
    # a shard may hold no slot of a small pool (pool 2, shard 3 of 4): it only drops
    assert (Action.MULTICAST in seen) == (shard_slots(pool, index, count) > 0)
