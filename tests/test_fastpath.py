"""The worker's compiled I/O loop and UDP segmentation offload (hostlib.fastpath).

GSO changes how datagrams leave the worker, not what they carry: the same
allreduce with and without it must give the same bytes, and the switch must
see ordinary datagrams of the packet length."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

import hostlib
from hostlib import fastpath
from swemu import fastio, wire
from swemu.launch import EmulatorProcess

pytestmark = pytest.mark.skipif(not fastio.AVAILABLE, reason="no recvmmsg/sendmmsg here")


@pytest.fixture(scope="module")
def emulator():
    with EmulatorProcess("--pool-size", "1024") as emu:
        yield emu


def _gso_supported() -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_UDP, fastpath.UDP_SEGMENT, 1000)
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_enable_gso_packs_within_64k_and_refuses_what_the_route_cannot_carry():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if not _gso_supported():
            assert fastpath.enable_gso(s, wire.packet_len(6), "127.0.0.1") == 1
            return
        for code in range(8):
            plen = wire.packet_len(code)
            k = fastpath.enable_gso(s, plen, "127.0.0.1")
            assert 2 <= k <= fastpath.GSO_MAX_SEGMENTS
            assert k * plen <= fastpath.GSO_MAX_BYTES
        # a packet bigger than the loopback MTU would be IP-fragmented: no GSO
        assert fastpath.enable_gso(s, 70000, "127.0.0.1") == 1
    finally:
        s.close()


def test_switch_receives_plain_datagrams_of_the_packet_length():
    """A GSO message of 5 rows arrives as 5 datagrams, each one row, in order."""
    if not _gso_supported():
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
    if _gso_supported():
        assert g0 > 1
    want = (xs[0].astype(np.float64) + xs[1]).astype(dtype)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(y0, want)  # small integers: exact in float32 too
