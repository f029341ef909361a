"""The data plane's compiled loops (swemu/serving/loops.py): what ends a serve
slice. A child switch of a fabric (docs/protocol.md §7) takes its parent's
results on uplink sockets of its own; a serve slice that watched only the
data-plane socket held them back while its members waited for them."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest

from swemu.protocol import fastio
from swemu.protocol.jit import kernel
from swemu.serving.loops import LoopStat, Serve, _slice_next

pytestmark = pytest.mark.skipif(not fastio.AVAILABLE, reason="no compiled I/O here")


@kernel
def slice_next(fd, more, t_end, serve):  # pragma: no cover - jit
    """:func:`_slice_next` from Python (it has no entry point of its own)."""
    return _slice_next(fd, more, t_end, serve)


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


def _serve(*fds: int) -> Serve:
    pollfd = np.zeros(2 * (1 + len(fds)), np.int32)
    pollfd[2::2] = fds
    return Serve(np.zeros(len(LoopStat), np.int64), 1.0, 1, np.zeros(2, np.int64), pollfd, 64, 16)


def test_a_parents_result_on_an_uplink_ends_the_serve_slice():
    data, uplink, parent = _udp(), _udp(), _udp()
    try:
        serve = _serve(uplink.fileno())
        t_end = time.monotonic() + 60.0
        parent.sendto(b"result", uplink.getsockname())
        time.sleep(0.01)
        # idle data-plane socket, or more waiting there: back to the event loop at once
        assert slice_next(data.fileno(), False, t_end, serve) == -1.0
        assert slice_next(data.fileno(), True, t_end, serve) == -1.0
        uplink.recv(64)
        # the uplink empty: the slice goes on while the workers send
        parent.sendto(b"contribution", data.getsockname())
        time.sleep(0.01)
        assert slice_next(data.fileno(), False, t_end, serve) > 0.0
        assert serve.stats[LoopStat.POLLS] == 1
        assert slice_next(data.fileno(), True, t_end, serve) > 0.0
        data.recv(64)
        assert slice_next(data.fileno(), False, t_end, serve) == -1.0  # idle 1 ms: return
    finally:
        for s in (data, uplink, parent):
            s.close()


def test_a_switch_without_uplinks_polls_its_socket_alone():
    data, peer = _udp(), _udp()
    try:
        serve = _serve()
        t_end = time.monotonic() + 60.0
        assert slice_next(data.fileno(), True, t_end, serve) > 0.0  # no poll at all
        assert serve.stats[LoopStat.POLLS] == 0
        peer.sendto(b"x", data.getsockname())
        time.sleep(0.01)
        assert slice_next(data.fileno(), False, t_end, serve) > 0.0
        assert serve.stats[LoopStat.POLLS] == 1
        assert slice_next(data.fileno(), False, time.monotonic() - 1.0, serve) == -1.0  # over
    finally:
        data.close()
        peer.close()


def test_the_data_plane_watches_each_uplink_while_it_has_it():
    from swemu.core.engine import EngineConfig, SwitchEngine
    from swemu.serving.dataplane import DataPlane

    engine = SwitchEngine(EngineConfig(pool_size=4, max_jobs=2))
    engine.register(session_id=7, rank=0, num_workers=1, ipv4=0x7F000001, udp_port=1)
    job = engine.jobs[7]
    loop = asyncio.new_event_loop()
    data, uplink = _udp(), _udp()
    try:
        plane = DataPlane(engine, data, loop)
        assert list(plane._serve.pollfd[::2]) == [0]
        plane.add_uplink(job, uplink)
        assert list(plane._serve.pollfd[2::2]) == [uplink.fileno()]
        plane.remove_uplink(job.index)
        assert plane._serve.pollfd.shape == (2,)
    finally:
        loop.close()
        data.close()
        uplink.close()
