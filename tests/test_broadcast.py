"""Loopback broadcast: an emulator bound to a 127/8 address sends each multicast
result once, to 127.255.255.255:port, when every worker of the job asked for it
(UdpSession ``loopback_broadcast`` / ``broadcast_port``). Real emulator
processes, real worker threads, real sockets; results must stay exact and
jobs must never see each other's results."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import numpy as np
import pytest
from workers import rank_input

import hostlib
from swemu.core.engine import EngineConfig, SwitchEngine
from swemu.launch import run
from swemu.observe.tui import fmt_count
from swemu.protocol.netutil import hold_broadcast_port


def _jobs(emu) -> dict[int, dict]:
    out = run(
        [sys.executable, "-m", "cli.main", "stats", "--control", emu.control, "--json"],
        timeout=60,
    ).stdout
    return {j["session_id"]: j["counters"] for j in json.loads(out)["jobs"]}


def _register(ctl, sid: int, rank: int, nw: int, port: int, ip: int = 0x7F000001, ask=True):
    """UdpSession of one rank, size code 0, asking for loopback broadcast or not."""
    return ctl.register(
        session_id=sid,
        rank=rank,
        num_workers=nw,
        ipv4=ip,
        udp_port=port,
        packet_size=0,
        loopback_broadcast=ask,
    )


def _run_job(emu, session_id: int, inputs: list[np.ndarray], out: dict) -> None:
    """One job: a thread per rank, each allreducing its input twice (the set parity
    and the broadcast socket carry over between calls)."""
    got: list = [None] * len(inputs)

    def rank_main(rank: int) -> None:
        opts = dict(rank=rank, world_size=len(inputs), packet_size=3, session_id=session_id)
        opts["release"] = False  # the test reads the job's counters afterwards
        with hostlib.connect(emu.switch, emu.control, **opts) as c:
            assert c._actx._bsock is not None  # offered and taken
            got[rank] = [c.allreduce(inputs[rank]), c.allreduce(inputs[rank] * 3)]

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    out[session_id] = got


@pytest.fixture(scope="module")
def emulator():
    from swemu.launch import EmulatorProcess

    with EmulatorProcess() as emu:
        yield emu


def test_two_concurrent_broadcast_jobs_stay_exact_and_apart(emulator):
    n = 300_001
    jobs = {
        71: [rank_input(r, n, 0, np.int32) for r in range(3)],
        72: [rank_input(r + 10, n, 1, np.int32) for r in range(2)],
    }
    out: dict = {}
    threads = [
        threading.Thread(target=_run_job, args=(emulator, sid, x, out)) for sid, x in jobs.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for sid, x in jobs.items():
        exact = np.sum([v.astype(np.int64) for v in x], axis=0).astype(np.int32)
        for rank_out in out[sid]:
            np.testing.assert_array_equal(rank_out[0], exact)
            np.testing.assert_array_equal(
                rank_out[1], (exact.astype(np.int64) * 3).astype(np.int32)
            )
    counters = _jobs(emulator)
    for sid, x in jobs.items():
        c = counters[sid]
        # every multicast went out once, counted as the copies it stands for
        assert c["broadcast"] == c["multicast"] > 0
        assert c["pkts_out"] == c["multicast"] * len(x) + c["unicast"]
    text = run(  # the text view shows them on each job's results line
        [sys.executable, "-m", "cli.main", "stats", "--control", emulator.control],
        timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    ).stdout
    for sid in jobs:
        c = counters[sid]
        want = f"multicast {fmt_count(c['multicast'])}   broadcast {fmt_count(c['broadcast'])}"
        assert want in text, text


def test_a_worker_that_does_not_ask_keeps_its_job_on_unicast(emulator, monkeypatch):
    # rank 0 asks, rank 1 opens with SWITCHML_BROADCAST=0 (read when a context
    # opens: set once rank 0 is registered, which the emulator's stats show)
    n = 50_000
    x = [rank_input(r, n, 2, np.int32) for r in range(2)]
    got: list = [None, None]

    def rank_main(rank: int) -> None:
        opts = dict(rank=rank, world_size=2, packet_size=3, session_id=73, release=False)
        with hostlib.connect(emulator.switch, emulator.control, **opts) as c:
            got[rank] = (c.allreduce(x[rank]), c._actx._bsock is not None)

    t0 = threading.Thread(target=rank_main, args=(0,))
    t0.start()
    deadline = time.monotonic() + 30
    while 73 not in _jobs(emulator):
        assert time.monotonic() < deadline, "rank 0 did not register"
        time.sleep(0.05)
    monkeypatch.setenv("SWITCHML_BROADCAST", "0")
    t1 = threading.Thread(target=rank_main, args=(1,))
    t1.start()
    t0.join(60)
    t1.join(60)
    exact = (x[0].astype(np.int64) + x[1]).astype(np.int32)
    for y, _ in got:
        np.testing.assert_array_equal(y, exact)
    # rank 0 was offered the port and took it; the job stayed on unicast
    assert got[0][1] and not got[1][1]
    c = _jobs(emulator)[73]
    assert c["broadcast"] == 0 and c["multicast"] > 0


def test_one_datagram_per_result_unless_egress_faults_are_set():
    # the kernel's destinations for a completed slot: one to 127.255.255.255:port
    # while broadcast is on; one per worker when a fault acts on what a worker
    # gets (loss, duplication, delay, link rate are per copy)
    from conftest import packet

    from swemu.core.state import BROADCAST_IP, FaultParam

    eng = SwitchEngine(EngineConfig(pool_size=8, max_jobs=2))
    eng.broadcast_ports = hold_broadcast_port
    ctl = eng.controller
    for rank in range(2):
        s = _register(ctl, 9, rank, 2, 6000 + rank)
    port, j = ctl.broadcast_port(s), s.handle.index

    def complete(slot_set: int) -> list:
        eng.receive_datagram(packet(0, slot_set, 1), (0x7F000001, 6000))
        return eng.receive_datagram(packet(0, slot_set, 2), (0x7F000001, 6001))[1]

    out = complete(0)
    assert [addr for _, addr in out] == [(BROADCAST_IP, port)]
    eng.faults[j, 1, FaultParam.LOSS_OUT] = 0.5
    out = complete(1)
    assert sorted(addr for _, addr in out) == [(0x7F000001, 6000), (0x7F000001, 6001)]
    eng.faults[j, 1, FaultParam.LOSS_OUT] = 0.0
    assert [addr for _, addr in complete(0)] == [(BROADCAST_IP, port)]


def test_engine_offers_a_held_port_and_uses_it_only_when_every_rank_asked():
    eng = SwitchEngine(EngineConfig(pool_size=8, max_jobs=4))
    eng.broadcast_ports = hold_broadcast_port
    ctl = eng.controller
    s1 = _register(ctl, 1, 0, 2, 5001)
    s2 = _register(ctl, 2, 0, 1, 5003)
    p1, p2 = ctl.broadcast_port(s1), ctl.broadcast_port(s2)
    assert p1 > 0 and p2 > 0 and p1 != p2
    # held: a socket without SO_REUSEADDR cannot take it
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, pytest.raises(OSError):
        probe.bind(("0.0.0.0", p1))
    j1, j2 = s1.handle.index, s2.handle.index
    assert eng.job_bcast[j1] == 0  # rank 1 has not registered yet
    assert eng.job_bcast[j2] == p2  # its only rank asked
    _register(ctl, 1, 1, 2, 5002)
    assert eng.job_bcast[j1] == p1
    # rank 1 registers again without asking: back to unicast
    _register(ctl, 1, 1, 2, 5002, ask=False)
    assert eng.job_bcast[j1] == 0
    # a worker off loopback never gets broadcast results
    _register(ctl, 1, 1, 2, 5002, ip=0x0A000001)
    assert eng.job_bcast[j1] == 0
    # freeing the job frees its port
    assert ctl.release(1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("0.0.0.0", p1))
