"""The control-plane model (swemu/core/controller.py) on both targets, and the controller process.

* registration through the real gRPC API of an in-process emulator: the tables it
  leaves (``read_state()``) and the traffic they carry;
* one registration sequence -- written out, and random ones -- applied to the
  emulator target and to the Tofino target over a recording BF Runtime client gives
  the same tables, and the Tofino target writes exactly the entries p4/README.md
  lists, with the names of p4/*.p4 (the recorder refuses any other);
* docs/protocol.md §5's session rules on both targets, and room refusals on each;
* drop simulation settings reaching the target;
* ``p4/controller/switchml_ctl.py --target emulator``: a dry run serving the gRPC
  API that hostlib joins unchanged, printing the table writes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import LOCALHOST, packet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import swemu
from p4.controller import BfrtError, RecordingBfrt, TofinoTarget, WorkerPort, load_schema
from p4.controller import bfrt_target as bt
from p4.controller.p4_schema import P4Program
from swemu.core.controller import (
    DropSimulation,
    RegistrationError,
    SessionController,
)
from swemu.core.engine import Action, EmulatorTarget, EngineConfig, SwitchEngine
from swemu.core.state import FaultCounter, FaultParam
from swemu.launch import Watched, run
from swemu.protocol import wire
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.serving.control_plane import SessionService, SyncService, start_control_server

REPO = Path(__file__).resolve().parent.parent
SCHEMA = load_schema()
SWITCH_IP, SWITCH_MAC = 0x0A0000FE, 0x0200000000FE
HOST_MAC = 0x02_00_00_00_00_99  # --default-port's MAC in these tests


def ip(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return a << 24 | b << 16 | c << 8 | d


def mac_of(ipv4: int) -> int:
    """The MAC a test worker sends in UdpSession (derived from its IP)."""
    return 0x02_00_00_00_00_00 | ipv4


# ----------------------------------------------------------------------------- targets
def emulator_controller(**config: Any) -> SessionController:
    engine = SwitchEngine(EngineConfig(**{"pool_size": 64, **config}))
    return engine.controller


def tofino_controller(**options: Any) -> tuple[SessionController, RecordingBfrt]:
    rec = RecordingBfrt(SCHEMA)
    target = TofinoTarget(
        rec.bfrt_info,
        rec.gc,
        rec.device,
        **{"default_port": WorkerPort(3, HOST_MAC), "default_pool_size": 64, **options},
    )
    return SessionController(target), rec


def both() -> list[SessionController]:
    return [emulator_controller(), tofino_controller()[0]]


def tables(controller: SessionController) -> dict[str, Any]:
    """The normalised state without the target's own ids (comparable across targets)."""
    state = controller.read_state()
    state.pop("target")
    return state


def reg(c: SessionController, sid: int, rank: int, w: int, addr: str, **kw: Any) -> Any:
    host, _, port = addr.partition(":")
    ipv4 = ip(host)
    return c.register(
        session_id=sid,
        rank=rank,
        num_workers=w,
        ipv4=ipv4,
        udp_port=int(port or 0),
        packet_size=kw.pop("code", 1),
        pool_size=kw.pop("pool", 8),
        mac=kw.pop("mac", mac_of(ipv4)),
        **kw,
    )


def worker_rows(c: SessionController) -> list[tuple[str, int, int, int]]:
    return [
        (w["ipv4"], w["udp_port"], w["session_id"], w["worker_id"]) for w in tables(c)["workers"]
    ]


