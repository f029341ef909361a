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


def _wait_for(predicate, timeout: float, what: str) -> None:
    """Wait for what a process we did not start does (a grandchild ending);
    a wait on our own child is :meth:`launch.Watched.wait_until`."""
    deadline = time.monotonic() + timeout
    while not predicate():
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


def _launch_run(tmp_path: Path, *args: str) -> tuple[launch.Watched, Path]:
    """``switchml run --workers 2 --shards 2 ARGS -- SLEEPER`` with its own
    TMPDIR (other test runs on the machine make ``swemu-*`` dirs too)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "user.py"
    script.write_text(SLEEPER)
    env = child_env(MARK=str(tmp_path / "started-"), TMPDIR=str(tmp))
    proc = launch.Watched(
        [*SWITCHML, "run", "-n", "2", "--shards", "2", *args, "--", sys.executable, str(script)],
        name="switchml run",
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
        proc.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "its workers")
        kids = _descendants(proc.pid)
        # the emulator, its two shards, two workers
        assert len(kids) >= 5, [k.cmdline() for k in kids]
        proc.send_signal(sig)
        proc.wait(30)
        _wait_for(lambda: _gone(kids), 10, "children to end")
    finally:
        proc.close()
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
    proc = launch.Watched(
        [sys.executable, "-c", code],
        name="the launcher",
        stdout=subprocess.PIPE,
        env=child_env(TMPDIR=str(tmp), NUMBA_CACHE_DIR=str(tmp_path / "numba")),
    )
    kids: list[psutil.Process] = []
    try:
        assert proc.readline(60) == "starting\n"
        proc.wait_until(lambda: any(tmp.iterdir()) and _descendants(proc.pid), 30, "its emulator")
        kids = _descendants(proc.pid)
        time.sleep(3)  # into its start-up: importing, then compiling for 40 s or more
        assert any(tmp.iterdir()), "the emulator started already: the cache was not empty"
        proc.kill()
        _wait_for(lambda: _gone(kids), 15, "the emulator to end")
        _wait_for(lambda: not any(tmp.iterdir()), 5, "its directory to go")
    finally:
        proc.close()
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
    with launch.Watched(
        [sys.executable, "-c", code], name="the parent", stdout=subprocess.PIPE, env=child_env()
    ) as proc:
        child = psutil.Process(int(proc.readline(60, "its child's pid")))
        assert child.is_running()
        proc.kill()
        _wait_for(lambda: _gone([child]), 5, "the child to end")


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
    proc = launch.Watched(
        [sys.executable, "-m", "pytest", "-q", "test_user.py"],
        name="pytest",
        stdout=subprocess.STDOUT,  # its report, for the message of a failed wait
        cwd=tmp_path,
        env=env,
    )
    kids: list[psutil.Process] = []
    try:
        proc.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "its ranks")
        kids = _descendants(proc.pid)
        assert len(kids) >= 3, [k.cmdline() for k in kids]  # emulator, two ranks
        proc.kill()
        _wait_for(lambda: _gone(kids), 10, "children to end")
    finally:
        proc.close()
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


def _ignored_and_blocked(out: str) -> tuple[int, int]:
    fields = dict(line.split(":\t") for line in out.splitlines())
    return int(fields["SigIgn"], 16), int(fields["SigBlk"], 16)


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


def test_spawn_can_start_a_child_with_default_signals():
    """A parent that ignores SIGINT (a background job of a non-interactive
    shell): ``default_signals`` gives the child every signal at its default
    action, unblocked; without it the child keeps SIGINT ignored, as the shell
    meant, but never SIGPIPE or SIGXFSZ (Popen's ``restore_signals``, which the
    Python program that execs the command would otherwise undo)."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cmd = ["grep", "^Sig\\(Ign\\|Blk\\)", "/proc/self/status"]
        runs = {}
        for default in (False, True):
            p = launch.spawn(cmd, default_signals=default, stdout=subprocess.PIPE, text=True)
            runs[default] = _ignored_and_blocked(p.communicate(timeout=30)[0])
    finally:
        signal.signal(signal.SIGINT, old)
    ignored = runs[False][0]
    assert ignored & _bit(signal.SIGINT)
    assert not ignored & (_bit(signal.SIGPIPE) | _bit(signal.SIGXFSZ))
    assert runs[True] == (0, 0)


