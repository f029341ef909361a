"""The worker's compiled I/O loop and UDP segmentation offload (hostlib.fastpath).

GSO changes how datagrams leave the worker, not what they carry: the same
allreduce with and without it must give the same bytes, and the switch must
see ordinary datagrams of the packet length."""

from __future__ import annotations

import asyncio
import ctypes
import socket
import time

import numpy as np
import pytest

import hostlib
from hostlib import fastpath
from swemu.launch import EmulatorProcess
from swemu.protocol import fastio, wire

pytestmark = pytest.mark.skipif(not fastio.AVAILABLE, reason="no recvmmsg/sendmmsg here")


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess("--pool-size", "1024") as emu:
        yield emu


def test_enable_gso_packs_within_64k_and_refuses_what_the_route_cannot_carry():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if not fastio.gso_available():
            assert fastpath.enable_gso(s, wire.packet_len(6), "127.0.0.1") == 1
            return
        for code in range(8):
            plen = wire.packet_len(code)
            k = fastpath.enable_gso(s, plen, "127.0.0.1")
            assert 2 <= k <= fastio.GSO_MAX_SEGMENTS
            assert k * plen <= fastio.GSO_MAX_BYTES
        # a packet bigger than the loopback MTU would be IP-fragmented: no GSO
        assert fastpath.enable_gso(s, 70000, "127.0.0.1") == 1
    finally:
        s.close()


def test_switch_receives_plain_datagrams_of_the_packet_length():
    """A GSO message of 5 rows arrives as 5 datagrams, each one row, in order."""
    if not fastio.gso_available():
        pytest.skip("no UDP_SEGMENT in this kernel")
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2.0)
        port = rx.getsockname()[1]
        plen = wire.packet_len(3)
        rows = np.arange(5 * plen, dtype=np.uint32).astype(np.uint8).reshape(5, plen)
        seg = fastpath.enable_gso(tx, plen, "127.0.0.1")
        batch = np.zeros((4, plen + 1), np.uint8)
        io = fastpath.FastIO(
            batch, np.zeros(4, np.int32), np.zeros(4, np.uint8), rows, 0x7F000001, [port], seg
        )
        send = np.array([0, 1, 2, 3, 4], np.int32)
        assert io.send(tx.fileno(), send, 5) == 0
        for r in range(5):
            assert rx.recv(70000) == rows[r].tobytes()
    finally:
        rx.close()
        tx.close()


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
async def test_same_result_with_and_without_gso(emulator, dtype):
    """Two workers, one with GSO and one without, then both swapped: identical sums."""
    n = 300_000
    rng = np.random.default_rng(5)
    xs = [rng.integers(-1000, 1000, n).astype(dtype) for _ in range(2)]

    async def one(rank, gso):
        async with hostlib.aconnect(
            emulator.switch,
            emulator.control,
            rank=rank,
            world_size=2,
            packet_size=6,
            window=32,
            gso=gso,
        ) as a:
            y = await a.allreduce(xs[rank])
            return y, a.gso_segments

    (y0, g0), (y1, g1) = await asyncio.gather(one(0, True), one(1, False))
    assert g1 == 1
    if fastio.gso_available():
        assert g0 > 1
    want = (xs[0].astype(np.float64) + xs[1]).astype(dtype)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(y0, want)  # small integers: exact in float32 too


def _mixed_batch(rxs, n, seed):
    rng = np.random.default_rng(seed)
    lens = rng.choice([100, 1034], n).astype(np.int64)
    buf = rng.integers(0, 256, (n, 1034)).astype(np.uint8)
    dst = rng.integers(0, len(rxs), n)
    ports = np.array([rxs[i].getsockname()[1] for i in dst], np.int32)
    ips = np.full(n, 0x7F000001, np.uint32)
    ptr = buf.ctypes.data + buf.strides[0] * np.arange(n, dtype=np.int64)
    return buf, lens, dst, ports, ips, ptr


def _received(sock):
    got = []
    sock.settimeout(0.3)
    try:
        while True:
            got.append(sock.recv(70000))
    except TimeoutError:
        return got


@pytest.mark.parametrize("seg_max", [1, 4, 64])
def test_send_batch_gso_delivers_every_datagram_in_order_per_address(seg_max):
    """Mixed lengths and three receivers: each gets exactly its datagrams, in
    the batch's order, and the vector still works for plain sends afterwards."""
    rxs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for r in rxs:
            r.bind(("127.0.0.1", 0))
        v = fastio.MsgVec(16)  # fewer messages than datagrams: several rounds
        n = 100
        buf, lens, dst, ports, ips, ptr = _mixed_batch(rxs, n, seg_max)
        out = fastio.Sends(ptr, lens, ips, ports)
        sent = fastio.send_batch_gso(tx.fileno(), v.tx(seg_max), n, out)
        assert sent == n
        for i, r in enumerate(rxs):
            want = [buf[k, : lens[k]].tobytes() for k in range(n) if dst[k] == i]
            assert _received(r) == want
        assert fastio.send_batch(tx.fileno(), v.tx(), 3, out) == 3
        got = [g for r in rxs for g in _received(r)]
        assert sorted(got) == sorted(buf[k, : lens[k]].tobytes() for k in range(3))
    finally:
        for s in [*rxs, tx]:
            s.close()


