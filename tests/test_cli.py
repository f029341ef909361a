"""The command line as a user meets it: real subprocesses, one-line errors, exit codes."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import emu, switchml
from cli.terminal import parse_size
from swemu.launch import Watched, child_env
from swemu.launch import run as launch_run

EMU = [sys.executable, "-c", "from cli.main import emu_main; emu_main()"]
SWITCHML = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]


def run(cmd, timeout=180, status=0, env=None, **kw):
    """The finished command (stdout, stderr as text); its exit status must be
    ``status`` (a failure message shows the status and stderr)."""
    env = child_env() if env is None else env
    return launch_run(cmd, status=status, timeout=timeout, env=env, **kw)


def one_line_error(proc):
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert err.count("\n") == 0 and err.startswith("error:"), err
    return err


def test_help_is_instant_and_lists_commands():
    r = CliRunner().invoke(emu, ["--help"], catch_exceptions=False)
    assert r.exit_code == 0 and "serve" in r.output
    r = CliRunner().invoke(switchml, ["run", "--help"], catch_exceptions=False)
    assert r.exit_code == 0 and "--workers" in r.output and "--packet-size" in r.output


def test_parse_size():
    assert parse_size("16Mi") == 16 << 20
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("1000") == 1000
    assert parse_size("4k") == 4000
    for bad in ("", "Mi", "1.5", "-3", "12XB"):
        with pytest.raises(Exception, match=r"size|whole"):
            parse_size(bad)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--pool-size", "0"], "--pool-size"),
        (["serve", "--max-pool-memory", "lots"], "size"),
        (["serve", "--bogus"], "--bogus"),
    ],
)
def test_bad_serve_options_are_one_line(args, words):
    p = run(EMU + args, timeout=60, status=2)
    assert words in one_line_error(p)


def test_port_in_use_is_one_line():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        p = run(
            [
                *EMU,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(s.getsockname()[1]),
                "--control-port",
                "0",
            ],
            timeout=60,
            status=1,
        )
    finally:
        s.close()
    assert "cannot listen for UDP" in one_line_error(p)


def test_control_port_in_use_is_one_line():
    """gRPC's C core logs its own bind failure unless told not to: the entry
    point silences it, so the user sees our one line only, with the system's
    reason (gRPC's message has none)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    env = child_env()
    env.pop("GRPC_VERBOSITY", None)
    try:
        p = run(
            [
                *EMU,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--control-port",
                str(port),
            ],
            timeout=60,
            env=env,
            status=1,
        )
    finally:
        s.close()
    assert one_line_error(p) == f"error: cannot listen for gRPC on 127.0.0.1:{port}: " + (
        "Address already in use"
    )


def test_serve_stops_cleanly_on_sigterm(tmp_path):
    ready = tmp_path / "ready.json"
    cmd = [*EMU, "serve", "--host", "127.0.0.1", "--port", "0", "--control-port", "0"]
    with Watched([*cmd, "--ready-file", str(ready)], name="serve", env=child_env()) as proc:
        proc.wait_until(ready.exists, 60, "its ready file")
        info = json.loads(ready.read_text())
        assert info["data"][1] > 0 and info["control"][1] > 0
        proc.send_signal(signal.SIGTERM)
        err = proc.expect(0, 30, "it to stop on SIGTERM")
    assert "shutdown:" in err and "Traceback" not in err


def test_run_bad_options_are_one_line():
    p = run([*SWITCHML, "run", "--workers", "0"], timeout=60, status=2)
    assert "--workers" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--switch", "host:notaport"], timeout=60, status=1)
    assert "port" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--size", "6"], timeout=60, status=1)
    assert "4-byte" in one_line_error(p)
    p = run(
        [*SWITCHML, "run", "-n", "2", "--switch", "127.0.0.1:9", "--shards", "2"],
        timeout=60,
        status=1,
    )
    assert "--shards" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--shards", "17"], timeout=60, status=2)
    assert "--shards" in one_line_error(p)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_run_with_embedded_emulator_verifies_results(tmp_path, dtype):
    out = tmp_path / "run.json"
    p = run(
        [
            *SWITCHML,
            "run",
            "--workers",
            "3",
            "--size",
            "2Mi",
            "--iters",
            "2",
            "--dtype",
            dtype,
            "--json",
            str(out),
        ]
    )
    assert "verified 2 results" in p.stderr and "goodput" in p.stdout
    data = json.loads(out.read_text())
    assert len(data["iters"]) == 2 and all(i["ok"] for i in data["iters"])


def test_run_with_a_sharded_emulator(tmp_path):
    """--shards 2: the local emulator serves two data ports; the workers spread
    their slots over both and the results verify."""
    out = tmp_path / "run.json"
    argv = [*SWITCHML, "run", "-n", "2", "--shards", "2", "--size", "1Mi", "--iters", "2"]
    p = run([*argv, "--dtype", "int32", "--json", str(out)])
    assert "+1 shards on the next ports" in p.stderr and "verified 2 results" in p.stderr
    assert all(i["ok"] for i in json.loads(out.read_text())["iters"])


def test_run_through_a_local_two_level_fabric(tmp_path):
    """--racks 2: a root emulator and two rack emulators under it; workers 0, 1
    register at rack 0's, 2, 3 at rack 1's, and every sum is exact."""
    out = tmp_path / "run.json"
    argv = [*SWITCHML, "run", "-n", "4", "--racks", "2", "--size", "1Mi", "--iters", "2"]
    p = run([*argv, "--dtype", "int32", "--json", str(out)])
    assert "rack 0 emulator" in p.stderr and "rack 1 emulator" in p.stderr
    assert "verified 2 results" in p.stderr
    assert all(i["ok"] for i in json.loads(out.read_text())["iters"])
    p = run([*SWITCHML, "run", "-n", "2", "--racks", "3"], timeout=60, status=1)
    assert "--racks" in one_line_error(p)


def test_run_command_mode_sets_the_environment(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import numpy as np, hostlib, os\n"
        "ctx = hostlib.from_env()\n"
        "y = ctx.allreduce(np.full(100, ctx.rank + 1, np.int32))\n"
        "assert (y == 3).all(), y\n"
        "print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} ok\", flush=True)\n"
        "ctx.close()\n"
    )
    p = run([*SWITCHML, "run", "--workers", "2", "--", sys.executable, str(script)])
    assert "[rank0]: rank 0 of 2 ok" in p.stdout and "[rank1]: rank 1 of 2 ok" in p.stdout


def test_run_command_mode_prefixes_each_line_with_its_rank(tmp_path):
    """Each rank's output (stdout and stderr apart) reaches the user line by
    line, each line prefixed with its rank (as torchrun's ``[rank0]:``), never
    two ranks within one line, however the ranks write: here each writes its
    lines in pieces, flushed one by one, all ranks at once; a last line
    without a newline arrives too."""
    script = tmp_path / "user.py"
    script.write_text(
        "import os, sys, time\n"
        "r = os.environ['RANK']\n"
        "for i in range(20):\n"
        "    for stream in (sys.stdout, sys.stderr):\n"
        "        for piece in ('rank', f' {r} ', f'line {i}', f' {r}\\n'):\n"
        "            stream.write(piece)\n"
        "            stream.flush()\n"
        "            time.sleep(0.001)\n"
        "sys.stdout.write(f'no newline {r}')\n"
    )
    p = run([*SWITCHML, "run", "--workers", "3", "--", sys.executable, str(script)])
    for stream in (p.stdout, p.stderr):
        mine = [line for line in stream.splitlines() if line.startswith("[rank")]
        for r in range(3):
            lines = [line for line in mine if line.startswith(f"[rank{r}]: ")]
            want = [f"[rank{r}]: rank {r} line {i} {r}" for i in range(20)]
            if stream is p.stdout:
                want.append(f"[rank{r}]: no newline {r}")
            assert lines == want, stream
    assert all(line.startswith("[rank") for line in p.stdout.splitlines()), p.stdout


def test_run_command_mode_stops_the_others_when_a_rank_fails(tmp_path):
    """A rank that exits with an error is said at once, in one line, and the
    other ranks (here: one that would sleep for a minute) are stopped at once."""
    t0 = time.monotonic()
    p = run(
        [
            *SWITCHML,
            "run",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-c",
            "import os, sys, time; time.sleep(60) if os.environ['RANK'] == '0' else sys.exit(3)",
        ],
        status=1,
    )
    assert "Traceback" not in p.stderr
    assert time.monotonic() - t0 < 50  # not the minute rank 0 would sleep
    last = p.stderr.strip().splitlines()[-1]
    assert last == "error: rank 1 exited with status 3; stopping the other ranks"


def test_run_ignores_modules_in_the_working_directory(tmp_path):
    """``python -m`` puts the working directory first on sys.path: the emulator
    and the built-in workers start elsewhere, so a user's scratch module that
    shadows the standard library (here ``nt``, which pathlib's import probes
    for) does not break them."""
    (tmp_path / "nt.py").write_text(
        "import os, sys\n"
        "if os.environ.get('SWITCHML_RUN_SIZE') or 'serve' in sys.argv:\n"
        "    raise RuntimeError('the working directory shadowed the standard library')\n"
        "raise ImportError  # what the probe expects off Windows\n"
    )
    p = run([*SWITCHML, "run", "--workers", "2", "--size", "64Ki", "--iters", "1"], cwd=tmp_path)
    assert "verified 1 results" in p.stderr


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_run_on_sigterm_stops_its_workers_and_emulator(tmp_path):
    """SIGTERM to ``switchml run`` (a job scheduler's stop) unwinds like Ctrl-C:
    the workers and the local emulator go with it, and it says so in one line."""
    script = tmp_path / "user.py"
    script.write_text(
        "import os, pathlib, time\n"
        "pathlib.Path(os.environ['MARK'] + os.environ['RANK']).touch()\n"
        "time.sleep(600)\n"
    )
    env = child_env(MARK=str(tmp_path / "started-"))
    cmd = [*SWITCHML, "run", "--workers", "2", "--", sys.executable, str(script)]
    with Watched(cmd, name="switchml run", env=env) as proc:
        proc.wait_until(lambda: len(list(tmp_path.glob("started-*"))) == 2, 120, "its workers")
        kids = _children(proc.pid)
        assert len(kids) == 3  # the emulator and two workers
        proc.send_signal(signal.SIGTERM)
        proc.wait(60, "it to stop on SIGTERM")
        err = proc.stderr()
        assert proc.returncode == 143, proc.report()
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: terminated"
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(k) for k in kids)