# ----------------------------------------------------------------------------- gRPC + UDP
async def test_grpc_registration_writes_the_tables_and_traffic_aggregates(peers):
    """Three workers join through UdpSession (one by IP alone, on another loopback
    address); the engine's tables say so, and their packets are summed."""
    async with swemu.serve(config=EngineConfig(pool_size=16)) as emu:
        a, b = peers(2)
        (c,) = peers(1, host="127.0.0.2")
        async with grpc.aio.insecure_channel("%s:%d" % emu.control_address) as channel:
            stub = pb_grpc.SessionStub(channel)
            for rank, (peer, addr) in enumerate(
                ((a, LOCALHOST), (b, LOCALHOST), (c, LOCALHOST + 1))
            ):
                resp = await stub.UdpSession(
                    pb.UdpSessionRequest(
                        session_id=42,
                        rank=rank,
                        num_workers=3,
                        mac=mac_of(addr),
                        ipv4=addr,
                        packet_size=1,
                        udp_port=0 if peer is c else peer.port,
                        pool_size=4,
                    )
                )
                assert (resp.session_id, resp.ipv4, resp.mac) == (42, LOCALHOST, emu.switch_mac)
        state = emu.engine.controller.read_state()
        assert state["target"]["kind"] == "emulator"
        state.pop("target")
        assert state == {
            "switch": {
                "ipv4": "127.0.0.1",
                "mac": "02:00:5e:be:e0:00",
                "data_ports": [emu.data_address[1]],
            },
            "drop_simulation": {"ingress": 0.0, "egress": 0.0},
            "jobs": {42: {"num_workers": 3, "size_code": 1, "pool_size": 4, "value_formats": 0}},
            "workers": [
                {"ipv4": h, "udp_port": port, "session_id": 42, "worker_id": w, "num_workers": 3}
                for h, port, w in sorted(
                    [("127.0.0.1", a.port, 0), ("127.0.0.1", b.port, 1), ("127.0.0.2", 0, 2)]
                )
            ],
            "destinations": [
                {
                    "session_id": 42,
                    "worker_id": 0,
                    "ipv4": "127.0.0.1",
                    "udp_port": a.port,
                    "mac": "02:00:7f:00:00:01",
                },
                {
                    "session_id": 42,
                    "worker_id": 1,
                    "ipv4": "127.0.0.1",
                    "udp_port": b.port,
                    "mac": "02:00:7f:00:00:01",
                },
                {
                    "session_id": 42,
                    "worker_id": 2,
                    "ipv4": "127.0.0.2",
                    "udp_port": 0,
                    "mac": "02:00:7f:00:00:02",
                },
            ],
            "multicast": {42: [0, 1, 2]},
        }
        # the tables carry traffic: slot 3 of each worker, summed and sent to all three
        for i, peer in enumerate((a, b, c)):
            peer.send(packet(slot=3, values=[i + 1, 10 * (i + 1)], code=1, tsi=7), emu.data_address)
        for peer in (a, b, c):
            got = await peer.recv()
            assert got is not None, "no result"
            res = wire.decode(got[0])
            assert got[1] == emu.data_address
            assert (res.slot, res.tsi, res.values[0], res.values[1]) == (3, 7, 6, 60)
        assert emu.engine.job_counters_of(42)["multicast"] == 1