def test_a_wait_on_a_watched_child_ends_when_it_exits():
    """Whatever a test waits for -- a line, a condition, the exit of several --
    the wait fails as soon as the child exits, with its status and stderr."""
    dies = [sys.executable, "-c", "import sys; sys.stderr.write('it broke here\\n'); sys.exit(7)"]
    t0 = time.monotonic()
    with (
        launch.Watched(dies, stdout=subprocess.PIPE) as child,
        pytest.raises(launch.ChildFailed) as line,
    ):
        child.readline(300, "the ready line")
    with (
        launch.Watched(dies, name="the server") as child,
        pytest.raises(launch.ChildFailed) as cond,
    ):
        child.wait_until(lambda: False, 300, "its ready file")
    sleeper = launch.Watched([sys.executable, "-c", "import time; time.sleep(600)"])
    with launch.Watched(dies, name="rank 1") as rank1, sleeper:
        with pytest.raises(launch.ChildFailed) as group:
            launch.Watched.wait_all([sleeper, rank1], 300, "the ranks")
        assert sleeper.returncode == -signal.SIGKILL  # it would have waited for rank 1
    assert time.monotonic() - t0 < 150  # not one of the 300 s timeouts, even on a loaded machine
    assert "waiting for the ready line:" in str(line.value)
    assert "waiting for its ready file: the server (pid" in str(cond.value)
    assert "waiting for the ranks: rank 1 (pid" in str(group.value)
    for failed in (line, cond, group):
        assert "exited with status 7; its stderr:\nit broke here" in str(failed.value)


def test_a_watched_child_that_overruns_is_reported_running():
    slow = "import sys, time; print('slow', file=sys.stderr, flush=True); time.sleep(600)"
    with launch.Watched(
        [sys.executable, "-c", slow], stdout=subprocess.PIPE, name="the sleeper"
    ) as child:
        child.wait_until(lambda: "slow" in child.stderr(), 60, "its first words")
        with pytest.raises(launch.ChildFailed, match=r"not within 0\.5 s; the sleeper .* running"):
            child.wait_until(lambda: False, 0.5, "nothing")
        with pytest.raises(launch.ChildFailed, match=r"is still running; its stderr:\nslow"):
            child.readline(0.5)
        assert child.stop() == -signal.SIGTERM
    with launch.Watched(
        [sys.executable, "-c", "print('a'); print('b')"], stdout=subprocess.PIPE
    ) as c:
        assert [c.readline(60), c.readline(60)] == ["a\n", "b\n"]
        assert c.expect(0, 60) == "" and c.stdout() == "a\nb\n"


def test_a_cache_index_naming_a_record_class_since_gone_is_a_miss(tmp_path):
    """Numba unpickles a cached function's index before it checks the source
    stamp, so an index that names a NamedTuple class (of an importable module)
    which an upgrade renamed failed every start with AttributeError
    (numba/numba#6018; switchml-emu's ``fastio.Receiver`` was such a class).
    With the project's kernel module imported it is a miss: the function
    compiles again and the index is rewritten."""
    records, script = tmp_path / "recs.py", tmp_path / "kern.py"
    env = child_env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join((str(tmp_path), env["PYTHONPATH"]))

    def run(cls: str, imports: str = "") -> subprocess.CompletedProcess:
        records.write_text(
            f"from typing import NamedTuple\nimport numpy as np\n\n"
            f"class {cls}(NamedTuple):\n    a: np.ndarray\n"
        )
        script.write_text(
            f"import numpy as np\n{imports}\nfrom numba import njit\n"
            f"from recs import {cls} as Rec\n\n"
            "@njit(cache=True)\ndef total(r):\n    return r.a.sum()\n\n"
            "print(int(total(Rec(np.arange(4)))))\n"
        )
        return subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
        )

    first = run("Record")  # compiles; the index names recs.Record
    assert first.returncode == 0 and first.stdout.strip() == "6", first.stderr
    for _ in range(2):  # compiles again (the index named Record), then loads from the cache
        later = run("Renamed", "import swemu.protocol.jit")
        assert later.returncode == 0 and later.stdout.strip() == "6", later.stderr
