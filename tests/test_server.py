"""The real server: UDP sockets and gRPC on 127.0.0.1, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
from conftest import LOCALHOST, packet

import swemu
from swemu.core.engine import EngineConfig
from swemu.protocol import wire
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc


@pytest.fixture(params=["compiled-io", "portable-io"])
async def emu(request, monkeypatch):
    """An in-process emulator, once with the recvmmsg/sendmmsg path, once portable."""
    monkeypatch.setenv("SWEMU_PORTABLE", "1" if request.param == "portable-io" else "0")
    async with swemu.serve(config=EngineConfig(pool_size=64, max_pool_memory=1 << 20)) as e:
        e.channel = grpc.aio.insecure_channel("%s:%d" % e.control_address)
        e.session = pb_grpc.SessionStub(e.channel)
        e.sync = pb_grpc.SyncStub(e.channel)
        yield e
        await e.channel.close()


async def register(emu, peers, sid=7, code=0, pool=8, **kw):
    for rank, p in enumerate(peers):
        resp = await emu.session.UdpSession(
            pb.UdpSessionRequest(
                session_id=sid,
                rank=rank,
                num_workers=len(peers),
                ipv4=LOCALHOST,
                packet_size=code,
                udp_port=p.port,
                pool_size=pool,
                **kw,
            )
        )
        assert resp.session_id == sid and resp.ipv4 == LOCALHOST


async def test_aggregation_multicast_and_unicast_over_udp(emu, peers):
    a, b, c = peers(3)
    await register(emu, [a, b, c])
    for i, p in enumerate((a, b, c)):
        p.send(packet(slot=3, values=[i + 1, -(i + 1)], tsi=9, job=4, e0=i - 2), emu.data_address)
    for p in (a, b, c):
        data, src = await p.recv()
        assert src == emu.data_address  # from the switch's address and the port sent to
        res = wire.decode(data)
        assert (res.values[0], res.values[1], res.tsi, res.job_number, res.slot, res.e0) == (
            6,
            -6,
            9,
            4,
            3,
            0,
        )
    # c lost its result: its retransmission is answered to c alone
    c.send(packet(slot=3, values=[3, -3], tsi=9, job=4, e0=0), emu.data_address)
    data, _ = await c.recv()
    assert wire.decode(data).values[0] == 6
    assert await a.recv(0.2) is None and await b.recv(0.2) is None
    cnt = emu.engine.snapshot()["jobs"][0]["counters"]
    assert (cnt["multicast"], cnt["unicast"], cnt["retransmissions"]) == (1, 1, 1)


async def test_every_drop_reason_is_counted(emu, peers):
    a, stranger = peers(2)
    await register(emu, [a], code=1, pool=4)
    addr = emu.data_address
    bad = bytearray(packet(code=1))
    bad[0] = 0x21  # msg_type 2
    sends = [
        (stranger, packet(code=1)),  # unknown source
        (a, b"\x11\x00\x00"),  # shorter than a header
        (a, packet(code=1)[:-4]),  # wrong length for its size code
        (a, bytes(bad)),  # msg_type != 1
        (a, packet(code=0)),  # a size code the job did not register
        (a, packet(slot=4, code=1)),  # slot >= pool size
    ]
    for peer, data in sends:
        peer.send(data, addr)
    await asyncio.sleep(0.2)
    snap = emu.engine.snapshot()
    cnt = snap["jobs"][0]["counters"]
    assert snap["counters"]["drop_unknown_source"] == 1
    assert (cnt["drop_malformed"], cnt["drop_wrong_size"], cnt["drop_slot_range"]) == (3, 1, 1)
    assert cnt["aggregated"] == 0 and await a.recv(0.1) is None


async def test_flood_of_random_bytes_then_normal_aggregation(emu, peers):
    a, b, spoof = peers(3)
    await register(emu, [a, b], code=0, pool=8)
    rng = random.Random(1)
    for i in range(3000):
        src = (a, b, spoof)[i % 3]
        n = rng.choice([0, 1, 9, 10, 11, 138, 139, 500])
        data = bytearray(rng.randbytes(n))
        if n == 138 and i % 2:
            data[0] = 0x10  # valid-looking: type 1, size 0, random slot/set/values
        src.send(bytes(data), emu.data_address)
        if i % 200 == 0:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    for p in (a, b):
        await p.recv_all(0.05)  # discard results the random packets may have completed
    # a fresh session: its pool starts clean, whatever the flood did to the old one
    await register(emu, [a, b], sid=8, code=0, pool=8)
    for v, p in ((40, a), (2, b)):
        p.send(packet(slot=5, values=v, tsi=77), emu.data_address)
    for p in (a, b):
        data, _ = await p.recv()
        assert wire.decode(data).values.tolist() == [42] * 32
    assert emu.engine.snapshot()["counters"]["pkts_in"] >= 3000


async def test_ip_only_worker_gets_results_on_source_port(emu, peers):
    (a,), (b,) = peers(1), peers(1, host="127.0.0.2")
    for rank, ip, port in ((0, LOCALHOST, a.port), (1, 0x7F000002, 0)):
        await emu.session.UdpSession(
            pb.UdpSessionRequest(
                session_id=3,
                rank=rank,
                num_workers=2,
                ipv4=ip,
                packet_size=0,
                udp_port=port,
                pool_size=4,
            )
        )
    a.send(packet(values=1), emu.data_address)
    b.send(packet(values=2), emu.data_address)  # b is known by its IP alone
    for p in (a, b):  # b's copy goes to the source port of the triggering packet
        data, _ = await p.recv()
        assert wire.decode(data).values[0] == 3


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"session_id": 0}, grpc.StatusCode.INVALID_ARGUMENT, "session_id"),
        ({"packet_size": 9}, grpc.StatusCode.INVALID_ARGUMENT, "packet_size"),
        ({"num_workers": 0}, grpc.StatusCode.INVALID_ARGUMENT, "num_workers"),
        ({"num_workers": 33}, grpc.StatusCode.INVALID_ARGUMENT, "num_workers"),
        ({"rank": 4}, grpc.StatusCode.INVALID_ARGUMENT, "rank"),
        ({"udp_port": 65536}, grpc.StatusCode.INVALID_ARGUMENT, "udp_port"),
        ({"pool_size": 65}, grpc.StatusCode.INVALID_ARGUMENT, "pool_size"),
        ({"rank": 1}, grpc.StatusCode.INVALID_ARGUMENT, "rank 0"),
        ({"pool_size": 64, "packet_size": 7}, grpc.StatusCode.RESOURCE_EXHAUSTED, "bytes"),
    ],
)
async def test_refused_registrations(emu, change, code, words):
    req = {
        "session_id": 9,
        "rank": 0,
        "num_workers": 4,
        "ipv4": LOCALHOST,
        "packet_size": 1,
        "udp_port": 1234,
        "pool_size": 8,
        **change,
    }
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await emu.session.UdpSession(pb.UdpSessionRequest(**req))
    assert info.value.code() == code and words in info.value.details()
    assert not emu.engine.jobs  # nothing half-registered


async def test_rdma_session_is_unimplemented(emu):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await emu.session.RdmaSession(pb.RdmaSessionRequest(session_id=1))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_barrier_and_broadcast(emu):
    async def barrier(scope=0):
        await emu.sync.Barrier(pb.BarrierRequest(num_workers=3, session_id=scope))
        return asyncio.get_running_loop().time()

    first = [asyncio.ensure_future(barrier()) for _ in range(2)]
    await asyncio.sleep(0.2)
    assert not any(f.done() for f in first)  # 2 of 3 arrived
    await barrier()
    await asyncio.gather(*first)

    async def bcast(rank, value, scope=0):
        req = pb.BroadcastRequest(value=value, rank=rank, num_workers=3, root=1, session_id=scope)
        return (await emu.sync.Broadcast(req)).value

    early = asyncio.ensure_future(bcast(0, 5))
    await asyncio.sleep(0.1)
    assert not early.done()  # non-root waits for the root
    assert await asyncio.gather(bcast(1, 99), bcast(2, 6), early) == [99, 99, 99]
    # scoped rendezvous do not mix with global ones
    scoped = asyncio.ensure_future(bcast(0, 0, scope=5))
    assert await asyncio.gather(bcast(1, 11), bcast(0, 0), bcast(2, 0)) == [11, 11, 11]
    assert not scoped.done()
    assert await asyncio.gather(bcast(1, 12, scope=5), bcast(2, 0, scope=5), scoped) == [12] * 3


async def test_a_rendezvous_its_callers_left_is_dropped(emu):
    """A Barrier or Broadcast whose every caller went away (a worker killed
    while it waits) leaves no round behind: nothing would ever read it, and at
    shutdown its failed future was logged as an exception never retrieved."""
    for call in (
        emu.sync.Barrier(pb.BarrierRequest(num_workers=2, session_id=3), timeout=0.3),
        emu.sync.Broadcast(
            pb.BroadcastRequest(rank=1, num_workers=2, root=0, session_id=3), timeout=0.3
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    sync = emu.sync_service
    for _ in range(50):  # the server sees the cancellation shortly after the client
        if not sync._barriers.get(3) and not sync._broadcasts.get(3):
            break
        await asyncio.sleep(0.02)
    assert not sync._barriers.get(3) and not sync._broadcasts.get(3)


async def test_many_jobs_concurrently_do_not_mix(emu, peers):
    jobs = [peers(2) for _ in range(4)]
    for sid, ps in enumerate(jobs, start=100):
        await register(emu, ps, sid=sid, code=0, pool=2)
    for sid, ps in enumerate(jobs, start=100):
        for p in ps:  # same slot, set, job_number and tsi in every job
            p.send(packet(slot=1, values=sid), emu.data_address)
    for sid, ps in enumerate(jobs, start=100):
        for p in ps:
            data, _ = await p.recv()
            assert wire.decode(data).values[0] == 2 * sid


def test_serve_binds_free_ports_and_releases_them():
    async def main():
        async with swemu.serve(port=0, control_port=0) as emu:
            host, port = emu.data_address
            assert host == "127.0.0.1" and port > 0 and emu.control_address[1] > 0
        return port

    port = asyncio.run(main())
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))  # free again after shutdown
    s.close()


def test_small_receive_buffers_are_reported_once_with_the_fix(caplog, monkeypatch):
    """A receive buffer below what a window needs (unprivileged processes are
    capped at net.core.rmem_max, 208 KiB on stock kernels) is named with the
    sysctl that fixes it: by the emulator at start, by a worker once."""
    import socket

    from hostlib import client
    from swemu.protocol.netutil import SWITCH_BUFFER_BYTES, buffer_advice, receive_buffer

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        have = receive_buffer(s)
        advice = buffer_advice(have, SWITCH_BUFFER_BYTES, "the emulator")
        assert advice is not None
        assert f"{have >> 10} KiB" in advice and "net.core.rmem_max=" in advice
        assert buffer_advice(SWITCH_BUFFER_BYTES, SWITCH_BUFFER_BYTES, "the emulator") is None

        monkeypatch.setattr(client, "_buffer_warned", False)
        monkeypatch.delenv("SWITCHML_BUFFER_WARNING", raising=False)
        opts = client.Options(packet_size=6, window=63)
        with caplog.at_level("WARNING", logger="hostlib"):
            client._check_buffer(s, opts)
            client._check_buffer(s, opts)
        assert [
            r.getMessage().startswith("worker 0's UDP receive buffer") for r in caplog.records
        ] == [True]
        caplog.clear()
        monkeypatch.setattr(client, "_buffer_warned", False)
        monkeypatch.setenv("SWITCHML_BUFFER_WARNING", "0")  # a launcher already warned
        client._check_buffer(s, opts)
        assert not caplog.records