async def test_hardware_controller_serves_grpc_and_writes_bfrt_entries():
    """The controller process's stack (SessionService over a TofinoTarget) through real
    gRPC: a registration becomes table entries, a refusal a gRPC status."""
    controller, rec = tofino_controller()
    controller.set_switch_address(SWITCH_IP, SWITCH_MAC)
    server, port = await start_control_server(
        "127.0.0.1", 0, (SessionService(controller, clock=time.monotonic), SyncService())
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.SessionStub(channel)
            resp = await stub.UdpSession(
                pb.UdpSessionRequest(
                    session_id=9,
                    rank=0,
                    num_workers=2,
                    ipv4=ip("10.0.0.1"),
                    packet_size=1,
                    udp_port=5001,
                    pool_size=16,
                    mac=0x0A0B0C0D0E0F,
                )
            )
            assert (resp.ipv4, resp.mac, list(resp.data_ports)) == (SWITCH_IP, SWITCH_MAC, [])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.UdpSession(
                    pb.UdpSessionRequest(
                        session_id=9,
                        rank=1,
                        num_workers=2,
                        ipv4=ip("10.0.0.2"),
                        packet_size=2,
                        udp_port=5002,
                        pool_size=16,
                    )
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "packet_size 2 is not supported" in info.value.details()
    finally:
        await server.stop(0)
    ((key, data),) = rec.entries(bt.WORKER_BY_ADDRESS)
    assert key == {
        "hdr.ipv4.src_addr": {"value": ip("10.0.0.1")},
        "hdr.udp.src_port": {"value": 5001},
    }
    assert data["action_name"] == bt.SET_WORKER and data["pool_size"] == 16
    ((_, rewrite),) = rec.entries(bt.WORKER_ADDRESS)
    assert rewrite["mac"] == 0x0A0B0C0D0E0F  # the request's MAC wins over --default-port's


# ----------------------------------------------------------------------------- both targets
#: A registration sequence touching every rule: IP-only workers, an address moving
#: between jobs, a rank moving, rank 0 replacing a session, a release, a retry.
SEQUENCE = [
    ("reg", 1, 0, 3, "10.0.0.1:5001", 16),
    ("reg", 1, 1, 3, "10.0.0.2:5002", 16),
    ("reg", 1, 2, 3, "10.0.0.3", 16),
    ("reg", 2, 0, 2, "10.0.0.4:5004", 8),
    ("reg", 2, 1, 2, "10.0.0.5:5005", 8),
    ("reg", 2, 1, 2, "10.0.0.2:5002", 8),  # job 1's rank 1 address joins job 2
    ("reg", 1, 1, 3, "10.0.0.6:5006", 16),  # job 1's rank 1 comes back elsewhere
    ("reg", 3, 0, 1, "10.0.0.3:7000", 4),  # same IP as an IP-only worker, with a port
    ("reg", 1, 0, 2, "10.0.0.1:5001", 32),  # rank 0 replaces session 1
    ("reg", 1, 1, 2, "10.0.0.7", 32),
    ("release", 2),
    ("reg", 1, 1, 2, "10.0.0.7", 32),  # registering again at the same address
    ("reg", 4, 0, 2, "10.0.0.2:5002", 8),
]


def apply(c: SessionController, op: tuple) -> Any:
    if op[0] == "release":
        return c.release(op[1])
    _, sid, rank, w, addr, pool = op
    return reg(c, sid, rank, w, addr, pool=pool)


def test_one_sequence_gives_the_same_tables_on_both_targets():
    emu, (tof, _) = emulator_controller(), tofino_controller()
    for c in (emu, tof):
        c.set_switch_address(SWITCH_IP, SWITCH_MAC)
    for i, op in enumerate(SEQUENCE):
        apply(emu, op)
        apply(tof, op)
        assert tables(emu) == tables(tof), f"after step {i}: {op}"
    state = tables(tof)
    assert state["jobs"] == {
        1: {"num_workers": 2, "size_code": 1, "pool_size": 32, "value_formats": 0},
        3: {"num_workers": 1, "size_code": 1, "pool_size": 4, "value_formats": 0},
        4: {"num_workers": 2, "size_code": 1, "pool_size": 8, "value_formats": 0},
    }
    assert worker_rows(tof) == [
        ("10.0.0.1", 5001, 1, 0),
        ("10.0.0.2", 5002, 4, 0),
        ("10.0.0.3", 7000, 3, 0),
        ("10.0.0.7", 0, 1, 1),
    ]
    assert state["multicast"] == {1: [0, 1], 3: [0], 4: [0]}


def addr_key(host: str, port: int | None = None) -> dict[str, dict[str, int]]:
    """A worker-table key as the recorder reports it."""
    key = {"hdr.ipv4.src_addr": {"value": ip(host)}}
    if port is not None:
        key["hdr.udp.src_port"] = {"value": port}
    return key


def set_worker(job_id: int, rank: int, pool_base: int, pool_size: int) -> dict[str, Any]:
    """A ``set_worker`` entry's data for a job of 2 workers at size code 1."""
    return {
        "action_name": bt.SET_WORKER,
        "is_default_entry": False,
        "job_id": job_id,
        "worker_id": rank,
        "worker_bit": 1 << rank,
        "num_workers": 2,
        "size_code": 1,
        "pool_base": pool_base,
        "pool_size": pool_size,
        "mgid": job_id,
        "value_formats": 0,
    }


def rewrite(host: str, port: int | None = None) -> dict[str, Any]:
    """A ``worker_address`` entry's data (to_worker, or to_worker_by_ip without a port)."""
    data = {
        "action_name": bt.TO_WORKER if port else bt.TO_WORKER_BY_IP,
        "is_default_entry": False,
        "mac": mac_of(ip(host)),
        "ip": ip(host),
    }
    return {**data, "udp_port": port} if port else data


def register_values(rec: RecordingBfrt, name: str) -> dict[int, set]:
    """Index -> the set of field values written there, for a register."""
    return {
        k["$REGISTER_INDEX"]["value"]: {v for f, v in d.items() if f != "is_default_entry"}
        for k, d in rec.entries(name)
    }


def test_tofino_target_writes_the_entries_of_the_p4_program():
    """Exactly the entries p4/README.md "The control plane's part" lists, and the
    bitmap/count registers zeroed over the job's range only (stale state elsewhere
    is left alone)."""
    controller, rec = tofino_controller()
    bitmap, gc = rec.tables[bt.WORKER_BITMAP], rec.gc
    stale = bitmap.make_data([gc.DataTuple(f, 7) for f in bitmap.info.data_field_name_list_get()])
    keys = [bitmap.make_key([gc.KeyTuple("$REGISTER_INDEX", i)]) for i in range(40)]
    bitmap.entry_mod(rec.device, keys, [stale] * 40)
    controller.set_switch_address(SWITCH_IP, SWITCH_MAC)
    reg(controller, 5, 0, 2, "10.0.0.1:5001", pool=16)  # job id 1, slots 0..15
    reg(controller, 7, 0, 2, "10.0.0.9:5009", pool=8)  # job id 2, slots 16..23
    reg(controller, 7, 1, 2, "10.0.0.8", pool=8)

    assert sorted(rec.entries(bt.WORKER_BY_ADDRESS), key=str) == sorted(
        [
            (addr_key("10.0.0.1", 5001), set_worker(1, 0, 0, 16)),
            (addr_key("10.0.0.9", 5009), set_worker(2, 0, 16, 8)),
        ],
        key=str,
    )
    assert rec.entries(bt.WORKER_BY_IP) == [(addr_key("10.0.0.8"), set_worker(2, 1, 16, 8))]
    by_rid = {k["eg_intr_md.egress_rid"]["value"]: d for k, d in rec.entries(bt.WORKER_ADDRESS)}
    assert by_rid == {
        1 << 5 | 0: rewrite("10.0.0.1", 5001),
        2 << 5 | 0: rewrite("10.0.0.9", 5009),
        2 << 5 | 1: rewrite("10.0.0.8"),
    }
    nodes = {k["$MULTICAST_NODE_ID"]["value"]: d for k, d in rec.entries(bt.PRE_NODE)}
    assert {n: (d["$MULTICAST_RID"], d["$DEV_PORT"]) for n, d in nodes.items()} == {
        32: (32, [3]),
        64: (64, [3]),
        65: (65, [3]),
    }
    groups = {k["$MGID"]["value"]: d["$MULTICAST_NODE_ID"] for k, d in rec.entries(bt.PRE_MGID)}
    assert groups == {1: [32], 2: [64, 65]}
    arp = sorted(d["action_name"] for _, d in rec.entries(bt.ARP_ICMP))
    assert arp == [bt.REPLY_ARP, bt.REPLY_ICMP_ECHO]
    # registers: zero over [0, 24) of the bitmap and [0, 48) of the count, stale beyond
    bitmaps = register_values(rec, bt.WORKER_BITMAP)
    assert all(bitmaps[i] == {0} for i in range(24))
    assert all(bitmaps[i] == {7} for i in range(24, 40))
    assert sorted(register_values(rec, bt.COUNT)) == list(range(48))
    # removing everything leaves no entry behind
    controller.release(5)
    controller.release(7)
    for name in (bt.WORKER_BY_ADDRESS, bt.WORKER_BY_IP, bt.WORKER_ADDRESS, bt.PRE_NODE):
        assert rec.entries(name) == [], name
    assert rec.entries(bt.PRE_MGID) == []


ADDRESSES = ["10.0.0.1:5001", "10.0.0.1:5002", "10.0.0.1", "10.0.0.2:5001", "10.0.0.2"]
ops = st.one_of(
    st.tuples(
        st.just("reg"),
        st.integers(1, 3),  # session
        st.integers(0, 2),  # rank
        st.integers(1, 3),  # num_workers
        st.sampled_from(ADDRESSES),
        st.sampled_from([4, 8]),  # pool
    ),
    st.tuples(st.just("release"), st.integers(1, 3)),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=14))
def test_random_sequences_agree_on_both_targets(sequence):
    """Any sequence of registrations and releases: the same answers (accepted, or refused
    with the same code and message) and the same tables on both targets."""
    emu, (tof, _) = emulator_controller(), tofino_controller()
    for op in sequence:
        outcomes = []
        for c in (emu, tof):
            try:
                apply(c, op)
                outcomes.append("ok")
            except RegistrationError as exc:
                outcomes.append((exc.code, exc.message))
        assert outcomes[0] == outcomes[1], op
        assert tables(emu) == tables(tof), op
    # the rule an address belongs to one worker of one job, as a table invariant
    rows = worker_rows(tof)
    assert len({(r[0], r[1]) for r in rows}) == len(rows)


# ----------------------------------------------------------------------------- §5 rules
@pytest.mark.parametrize(
    "make", [emulator_controller, lambda: tofino_controller()[0]], ids=["emulator", "tofino"]
)
def test_session_rules(make):
    c = make()
    reg(c, 1, 0, 2, "10.0.0.1:1", pool=8)
    reg(c, 1, 1, 2, "10.0.0.2:2", pool=8)
    before = tables(c)
    # another rank with other parameters than rank 0's: refused, nothing changes
    for change in ({"w": 3}, {"pool": 16}):
        with pytest.raises(RegistrationError, match="rank 0 registered") as info:
            reg(c, 1, 1, change.get("w", 2), "10.0.0.2:2", pool=change.get("pool", 8))
        assert info.value.code == "INVALID_ARGUMENT"
    # a rank before its session's rank 0: refused
    with pytest.raises(RegistrationError, match="rank 0 registers first"):
        reg(c, 2, 1, 2, "10.0.0.3:3")
    assert tables(c) == before
    # rank 0 again replaces the session: new parameters, the other ranks are gone
    reg(c, 1, 0, 3, "10.0.0.1:1", pool=4)
    assert tables(c)["jobs"] == {
        1: {"num_workers": 3, "size_code": 1, "pool_size": 4, "value_formats": 0}
    }
    assert worker_rows(c) == [("10.0.0.1", 1, 1, 0)]
    assert c.owner_of(ip("10.0.0.2"), 2) is None
    # the old parameters are refused now, the new ones accepted
    with pytest.raises(RegistrationError, match="num_workers=3, packet_size=1, pool_size=4"):
        reg(c, 1, 1, 2, "10.0.0.2:2", pool=8)
    reg(c, 1, 1, 3, "10.0.0.2:2", pool=4)
    # an address moves between jobs: it leaves job 1's rank 1 and joins job 2
    reg(c, 2, 0, 1, "10.0.0.2:2", pool=4)
    assert c.owner_of(ip("10.0.0.2"), 2) == (2, 0)
    assert tables(c)["multicast"] == {1: [0], 2: [0]}
    # a rank registering again replaces its address; the old one becomes unknown
    reg(c, 1, 1, 3, "10.0.0.9:9", pool=4)
    reg(c, 1, 1, 3, "10.0.0.8:8", pool=4)
    assert ("10.0.0.9", 9, 1, 1) not in worker_rows(c)
    assert ("10.0.0.8", 8, 1, 1) in worker_rows(c)
    assert c.release(1) and not c.release(1)
    assert worker_rows(c) == [("10.0.0.2", 2, 2, 0)]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"sid": 0}, "session_id"),
        ({"code": 8}, "packet_size 8 is not a size code"),
        ({"w": 0}, "num_workers"),
        ({"w": 33}, "num_workers"),
        ({"rank": 2}, "rank 2 must be in 0..1"),
        ({"addr": "10.0.0.1:65536"}, "udp_port"),
        ({"addr": "0.0.0.0:1"}, "ipv4"),
        ({"mac": 1 << 48}, "mac"),
        ({"pool": 10_000}, "pool_size 10000 exceeds"),
    ],
)
def test_invalid_requests_are_refused_the_same_on_both_targets(change, words):
    for c in both():
        args = {"sid": 1, "rank": 0, "w": 2, "addr": "10.0.0.1:1", "pool": 8, **change}
        extra = {"mac": change["mac"]} if "mac" in change else {}
        with pytest.raises(RegistrationError, match=words) as info:
            reg(
                c,
                args["sid"],
                args["rank"],
                args["w"],
                args["addr"],
                pool=args["pool"],
                code=args.get("code", 1),
                **extra,
            )
        assert info.value.code == "INVALID_ARGUMENT"
        assert not c.sessions and tables(c)["workers"] == []


