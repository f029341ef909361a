"""The P4 program through real compilers: p4c's p4test front end and, where present, bf-p4c.

* ``check-p4`` (p4c's ``p4test`` with the Tofino headers, found through
  ``$SWITCHML_CHECK_P4``, which ``.ci/run`` sets, or beside the repository in
  ``../shared/tools/p4c/bin/check-p4``) must accept ``p4/switchml.p4``: P4_16 syntax,
  types, the TNA extern signatures, p4c's front and mid end. It does not place tables
  or allocate PHV (no Tofino back end).
* ``bf-p4c`` (``$BF_P4C`` or on PATH) compiles it for Tofino 1 through
  ``p4/build.sh``, which must leave the binary, the BF Runtime schema and the resource
  logs; the program must fit (``p4/resource_summary.py``: stages, per-stage resources,
  stateful ALUs), and the compiled parser must keep its ``select`` transitions (a bf-p4c
  without p4c #5753 loses them on Tofino 1).
  ``tests/test_p4_bfrt_names.py`` then checks the controller's names against that
  ``bfrt.json``.

Each test skips, saying why, when its compiler is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from p4 import resource_summary

REPO = Path(__file__).resolve().parent.parent
BUILD_SH = REPO / "p4" / "build.sh"


#: Why the p4test checks skip, and where a user finds how to get the tool.
NO_CHECK_P4 = (
    "no check-p4 (p4c's p4test with the Tofino headers): build one as p4/README.md, "
    "Building, says, then set SWITCHML_CHECK_P4"
)


def check_p4() -> Path | None:
    """The check-p4 wrapper: ``$SWITCHML_CHECK_P4``, else the shared tools beside the repo."""
    env = os.environ.get("SWITCHML_CHECK_P4")
    path = Path(env) if env else REPO.parent / "shared" / "tools" / "p4c" / "bin" / "check-p4"
    usable = path.is_file() and os.access(path, os.X_OK)
    if env and not usable:  # asked for (CI sets it): a missing tool is a failure, not a skip
        pytest.fail(f"SWITCHML_CHECK_P4={env} is not an executable file")
    return path if usable else None


def bf_p4c() -> str | None:
    """The bf-p4c driver: ``$BF_P4C``, else ``bf-p4c`` on PATH."""
    return os.environ.get("BF_P4C") or shutil.which("bf-p4c")


def run_build(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(BUILD_SH), *args],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, **(env or {})},
    )


def test_check_p4_accepts_the_program(tmp_path: Path) -> None:
    """p4test (front end + mid end, Tofino 1 headers) accepts switchml.p4 without errors."""
    tool = check_p4()
    if tool is None:
        pytest.skip(NO_CHECK_P4)
    if shutil.which("cpp") is None:
        pytest.skip("check-p4 needs cpp, the C preprocessor (Debian: apt install cpp)")
    r = run_build("--check-only", "--out", str(tmp_path), env={"SWITCHML_CHECK_P4": str(tool)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "error" not in r.stderr.lower(), r.stderr


def test_check_p4_rejects_a_broken_program(tmp_path: Path) -> None:
    """The check can fail: a type error in a copy of the program is reported."""
    tool = check_p4()
    if tool is None:
        pytest.skip(NO_CHECK_P4)
    if shutil.which("cpp") is None:
        pytest.skip("check-p4 needs cpp, the C preprocessor (Debian: apt install cpp)")
    copy = tmp_path / "p4"
    shutil.copytree(REPO / "p4", copy, ignore=shutil.ignore_patterns("build", "__pycache__"))
    text = (copy / "checks.p4").read_text()
    broken = text.replace("ig_md.count_start = ", "ig_md.count_start = 1w1 + ")  # width clash
    (copy / "checks.p4").write_text(broken)
    r = subprocess.run(
        ["bash", str(copy / "build.sh"), "--check-only", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SWITCHML_CHECK_P4": str(tool)},
    )
    assert r.returncode != 0
    assert "checks.p4" in r.stderr


def test_build_without_compiler_is_one_clear_line(tmp_path: Path) -> None:
    """No bf-p4c anywhere: one line naming the three ways to give one, exit status 127."""
    r = subprocess.run(
        ["bash", str(BUILD_SH), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
    )
    assert r.returncode == 127
    assert r.stderr.strip().count("\n") == 0
    assert "no bf-p4c found" in r.stderr and "BF_P4C" in r.stderr and "--compiler" in r.stderr


@pytest.fixture(scope="module")
def bf_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """p4/build.sh run once with bf-p4c; its output directory DIR/switchml."""
    compiler = bf_p4c()
    if compiler is None:
        pytest.skip("no bf-p4c: put it on PATH or set BF_P4C (see p4/README.md, Building)")
    tmp_path = tmp_path_factory.mktemp("bf-p4c")
    r = run_build("--compiler", compiler, "--out", str(tmp_path))
    out = tmp_path / "switchml"
    assert r.returncode == 0, (out / "compile.log").read_text()[-4000:]
    return out


def test_bf_p4c_compiles_for_tofino_1(bf_build: Path) -> None:
    """bf-p4c --target tofino --arch tna compiles switchml.p4 (both size codes: one
    program) through to the binary, and it fits one Tofino 1 pipe: at most 12 MAU
    stages, no stage over its capacity, the 35 stateful ALUs the program needs
    (bitmap, count, exponents, 32 value pairs), and the BF Runtime schema."""
    out = bf_build
    assert "exit status: 0" in (out / "BUILD-INFO.txt").read_text()
    for name in ("bfrt.json", "pipe/context.json", "pipe/tofino.bin", "pipe/logs/resources.json"):
        assert (out / name).is_file(), name
    assert "error:" not in (out / "compile.log").read_text()

    summary = resource_summary.load(out)
    assert summary.n_stages <= resource_summary.STAGES
    assert sorted(summary.stages) == list(range(summary.n_stages))
    for stage, used in summary.stages.items():
        for column, capacity in resource_summary.STAGE_CAPACITY.items():
            assert used[column] <= capacity, (stage, column)
    assert summary.total("stateful_alu") == 35
    assert "| total |" in (out / "resources.txt").read_text()


def test_bf_p4c_parser_keeps_its_select_transitions(bf_build: Path) -> None:
    """The compiled parser still selects: bfas warns "Can't match parser state due to
    previous match" when a parser state's transitions all match '*' -- the bug of p4c
    #5063 that p4c #5753 fixes (on Tofino 1 every select loses its match register, and
    each state takes its first transition whatever the packet: here every packet would
    be parsed as a recirculated one). Fails with a compiler that lacks that fix."""
    log = (bf_build / "compile.log").read_text()
    broken = log.count("Can't match parser state due to previous match")
    assert broken == 0, (
        f"bf-p4c emitted {broken} parser transitions that can never match: the compiler "
        "lacks p4c #5753 (parser match registers dropped on Tofino 1); the binary's parser "
        "ignores every select. Rebuild bf-p4c with that fix."
    )
