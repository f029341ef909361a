"""Seeing the switch from outside: GetStats over gRPC, ``switchml-emu stats``, and
the Prometheus endpoint, each against a real emulator carrying real traffic."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from itertools import pairwise
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import LOCALHOST, packet

import hostlib
import swemu
from cli.main import emu as emu_cli
from swemu.core.engine import EngineConfig
from swemu.launch import EmulatorProcess, child_env
from swemu.observe.metrics import CONTENT_TYPE, render_metrics
from swemu.observe.pcap import read_pcap
from swemu.observe.stats import EmulatorControlService, add_to_server, afetch_stats, fetch_stats
from swemu.protocol.proto import emulator_pb2 as epb
from swemu.protocol.proto import emulator_pb2_grpc as epb_grpc
from swemu.protocol.proto import switchml_pb2 as spb
from swemu.protocol.proto import switchml_pb2_grpc as spb_grpc

W = 2
LENGTH = 5000
CODE = 1  # 64 values a packet
CHUNKS = -(-LENGTH // (32 << CODE))
RAW_SID = 99
CONFIG = EngineConfig(pool_size=64, max_pool_memory=1 << 22)


async def allreduce_job(switch: str, control: str, calls: int = 2) -> None:
    """``W`` hostlib workers in this loop, ``calls`` int32 allreduces, results checked."""

    async def one(rank: int) -> None:
        async with hostlib.aconnect(
            switch,
            control,
            rank=rank,
            world_size=W,
            packet_size=CODE,
            window=16,
            no_progress=60,  # a first run compiles the worker's kernels inside the call
            release=False,  # the tests read the job's counters after its workers left
        ) as ctx:
            for call in range(calls):
                y = await ctx.allreduce(np.full(LENGTH, rank * 10 + call, np.int32))
                assert (y == sum(r * 10 + call for r in range(W))).all()

    await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(W))), 60)


async def raw_job(emu, peer) -> None:
    """Job RAW_SID: rank 0 of 2 is ``peer`` (rank 1 never registers); a pending
    slot and a drop of every reason, plus a packet from an unknown source."""
    async with grpc.aio.insecure_channel("%s:%d" % emu.control_address) as ch:
        await spb_grpc.SessionStub(ch).UdpSession(
            spb.UdpSessionRequest(
                session_id=RAW_SID,
                rank=0,
                num_workers=2,
                ipv4=LOCALHOST,
                packet_size=0,
                udp_port=peer.port,
                pool_size=4,
            )
        )
    for data in (packet(slot=2, values=5), b"\x10\x00", packet(code=2), packet(slot=4)):
        peer.send(data, emu.data_address)
    deadline = time.monotonic() + 5

    def raw_pkts_in() -> int:
        jobs = emu.engine.snapshot()["jobs"]
        return next(j for j in jobs if j["session_id"] == RAW_SID)["counters"]["pkts_in"]

    while raw_pkts_in() < 4:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def without_clock(snap: dict) -> dict:
    return {k: v for k, v in snap.items() if k not in ("time", "uptime")}


# ------------------------------------------------------------------ GetStats
async def test_get_stats_over_grpc_equals_the_snapshot(peers):
    async with swemu.serve(config=CONFIG) as emu:
        control = "%s:%d" % emu.control_address
        await allreduce_job("%s:%d" % emu.data_address, control)
        (peer,) = peers(1)
        await raw_job(emu, peer)
        before = time.monotonic()
        fetched = await afetch_stats(control)
        local = emu.snapshot()
        engine = emu.engine.snapshot()
        async with grpc.aio.insecure_channel(control) as ch:
            msg = await epb_grpc.EmulatorControlStub(ch).GetStats(epb.GetStatsRequest())

    # every key of the engine's snapshot, value for value (floats included)
    for key, value in engine.items():
        assert fetched[key] == value, key
    assert without_clock(fetched) == without_clock(local)
    assert before <= fetched["time"] <= local["time"]
    assert 0 < fetched["uptime"] <= local["uptime"]
    assert fetched["data_address"] == "%s:%d" % emu.data_address
    assert fetched["limits"]["pool_size"] == 64 and fetched["limits"]["idle_timeout"] is None
    assert fetched["data_plane"]["batches"] > 0

    # what is on the wire: counters as maps, an absent rank marked unregistered
    hl, raw = sorted(msg.jobs, key=lambda j: j.session_id == RAW_SID)
    assert hl.counters["multicast"] == 2 * CHUNKS and hl.counters["aggregated"] == W * 2 * CHUNKS
    assert [w.registered for w in raw.workers] == [True, False]
    rc = raw.counters
    assert (rc["pkts_in"], rc["aggregated"], rc["multicast"], rc["pkts_out"]) == (4, 1, 0, 0)
    assert rc["drop_malformed"] == rc["drop_wrong_size"] == rc["drop_slot_range"] == 1
    assert list(raw.slots_pending) == [1, 0] and msg.counters["drop_unknown_source"] == 0


async def test_set_faults_validates_and_reaches_the_handler():
    """SetFaults on a real gRPC server: UNIMPLEMENTED without a handler, else the
    handler gets the validated request (``worker`` unset means every worker)."""
    seen = []

    def handler(cfg: epb.FaultConfig) -> epb.FaultConfig:
        seen.append(cfg)
        if cfg.session_id == 7:
            raise LookupError("no session 7")
        return cfg

    snap = {"counters": {}, "jobs": [], "memory_in_use": 0, "max_pool_memory": 0}
    servers = []
    for h in (None, handler):
        server = grpc.aio.server()
        add_to_server(EmulatorControlService(lambda: snap, h), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append((server, port))
    try:
        async with grpc.aio.insecure_channel("127.0.0.1:%d" % servers[0][1]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await epb_grpc.EmulatorControlStub(ch).SetFaults(epb.FaultConfig(loss_in=0.1))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel("127.0.0.1:%d" % servers[1][1]) as ch:
            stub = epb_grpc.EmulatorControlStub(ch)
            got = await stub.SetFaults(epb.FaultConfig(loss_in=0.25, delay_ms=3, seed=5))
            assert got.loss_in == 0.25 and not got.HasField("worker")
            got = await stub.SetFaults(epb.FaultConfig(duplicate=1.0, worker=0))
            assert got.HasField("worker") and got.worker == 0
            for bad, words in (
                (epb.FaultConfig(loss_out=1.5), "loss_out 1.5 must be a probability"),
                (epb.FaultConfig(reorder_ms=-1), "reorder_ms -1.0 must be"),
                (epb.FaultConfig(worker=-2), "worker -2 must be a rank"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.SetFaults(bad)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert words in err.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SetFaults(epb.FaultConfig(session_id=7))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "no session 7" in err.value.details()
        assert len(seen) == 3  # the refused ones never reached the handler
    finally:
        for server, _ in servers:
            await server.stop(None)


# ---------------------------------------------------------------- Prometheus
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """A strict reader of the text format: every sample's family has one TYPE line
    before it, label values are unescaped; returns (name, labels) -> value."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, f"second TYPE line for {name}"
            assert kind in ("counter", "gauge"), line
            assert kind == "gauge" or name.endswith("_total"), line
            types[name] = kind
            continue
        if line.startswith("# HELP ") or not line:
            continue
        assert not line.startswith("#"), line
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, body, value = m.groups()
        assert name in types, f"{name} has no TYPE line before it"
        labels = {}
        pos = 0
        while body and pos < len(body):
            lm = _LABEL.match(body, pos)
            assert lm, f"bad labels in {line!r}"
            raw = lm.group(2)
            labels[lm.group(1)] = re.sub(
                r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), raw
            )
            pos = lm.end()
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return samples