def test_room_refusals_of_each_target():
    """No room is RESOURCE_EXHAUSTED; a refused rank 0 leaves the old session alone."""
    # the emulator: pool memory
    emu = emulator_controller(pool_size=1024, max_pool_memory=600_000)
    reg(emu, 1, 0, 1, "10.0.0.1:1", pool=1024)  # 544 KiB at size code 1
    with pytest.raises(RegistrationError, match="--max-pool-memory") as info:
        reg(emu, 2, 0, 1, "10.0.0.2:2", pool=1024)
    assert info.value.code == "RESOURCE_EXHAUSTED"
    reg(emu, 1, 0, 1, "10.0.0.1:1", pool=1024)  # replacing frees the old pool first
    # the Tofino: slots of the shared pool, job ids, worker entries
    tof, _ = tofino_controller()
    reg(tof, 1, 0, 1, "10.0.0.1:1", pool=5000)
    with pytest.raises(RegistrationError, match="no free range of 5000 slots") as info:
        reg(tof, 2, 0, 1, "10.0.0.2:2", pool=5000)
    assert info.value.code == "RESOURCE_EXHAUSTED"
    reg(tof, 1, 0, 1, "10.0.0.1:1", pool=8000)  # its own range counts as free
    with pytest.raises(RegistrationError, match="packet_size 2 is not supported") as info:
        reg(tof, 2, 0, 1, "10.0.0.2:2", code=2)
    assert info.value.code == "INVALID_ARGUMENT"
    many, _ = tofino_controller()
    for sid in range(1, 33):
        reg(many, sid, 0, 32, f"10.0.1.{sid}:1", pool=1)
    with pytest.raises(RegistrationError, match="worker entries"):
        reg(many, 99, 0, 1, "10.0.2.1:1", pool=1)


