"""The build scripts of p4/model/: argument handling, resumable steps, patches applied once.

The builds themselves take hours and are not run here (p4/README.md, "Running on the
Tofino model"); these tests run the scripts' own logic (p4/model/buildlib.sh) in a
temporary build directory with bash.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "p4" / "model"


def bash(script: str, build_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in bash with buildlib.sh sourced and BUILD_DIR set."""
    return subprocess.run(
        ["bash", "-c", f'. "{MODEL}/buildlib.sh"\n{script}'],
        env={"PATH": "/usr/bin:/bin", "BUILD_DIR": str(build_dir), "HOME": str(build_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("script", ["build-bf-p4c.sh", "build-p4testgen.sh", "build-model.sh"])
def test_unknown_argument_is_refused(script: str, tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(MODEL / script), "--dir", str(tmp_path), "--frobnicate"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "unknown argument: --frobnicate" in r.stderr


@pytest.mark.parametrize("script", ["build-bf-p4c.sh", "build-p4testgen.sh", "build-model.sh"])
def test_status_of_an_empty_directory(script: str, tmp_path: Path) -> None:
    r = subprocess.run(
        ["bash", str(MODEL / script), "--dir", str(tmp_path / "b"), "--status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0
    assert f"no build in {tmp_path / 'b'}" in r.stdout


def test_a_step_runs_once_and_records_itself(tmp_path: Path) -> None:
    once = 'step one bash -c "echo ran >>$BUILD_DIR/count"'
    script = f"{once}\n{once}"
    r = bash(script, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "count").read_text() == "ran\n"
    assert "step one: done before, skipped" in r.stdout
    assert (tmp_path / "stamps" / "one").exists()
    assert "step: one (since " in (tmp_path / "STATUS").read_text()


def test_a_failing_step_leaves_no_stamp(tmp_path: Path) -> None:
    r = bash("step bad false", tmp_path)
    assert r.returncode != 0
    assert not (tmp_path / "stamps" / "bad").exists()


PATCH = """--- a/f.txt
+++ b/f.txt
@@ -1,2 +1,2 @@
 first
-second
+changed
"""


def test_a_patch_applies_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("first\nsecond\n")
    script = f"apply_patch {src} p <<'EOF'\n{PATCH}EOF\napply_patch {src} p <<'EOF'\n{PATCH}EOF"
    r = bash(script, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (src / "f.txt").read_text() == "first\nchanged\n"
    assert (tmp_path / "stamps" / "patch-p").exists()


def test_a_patch_that_does_not_apply_stops_the_build(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("something else\n")
    r = bash(f"apply_patch {src} p <<'EOF'\n{PATCH}EOF", tmp_path)
    assert r.returncode == 1
    assert "patch p does not apply" in r.stderr
    assert (src / "f.txt").read_text() == "something else\n"


def test_jobs_are_capped_by_memory(tmp_path: Path) -> None:
    r = bash("jobs_for_memory 3; jobs_for_memory 1000000", tmp_path)
    assert r.returncode == 0, r.stderr
    by_3, by_huge = (int(x) for x in r.stdout.split())
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    assert 1 <= by_3 <= nproc
    assert by_huge == 1


def test_a_patch_already_in_the_sources_is_left_alone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("first\nchanged\n")
    r = bash(f"apply_patch {src} p <<'EOF'\n{PATCH}EOF", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "patch p: the sources have it already" in r.stdout
    assert (src / "f.txt").read_text() == "first\nchanged\n"
