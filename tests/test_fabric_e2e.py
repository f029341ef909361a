"""A fabric of real emulators (docs/protocol.md §7): a root and child switches as
processes on loopback, workers registered at their own switch only, several jobs
at once, loss on every link. The same rules in memory: tests/test_fabric.py."""

from __future__ import annotations

import multiprocessing
import queue
import time

import pytest
from workers import fabric_loop, fabric_rank

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
    there, no hop), job 13 spans A and C; int32 calls are exact, float32 calls and
    float16 ones on the 16-bit wire (its format registered at every level) are
    bit for bit what one switch gives, with 1 % loss on every link; then all
    three jobs are freed at every switch."""
    root, a, b, c = fabric
    jobs = {
        11: [a.control, a.control, b.control, c.control],
        12: [b.control, b.control],
        13: [c.control, a.control, c.control],
    }
    got = run_jobs(jobs, calls=6, n=60_000)
    assert got == {(sid, r): [] for sid, controls in jobs.items() for r in range(len(controls))}
    # the job inside one child never reached the root; the others went through it
    root_stats = fetch_stats(root.control)
    assert root_stats["released"]["explicit"] == 2  # 11 and 13
    assert fetch_stats(b.control)["released"]["explicit"] == 2  # 11 and 12 (served alone)
    for emu in fabric:
        snap = fetch_stats(emu.control)
        assert snap["jobs"] == [], (emu.control, snap["jobs"])
        assert snap["memory_in_use"] == 0


@pytest.mark.slow
def test_a_child_and_then_the_root_restart_under_a_running_job():
    """SIGKILL of a child switch in the middle of a job spread over two children,
    later of the root; each comes back on its ports. The workers below the dead
    switch resume, the root frees the job everywhere so that the others resume
    too, and after the root's restart the children notice (Hello) and free it:
    every result of every call is the exact sum."""
    root = EmulatorProcess().start()
    ports = {"root": (root.data[1], root.control_addr[1])}
    a = EmulatorProcess("--parent", root.control).start()
    b = EmulatorProcess("--parent", root.control).start()
    ports["a"] = (a.data[1], a.control_addr[1])
    emus = {"root": root, "a": a, "b": b}

    def restart(name: str) -> None:
        emus[name].kill()
        args = () if name == "root" else ("--parent", root.control)
        port, control = ports[name]
        emus[name] = EmulatorProcess(*args, port=port, control_port=control).start()

    mp = multiprocessing.get_context("spawn")
    progress, out = mp.Queue(), mp.Queue()
    controls = [a.control, a.control, b.control, b.control]
    procs = [
        mp.Process(
            target=fabric_loop,
            args=(r, 4, controls[r], 21, 12, 100_000, "int32", progress, out),
        )
        for r in range(4)
    ]
    for p in procs:
        p.start()
    fired = []
    try:
        results = {}
        deadline = time.monotonic() + 300
        while len(results) < 4 and time.monotonic() < deadline:
            try:
                rank, call, what = progress.get(timeout=0.2)
            except queue.Empty:
                while not out.empty():
                    _, r, value = out.get()
                    results[r] = value
                failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0)}
                if failed and out.empty():
                    pytest.fail(f"ranks exited without a result: {failed}")
                continue
            if what == "start" and rank == 0 and call == 3 and "a" not in fired:
                fired.append("a")
                restart("a")
            elif what == "start" and rank == 2 and call == 8 and "root" not in fired:
                fired.append("root")
                restart("root")
        while not out.empty():
            _, r, value = out.get()
            results[r] = value
        for p in procs:
            p.join(30)
        assert results == {r: [] for r in range(4)}, results
        assert fired == ["a", "root"]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for emu in emus.values():
            emu.stop()


def test_bad_fabric_requests_get_an_error_and_the_switch_keeps_serving():
    """Malformed and nonsensical Fabric calls -- a Hello without a port, a plan
    naming a child nobody knows, more members than a job may have, members at
    no address, a Join that breaks the session rules, drops and gones of
    sessions that do not exist -- each get a status (or change nothing), and
    the switch serves a job normally afterwards."""
    import grpc
    import numpy as np
    from workers import int_lengths

    from hostlib.pytest_plugin import run_workers
    from swemu.protocol.proto import fabric_pb2 as fb
    from swemu.protocol.proto import fabric_pb2_grpc as fb_grpc
    from swemu.protocol.proto import switchml_pb2 as pb

    with EmulatorProcess() as emu:
        with grpc.insecure_channel(emu.control) as ch:
            stub = fb_grpc.FabricStub(ch)
            bad = [
                (stub.Hello, fb.HelloRequest(instance=1, control="no-port")),
                (stub.Hello, fb.HelloRequest(instance=1, control="[::1")),
                (
                    stub.Configure,
                    fb.ConfigureRequest(
                        session_id=5,
                        num_workers=2,
                        packet_size=3,
                        pool_size=8,
                        epoch=1,
                        plan=fb.Plan(switch=1, involved=False, below=[fb.Plan(switch=99)]),
                    ),
                ),
                (
                    stub.Configure,
                    fb.ConfigureRequest(
                        session_id=5,
                        num_workers=40,
                        packet_size=3,
                        pool_size=8,
                        epoch=1,
                        plan=fb.Plan(
                            switch=1,
                            involved=True,
                            members=[
                                fb.Member(rank=r, ipv4=0x7F000001, udp_port=1000 + r)
                                for r in range(40)
                            ],
                        ),
                    ),
                ),
                (
                    stub.Configure,
                    fb.ConfigureRequest(
                        session_id=6,
                        num_workers=1,
                        packet_size=9,
                        pool_size=8,
                        epoch=1,
                        plan=fb.Plan(switch=1, involved=True, members=[fb.Member(rank=0)]),
                    ),
                ),
                (
                    stub.Join,
                    fb.JoinRequest(
                        registration=pb.UdpSessionRequest(session_id=7, rank=3, num_workers=2)
                    ),
                ),
            ]
            for method, request in bad:
                with pytest.raises(grpc.RpcError) as info:
                    method(request, timeout=10)
                assert info.value.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.UNAVAILABLE,
                ), (request, info.value)
            stub.Drop(fb.DropRequest(session_id=12345, why="test"), timeout=10)
            stub.Gone(fb.GoneRequest(session_id=12345, why="test"), timeout=10)
        assert fetch_stats(emu.control)["jobs"] == []
        outs = run_workers(emu.switch, emu.control, 2, int_lengths)
        assert all(np.array_equal(a, b) for a, b in zip(*outs))
