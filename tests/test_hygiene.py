"""Process hygiene: whatever way a launcher dies, its children die with it and
no temporary directory is left behind (swemu.launch, ``switchml run``, the
pytest plugin). Real processes, real signals; each child is followed by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from swemu import launch
from swemu.launch import child_env, process

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

SWITCHML = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]

#: a user command that says it started, then sleeps (stands for a training job)
SLEEPER = (
    "import os, pathlib, time\n"
    "pathlib.Path(os.environ['MARK'] + os.environ['RANK']).touch()\n"
    "time.sleep(600)\n"
)


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the launcher exited with {proc.returncode} first")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def _gone(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def _kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def _launch_run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """``switchml run --workers 2 --shards 2 ARGS -- SLEEPER`` with its own
    TMPDIR (other test runs on the machine make ``swemu-*`` dirs too)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "user.py"
    script.write_text(SLEEPER)
    env = child_env(MARK=str(tmp_path / "started-"), TMPDIR=str(tmp))
    proc = subprocess.Popen(
        [*SWITCHML, "run", "-n", "2", "--shards", "2", *args, "--", sys.executable, str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a signal to it alone, as from `kill`, not to a terminal's group
    )
    return proc, tmp


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_run_killed_leaves_no_process_and_no_directory(tmp_path, sig):
    """SIGKILL (nothing of the launcher runs) or SIGHUP (its terminal closed) to
    ``switchml run``: the emulator, its shard processes and both workers end
    within seconds, and its ``swemu-*`` directory is gone."""
    proc, tmp = _launch_run(tmp_path)
    kids: list[psutil.Process] = []
    try:
        _wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "workers", proc)
        kids = _descendants(proc.pid)
        # the emulator, its two shards, two workers
        assert len(kids) >= 5, [k.cmdline() for k in kids]
        proc.send_signal(sig)
        proc.wait(30)
        _wait_for(lambda: _gone(kids), 10, "children to end")
    finally:
        proc.kill()
        _kill_all(kids)
    assert not list(tmp.iterdir())
    if sig == signal.SIGHUP:
        assert proc.returncode == 143  # handled like SIGTERM: it stopped them itself


def test_killed_during_emulator_start_leaves_no_directory(tmp_path):
    """A launcher killed while its emulator is still starting (a first run: it
    compiles, here in an empty Numba cache) leaves no directory: the emulator
    removes it as it stops."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = textwrap.dedent(
        """
        import sys
        from swemu.launch import EmulatorProcess
        emu = EmulatorProcess()
        emu.startup_timeout = 600
        print("starting", flush=True)
        emu.start()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        env=child_env(TMPDIR=str(tmp), NUMBA_CACHE_DIR=str(tmp_path / "numba")),
        text=True,
    )
    kids: list[psutil.Process] = []
    try:
        assert proc.stdout.readline() == "starting\n"
        _wait_for(lambda: any(tmp.iterdir()) and _descendants(proc.pid), 30, "emulator", proc)
        kids = _descendants(proc.pid)
        time.sleep(3)  # into its start-up: importing, then compiling for 40 s or more
        assert any(tmp.iterdir()), "the emulator started already: the cache was not empty"
        proc.kill()
        proc.wait(30)
        _wait_for(lambda: _gone(kids), 15, "the emulator to end")
        _wait_for(lambda: not any(tmp.iterdir()), 5, "its directory to go")
    finally:
        proc.kill()
        _kill_all(kids)


def test_stale_directories_of_dead_launchers_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"swemu-{dead.pid}-abc"
    live = tmp_path / f"swemu-{os.getpid()}-abc"
    other = tmp_path / "swemu-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "ready.json").write_text("{}")
    assert launch.sweep_stale_dirs(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and other.exists()


def test_spawned_child_dies_with_a_sigkilled_parent(tmp_path):
    """swemu.launch.spawn, as the library offers it: the grandchild gets SIGTERM."""
    code = textwrap.dedent(
        """
        import sys, time
        from swemu.launch import spawn
        child = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=child_env())
    try:
        child = psutil.Process(int(proc.stdout.readline()))
        assert child.is_running()
        proc.kill()
        proc.wait(10)
        _wait_for(lambda: _gone([child]), 5, "the child to end")
    finally:
        proc.kill()


PLUGIN_TEST = """
import os, pathlib, time

def sleeper(ctx, mark):
    pathlib.Path(mark + str(ctx.rank)).touch()
    time.sleep(600)

def test_hangs(switchml_workers):
    switchml_workers(2, sleeper, os.environ["MARK"])
"""


def test_pytest_plugin_fixtures_die_with_a_killed_pytest(tmp_path):
    """A test session using ``switchml_emulator``/``switchml_workers`` killed
    with SIGKILL (a CI timeout): its emulator and worker processes end too."""
    (tmp_path / "test_user.py").write_text(PLUGIN_TEST)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = child_env(MARK=str(tmp_path / "started-"), TMPDIR=str(tmp))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "test_user.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kids: list[psutil.Process] = []
    try:
        _wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "ranks", proc)
        kids = _descendants(proc.pid)
        assert len(kids) >= 3, [k.cmdline() for k in kids]  # emulator, two ranks
        proc.kill()
        proc.wait(10)
        _wait_for(lambda: _gone(kids), 10, "children to end")
    finally:
        proc.kill()
        _kill_all(kids)
    assert not list(tmp.iterdir())


def test_numba_cache_goes_to_a_user_directory_for_a_read_only_install(tmp_path, monkeypatch):
    package = Path(process.__file__).resolve().parent
    real = process._writable
    monkeypatch.setattr(
        process, "_writable", lambda p: not str(p).startswith(str(package)) and real(p)
    )
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    want = str(tmp_path / "cache" / "switchml-emu" / "numba")
    assert process.numba_cache_env() == {"NUMBA_CACHE_DIR": want}
    assert child_env()["NUMBA_CACHE_DIR"] == want and Path(want).is_dir()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))  # the user's choice stands
    assert process.numba_cache_env() == {}
    monkeypatch.setattr(process, "_writable", real)
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    assert process.numba_cache_env() == {}  # a writable checkout keeps the cache beside the sources


def test_wait_all_returns_the_codes_and_kills_what_a_timeout_leaves():
    """Exit codes in order; a timeout raises and leaves no process running."""
    quick = [launch.spawn([sys.executable, "-c", f"raise SystemExit({c})"]) for c in (0, 3)]
    assert launch.wait_all(quick, 60) == [0, 3]
    slow = launch.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    done = launch.spawn([sys.executable, "-c", "pass"])
    with pytest.raises(subprocess.TimeoutExpired):
        launch.wait_all([slow, done], 0.5)
    assert slow.returncode == -signal.SIGKILL and done.returncode is not None
