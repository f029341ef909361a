"""The command line as a user meets it: real subprocesses, one-line errors, exit codes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import emu, switchml
from cli.terminal import parse_size
from swemu.launch import child_env

EMU = [sys.executable, "-c", "from cli.main import emu_main; emu_main()"]
SWITCHML = [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()"]


def run(cmd, timeout=180, **kw):
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), **kw
    )


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
    p = run(EMU + args, timeout=60)
    assert p.returncode == 2
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
        )
    finally:
        s.close()
    assert p.returncode == 1
    assert "cannot listen for UDP" in one_line_error(p)


def test_control_port_in_use_is_one_line():
    """gRPC's C core logs its own bind failure unless told not to: the entry
    point silences it, so the user sees our one line only."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    env = child_env()
    env.pop("GRPC_VERBOSITY", None)
    try:
        p = subprocess.run(
            [
                *EMU,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--control-port",
                str(s.getsockname()[1]),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        s.close()
    assert p.returncode == 1
    assert "cannot listen for gRPC" in one_line_error(p)


def test_serve_stops_cleanly_on_sigterm(tmp_path):
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [
            *EMU,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--control-port",
            "0",
            "--ready-file",
            str(ready),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["data"][1] > 0 and info["control"][1] > 0
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert "shutdown:" in err and "Traceback" not in err


def test_run_bad_options_are_one_line():
    p = run([*SWITCHML, "run", "--workers", "0"], timeout=60)
    assert p.returncode == 2 and "--workers" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--switch", "host:notaport"], timeout=60)
    assert p.returncode == 1 and "port" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--size", "6"], timeout=60)
    assert p.returncode == 1 and "4-byte" in one_line_error(p)
    p = run([*SWITCHML, "run", "-n", "2", "--switch", "127.0.0.1:9", "--shards", "2"], timeout=60)
    assert p.returncode == 1 and "--shards" in one_line_error(p)
    p = run([*SWITCHML, "run", "--workers", "2", "--shards", "17"], timeout=60)
    assert p.returncode == 2 and "--shards" in one_line_error(p)


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
    assert p.returncode == 0, p.stderr
    assert "verified 2 results" in p.stderr and "goodput" in p.stdout
    data = json.loads(out.read_text())
    assert len(data["iters"]) == 2 and all(i["ok"] for i in data["iters"])


def test_run_with_a_sharded_emulator(tmp_path):
    """--shards 2: the local emulator serves two data ports; the workers spread
    their slots over both and the results verify."""
    out = tmp_path / "run.json"
    argv = [*SWITCHML, "run", "-n", "2", "--shards", "2", "--size", "1Mi", "--iters", "2"]
    p = run([*argv, "--dtype", "int32", "--json", str(out)])
    assert p.returncode == 0, p.stderr
    assert "+1 shards on the next ports" in p.stderr and "verified 2 results" in p.stderr
    assert all(i["ok"] for i in json.loads(out.read_text())["iters"])


def test_run_through_a_local_two_level_fabric(tmp_path):
    """--racks 2: a root emulator and two rack emulators under it; workers 0, 1
    register at rack 0's, 2, 3 at rack 1's, and every sum is exact."""
    out = tmp_path / "run.json"
    argv = [*SWITCHML, "run", "-n", "4", "--racks", "2", "--size", "1Mi", "--iters", "2"]
    p = run([*argv, "--dtype", "int32", "--json", str(out)])
    assert p.returncode == 0, p.stderr
    assert "rack 0 emulator" in p.stderr and "rack 1 emulator" in p.stderr
    assert "verified 2 results" in p.stderr
    assert all(i["ok"] for i in json.loads(out.read_text())["iters"])
    p = run([*SWITCHML, "run", "-n", "2", "--racks", "3"], timeout=60)
    assert p.returncode == 1 and "--racks" in one_line_error(p)


def test_run_command_mode_sets_the_environment(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import numpy as np, hostlib, os\n"
        "ctx = hostlib.from_env()\n"
        "y = ctx.allreduce(np.full(100, ctx.rank + 1, np.int32))\n"
        "assert (y == 3).all(), y\n"
        # one string, one write: the two ranks share the pipe and may interleave writes
        "print(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} ok\", flush=True)\n"
        "ctx.close()\n"
    )
    p = run([*SWITCHML, "run", "--workers", "2", "--", sys.executable, str(script)])
    assert p.returncode == 0, p.stderr
    assert "rank 0 of 2 ok" in p.stdout and "rank 1 of 2 ok" in p.stdout


def test_run_command_mode_reports_failing_workers(tmp_path):
    p = run(
        [
            *SWITCHML,
            "run",
            "--workers",
            "2",
            "--",
            sys.executable,
            "-c",
            "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)",
        ]
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last == "error: 1 of 2 workers failed: rank 1 (exit 3)"


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
    assert p.returncode == 0, p.stderr
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
    proc = subprocess.Popen(
        [*SWITCHML, "run", "--workers", "2", "--", sys.executable, str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        kids = _children(proc.pid)
        assert len(kids) == 3  # the emulator and two workers
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "error: terminated"
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(k) for k in kids)


def test_run_checks_the_json_path_before_the_run(tmp_path):
    """An unwritable --json fails at once, before any emulator or worker starts."""
    t0 = time.monotonic()
    bad = tmp_path / "no such dir" / "run.json"
    p = run([*SWITCHML, "run", "-n", "2", "--json", str(bad)], timeout=60)
    assert p.returncode == 1 and "cannot write --json" in one_line_error(p)
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
        )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 of 2 workers failed: rank 0 (exit 2: the warm-up allreduce")
    assert "from the switch at 127.0.0.1:9" in last and "not one result" in last
    assert "slots finished" not in last and "allreduce #" not in last


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
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    assert first.stdout.splitlines()[0] == COMPILING
    assert first.stdout.splitlines()[-1].startswith(WARM_PREFIX)
    assert COMPILING not in again.stdout and again.stdout.startswith(WARM_PREFIX)
    assert list((tmp_path / "numba").rglob("*.nbi"))