def test_tofino_pool_ranges_first_fit():
    tof, _ = tofino_controller()
    for sid, pool in ((1, 100), (2, 50)):
        reg(tof, sid, 0, 1, f"10.0.0.{sid}:1", pool=pool)
    tof.release(1)
    reg(tof, 3, 0, 1, "10.0.0.3:1", pool=80)
    reg(tof, 4, 0, 1, "10.0.0.4:1", pool=30)  # the gap [80, 100) is too small: after job 2
    reg(tof, 5, 0, 1, "10.0.0.5:1", pool=20)  # fills the gap [80, 100)
    bases = {sid: j["pool_base"] for sid, j in tof.read_state()["target"]["jobs"].items()}
    assert bases == {2: 100, 3: 0, 4: 150, 5: 80}


def test_tofino_needs_a_port_and_a_mac_for_each_worker():
    tof, _ = tofino_controller(default_port=None, ports={ip("10.0.0.1"): WorkerPort(8)})
    reg(tof, 1, 0, 2, "10.0.0.1:1")
    before = tables(tof)
    with pytest.raises(RegistrationError, match=r"no device port is known for worker 10\.0\.0\.2"):
        reg(tof, 1, 1, 2, "10.0.0.2:2")
    with pytest.raises(RegistrationError, match=r"no MAC address for worker 10\.0\.0\.1"):
        reg(tof, 1, 0, 2, "10.0.0.1:1", mac=0)  # rank 0 refused: session 1 survives
    assert tables(tof) == before


