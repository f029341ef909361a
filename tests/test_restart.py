"""Jobs that survive a switch restart (docs/protocol.md §5, "Surviving a switch
restart"): a real emulator killed with SIGKILL at seeded points of a running job
and started again on the same ports, or a fresh one elsewhere; the workers
notice, resume, and every result is what an uninterrupted job gives. The
in-memory property tests of the same rules are tests/test_recovery.py."""

from __future__ import annotations

import multiprocessing
import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from workers import RESTART_PATIENCE, restart_loop

from hostlib.pytest_plugin import run_workers
from swemu.launch import EmulatorProcess, child_env

W = 3


class Restarter:
    """The emulator the test kills and starts again on the same ports."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.emu = EmulatorProcess(*args).start()
        self.ports = (self.emu.data[1], self.emu.control_addr[1])
        self.restarts: list[tuple[float, float]] = []  # (kill → serving again), start time

    def restart(self) -> None:
        t0 = time.monotonic()
        self.emu.kill()
        t1 = time.monotonic()
        self.emu = self._next()
        self.emu.start()
        self.restarts.append((time.monotonic() - t0, time.monotonic() - t1))

    def _next(self) -> EmulatorProcess:
        """The emulator that comes up after a kill: on the same ports."""
        return EmulatorProcess(*self.args, port=self.ports[0], control_port=self.ports[1])

    def stop(self) -> None:
        self.emu.stop()


def run_with_kills(
    emu: Restarter,
    plan,
    *,
    iters: int,
    n: int,
    dtype: str,
    switch: str | None = "",
    no_progress: float = RESTART_PATIENCE,
    **connect,
):
    """Run ``restart_loop`` on W ranks; ``plan(event, restart, go)`` sees every
    progress event ``(rank, call, what)`` and calls ``restart()`` when it wants
    (``go``: the event the ranks wait on before their first call).
    ``switch``: the data plane the ranks are given ("": the emulator's; None:
    none, they learn it from the control plane). Returns the ranks' lists of
    wrong results."""
    mp = multiprocessing.get_context("spawn")
    progress, go = mp.Queue(), mp.Event()
    out: dict[str, object] = {}

    def ranks() -> None:
        try:
            out["wrong"] = run_workers(
                emu.emu.switch if switch == "" else switch,
                emu.emu.control,
                W,
                restart_loop,
                iters,
                n,
                dtype,
                progress,
                go,
                timeout=180.0,
                session_id=0x5EED,
                no_progress=no_progress,
                **connect,
            )
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=ranks)
    thread.start()
    try:
        while thread.is_alive():
            try:
                event = progress.get(timeout=0.1)
            except queue.Empty:
                continue
            plan(event, emu.restart, go)
    finally:
        go.set()
        thread.join(200)
    if "error" in out:
        raise out["error"]
    return out["wrong"]


def seeded_plan(seed: int, iters: int):
    """Kill points drawn from ``seed``: before the first call (all ranks joined,
    none sent), during the first call, right after one rank finished it, and in
    the middle of later calls (with loss injected, retransmissions are pending)."""
    rng = random.Random(seed)
    joined: set[int] = set()
    later = sorted(rng.sample(range(2, iters - 1), 2))
    who = rng.randrange(W)  # whose start of those calls triggers the kill
    fired: list[str] = []

    def plan(event, restart, go) -> None:
        rank, call, what = event
        if what == "joined":
            joined.add(rank)
            if len(joined) == W:
                restart()  # before the job's first round
                fired.append("before")
                go.set()
        elif call == 0 and what == "start" and rank == 0 and "during" not in fired:
            time.sleep(rng.uniform(0.0, 0.02))
            restart()
            fired.append("during")
        elif call == 0 and what == "done" and "after" not in fired:
            restart()  # one rank is done with the call, the others may not be
            fired.append("after")
        elif what == "start" and rank == who and later and call == later[0]:
            later.pop(0)
            time.sleep(rng.uniform(0.0, 0.03))
            restart()
            fired.append(f"call {call}")

    plan.fired = fired
    return plan


def mid_call_plan(rank: int, calls: tuple[int, ...]):
    """A kill plan: go at once, and kill just after rank ``rank`` starts each of
    ``calls`` (``plan.fired`` lists the calls it killed in)."""
    fired: list[int] = []

    def plan(event, restart, go) -> None:
        r, call, what = event
        if what == "joined":
            go.set()
        if what == "start" and r == rank and call in calls and call not in fired:
            fired.append(call)
            time.sleep(0.005)
            restart()

    plan.fired = fired
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 23])
def test_int32_loop_survives_restarts_at_seeded_points(seed):
    """Five SIGKILLs per run (before, during and right after the first round,
    two later calls with retransmissions pending under injected loss), two
    seeds: every one of the 12 results of every rank is the exact sum."""
    emu = Restarter("--loss-in", "0.02", "--loss-out", "0.02", "--seed", str(seed))
    iters = 12
    plan = seeded_plan(seed, iters)
    try:
        wrong = run_with_kills(emu, plan, iters=iters, n=300_000, dtype="int32", window=24)
    finally:
        emu.stop()
    assert plan.fired[:3] == ["before", "during", "after"], plan.fired
    assert len(emu.restarts) == len(plan.fired) == 5
    assert wrong == [[]] * W


@pytest.mark.slow
def test_float32_results_equal_an_uninterrupted_jobs():
    """float32 through block floating point, two restarts mid-call: every
    result is bit for bit what the same inputs give without restarts
    (quant.simulate_allreduce), so within §4's bound."""
    emu = Restarter()
    iters = 6
    plan = mid_call_plan(1, (1, 4))
    try:
        wrong = run_with_kills(
            emu, plan, iters=iters, n=200_000, dtype="float32", packet_size=6, window=16
        )
    finally:
        emu.stop()
    assert plan.fired == [1, 4]
    assert wrong == [[]] * W


