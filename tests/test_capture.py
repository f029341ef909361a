"""Packet capture of a real allreduce: the emulator's pcap tap, read back with scapy.

An in-process emulator on a SwitchML port (0xBEE0-0xBEEF, so that the decoder
and the scapy layer recognise the traffic) records to a pcap file while
hostlib workers allreduce int32 inputs chosen here. The file is read back with
scapy (``swemu.observe.scapy_switchml``) and every header and value is checked
against what the workers sent and what the switch had to answer; the counts
are checked against the engine's counters; ``switchml-emu decode`` shows the
slots. Runs on both the compiled (recvmmsg) and the portable data-plane paths,
whose taps are separate code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import hostlib
import swemu
from cli.main import emu as emu_cli
from swemu.core.engine import EngineConfig
from swemu.observe.pcap import read_pcap
from swemu.protocol import wire

pytest.importorskip("scapy")
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from swemu.observe.scapy_switchml import SwitchML

W = 3  # workers
CODE = 0  # size code: 32 values per packet
N = wire.values_per_packet(CODE)
WINDOW = 4  # slots
LENGTH = 10 * N + 5  # 11 chunks, the last one partial
CHUNKS = -(-LENGTH // N)
CALLS = 2


def inputs(rank: int, call: int) -> np.ndarray:
    """What rank ``rank`` sends in call ``call``: distinct per rank, call and element,
    negative values and int32 wrap-around included."""
    x = np.arange(LENGTH, dtype=np.int64) * (rank + 1) * (-1) ** call + 1000 * rank
    x[0] = 2**31 - 1 - rank  # the sum wraps
    return x.astype(np.int32)


def uses_per_call(slot: int) -> int:
    """How many chunks of one call go on ``slot`` (chunks slot, slot + K, …)."""
    return len(range(slot, CHUNKS, WINDOW))


def chunk_of(x: np.ndarray, tsi: int) -> list[int]:
    """The values of chunk ``tsi`` as a packet carries them (zero-padded)."""
    c = np.zeros(N, np.int32)
    part = x[tsi * N : (tsi + 1) * N]
    c[: part.size] = part
    return c.tolist()


@contextlib.asynccontextmanager
async def switchml_port_emulator(**kw):
    """An emulator on a free port of 0xBEE0-0xBEEF (other test runs may hold some)."""
    last: OSError | None = None
    for port in range(wire.UDP_PORT_BASE, wire.UDP_PORT_BASE + 16):
        try:
            cm = swemu.serve(port=port, **kw)
            emu = await cm.__aenter__()
        except OSError as exc:
            last = exc
            continue
        try:
            yield emu
        finally:
            await cm.__aexit__(None, None, None)
        return
    pytest.skip(f"every SwitchML port 0xBEE0-0xBEEF is in use ({last})")


async def run_workers(emu) -> list[tuple[str, int]]:
    """``CALLS`` allreduces of :func:`inputs` by ``W`` workers; returns the rank ->
    (ip, port) addresses the switch registered, and checks every result."""
    switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address

    async def one(rank: int) -> list[np.ndarray]:
        async with hostlib.aconnect(
            switch,
            control,
            rank=rank,
            world_size=W,
            packet_size=CODE,
            window=WINDOW,
            no_progress=60,  # a first run compiles the worker's kernels inside the call
            release=False,  # the job's registered addresses are read afterwards
        ) as ctx:
            return [await ctx.allreduce(inputs(rank, c)) for c in range(CALLS)]

    results = await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(W))), 30)
    for c in range(CALLS):
        want = sum(inputs(r, c).astype(np.int64) for r in range(W)).astype(np.int32)
        for r in range(W):
            np.testing.assert_array_equal(results[r][c], want)
    (job,) = emu.snapshot()["jobs"]
    return [(w["ip"], w["udp_port"]) for w in job["workers"]]


@pytest.fixture(params=["compiled-io", "portable-io"])
def io_path(request, monkeypatch):
    monkeypatch.setenv("SWEMU_PORTABLE", "1" if request.param == "portable-io" else "0")
    return request.param


CONFIG = EngineConfig(pool_size=64, max_pool_memory=1 << 20)


async def test_capture_of_an_allreduce_matches_what_was_sent(tmp_path: Path, io_path):
    path = tmp_path / "allreduce.pcap"
    started = time.time() * 1e6
    async with switchml_port_emulator(config=CONFIG, pcap=path) as emu:
        addrs = await run_workers(emu)
        switch = emu.data_address
        snap = emu.snapshot()
    rank_of = {a: r for r, a in enumerate(addrs)}
    (job,) = snap["jobs"]
    cnt = job["counters"]

    pkts = rdpcap(str(path))
    assert len(pkts) == snap["counters"]["pkts_in"] + cnt["pkts_out"]
    # wall-clock times of this run, in order, to the µs (under uvloop too, whose
    # loop clock moves in whole milliseconds: they were all multiples of 1 ms)
    us = [round(p.time * 1e6) for p in pkts]
    assert us == sorted(us) and started - 1e6 <= us[0] and us[-1] <= time.time() * 1e6 + 1e6
    steps = [b - a for a, b in itertools.pairwise(sorted(set(us)))]
    assert any(d % 1000 not in (999, 0, 1) for d in steps), "timestamps in 1 ms steps"
    assert snap["capture"]["packets"] == len(pkts) and snap["capture"]["dropped"] == 0

    sent: dict[tuple[int, int, int], set] = defaultdict(set)  # (rank, call, tsi) -> copies
    results: dict[tuple[int, int], set[int]] = defaultdict(set)  # (call, tsi) -> ranks
    n_in = n_out = 0
    for p in pkts:
        assert SwitchML in p, p.summary()
        sw = p[SwitchML]
        src, dst = (p[IP].src, p[UDP].sport), (p[IP].dst, p[UDP].dport)
        assert (sw.msg_type, sw.size, sw.reserved, sw.e0, sw.e1) == (1, CODE, 0, 0, 0)
        call, tsi = sw.job_number, sw.tsi
        assert 0 <= call < CALLS and 0 <= tsi < CHUNKS
        # chunk i goes on slot i mod K; each use of a slot flips its set, across calls too
        assert sw.slot == tsi % WINDOW
        assert sw.set == (call * uses_per_call(sw.slot) + tsi // WINDOW) % 2
        if dst == switch:
            n_in += 1
            rank = rank_of[src]
            assert sw.values == chunk_of(inputs(rank, call), tsi)
            sent[(rank, call, tsi)].add(bytes(sw))
        else:
            assert src == switch
            n_out += 1
            want = sum(np.array(chunk_of(inputs(r, call), tsi), np.int64) for r in range(W))
            assert sw.values == want.astype(np.int32).tolist()
            results[(call, tsi)].add(rank_of[dst])
    assert n_in == cnt["pkts_in"] and n_out == cnt["pkts_out"]
    # every worker sent every chunk of every call (a retransmission is an identical copy)
    assert set(sent) == {(r, c, t) for r in range(W) for c in range(CALLS) for t in range(CHUNKS)}
    assert all(len(copies) == 1 for copies in sent.values())
    # every chunk's result reached every worker
    assert set(results) == {(c, t) for c in range(CALLS) for t in range(CHUNKS)}
    assert all(ranks == set(range(W)) for ranks in results.values())
    assert cnt["multicast"] == CALLS * CHUNKS and cnt["aggregated"] == W * CALLS * CHUNKS

    # the decoder, as `switchml-emu decode` runs it
    slot = 1
    r = CliRunner(catch_exceptions=False).invoke(
        emu_cli, ["decode", str(path), "--slot", str(slot), "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    events = doc["events"]
    tsis = {t for t in range(CHUNKS) if t % WINDOW == slot}
    assert events and {e["slot"] for e in events} == {slot}
    assert {e["tsi"] for e in events} == tsis
    contributions = [e for e in events if e["kind"] == "contribution"]
    assert len(contributions) == W * CALLS * len(tsis)
    multicasts = [e for e in events if e["kind"] == "result (multicast)"]
    assert len(multicasts) == W * CALLS * len(tsis) and {e["fanout"] for e in multicasts} == {W}
    s = doc["summary"]
    assert s["results"]["multicast"] == CALLS * CHUNKS
    assert s["retransmissions"] == cnt["retransmissions"] and s["malformed"] == 0
    assert s["slots"] == WINDOW and len(s["workers"]) == W

    r = CliRunner(catch_exceptions=False).invoke(
        emu_cli, ["decode", str(path), "--slot", str(slot)]
    )
    assert r.exit_code == 0, r.output
    port = f"{switch[1]:#x}:{slot}"
    assert port in r.output and f"{port[:-1]}{slot + 1}" not in r.output
    assert f"{len(events)} of {len(events)} events" in r.output
    for a in addrs:
        assert "%s:%d" % a in r.output


async def test_capture_is_bounded_and_counts_what_it_left_out(tmp_path: Path, io_path):
    path = tmp_path / "bounded.pcap"
    async with switchml_port_emulator(config=CONFIG, pcap=path, pcap_max_packets=10) as emu:
        await run_workers(emu)
        snap = emu.snapshot()
    total = snap["counters"]["pkts_in"] + snap["jobs"][0]["counters"]["pkts_out"]
    assert len(list(read_pcap(path))) == 10
    assert snap["capture"] == {
        "packets": 10,
        "bytes": path.stat().st_size,
        "dropped": total - 10,
        "full": 1,
    }


def test_decode_cli_errors_are_one_line(tmp_path: Path):
    bad = tmp_path / "not.pcap"
    bad.write_bytes(b"this is not a capture at all")
    r = CliRunner(catch_exceptions=False).invoke(emu_cli, ["decode", str(bad)])
    assert r.exit_code == 1 and "not a classic pcap" in r.output
