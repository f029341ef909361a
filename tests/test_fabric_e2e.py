"""A fabric of real emulators (docs/protocol.md §7): a root and child switches as
processes on loopback, workers registered at their own switch only, several jobs
at once, loss on every link. The same rules in memory: tests/test_fabric.py."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest
from workers import fabric_rank

from swemu.launch import EmulatorProcess
from swemu.observe.stats import fetch_stats

LOSS = ("--loss-in", "0.01", "--loss-out", "0.01")


def run_jobs(jobs: dict[int, list[str]], *, calls: int, n: int, timeout: float = 240.0):
    """Run every job at once: ``jobs[session] = [control address of rank r]``.
    Returns ``{(session, rank): wrong lines}``. A rank that raised fails the test
    with its traceback; one that exited without a word, with its exit status."""
    mp = multiprocessing.get_context("spawn")
    out = mp.Queue()
    procs = {}
    for sid, controls in jobs.items():
        for rank, control in enumerate(controls):
            p = mp.Process(
                target=fabric_rank, args=(rank, len(controls), control, sid, calls, n, out)
            )
            p.start()
            procs[(sid, rank)] = p
    got: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(procs):
            try:
                sid, rank, value = out.get(timeout=0.5)
            except queue.Empty:
                dead = {k: p.exitcode for k, p in procs.items() if p.exitcode is not None}
                silent = {k: c for k, c in dead.items() if k not in got}
                if silent and out.empty():
                    time.sleep(1.0)  # its last message may still be on its way
                    if out.empty():
                        pytest.fail(f"ranks exited without a result (exit status): {silent}")
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"no result within {timeout:g} s from {sorted(set(procs) - set(got))}"
                    )
                continue
            if isinstance(value, str):
                pytest.fail(f"session {sid} rank {rank}: {value}")
            got[(sid, rank)] = value
    finally:
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
    return got


@pytest.fixture
def fabric():
    """A root and three children, with 1 % loss on every link (each switch's
    own: a child's links to its workers, the root's to the children)."""
    started = []
    try:
        root = EmulatorProcess(*LOSS, "--seed", "1").start()
        started.append(root)
        for i in range(3):
            started.append(
                EmulatorProcess("--parent", root.control, *LOSS, "--seed", str(2 + i)).start()
            )
        yield started
    finally:
        for emu in reversed(started):
            emu.stop()


@pytest.mark.slow
def test_three_jobs_through_a_two_level_fabric_with_loss_on_every_link(fabric):
    """Job 11 spans the three children, job 12 lives inside child B alone (served
    there, no hop), job 13 spans A and C; int32 calls are exact and float32 calls
    are bit for bit what one switch gives, with 1 % loss on every link; then all
    three jobs are freed at every switch."""
    root, a, b, c = fabric
    jobs = {
        11: [a.control, a.control, b.control, c.control],
        12: [b.control, b.control],
        13: [c.control, a.control, c.control],
    }
    got = run_jobs(jobs, calls=4, n=60_000)
    assert got == {(sid, r): [] for sid, controls in jobs.items() for r in range(len(controls))}
    # the job inside one child never reached the root; the others went through it
    root_stats = fetch_stats(root.control)
    assert root_stats["released"]["explicit"] == 2  # 11 and 13
    assert fetch_stats(b.control)["released"]["explicit"] == 2  # 11 and 12 (served alone)
    for emu in fabric:
        snap = fetch_stats(emu.control)
        assert snap["jobs"] == [], (emu.control, snap["jobs"])
        assert snap["memory_in_use"] == 0