def test_idle_release_by_the_engine_reaches_the_controller():
    engine = SwitchEngine(EngineConfig(pool_size=4, idle_timeout=5.0))
    engine.register(session_id=3, rank=0, num_workers=2, ipv4=LOCALHOST, udp_port=1, now=0.0)
    assert engine.handle_timer(10.0) == [3]
    assert not engine.controller.sessions and engine.controller.owner_of(LOCALHOST, 1) is None
    with pytest.raises(RegistrationError, match="rank 0 registers first"):
        engine.register(session_id=3, rank=1, num_workers=2, ipv4=LOCALHOST, udp_port=2)
    engine.register(session_id=4, rank=0, num_workers=1, ipv4=LOCALHOST, udp_port=1)
    assert tables(engine.controller)["workers"][0]["session_id"] == 4


# ----------------------------------------------------------------------------- drops
def test_drop_simulation_settings_reach_the_target():
    """On the emulator they are its fault injection's loss_in/loss_out, for every job
    present and future; the Tofino program has no drop simulator and refuses them."""
    emu = emulator_controller()
    engine = emu.target.engine
    old = engine.register(
        session_id=1, rank=0, num_workers=2, ipv4=LOCALHOST, udp_port=1, packet_size=0
    )
    emu.set_drop_simulation(0.01, 0.25)
    new = engine.register(
        session_id=2, rank=0, num_workers=2, ipv4=LOCALHOST, udp_port=2, packet_size=0
    )
    for job in (old, new):
        assert (engine.faults[job.index, :, FaultParam.LOSS_IN] == 0.01).all()
        assert (engine.faults[job.index, :, FaultParam.LOSS_OUT] == 0.25).all()
    assert emu.read_state()["drop_simulation"] == {"ingress": 0.01, "egress": 0.25}
    assert DropSimulation.threshold(0.25) == 0x3FFF  # p4app-switchML's 16-bit encoding
    with pytest.raises(ValueError, match="ingress drop probability"):
        emu.set_drop_simulation(1.5, 0.0)
    assert emu.read_state()["drop_simulation"] == {"ingress": 0.01, "egress": 0.25}
    # and they act on packets: everything dropped on ingress, then nothing
    emu.set_drop_simulation(1.0, 0.0)
    assert engine.receive_datagram(packet(), (LOCALHOST, 1))[0] == Action.INJECTED_LOSS
    emu.set_drop_simulation(0.0, 0.0)
    assert engine.receive_datagram(packet(), (LOCALHOST, 1))[0] == Action.AGGREGATED

    tof, _ = tofino_controller()
    tof.set_drop_simulation(0.0, 0.0)
    with pytest.raises(NotImplementedError, match="no drop simulator"):
        tof.set_drop_simulation(0.1, 0.0)
    assert tof.read_state()["drop_simulation"] == {"ingress": 0.0, "egress": 0.0}