_SMALL_MTU_SCRIPT = """
import socket, subprocess, numpy as np
from swemu.protocol import fastio
subprocess.run(["ip", "link", "set", "lo", "mtu", "1500", "up"], check=True)
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0))
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v = fastio.MsgVec(8)
n = 6
buf = np.arange(n * 8202, dtype=np.uint32).astype(np.uint8).reshape(n, 8202)
ptr = buf.ctypes.data + 8202 * np.arange(n, dtype=np.int64)
lens = np.full(n, 8202, np.int64)
out = fastio.Sends(ptr, lens, np.full(n, 0x7F000001, np.uint32),
    np.full(n, rx.getsockname()[1], np.int32))
sent = fastio.send_batch_gso(tx.fileno(), v.tx(64), n, out)
rx.settimeout(1.0)
got = [rx.recv(70000) for _ in range(n)]
assert sent == n, sent
assert got == [buf[k].tobytes() for k in range(n)]
print("ok")
"""


def test_send_batch_gso_falls_back_where_the_mtu_forbids_segmentation():
    """Datagrams larger than the route MTU cannot use GSO (the kernel refuses
    the message); they must still leave, IP-fragmented, one by one. Run in a
    private network namespace whose loopback has MTU 1500."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip")
    r = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", _SMALL_MTU_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("network namespaces are not permitted here")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("ok")


@pytest.mark.parametrize("zero_copy", [False, True])
def test_recv_rows_cuts_coalesced_messages_back_into_the_datagrams(zero_copy):
    """With UDP_GRO on, runs of equal-size datagrams arrive coalesced; recv_rows
    must return every datagram as sent, in order, including empty ones and ones
    longer than a row (cut to the row, as recvmmsg would), across many calls
    with few rows each; copied into the rows, or (zero copy, as the worker
    uses it) as addresses in the landing area that stay valid until the next
    call."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        gro = fastio.enable_gro(rx)
        rng = np.random.default_rng(1)
        n = 300
        lens = rng.choice([0, 100, 1034, 3000], n, p=[0.02, 0.3, 0.6, 0.08]).astype(np.int64)
        buf = rng.integers(0, 256, (n, 3000)).astype(np.uint8)
        ports = np.full(n, rx.getsockname()[1], np.int32)
        ips = np.full(n, 0x7F000001, np.uint32)
        ptr = buf.ctypes.data + buf.strides[0] * np.arange(n, dtype=np.int64)
        v = fastio.MsgVec(64)
        seg = 64 if fastio.gso_available() else 1
        out = fastio.Sends(ptr, lens, ips, ports)
        assert fastio.send_batch_gso(tx.fileno(), v.tx(seg), n, out) == n
        g = fastio.GroRx(8, 16 if zero_copy else 0)
        rows = np.zeros((16, 2049), np.uint8)
        rl, rip, rp = np.zeros(16, np.int32), np.zeros(16, np.uint32), np.zeros(16, np.int32)
        into = fastio.Rows(rows, rl, rip, rp)
        got, coalesced = [], 0
        deadline = time.monotonic() + 5
        while len(got) < n and time.monotonic() < deadline:
            k = fastio.recv_rows(rx.fileno(), g.landing(), into, 16)
            coalesced += int((g.gso[: g.cursor[fastio.Cursor.LANDED]] > 0).sum()) if k else 0
            if zero_copy:
                got += [ctypes.string_at(int(g.addr[i]), int(rl[i])) for i in range(k)]
                assert not rows.any()  # nothing was copied
            else:
                got += [rows[i, : rl[i]].tobytes() for i in range(k)]
            assert (rip[:k] == 0x7F000001).all() and (rp[:k] == tx.getsockname()[1]).all()
        assert got == [buf[i, : min(lens[i], 2049)].tobytes() for i in range(n)]
        if gro and seg > 1:
            assert coalesced > 0  # the kernel did coalesce: the cutting was exercised
    finally:
        rx.close()
        tx.close()


