"""The live view: ``swemu.observe.tui.render`` on snapshots of a real emulator, and the
commands that show it (``serve --tui``, ``top``).

The numbers on screen must be the snapshot's counters: the view is rendered
with ``Console(record=True)`` and read back as text.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from click.testing import CliRunner
from conftest import LOCALHOST, packet
from rich.console import Console

import hostlib
import swemu
from cli.main import emu as emu_cli
from swemu.core.engine import EngineConfig
from swemu.launch import Watched, child_env
from swemu.observe.stats import fetch_stats
from swemu.observe.tui import (
    SPARK_BLOCKS,
    History,
    fault_totals,
    fmt_bytes,
    fmt_count,
    fmt_gbps,
    fmt_rate,
    payload_bytes,
    render,
    sparkline,
)
from swemu.protocol.proto import switchml_pb2 as spb
from swemu.protocol.proto import switchml_pb2_grpc as spb_grpc

W = 3
RAW_SID = 4242  # the hand-made job with drops of every reason


def text_of(renderable, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def job_section(text: str, sid: int) -> str:
    """The lines of the panel of job ``sid``."""
    start = text.index(f"╭─ job {sid} ")
    end = text.find("╭─ job ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def line_with(text: str, needle: str) -> str:
    (line,) = [ln for ln in text.splitlines() if needle in ln]
    return line


async def raw_job_with_drops(emu, peer) -> None:
    """Job RAW_SID: rank 0 of 2 is ``peer`` (rank 1 never registers); one good
    packet (a pending slot) and one drop of each reason."""
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
    for data in (
        packet(slot=1, values=7),  # aggregated, slot 1 of set 0 waits for rank 1
        b"\x10\x00\x00",  # malformed: shorter than a header
        packet(code=1),  # wrong size code
        packet(slot=9),  # slot out of range
    ):
        peer.send(data, emu.data_address)


async def wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the emulator did not see the packets in time"
        await asyncio.sleep(0.01)


async def test_view_shows_the_counters_of_a_real_run(peers):
    async with swemu.serve(config=EngineConfig(pool_size=64, max_pool_memory=1 << 22)) as emu:
        history = History()
        first = emu.snapshot()
        history.add(first)
        switch, control = "%s:%d" % emu.data_address, "%s:%d" % emu.control_address

        async def worker(rank: int) -> None:
            async with hostlib.aconnect(
                switch,
                control,
                rank=rank,
                world_size=W,
                packet_size=1,
                window=8,
                no_progress=60,
                release=False,  # the view is drawn from the job's counters after the run
            ) as ctx:
                for call in range(3):
                    y = await ctx.allreduce(np.full(3000, rank + call, np.int32))
                    assert (y == sum(r + call for r in range(W))).all()

        await asyncio.wait_for(asyncio.gather(*(worker(r) for r in range(W))), 30)
        raw, stranger = peers(2)
        await raw_job_with_drops(emu, raw)
        stranger.send(packet(), emu.data_address)  # unknown source
        await wait_for(
            lambda: (
                emu.snapshot()["counters"]["pkts_in"]
                == sum(j["counters"]["pkts_in"] for j in emu.snapshot()["jobs"]) + 1
                and len(emu.snapshot()["jobs"]) == 2
                and emu.snapshot()["jobs"][1]["counters"]["pkts_in"] == 4
            )
        )
        snap = emu.snapshot()
        history.add(snap)
    frozen = copy.deepcopy(snap)
    text = text_of(render(snap, history))
    assert snap == frozen, "render must not change the snapshot"
    assert text == text_of(render(snap, history)), "render must be a pure function"

    # the switch
    glob, lim = snap["counters"], snap["limits"]
    assert f"switch pkts in {fmt_count(glob['pkts_in'])}" in text
    assert f"unknown source {fmt_count(glob['drop_unknown_source'])}" in text
    assert glob["drop_unknown_source"] == 1
    assert f"jobs 2/{lim['max_jobs']}" in text
    mem = f"pool memory {fmt_bytes(snap['memory_in_use'])} / {fmt_bytes(snap['max_pool_memory'])}"
    assert mem in text
    assert f"data udp {snap['data_address']}" in text
    # no faults were configured: none injected (or "off" from an engine without them)
    assert ("faults off" if fault_totals(snap) is None else "faults injected 0") in text

    # rates: counter deltas over the snapshots' clock
    dt = snap["time"] - first["time"]
    jobs = snap["jobs"]
    tot_in = sum(j["counters"]["pkts_in"] for j in jobs)
    tot_out = sum(j["counters"]["pkts_out"] for j in jobs)
    good = sum(j["counters"]["aggregated"] * payload_bytes(j["size_code"]) for j in jobs)
    rates = line_with(text.split("╭─ job")[0], " pkt/s")
    assert rates.lstrip().startswith(f"in {fmt_rate(tot_in / dt)} pkt/s")
    assert f"out {fmt_rate(tot_out / dt)} pkt/s" in rates
    assert f"goodput {fmt_gbps(8 * good / dt)} Gbit/s" in rates
    spark = line_with(text, "goodput, last 60 s")
    assert spark.count(SPARK_BLOCKS[-1]) >= 1 and f"peak {fmt_gbps(8 * good / dt)} Gbit/s" in spark

    # every job, every worker
    for job in jobs:
        sec = job_section(text, job["session_id"])
        c = job["counters"]
        assert f"{job['num_workers']} workers · size code {job['size_code']}" in sec
        assert f"pool {fmt_count(job['pool_size'])} slots" in sec
        for s in (0, 1):
            pend, hold = job["slots_pending"][s], job["slots_holding"][s]
            assert f"set {s}: {pend} pending, {hold} holding" in sec
        line = line_with(sec, " aggregated ")
        for label, key in (
            ("in", "pkts_in"),
            ("aggregated", "aggregated"),
            ("retransmissions", "retransmissions"),
            ("out", "pkts_out"),
        ):
            assert f" {label} {fmt_count(c[key])} " in line + " ", (label, line)
        line = line_with(sec, " multicast ")
        assert f"multicast {fmt_count(c['multicast'])} " in line
        assert f"unicast {fmt_count(c['unicast'])} " in line
        line = line_with(sec, " malformed ")
        for label, key in (
            ("malformed", "drop_malformed"),
            ("wrong size", "drop_wrong_size"),
            ("slot range", "drop_slot_range"),
        ):
            assert f"{label} {fmt_count(c[key])} " in line + " "
        jr = (c["pkts_in"] / dt, c["pkts_out"] / dt)
        line = line_with(sec, " pkt/s")
        assert f"in {fmt_rate(jr[0])} pkt/s" in line and f"out {fmt_rate(jr[1])} pkt/s" in line
        for w in job["workers"]:
            addr = f"{w['ip']}:{w['udp_port']}" if w["ip"] else "(not registered)"
            cells = line_with(sec, f" {addr} ").strip("│ \n").split()
            assert cells[0] == str(w["rank"])
            numbers = [fmt_count(w[k]) for k in ("pkts_in", "retransmissions", "last", "drops")]
            assert cells[-4:] == numbers, (cells, w)
        last = [w["last"] for w in job["workers"]]
        slow = line_with(sec, "slowest")
        if sum(last):
            rank = int(np.argmax(last))
            assert f"rank {rank}   last in {fmt_count(last[rank])} slots" in slow
        else:
            assert "—" in slow

    # the hand-made job: one drop of each reason, a pending slot, an absent rank
    raw_job = next(j for j in jobs if j["session_id"] == RAW_SID)
    assert raw_job["slots_pending"] == [1, 0] and raw_job["slots_holding"] == [1, 0]
    sec = job_section(text, RAW_SID)
    assert "malformed 1   wrong size 1   slot range 1" in sec and "(not registered)" in sec
    hl = next(j for j in jobs if j["session_id"] != RAW_SID)
    assert hl["counters"]["multicast"] == 3 * -(-3000 // 64)


def test_view_of_faults_capture_and_many_jobs():
    """The optional parts of a snapshot (fault counters, capture) and the job limit."""
    snap = {
        "counters": {"pkts_in": 5, "drop_unknown_source": 0},
        "released": {},
        "memory_in_use": 0,
        "max_pool_memory": 1 << 30,
        "jobs": [
            {
                "session_id": sid,
                "index": sid,
                "num_workers": 1,
                "size_code": 1,
                "pool_size": 4,
                "memory_bytes": 10,
                "slots_pending": [0, 0],
                "slots_holding": [0, 0],
                "last_seen": 0.0,
                "counters": {"pkts_in": 1},
                "workers": [{"rank": 0, "ip": "10.0.0.1", "udp_port": 9, "pkts_in": 1}],
            }
            for sid in range(1, 6)
        ],
        "time": 1.0,
        "capture": {"packets": 10, "bytes": 1000, "dropped": 4, "full": 1},
    }
    text = text_of(render(snap, None, max_jobs=2))
    assert "faults off" in text and "injected" not in text  # no fault injection at all
    assert "capture 10 pkts (4 not recorded, full)" in text
    assert "job 1 " in text and "job 2 " in text and "job 3 " not in text
    assert "… and 3 more jobs" in text
    for job in snap["jobs"]:
        job["faults"] = {"loss_in": 0, "duplicated": 0}
    text = text_of(render(snap, None))
    assert "faults injected 0" in text and text.count("injected 0") == 6  # header + 5 jobs
    snap["jobs"][0]["faults"] = {"loss_in": 3, "duplicated": 1}
    snap["jobs"][1]["faults"] = {"loss_in": 2, "duplicated": 0}
    snap["faults"] = {"queue_drops": 7}  # switch-wide
    text = text_of(render(snap, None))
    assert "faults injected: duplicated 1   loss in 5   queue drops 7" in text
    assert "injected: duplicated 1   loss in 3" in job_section(text, 1)
    assert "injected: loss in 2" in job_section(text, 2)


def test_history_rates_and_sparkline():
    def snap(t: float, aggregated: int, sid: int = 1) -> dict:
        job = {"session_id": sid, "index": 0, "size_code": 0, "counters": {}}
        job["counters"] = {"aggregated": aggregated, "pkts_in": aggregated}
        return {"time": t, "jobs": [job], "counters": {"pkts_in": aggregated}}

    h = History(window=60.0)
    assert h.rates() is None
    h.add(snap(0.0, 0))
    h.add(snap(2.0, 100))
    h.add(snap(2.0, 999))  # not newer: ignored
    r = h.rates()
    assert r[(1, 0)]["pkts_in"] == 50.0 and r[None]["goodput_bytes"] == 50.0 * 128
    h.add(snap(3.0, 10))  # counters went down: the job was registered again
    assert h.rates()[None]["pkts_in"] == 10.0
    series = h.goodput_series()
    assert [(a, b) for a, b, _ in series] == [(0.0, 2.0), (2.0, 3.0)]
    line, peak = sparkline(series, now=3.0, width=6, span=6.0)
    # columns of 1 s: three before the history, two at 51200 bit/s, one at 10240 bit/s
    assert peak == 100 * 128 * 8 / 2
    assert line == "   " + SPARK_BLOCKS[-1] * 2 + SPARK_BLOCKS[1]
    for t in range(4, 100):
        h.add(snap(float(t), 10 + t))
    assert h.samples[0].time >= 100 - 1 - 60 - 1  # older samples are forgotten


def test_serve_tui_and_top_show_a_running_emulator(tmp_path: Path):
    """``serve --tui`` in a child process; ``top`` attached to it over gRPC."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "cli.main", "serve", "--tui", "--host", "127.0.0.1"]
    cmd += ["--port", "0", "--control-port", "0", "--log-level", "warning"]
    with Watched(
        [*cmd, "--ready-file", str(ready)],
        name="serve --tui",
        stdout=subprocess.PIPE,
        env=child_env(COLUMNS="140"),
    ) as proc:
        proc.wait_until(ready.exists, 60, "its ready file")
        info = json.loads(ready.read_text())
        control = "%s:%d" % tuple(info["control"])
        with hostlib.connect(
            "%s:%d" % tuple(info["data"]),
            control,
            rank=0,
            world_size=1,
            packet_size=0,
            no_progress=60,  # a first run compiles the worker's kernels inside the call
            release=False,  # top shows the job after the worker left
        ) as ctx:
            ctx.allreduce(np.arange(100, dtype=np.int32))
            sid = ctx.session_id
        r = CliRunner(catch_exceptions=False).invoke(
            emu_cli,
            ["top", "--control", control, "--interval", "0.2", "--count", "2"],
            env={"COLUMNS": "140"},
        )
        assert r.exit_code == 0, r.output
        assert f"job {sid} · 1 workers" in r.output and "pkt/s" in r.output
        (job,) = fetch_stats(control)["jobs"]
        c = job["counters"]
        assert job["session_id"] == sid and c["multicast"] == 4  # 100 values, 32 a packet
        line = f"in {c['pkts_in']}   aggregated 4   retransmissions {c['retransmissions']}"
        assert f"{line}   out {c['pkts_out']}" in r.output
        time.sleep(0.6)  # at least one refresh of the serving terminal's view
        proc.send_signal(signal.SIGTERM)
        proc.expect(0, 20, "it to stop on SIGTERM")
        out = proc.stdout()
    # stdout is not a terminal: the view is printed once, at exit
    assert out.count(f"switchml-emu {swemu.__version__}") == 1, out
    assert f"job {sid} · 1 workers" in out and f"switch pkts in {c['pkts_in']}" in out


