"""The conformance vectors (tests/vectors/*.json) through a real in-process emulator:
workers register with ``UdpSession`` over gRPC and send real UDP datagrams.

``test_conformance.py`` runs the same files on the engine in memory; this runner
adds everything between a worker and that engine: the gRPC control plane and its
session controller, the UDP socket, the batching data plane and the sending of
results from the switch's own address. Each vector IP becomes a loopback address
of its own (127.77.0.x), each ``ip:port`` a socket bound there, so that results
reach the address the vector names and nothing else; a worker registered by IP
alone (udp_port 0) is registered as such.

The action of each step is read in two ways (both must be the vector's): from a
data-plane tap that sees every batch (the step-by-step path), and -- on the
default compiled path, which a tap would bypass -- from the engine's counters.
After each datagram the runner waits until the switch has counted it; results are
sent in the same event-loop callback, and loopback delivery is synchronous, so
every socket is then drained: what is not there was not sent.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest
from conformance import (
    StepResult,
    VectorMismatch,
    check_counters,
    check_step,
    format_addr,
    initial_registrations,
    load_vectors,
    parse_addr,
    step_datagram,
    step_registration,
)

import swemu
from swemu.core.engine import Action, Batch, EngineConfig
from swemu.core.state import GlobalCounter, JobCounter
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc

VECTORS = load_vectors()
LOOPBACK_BASE = 0x7F4D0000  # 127.77.0.0/16
STEP_TIMEOUT = 5.0  # seconds for the switch to count one datagram


def _ip_str(ip: int) -> str:
    return ".".join(str((ip >> s) & 0xFF) for s in (24, 16, 8, 0))


class LoopbackNet:
    """Vector addresses mapped onto loopback sockets, one per ``ip:port`` the vector uses."""

    def __init__(self, vector: dict[str, Any]) -> None:
        addrs: set[tuple[int, int]] = set()
        regs = [*initial_registrations(vector)]
        regs += [step_registration(s) for s in vector["steps"] if "register" in s]
        addrs.update((r.ipv4, r.udp_port) for r in regs if r.udp_port)
        ips = {r.ipv4 for r in regs}
        for step in vector["steps"]:
            if "register" in step:
                continue
            addrs.add(parse_addr(step["from"]))
            addrs.update(parse_addr(o["to"]) for o in step["expect"].get("out", []))
        ips.update(ip for ip, _ in addrs)
        self.ip_map = {ip: LOOPBACK_BASE + i + 1 for i, ip in enumerate(sorted(ips))}
        self.socks: dict[tuple[int, int], socket.socket] = {}
        self.port_map: dict[int, int] = {}  # vector port number -> real port number
        # A port number keeps its meaning across IPs (a worker registered by IP alone
        # gets results at the *triggering packet's* source port): map numbers, not
        # addresses, to one free port bound on every IP that uses it.
        for port in sorted({p for _, p in addrs}):
            group = sorted(a for a in addrs if a[1] == port)
            self._bind_group(port, group)

    def _bind_group(self, port: int, group: list[tuple[int, int]]) -> None:
        for _ in range(50):
            bound: list[socket.socket] = []
            try:
                real = 0
                for ip, _ in group:
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    bound.append(s)
                    s.bind((_ip_str(self.ip_map[ip]), real))
                    real = s.getsockname()[1]
            except OSError:
                for s in bound:
                    s.close()
                continue
            for addr, s in zip(group, bound):
                s.setblocking(False)
                self.socks[addr] = s
            self.port_map[port] = real
            return
        raise OSError(f"no port number free on all of {group}")

    def registered(self, ipv4: int, udp_port: int) -> tuple[int, int]:
        """The (ip, port) a vector registration becomes (port 0 stays 0)."""
        return self.ip_map[ipv4], self.port_map[udp_port] if udp_port else 0

    def drain(self, switch: tuple[str, int]) -> list[tuple[str, bytes]]:
        """Every datagram waiting on any socket, as ``(vector address, bytes)``."""
        got = []
        for (ip, port), s in self.socks.items():
            while True:
                try:
                    data, src = s.recvfrom(65536)
                except BlockingIOError:
                    break
                assert src == switch, f"result from {src}, not the switch's {switch}"
                got.append((format_addr(ip, port), data))
        return got

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


def _totals(engine: Any) -> dict[str, int]:
    jobs = engine.job_counters.sum(axis=0)
    return {
        "pkts_in": int(engine.global_counters[GlobalCounter.PKTS_IN]),
        "unknown": int(engine.global_counters[GlobalCounter.DROP_UNKNOWN_SOURCE]),
        "malformed": int(jobs[JobCounter.DROP_MALFORMED]),
        "wrong_size": int(jobs[JobCounter.DROP_WRONG_SIZE]),
        "slot_range": int(jobs[JobCounter.DROP_SLOT_RANGE]),
        "unicast": int(jobs[JobCounter.UNICAST]),
        "multicast": int(jobs[JobCounter.MULTICAST]),
        "retransmissions": int(jobs[JobCounter.RETRANSMISSIONS]),
        "aggregated": int(jobs[JobCounter.AGGREGATED]),
    }


#: Counter that moves -> the action, first match wins (a unicast is also a
#: retransmission, a multicast also an aggregation).
_ACTION_OF_COUNTER = [
    ("unknown", Action.DROP_UNKNOWN_SOURCE),
    ("malformed", Action.DROP_MALFORMED),
    ("wrong_size", Action.DROP_WRONG_SIZE),
    ("slot_range", Action.DROP_SLOT_RANGE),
    ("unicast", Action.UNICAST),
    ("multicast", Action.MULTICAST),
    ("retransmissions", Action.RETRANSMIT_PENDING),
    ("aggregated", Action.AGGREGATED),
]


def _action_from_counters(before: dict[str, int], after: dict[str, int]) -> str:
    for name, action in _ACTION_OF_COUNTER:
        if after[name] != before[name]:
            return action.name
    return "NOTHING_COUNTED"


async def _register(stub: Any, net: LoopbackNet, reg: Any) -> None:
    ipv4, udp_port = net.registered(reg.ipv4, reg.udp_port)
    resp = await stub.UdpSession(
        pb.UdpSessionRequest(
            session_id=reg.session_id,
            rank=reg.rank,
            num_workers=reg.num_workers,
            ipv4=ipv4,
            udp_port=udp_port,
            packet_size=reg.size_code,
            pool_size=reg.pool_size,
            value_formats=reg.value_formats,
        )
    )
    assert resp.session_id == reg.session_id
    assert resp.value_formats == reg.value_formats


async def run_vector_over_udp(vector: dict[str, Any], *, tap: bool) -> list[StepResult]:
    """Every step of ``vector`` through a fresh in-process emulator; raise
    :class:`conformance.VectorMismatch` at the first difference."""
    loop = asyncio.get_running_loop()
    net = LoopbackNet(vector)
    seen: list[int] = []
    results = []
    try:
        async with swemu.serve(config=EngineConfig(pool_size=vector["switch"]["pool_size"])) as emu:
            if tap:

                def record(batch: Batch, now: float) -> None:
                    seen.extend(int(a) for a in batch.action[: batch.n])

                emu.data_plane.tap = record
            engine = emu.engine
            async with grpc.aio.insecure_channel("%s:%d" % emu.control_address) as channel:
                stub = pb_grpc.SessionStub(channel)
                for reg in initial_registrations(vector):
                    await _register(stub, net, reg)
                for i, step in enumerate(vector["steps"]):
                    if "register" in step:
                        await _register(stub, net, step_registration(step))
                        continue
                    before = _totals(engine)
                    net.socks[parse_addr(step["from"])].sendto(
                        step_datagram(step), emu.data_address
                    )
                    deadline = loop.time() + STEP_TIMEOUT
                    while _totals(engine)["pkts_in"] == before["pkts_in"]:
                        assert loop.time() < deadline, f"step {i}: the switch never saw it"
                        await asyncio.sleep(0.001)
                    action = _action_from_counters(before, _totals(engine))
                    if tap:
                        assert Action(seen[-1]).name == action, f"step {i}: tap vs counters"
                    got = StepResult(i, action, net.drain(emu.data_address))
                    check_step(vector, i, got)
                    results.append(got)
                check_counters(vector, engine)
    finally:
        net.close()
    return results


@pytest.mark.parametrize("path", ["compiled", "tap"])
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
async def test_vector_over_grpc_and_udp(vector: dict[str, Any], path: str) -> None:
    """Same actions, same datagrams from the switch's address to the same sockets."""
    results = await run_vector_over_udp(vector, tap=path == "tap")
    assert len(results) == sum(1 for s in vector["steps"] if "register" not in s)


async def test_a_wrong_expectation_fails_over_udp() -> None:
    """The runner can fail: a vector expecting a different sum is caught."""
    vector = next(v for v in VECTORS if v["name"] == "write_add_multicast")
    broken = {**vector, "steps": [dict(s) for s in vector["steps"]]}
    last = max(i for i, s in enumerate(broken["steps"]) if "register" not in s)
    step = broken["steps"][last]
    assert step["expect"]["out"], "the last step of this vector multicasts"
    outs = [{**o, "packet": {**o["packet"], "values": [-1]}} for o in step["expect"]["out"]]
    broken["steps"][last] = {**step, "expect": {**step["expect"], "out": outs}}
    with pytest.raises(VectorMismatch, match=r"write_add_multicast\.json step"):
        await run_vector_over_udp(broken, tap=False)