def test_run_checks_the_json_path_before_the_run(tmp_path):
    """An unwritable --json fails at once, before any emulator or worker starts."""
    t0 = time.monotonic()
    bad = tmp_path / "no such dir" / "run.json"
    p = run([*SWITCHML, "run", "-n", "2", "--json", str(bad)], timeout=60, status=1)
    assert "cannot write --json" in one_line_error(p)
    assert "starting a local emulator" not in p.stderr
    assert time.monotonic() - t0 < 20  # no emulator started (it takes seconds even warm)
    ok = tmp_path / "fresh.json"
    from cli.run import _check_writable

    _check_writable(str(ok))
    assert not ok.exists()  # checked, not left behind


def test_run_unreachable_switch_says_no_result_ever_arrived(tmp_path):
    """Workers whose packets go nowhere (a data port nobody serves) say that not
    one result arrived from that address, not "N/M slots finished", and name
    the phase of the run, not the context's allreduce count."""
    from swemu.launch import EmulatorProcess

    with EmulatorProcess() as emu:
        p = run(
            [
                *SWITCHML,
                "run",
                "-n",
                "2",
                "--switch",
                "127.0.0.1:9",
                "--control",
                emu.control,
                "--no-progress",
                "1",
                "--size",
                "64Ki",
            ],
            timeout=120,
            status=1,
        )
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert re.match(r"error: rank [01] failed: the warm-up allreduce", last), last
    assert "from the switch at 127.0.0.1:9" in last and "not one result" in last
    assert "slots finished" not in last and "allreduce #" not in last
    assert p.stderr.count("error:") == 1, p.stderr  # said once, by the first to give up