async def test_egress_drop_simulation_drops_results_on_the_wire(peers):
    async with swemu.serve(config=EngineConfig(pool_size=4)) as emu:
        (a,) = peers(1)
        emu.engine.register(
            session_id=5, rank=0, num_workers=1, ipv4=LOCALHOST, udp_port=a.port, packet_size=0
        )
        emu.engine.controller.set_drop_simulation(0.0, 1.0)
        a.send(packet(slot=0, values=3), emu.data_address)
        assert await a.recv(timeout=0.3) is None
        assert engine_fault(emu.engine, 5, FaultCounter.LOSS_OUT) == 1
        emu.engine.controller.set_drop_simulation(0.0, 0.0)
        a.send(packet(slot=1, values=4), emu.data_address)
        got = await a.recv()
        assert got is not None and wire.decode(got[0]).values[0] == 4


def engine_fault(engine: SwitchEngine, session_id: int, counter: int) -> int:
    return int(engine.fault_counters[engine.jobs[session_id].index, counter])


# ----------------------------------------------------------------------------- the P4 names
def test_recorder_refuses_what_the_p4_program_does_not_have():
    """The recording client has teeth: a wrong name, field, width or write fails."""
    rec = RecordingBfrt(SCHEMA)
    gc, dev = rec.gc, rec.device
    with pytest.raises(BfrtError, match="not in the P4 program"):
        rec.bfrt_info.table_get("pipe.Ingress.worker_lookup.workers")
    t = rec.bfrt_info.table_get(bt.WORKER_BY_ADDRESS)
    with pytest.raises(BfrtError, match="key fields"):
        t.make_key([gc.KeyTuple("hdr.ipv4.src_addr", 1)])
    with pytest.raises(BfrtError, match="no action"):
        t.make_data([], "Ingress.worker_lookup.set_job")
    fields = dict(
        job_id=1,
        worker_id=0,
        worker_bit=1,
        num_workers=1,
        size_code=1,
        pool_base=0,
        pool_size=1,
        mgid=1,
        value_formats=0,
    )
    with pytest.raises(BfrtError, match="data"):
        t.make_data([gc.DataTuple(n, v) for n, v in fields.items() if n != "mgid"], bt.SET_WORKER)
    too_wide = {**fields, "pool_base": 8192}
    with pytest.raises(BfrtError, match="does not fit 13 bits"):
        t.make_data([gc.DataTuple(n, v) for n, v in too_wide.items()], bt.SET_WORKER)
    key = t.make_key([gc.KeyTuple("hdr.ipv4.src_addr", 1), gc.KeyTuple("hdr.udp.src_port", 2)])
    data = t.make_data([gc.DataTuple(n, v) for n, v in fields.items()], bt.SET_WORKER)
    t.entry_add(dev, [key], [data])
    with pytest.raises(BfrtError, match="already exists"):
        t.entry_add(dev, [key], [data])
    with pytest.raises(BfrtError, match="not writable"):
        rec.bfrt_info.table_get("pipe.Ingress.next_step.next_step").entry_del(dev)


