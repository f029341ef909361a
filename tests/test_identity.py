"""Worker identity: by (IP, port), or by IP alone as p4app-switchML's switch does.

``serve --identify-by ip`` registers every worker by its IPv4 alone (``udp_port``
ignored) and sends each result to the source port of the packet that completed
its slot. Against such a switch all workers of a job must send from and listen
on one shared port (``worker_port``). The host library learns which switch it
faces from ``UdpSessionResponse.worker_identity``; where the reply does not say
(a p4app-switchML controller, a switch from before the field), workers on
distinct IPs use the shared port and workers that share an IP keep their own.
Every case runs real sockets and gRPC against an in-process emulator, workers on
distinct loopback addresses (127.0.0.2..), and checks the sums and that no
result had to be recovered by retransmission (the slow path this avoids).
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import numpy as np
import pytest

import hostlib
import swemu
from hostlib.errors import SwitchMLError
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc

W = 3
IPS = [f"127.0.0.{2 + r}" for r in range(W)]


def free_port(ip: str = "127.0.0.2") -> int:
    """A UDP port free on ``ip`` now (the shared worker port of a test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


async def run_job(emu, ips, *, n=70_000, calls=2, worker_port=None, **kw):
    """W workers in this event loop, rank r on ``ips[r]``: their results and contexts."""
    ctxs = [
        hostlib.aconnect(
            switch="%s:%d" % emu.data_address,
            control="%s:%d" % emu.control_address,
            rank=r,
            world_size=len(ips),
            bind=ip,
            packet_size=3,
            window=64,
            worker_port=worker_port,
            no_progress=20.0,
            **kw,
        )
        for r, ip in enumerate(ips)
    ]
    await asyncio.wait_for(asyncio.gather(*(c.open() for c in ctxs)), 60)
    results = []
    try:
        for call in range(calls):
            xs = [np.arange(n, dtype=np.int32) * (r + 1) + call for r in range(len(ips))]
            ys = await asyncio.wait_for(
                asyncio.gather(*(c.allreduce(x) for c, x in zip(ctxs, xs))), 60
            )
            want = np.sum(xs, axis=0, dtype=np.int32)
            for y in ys:
                np.testing.assert_array_equal(y, want)
            results.append(ys)
    except BaseException:
        for c in ctxs:
            c.close()
        raise
    return results, ctxs


#: For tests whose sign is "no retransmission": results that come by the shared
#: port come at once, but the 20 ms default timer also fires when this one event
#: loop stalls on a loaded machine; a second's floor tells the two apart.
PATIENT = {"timeout": 1.0, "max_timeout": 1.0}


def retransmissions(ctxs) -> int:
    return sum(c.last_stats["retransmissions"] for c in ctxs)


async def test_identify_by_ip_registers_by_ip_and_says_so():
    async with (
        swemu.serve(identify_by="ip") as emu,
        grpc.aio.insecure_channel("%s:%d" % emu.control_address) as ch,
    ):
        stub = pb_grpc.SessionStub(ch)
        req = dict(session_id=7, num_workers=2, ipv4=0x7F000002, packet_size=3)
        resp = await stub.UdpSession(
            pb.UdpSessionRequest(rank=0, udp_port=5555, loopback_broadcast=True, **req)
        )
        assert resp.worker_identity == pb.IDENTITY_IP
        assert resp.broadcast_port == 0  # p4app-switchML's controller offers none
        assert emu.engine.controller.owner_of(0x7F000002, 0) == (7, 0)
        assert emu.engine.controller.owner_of(0x7F000002, 5555) is None
        # a second worker on the same IP would take the first one's place: refused
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.UdpSession(pb.UdpSessionRequest(rank=1, udp_port=5556, **req))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "needs one IP per worker" in err.value.details()
    async with (
        swemu.serve() as emu,
        grpc.aio.insecure_channel("%s:%d" % emu.control_address) as ch,
    ):
        resp = await pb_grpc.SessionStub(ch).UdpSession(
            pb.UdpSessionRequest(
                session_id=8, rank=0, num_workers=1, ipv4=0x7F000001, udp_port=9, packet_size=3
            )
        )
        assert resp.worker_identity == pb.IDENTITY_IP_PORT


async def test_workers_share_the_worker_port_when_the_switch_knows_them_by_ip():
    port = free_port()
    async with swemu.serve(identify_by="ip") as emu:
        _, ctxs = await run_job(emu, IPS, worker_port=port, **PATIENT)
        try:
            assert [c._sock.getsockname() for c in ctxs] == [(ip, port) for ip in IPS]
            assert retransmissions(ctxs) == 0  # every result came without a timeout
            snap = emu.engine.snapshot()
            assert snap["counters"]["drop_unknown_source"] == 0
        finally:
            for c in ctxs:
                c.close()


async def test_without_the_sign_workers_on_distinct_ips_move_to_the_shared_port():
    """A p4app-switchML controller: IP identity and no worker_identity in the reply."""
    port = free_port()
    async with swemu.serve(identify_by="ip", advertise_identity=False) as emu:
        _, ctxs = await run_job(emu, IPS, worker_port=port, **PATIENT)
        try:
            assert all(c.membership.worker_identity == pb.IDENTITY_UNKNOWN for c in ctxs)
            assert [c._sock.getsockname() for c in ctxs] == [(ip, port) for ip in IPS]
            assert retransmissions(ctxs) == 0
        finally:
            for c in ctxs:
                c.close()


async def test_without_the_sign_a_switch_that_honours_udp_port_still_works():
    """A switch built from the contract (udp_port honoured, no new reply field):
    distinct IPs move to the shared port, registered again, which it follows;
    workers that share one IP keep a port each, as before."""
    port = free_port()
    async with swemu.serve(advertise_identity=False) as emu:
        _, ctxs = await run_job(emu, IPS, worker_port=port, **PATIENT)
        try:
            assert [c._sock.getsockname() for c in ctxs] == [(ip, port) for ip in IPS]
            assert retransmissions(ctxs) == 0
        finally:
            for c in ctxs:
                c.close()
        _, ctxs = await run_job(emu, ["127.0.0.1"] * W, worker_port=port)
        try:
            ports = {c._sock.getsockname()[1] for c in ctxs}
            assert len(ports) == W and port not in ports
            assert emu.engine.snapshot()["counters"]["drop_unknown_source"] == 0
        finally:
            for c in ctxs:
                c.close()


async def test_a_busy_worker_port_is_a_clear_error():
    port = free_port(IPS[1])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
        squatter.bind((IPS[1], port))
        async with swemu.serve(identify_by="ip") as emu:
            ctxs = [
                hostlib.aconnect(
                    switch="%s:%d" % emu.data_address,
                    control="%s:%d" % emu.control_address,
                    rank=r,
                    world_size=2,
                    bind=IPS[r],
                    worker_port=port,
                    join_timeout=3.0,
                )
                for r in range(2)
            ]
            outcome = await asyncio.gather(*(c.open() for c in ctxs), return_exceptions=True)
            for c in ctxs:
                c.close()
    assert isinstance(outcome[1], SwitchMLError)
    assert f"cannot bind the shared worker port {IPS[1]}:{port}" in str(outcome[1])
    assert "SWITCHML_WORKER_PORT" in str(outcome[1])
    assert isinstance(outcome[0], hostlib.ControlPlaneError)  # rank 0 waited in vain


def test_worker_port_from_the_environment(monkeypatch):
    monkeypatch.setenv("SWITCHML_WORKER_PORT", "4321")
    assert hostlib.Options().worker_port == 4321
    assert hostlib.Options(worker_port=77).worker_port == 77
    monkeypatch.delenv("SWITCHML_WORKER_PORT")
    assert hostlib.Options().worker_port == 4000  # p4app-switchML's worker_port
    monkeypatch.setenv("SWITCHML_WORKER_PORT", "x")
    with pytest.raises(ValueError, match="SWITCHML_WORKER_PORT"):
        hostlib.Options()
