"""Shared fixtures: in-process emulators under both event loops, packet helpers,
and the session's process hygiene (no child outlives the test session)."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest
from hypothesis import settings

from swemu.protocol import wire

LOCALHOST = 0x7F000001

# No per-example deadline: the suite runs on loaded 2-core machines, where one
# example that a garbage collection or another process delays past Hypothesis's
# 200 ms would fail a property that holds. Example counts stay as each test says.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_processes():
    """Around the whole session: remove ``swemu-*`` directories that killed
    launchers left, and at the end stop any child process a test left running
    (an interrupted test's ``finally`` may not have run), with a warning that
    names it. Children of a pytest that is killed outright end by themselves
    (swemu.launch.spawn, die_with_parent)."""
    import warnings

    from swemu.launch import sweep_stale_dirs

    sweep_stale_dirs()
    yield
    try:
        import psutil
    except ImportError:
        return
    helpers = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
    left = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            if child.status() == psutil.STATUS_ZOMBIE or any(h in cmdline for h in helpers):
                continue
            child.kill()
            left.append(f"{child.pid}: {cmdline[:120]}")
        except psutil.Error:
            continue
    if left:
        warnings.warn("tests left processes running (killed): " + "; ".join(left), stacklevel=1)


def pytest_asyncio_loop_factories(config, item):
    """Every async test runs under the default asyncio loop and under uvloop."""
    factories = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories


def packet(
    slot: int = 0,
    set: int = 0,
    values=None,
    *,
    code: int = 0,
    tsi: int = 0,
    job: int = 0,
    e0: int = 0,
    e1: int = 0,
) -> bytes:
    """A SwitchML packet; ``values`` may be a scalar (filled) or a sequence (zero-padded)."""
    n = wire.values_per_packet(code)
    arr = np.zeros(n, np.int32)
    if values is not None:
        v = np.atleast_1d(np.asarray(values, np.int64))
        if v.size == 1:
            arr[:] = v[0]
        else:
            arr[: v.size] = v
    return wire.encode(
        size_code=code, job_number=job, tsi=tsi, set=set, slot=slot, values=arr, e0=e0, e1=e1
    )


class UdpPeer:
    """A blocking UDP socket on 127.0.0.1 for talking to a real emulator."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def send(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sock.sendto(data, addr)

    async def recv(self, timeout: float = 2.0) -> tuple[bytes, tuple[str, int]] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                return self.sock.recvfrom(65536)
            except BlockingIOError:
                await asyncio.sleep(0.002)
        return None

    async def recv_all(self, quiet: float = 0.15) -> list[bytes]:
        """Everything that arrives until ``quiet`` seconds pass without a datagram."""
        out = []
        while True:
            got = await self.recv(quiet)
            if got is None:
                return out
            out.append(got[0])

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def peers():
    made: list[UdpPeer] = []

    def make(n: int, host: str = "127.0.0.1") -> list[UdpPeer]:
        new = [UdpPeer(host) for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for p in made:
        p.close()