def test_run_an_unresolvable_switch_is_one_line_before_anything_starts():
    """``--switch``/``--control`` hosts are resolved before anything starts: one
    line, not a traceback from every worker."""
    for args in (
        ["--switch", "nosuchhost.invalid:47000", "--control", "127.0.0.1:9"],
        ["--switch", "127.0.0.1:47000", "--control", "nosuchhost.invalid:50099"],
        ["--switch", "nosuchhost.invalid"],
    ):
        p = run([*SWITCHML, "run", "--workers", "2", *args], timeout=60, status=1)
        err = one_line_error(p)
        assert "cannot resolve 'nosuchhost.invalid'" in err, err
        option = "--control" if "--control nosuchhost" in " ".join(args) else "--switch"
        assert err.startswith(f"error: {option} nosuchhost.invalid"), err


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of a child of ``launcher`` that is worker ``rank`` (its RANK)."""
    for kid in _children(launcher):
        try:
            env = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(e.startswith(b"SWITCHML_RUN_") for e in env):
            return kid
    return None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_run_a_killed_worker_is_said_at_once_and_the_others_stop(tmp_path):
    """``kill -9`` of one built-in worker in the middle of a run: the launcher
    says so in one line at once (not after the others gave up on the switch,
    ``--no-progress`` later, blaming it), stops the other ranks and the
    emulator, and exits non-zero."""
    out = tmp_path / "run.json"
    argv = ["run", "--workers", "3", "--size", "4Mi", "--iters", "100000", "--no-progress", "60"]
    with Watched([*SWITCHML, *argv, "--json", str(out)], env=child_env()) as proc:
        victim = proc.wait_until(lambda: _rank_pid(proc.pid, 1), 240, "rank 1 to start")
        kids = _children(proc.pid)
        time.sleep(3)  # in its iterations (or joining: the launcher must not care)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        err = proc.expect(1, timeout=120, what="the launcher to give up")
        took = time.monotonic() - t0
    assert took < 30, took  # not --no-progress (60 s) and more
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: rank 1 was killed by signal 9 (SIGKILL); stopping the other ranks"]
    assert "unreachable" not in err and "Traceback" not in err
    assert json.loads(out.read_text())["failed"] == [lines[0][len("error: ") :].split(";")[0]]
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(k) for k in kids)


def test_worker_errors_use_the_tables_iteration_numbers():
    from cli.worker import _in_table_terms

    msg = "allreduce #47 (job_number 3): no result for chunk 2 on slot 1"
    assert _in_table_terms(msg, "iteration 23") == (
        "iteration 23 (job_number 3): no result for chunk 2 on slot 1"
    )


def test_run_rows_appear_as_every_rank_finishes_an_iteration():
    """The table grows row by row, in iteration order, a row once every rank
    has reported it; in a terminal it is redrawn each time."""
    from rich.console import Console

    import cli.run as run_mod

    def rep(rank, it, t):
        return {"rank": rank, "iter": it, "time": t, "ok": True, "worst": 0.0}

    console = Console(record=True, force_terminal=True, width=100)
    saved = run_mod.terminal.out
    run_mod.terminal.out = console
    try:
        with run_mod._RowView("t", 1 << 20, 2) as view:
            view.add(rep(0, 0, 0.010))
            assert view.rows == []  # rank 1 has not finished iteration 0
            view.add(rep(0, 1, 0.020))
            view.add(rep(1, 1, 0.030))
            assert view.rows == []  # iteration 1 waits for iteration 0
            view.add(rep(1, 0, 0.012))
            assert [r["iter"] for r in view.rows] == [0, 1]
            assert [r["time"] for r in view.rows] == [0.012, 0.030]
            assert view.shown
    finally:
        run_mod.terminal.out = saved
    text = console.export_text()
    assert "12.0" in text and "30.0" in text


@pytest.mark.slow
def test_warm_up_says_it_compiles_only_on_a_first_run(tmp_path):
    """``cli.worker --warm-up`` in an empty Numba cache announces the compile;
    the next one loads every kernel and says nothing of the kind."""
    from cli.worker import COMPILING, WARM_PREFIX

    env = child_env(NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    argv = [sys.executable, "-m", "cli.worker", "--warm-up"]
    first = run(argv, env=env, timeout=600)
    again = run(argv, env=env, timeout=600)
    assert first.stdout.splitlines()[0] == COMPILING
    assert first.stdout.splitlines()[-1].startswith(WARM_PREFIX)
    assert COMPILING not in again.stdout and again.stdout.startswith(WARM_PREFIX)
    assert list((tmp_path / "numba").rglob("*.nbi"))


def test_compiling_is_said_only_when_numba_compiles(caplog):
    """``compiling_said`` (around the emulator's warm-up) logs as the first
    compilation begins and how long it took, and nothing when every kernel
    is already compiled (a warm cache)."""
    from numba import njit

    from swemu.protocol.jit import compiling_said

    fresh = njit(lambda x: x + 1)  # not cached: compiles on its first call
    log = logging.getLogger("test.compile")
    with caplog.at_level("INFO", logger="test.compile"):
        with compiling_said(log):
            assert fresh(1) == 2
        said = [r.getMessage() for r in caplog.records]
        assert said[0].startswith("compiling kernels (first start only")
        assert re.fullmatch(r"compiled the kernels in \d+\.\d s", said[1]) and len(said) == 2
        caplog.clear()
        with compiling_said(log):
            assert fresh(2) == 3  # compiled already
        assert caplog.records == []


@pytest.mark.slow
def test_serve_says_it_compiles_on_a_first_start(tmp_path):
    """``switchml-emu serve`` in an empty Numba cache says it is compiling
    before it serves (it is silent for those seconds otherwise); started again
    in that cache, it loads the kernels and does not."""
    env = child_env(NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    said = []
    for start in range(2):
        ready = tmp_path / f"ready{start}.json"
        argv = ["serve", "--host", "127.0.0.1", "--port", "0", "--control-port", "0"]
        with Watched([*EMU, *argv, "--ready-file", str(ready)], env=env) as proc:
            proc.wait_until(ready.exists, 600, "the emulator to serve")
            proc.send_signal(signal.SIGTERM)
            err = proc.expect(0, timeout=60, what="the emulator to stop on SIGTERM")
        said.append(err)
    first, again = said
    assert "compiling kernels (first start only" in first
    assert first.index("compiling kernels") < first.index("switchml-emu serving")
    assert re.search(r"compiled the kernels in \d+\.\d s", first)
    assert "compiling" not in again and "switchml-emu serving" in again


def test_tensorflow_early_absl_lines_follow_tf_cpp_min_log_level():
    """absl's INFO lines from before TensorFlow sets up its logging ignore
    TF_CPP_MIN_LOG_LEVEL; the launcher applies it to them (its own default 1:
    INFO off), and keeps them when the level is 0."""
    from cli.run import _tensorflow_quiet

    early = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796571127.211796   17285 port.cc:153] oneDNN custom operations are on.",
        "I1114 09:32:22.280168 13509 tpu_hal.cc:448] Registered plugin",
    ]
    kept = ["E0000 00:00:1796571127.2 17285 x.cc:1] an error", "Epoch 1/3", "I am a line"]
    for level in ("1", "2", "3"):
        quiet = _tensorflow_quiet(level)
        assert all(quiet(line) for line in early) and not any(quiet(line) for line in kept)
    for level in ("0", None, "nonsense"):
        assert not any(_tensorflow_quiet(level)(line) for line in early + kept)