def test_target_constants_and_names_are_the_p4_programs():
    program = P4Program()
    assert program.value("NUM_POOL_SLOTS") == bt.NUM_POOL_SLOTS
    assert program.value("MAX_WORKER_ENTRIES") == bt.MAX_WORKER_ENTRIES
    assert (1 << program.value("JOB_ID_BITS")) - 1 == bt.MAX_JOB_ID
    assert program.value("WORKER_ID_BITS") == bt.RID_WORKER_BITS
    codes = {program.value("SIZE_CODE_ONE_PASS"), program.value("SIZE_CODE_FOUR_PASSES")}
    assert codes == set(bt.SIZE_CODES)
    assert program.value("QUARTERS") == bt.ENTRIES_PER_SLOT[3] and bt.ENTRIES_PER_SLOT[1] == 1
    for name in (bt.WORKER_BY_ADDRESS, bt.WORKER_BY_IP, bt.WORKER_ADDRESS, bt.ARP_ICMP):
        assert SCHEMA[name].kind == "match" and SCHEMA[name].writable, name
    assert set(SCHEMA[bt.WORKER_BY_ADDRESS].actions) >= {bt.SET_WORKER}
    assert set(SCHEMA[bt.WORKER_ADDRESS].actions) >= {bt.TO_WORKER, bt.TO_WORKER_BY_IP}
    assert set(SCHEMA[bt.ARP_ICMP].actions) >= {bt.REPLY_ARP, bt.REPLY_ICMP_ECHO}
    assert SCHEMA[bt.WORKER_BITMAP].size == bt.NUM_POOL_SLOTS
    assert SCHEMA[bt.COUNT].size == 2 * bt.NUM_POOL_SLOTS


def test_emulator_target_is_the_engines_own_controller():
    engine = SwitchEngine(EngineConfig(pool_size=4))
    assert isinstance(engine.controller.target, EmulatorTarget)
    job = engine.register(session_id=1, rank=0, num_workers=1, ipv4=LOCALHOST, udp_port=9)
    assert engine.controller.sessions[1].handle is job and engine.jobs[1] is job
    assert engine.release(1) and not engine.release(1) and engine.released["explicit"] == 1


# ----------------------------------------------------------------------------- the process
def _allreduce(switch: str, control: str, rank: int, out: list) -> None:
    import hostlib

    with hostlib.connect(
        switch=switch,
        control=control,
        rank=rank,
        world_size=2,
        packet_size=1,
        window=16,
        session_id=77,
        no_progress=20.0,
    ) as ctx:
        out[rank] = ctx.allreduce(np.arange(1000, dtype=np.int32) * (rank + 1))


@pytest.mark.slow
def test_switchml_ctl_dry_run_serves_hostlib(tmp_path):
    """The hardware controller's entry point, with --target emulator: hostlib joins it
    as it would join a Tofino (size code 1), the allreduce is exact, and the table
    writes the switch would get are printed."""
    ready = tmp_path / "ready.json"
    out_path = tmp_path / "out.txt"
    cmd = [
        sys.executable,
        str(REPO / "p4" / "controller" / "switchml_ctl.py"),
        "--target",
        "emulator",
        "--switch-ip",
        "127.0.0.1",
        "--control-host",
        "127.0.0.1",
        "--control-port",
        "0",
        "--data-port",
        "0",
        "--ready-file",
        str(ready),
        "--default-port",
        "1/02:00:00:00:00:01",
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds the repo
    with out_path.open("w") as out, Watched(cmd, stdout=out, env=env, cwd=tmp_path) as proc:
        proc.wait_until(ready.exists, 60, "the controller's ready file")
        info = json.loads(ready.read_text())
        results: list = [None, None]
        threads = [
            threading.Thread(target=_allreduce, args=(info["switch"], info["control"], r, results))
            for r in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        expected = np.arange(1000, dtype=np.int32) * 3
        assert all(r is not None and np.array_equal(r, expected) for r in results), results
        proc.send_signal(signal.SIGTERM)
        proc.expect(0, 20, "it to stop on SIGTERM")
    printed = out_path.read_text()
    assert printed.count(f"entry_add {bt.WORKER_BY_ADDRESS}") == 2
    assert f"-> {bt.SET_WORKER}(job_id=1, worker_id=1, worker_bit=2, num_workers=2" in printed
    assert f"entry_add {bt.ARP_ICMP}" in printed


def test_switchml_ctl_without_sdk_says_so(tmp_path):
    proc = run(
        [
            sys.executable,
            str(REPO / "p4" / "controller" / "switchml_ctl.py"),
            "--switch-ip",
            "10.0.0.254",
            "--control-port",
            "0",
        ],
        status=2,
        timeout=60,
        cwd=tmp_path,
    )
    assert "BF Runtime" in proc.stderr and "--target emulator" in proc.stderr
    assert "Traceback" not in proc.stderr