def test_recv_rows_lands_about_its_byte_budget_per_receive():
    """Large coalesced messages land a few at a time (the landing budget, so
    that what the kernel copied in is still in cache when it is read), single
    datagrams sixteen at a time; either way every datagram arrives intact."""
    if not fastio.gso_available():
        pytest.skip("no UDP GSO/GRO in this kernel")
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        assert fastio.enable_gro(rx)
        plen = 16394
        tx.setsockopt(fastio.SOL_UDP, fastio.UDP_SEGMENT, plen)
        payload = np.random.default_rng(2).integers(0, 256, 3 * plen * 30, np.uint8).tobytes()
        for m in range(30):  # 30 messages of three datagrams each
            tx.sendto(payload[m * 3 * plen : (m + 1) * 3 * plen], rx.getsockname())
        tx.setsockopt(fastio.SOL_UDP, fastio.UDP_SEGMENT, 0)
        for k in range(40):  # then 40 single small datagrams, each its own message
            tx.sendto(bytes([k]) * 100, rx.getsockname())
        g = fastio.GroRx(fastio.GRO_MESSAGES, 64)
        rows = np.zeros((64, plen + 1), np.uint8)
        rl, rip, rp = np.zeros(64, np.int32), np.zeros(64, np.uint32), np.zeros(64, np.int32)
        into = fastio.Rows(rows, rl, rip, rp)
        got, landed = [], []
        deadline = time.monotonic() + 5
        while len(got) < 130 and time.monotonic() < deadline:
            k = fastio.recv_rows(rx.fileno(), g.landing(), into, 64)
            if k:
                landed.append(int(g.cursor[fastio.Cursor.LANDED]))
            got += [ctypes.string_at(int(g.addr[i]), int(rl[i])) for i in range(k)]
        big = [payload[i * plen : (i + 1) * plen] for i in range(90)]
        assert got == big + [bytes([k]) * 100 for k in range(40)]
        per_receive = fastio.GRO_LAND_BYTES // (3 * plen)  # 5 messages of ~48 KiB
        assert landed[0] == fastio.GRO_MESSAGES  # nothing known yet: as many as it may
        assert per_receive in landed[1:4] and max(landed[1:4]) <= per_receive
        assert fastio.GRO_MESSAGES in landed[-3:]  # small ones: sixteen at a time again
    finally:
        rx.close()
        tx.close()


async def test_datagrams_a_pass_left_landed_are_served_without_more_traffic():
    """A drain pass ends on its batch limit (or with its serve slice) and may
    leave datagrams in the landing area while the socket is empty; they are
    served at once, not when the next datagram (a worker's retransmission)
    wakes the socket. One coalesced message of 100 datagrams into a data plane
    whose pass takes 16 batches of 4 and whose serve slice is off."""
    from swemu.core.engine import EngineConfig, SwitchEngine
    from swemu.serving.dataplane import DataPlane
    from swemu.serving.loops import LoopStat

    if not fastio.gso_available():
        pytest.skip("no UDP GSO/GRO in this kernel")
    engine = SwitchEngine(EngineConfig(pool_size=4, max_jobs=2))
    data = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    plane = None
    try:
        data.bind(("127.0.0.1", 0))
        plane = DataPlane(engine, data, asyncio.get_running_loop(), batch_capacity=4)
        plane._serve = plane._serve._replace(slice_s=0.0)  # one pass per wakeup
        plane.start()
        assert plane._gro_socket
        tx.setsockopt(fastio.SOL_UDP, fastio.UDP_SEGMENT, 100)
        tx.sendto(bytes(100 * 100), data.getsockname())  # one GSO message: 100 datagrams
        stats = plane._fast_stats
        deadline = time.monotonic() + 5
        while stats[LoopStat.PACKETS] < 100 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert stats[LoopStat.PACKETS] == 100
        assert stats[LoopStat.BATCHES] >= 25  # more than one pass of 16 took them
    finally:
        if plane is not None:
            plane.stop()
        data.close()
        tx.close()


async def test_emulator_gro_zero_copy_and_switching_it_off():
    """UDP_GRO is on by default on the switch socket: the fast path reads the
    coalesced datagrams where the kernel landed them. Jobs of 1 KiB and 8 KiB
    packets, at once and one after the other, give exact sums; so do jobs
    after GRO is turned off (the landing area then holds single datagrams),
    and with it on again."""
    import swemu

    if not fastio.gso_available():
        pytest.skip("no UDP GSO/GRO in this kernel")
    async with swemu.serve(host="127.0.0.1", port=0, control_port=0) as emu:
        dp = emu.data_plane
        sw = "%s:%d" % emu.data_address
        ctl = "%s:%d" % emu.control_address

        async def job(code, session, n=100_000):
            async def one(rank):
                async with hostlib.aconnect(
                    sw,
                    ctl,
                    rank=rank,
                    world_size=2,
                    packet_size=code,
                    window=16,
                    session_id=session,
                ) as a:
                    x = np.arange(n, dtype=np.int32) * (rank + 1)
                    return await a.allreduce(x)

            ys = await asyncio.gather(one(0), one(1))
            for y in ys:
                assert (y == 3 * np.arange(n, dtype=np.int32)).all()

        assert dp._gro_socket
        await asyncio.gather(job(3, 11), job(6, 12))
        assert dp._gro_socket
        dp._set_gro(False)
        await job(6, 13)
        assert not dp._gro_socket
        dp._set_gro(True)
        await job(7, 14)
        assert dp._gro_socket