def test_top_names_an_unreachable_emulator():
    r = CliRunner(catch_exceptions=False).invoke(
        emu_cli, ["top", "--control", "127.0.0.1:1", "--timeout", "0.5"]
    )
    assert r.exit_code == 1 and "no emulator answers on 127.0.0.1:1" in r.output


def _top(control: str, *args: str, **kw) -> subprocess.Popen:
    env = child_env()
    env.pop("COLUMNS", None)  # as a user's pipe: rich's own default width
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "top", "--control", control, *args], env=env, **kw
    )


def test_top_into_a_pipe_prints_every_frame_unwrapped():
    """``top --count 3 | ...``: three frames, one after the other (not only the
    last), no line broken inside a value at rich's 80 columns."""
    from swemu.launch import EmulatorProcess

    with EmulatorProcess() as emu:
        with hostlib.connect(emu.switch, emu.control, rank=0, world_size=1, release=False) as ctx:
            ctx.allreduce(np.arange(5000, dtype=np.int32))
            sid = ctx.session_id
        proc = _top(emu.control, "--count", "3", "--interval", "0.2", stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=60)
        pkts_in = fetch_stats(emu.control)["counters"]["pkts_in"]
    assert proc.returncode == 0
    assert out.decode().count(f"switchml-emu {swemu.__version__}") == 3
    lines = out.decode().splitlines()
    assert sum(f"switch pkts in {pkts_in:,}" in line for line in lines) == 3
    assert sum(f"job {sid} · 1 workers" in line for line in lines) == 3
    assert "q to quit" not in out.decode()  # nobody types into a pipe


def test_top_in_a_terminal_says_how_to_quit_and_q_quits():
    """In a terminal (a pty here) the view ends with how to quit; typing ``q``
    ends ``top`` at once with status 0 and gives the terminal back as it was."""
    import os
    import pty
    import select
    import termios

    from swemu.launch import EmulatorProcess

    with EmulatorProcess() as emu:
        master, slave = pty.openpty()
        before = termios.tcgetattr(slave)
        proc = _top(emu.control, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        seen = b""
        try:
            deadline = time.monotonic() + 60
            while b"q to quit" not in seen:
                assert proc.poll() is None and time.monotonic() < deadline, seen
                if select.select([master], [], [], 0.2)[0]:
                    seen += os.read(master, 65536)
            os.write(master, b"q")
            proc.wait(timeout=10)  # within an --interval (1 s) and its snapshot
            after = termios.tcgetattr(slave)
        finally:
            proc.kill()
            os.close(master)
            os.close(slave)
    assert proc.returncode == 0
    assert b"q to quit (or Ctrl-C)" in seen and b"switchml-emu" in seen
    assert after[3] == before[3]  # echo and line mode restored