class Mover(Restarter):
    """The emulator the test kills and replaces by a fresh one elsewhere: the
    control plane stays at the address the workers were given (a moved VM, a
    name or a virtual IP pointed at the new host), the data plane comes up on
    another address and port, which the workers learn when they resume."""

    def __init__(self) -> None:
        super().__init__()
        self.data_planes = [self.emu.data]

    def restart(self) -> None:
        super().restart()
        self.data_planes.append(self.emu.data)

    def _next(self) -> EmulatorProcess:
        host = f"127.0.0.{3 + len(self.restarts)}"  # a new address, any free port
        return EmulatorProcess("--control-host", "127.0.0.1", host=host, control_port=self.ports[1])


@pytest.mark.slow
def test_a_fresh_switch_elsewhere_takes_the_job_over():
    """The emulator is SIGKILLed during a call and a fresh one takes over, its
    data plane on another address and port (the workers were given the control
    address only, and learn the data plane from it): the job goes on and every
    result is the exact sum."""
    emu = Mover()
    plan = mid_call_plan(2, (2, 5))
    control = emu.emu.control
    try:
        wrong = run_with_kills(emu, plan, iters=8, n=200_000, dtype="int32", window=16, switch=None)
    finally:
        emu.stop()
    assert plan.fired == [2, 5]
    hosts = [h for h, _ in emu.data_planes]
    assert hosts == ["127.0.0.1", "127.0.0.3", "127.0.0.4"], emu.data_planes
    assert emu.emu.control == control
    assert wrong == [[]] * W


def train(tmp: Path, emu: Restarter, mode: str, kill_at: int | None) -> list[bytes]:
    """``switchml run`` the training program against ``emu``; with ``kill_at``,
    SIGKILL the emulator once rank 0 finished that step, and start it again.
    Returns each rank's final parameters."""
    out = tmp / f"{mode}-{kill_at}"
    out.mkdir()
    switchml = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]
    cmd = [
        *switchml,
        "run",
        "--workers",
        "2",
        "--switch",
        emu.emu.switch,
        "--control",
        emu.emu.control,
        "--no-progress",
        str(RESTART_PATIENCE),
        "--",
        sys.executable,
        str(Path(__file__).parent / "restart_training.py"),
        str(out),
        mode,
    ]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if kill_at is not None:
            step = out / "step.0"
            deadline = time.monotonic() + 240
            while not (step.exists() and int(step.read_text() or -1) >= kill_at):
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            emu.restart()
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr.decode()[-4000:]
    return [(out / f"params.{r}").read_bytes() for r in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["numpy", pytest.param("torch", marks=pytest.mark.torch)])
def test_training_with_a_restart_ends_where_an_uninterrupted_run_does(tmp_path, mode):
    """A training run under ``switchml run -- CMD`` (hostlib.from_env, or DDP on
    the switchml backend) against an emulator SIGKILLed and started again at
    step 12: the replicas are identical and the final parameters are bit for
    bit those of the same run without a restart."""
    if mode == "torch":
        pytest.importorskip("torch")
    emu = Restarter()
    try:
        plain = train(tmp_path, emu, mode, None)
        restarted = train(tmp_path, emu, mode, 12)
    finally:
        emu.stop()
    assert len(emu.restarts) == 1
    assert plain[0] == plain[1] and restarted[0] == restarted[1]
    assert restarted[0] == plain[0]
