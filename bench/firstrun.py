"""``python -m bench firstrun``: what a first run of ``switchml run`` costs.

Each round runs the same ``switchml run --workers W`` twice in one fresh Numba
cache directory (``NUMBA_CACHE_DIR``, so every process of the run, emulator and
workers, uses it): first with the cache empty (cold: every kernel compiles),
then again (warm: every kernel loads). It reports wall time and the CPU time of
the whole process tree for each, and the cold/warm ratios. ``--tree`` runs the
same rounds for other source trees too (an export of an older commit, say),
interleaved with this one, so that a before/after comparison shares the
machine's load.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _one(tree: Path, cache: str, argv: list[str], timeout: float) -> dict[str, Any]:
    """One ``switchml run`` from ``tree`` with Numba's cache in ``cache``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env["NUMBA_CACHE_DIR"] = cache
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "from cli.main import switchml_main; switchml_main()", *argv],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stderr.strip().splitlines()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "exit": proc.returncode,
        "said_compiling": any("compiling kernels" in line for line in lines),
        "last_line": lines[-1] if lines else "",
    }


def run(
    workers: int = 4,
    size: str = "1Mi",
    iters: int = 3,
    rounds: int = 1,
    trees: list[Path] | None = None,
    timeout: float = 900.0,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Cold then warm ``switchml run`` per tree per round; see the module docstring."""
    trees = [ROOT, *(trees or [])]
    argv = ["run", "--workers", str(workers), "--size", size, "--iters", str(iters)]
    results: list[dict[str, Any]] = []
    for r in range(rounds):
        for tree in trees:
            with tempfile.TemporaryDirectory(prefix="swemu-bench-numba-") as cache:
                cold = _one(tree, cache, argv, timeout)
                log(f"round {r} {tree}: cold {cold['wall_s']:.1f} s ({cold['last_line']})")
                warm = _one(tree, cache, argv, timeout)
                log(f"round {r} {tree}: warm {warm['wall_s']:.1f} s ({warm['last_line']})")
            results.append(
                {
                    "round": r,
                    "tree": str(tree),
                    "cold": cold,
                    "warm": warm,
                    "wall_ratio": cold["wall_s"] / warm["wall_s"],
                    "cpu_ratio": cold["cpu_s"] / warm["cpu_s"] if warm["cpu_s"] else None,
                }
            )
    return {"argv": ["switchml", *argv], "cpus": os.cpu_count(), "results": results}


def markdown(data: dict[str, Any]) -> str:
    out = [
        f"`{' '.join(data['argv'])}`, empty Numba cache (cold) then the same again (warm); "
        f"{data['cpus']} CPUs",
        "",
        "| round | tree | cold wall (s) | warm wall (s) | wall ratio | cold CPU (s) | "
        "warm CPU (s) | CPU ratio | exits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        c, w = r["cold"], r["warm"]
        cpu_ratio = f"{r['cpu_ratio']:.1f}x" if r["cpu_ratio"] else "-"
        out.append(
            f"| {r['round']} | {r['tree']} | {c['wall_s']:.1f} | {w['wall_s']:.1f} | "
            f"{r['wall_ratio']:.1f}x | {c['cpu_s']:.1f} | {w['cpu_s']:.1f} | {cpu_ratio} | "
            f"{c['exit']}/{w['exit']} |"
        )
    return "\n".join(out) + "\n"