def scrape(url: str) -> tuple[int, dict, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, dict(resp.headers), resp.read().decode()


def lab(**kw) -> frozenset:
    return frozenset((k, str(v)) for k, v in kw.items())


def check_metrics_equal_snapshot(samples: dict, snap: dict) -> None:
    """Every counter and gauge of the snapshot, as the endpoint must show it."""
    glob = snap["counters"]
    assert samples[("switchml_switch_packets_in_total", lab())] == glob["pkts_in"]
    assert (
        samples[("switchml_drops_total", lab(reason="unknown_source"))]
        == glob["drop_unknown_source"]
    )
    assert samples[("switchml_jobs", lab())] == len(snap["jobs"])
    assert samples[("switchml_pool_memory_bytes", lab())] == snap["memory_in_use"]
    assert samples[("switchml_pool_memory_max_bytes", lab())] == snap["max_pool_memory"]
    names = {
        "pkts_in": "switchml_packets_in_total",
        "bytes_in": "switchml_bytes_in_total",
        "aggregated": "switchml_aggregated_total",
        "retransmissions": "switchml_retransmissions_total",
        "pkts_out": "switchml_packets_out_total",
        "bytes_out": "switchml_bytes_out_total",
    }
    for job in snap["jobs"]:
        sid, c = job["session_id"], job["counters"]
        for key, name in names.items():
            assert samples[(name, lab(job=sid))] == c[key], name
        for kind in ("multicast", "unicast"):
            assert samples[("switchml_results_total", lab(job=sid, kind=kind))] == c[kind]
        for reason in ("malformed", "wrong_size", "slot_range"):
            value = samples[("switchml_drops_total", lab(job=sid, reason=reason))]
            assert value == c[f"drop_{reason}"]
        assert samples[("switchml_job_workers", lab(job=sid))] == job["num_workers"]
        assert samples[("switchml_job_pool_slots", lab(job=sid))] == job["pool_size"]
        assert samples[("switchml_job_memory_bytes", lab(job=sid))] == job["memory_bytes"]
        for s in (0, 1):
            pend = samples[("switchml_slots_pending", lab(job=sid, set=s))]
            hold = samples[("switchml_slots_holding", lab(job=sid, set=s))]
            assert (pend, hold) == (job["slots_pending"][s], job["slots_holding"][s])
        for kind, n in (job.get("faults") or {}).items():
            assert samples[("switchml_faults_injected_total", lab(job=sid, kind=kind))] == n
        for w in job["workers"]:
            addr = f"{w['ip']}:{w['udp_port']}" if w["ip"] else ""
            wl = lab(job=sid, rank=w["rank"], address=addr)
            assert samples[("switchml_worker_packets_in_total", wl)] == w["pkts_in"]
            assert samples[("switchml_worker_retransmissions_total", wl)] == w["retransmissions"]
            assert samples[("switchml_worker_last_total", wl)] == w["last"]
            assert samples[("switchml_worker_drops_total", wl)] == w["drops"]


async def test_prometheus_endpoint_during_and_after_a_run(peers):
    async with swemu.serve(config=CONFIG, metrics_port=0) as emu:
        url = "http://%s:%d/metrics" % emu.metrics_address
        control = "%s:%d" % emu.control_address
        run = asyncio.ensure_future(allreduce_job("%s:%d" % emu.data_address, control, calls=40))
        during = []
        n_scrapes = 0
        while not run.done():
            status, headers, body = await asyncio.to_thread(scrape, url)
            n_scrapes += 1
            assert status == 200 and headers["Content-Type"] == CONTENT_TYPE
            if not run.done():
                during.append(parse_exposition(body))
        await run
        (peer,) = peers(1)
        await raw_job(emu, peer)
        _, _, body = await asyncio.to_thread(scrape, url)
        snap = emu.snapshot()
        for path, method, code in (("/nope", "GET", 404), ("/metrics", "POST", 405)):
            req = urllib.request.Request(url.replace("/metrics", path), method=method, data=None)
            with pytest.raises(urllib.error.HTTPError) as err:
                await asyncio.to_thread(urllib.request.urlopen, req, None, 10)
            assert err.value.code == code
        head = urllib.request.Request(url, method="HEAD")
        resp = await asyncio.to_thread(urllib.request.urlopen, head, None, 10)
        assert resp.status == 200 and resp.read() == b"" and int(resp.headers["Content-Length"]) > 0
        scrapes = emu.metrics.scrapes

    assert during, "no scrape while the workers ran"
    # counters never go down between scrapes
    seq = [*during, parse_exposition(body)]
    for a, b in pairwise(seq):
        for key, value in a.items():
            if key[0].endswith("_total") and key in b:
                assert b[key] >= value, key
    final = parse_exposition(body)
    check_metrics_equal_snapshot(final, snap)
    assert scrapes == n_scrapes + 2  # the final GET and the HEAD; not the 404 and 405


def test_label_values_are_escaped():
    snap = {
        "counters": {"pkts_in": 1, "drop_unknown_source": 0},
        "released": {"idle": 0},
        "memory_in_use": 0,
        "max_pool_memory": 1,
        "version": 'v"1\\2\n3',
        "jobs": [
            {
                "session_id": 5,
                "index": 0,
                "num_workers": 1,
                "size_code": 0,
                "pool_size": 1,
                "memory_bytes": 1,
                "slots_pending": [0, 0],
                "slots_holding": [0, 0],
                "last_seen": 0.0,
                "counters": {"pkts_in": 1, "new-counter": 2},
                "workers": [
                    {"rank": 0, "ip": "a\\b", "udp_port": 1, "pkts_in": 1, "last": 0},
                ],
            }
        ],
    }
    text = render_metrics(snap)
    assert 'switchml_up{version="v\\"1\\\\2\\n3"} 1\n' in text
    samples = parse_exposition(text)
    assert samples[("switchml_up", lab(version='v"1\\2\n3'))] == 1
    assert samples[("switchml_worker_packets_in_total", lab(job=5, rank=0, address="a\\b:1"))] == 1
    assert samples[("switchml_job_new_counter_total", lab(job=5))] == 2  # names made valid


# ------------------------------------------------------- the command line
def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stats_command_and_metrics_of_a_serving_process(tmp_path: Path):
    pcap = tmp_path / "run.pcap"
    mport = free_tcp_port()
    with EmulatorProcess("--metrics-port", str(mport), "--pcap", str(pcap)) as proc:
        asyncio.run(allreduce_job(proc.switch, proc.control))
        r = subprocess.run(
            [sys.executable, "-m", "cli.main", "stats", "--control", proc.control, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
        assert r.returncode == 0, r.stderr
        printed = json.loads(r.stdout)
        now = fetch_stats(proc.control)
        _, _, body = scrape(f"http://127.0.0.1:{mport}/metrics")
        text = CliRunner(catch_exceptions=False).invoke(
            emu_cli, ["stats", "--control", proc.control], env={"COLUMNS": "140"}
        )
        env = child_env()
        env.pop("COLUMNS", None)  # as a user's pipe: rich's own default of 80 columns
        piped = subprocess.run(
            [sys.executable, "-m", "cli.main", "stats", "--control", proc.control],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert without_clock(printed) == without_clock(now)
    assert printed["time"] < now["time"]
    (job,) = printed["jobs"]
    c = job["counters"]
    assert c["multicast"] == 2 * CHUNKS and c["aggregated"] == W * c["multicast"]
    assert c["pkts_in"] == c["aggregated"] + c["retransmissions"]
    assert c["pkts_out"] == W * c["multicast"] + c["unicast"]
    assert printed["capture"]["packets"] == printed["counters"]["pkts_in"] + c["pkts_out"]
    check_metrics_equal_snapshot(parse_exposition(body), printed)

    assert text.exit_code == 0, text.output
    out = text.output
    assert f"job {job['session_id']} · {W} workers" in out
    assert f"in {c['pkts_in']:,}   aggregated {c['aggregated']:,}" in out
    assert f"multicast {c['multicast']:,}   unicast {c['unicast']:,}" in out
    dp = printed["data_plane"]
    assert f"data plane: batches {dp['batches']:,}   recv errors {dp['recv_errors']}" in out

    # into a pipe: no line broken inside a value (it was at 80 columns)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    pkts = f"switch pkts in {now['counters']['pkts_in']:,}"  # the last snapshot's, as piped's
    assert any(pkts in line for line in lines), piped.stdout
    assert any("drops: unknown source 0   malformed 0" in line for line in lines)
    assert any(f"in {c['pkts_in']:,}   aggregated {c['aggregated']:,}" in line for line in lines)
    freed = (
        "jobs freed: released 0   expired 0   evicted 0   replaced 0   "
        "idle timeout 600 s, evict after 1 s idle"
    )
    assert len(freed) > 80 and freed in lines, piped.stdout  # one line, however long
    drops = "slot range 0   faults injected 0   capture"
    assert any(line.startswith("drops: ") and drops in line for line in lines), piped.stdout

    # the capture file, closed at exit, holds every packet in and out
    assert len(list(read_pcap(pcap))) == printed["capture"]["packets"]


def test_stats_without_an_emulator_is_one_line():
    r = CliRunner(catch_exceptions=False).invoke(
        emu_cli, ["stats", "--control", "127.0.0.1:1", "--timeout", "0.5"]
    )
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert r.output.startswith("error: no emulator answers on 127.0.0.1:1 (")
    r = CliRunner(catch_exceptions=False).invoke(emu_cli, ["stats", "--control", "nohost:99999"])
    assert r.exit_code == 2 and "is not HOST:PORT" in r.output
