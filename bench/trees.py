"""Measuring other source trees beside this one (``--tree``).

``bench compile``, ``bench calls`` and ``bench firstrun`` run the same
measurement for an export of another commit (``git archive``), each tree in
processes of its own with that tree first on ``PYTHONPATH``, interleaved round
by round with this one, so that before/after figures come from one invocation
on a shared, noisy machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_child(
    script: Path,
    tree: Path,
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    what: str = "",
) -> dict[str, Any]:
    """Run ``python SCRIPT --child ARGS`` with ``tree``'s code and return the JSON
    object its last line of output holds, with ``"tree"`` added. A child that
    fails raises RuntimeError with its last line of stderr (``what`` names the
    part in the message)."""
    proc = subprocess.run(
        [sys.executable, str(script), "--child", *args],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree), **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        label = f"{tree} {what}".strip()
        raise RuntimeError(f"{label}: exit {proc.returncode}: {last}")
    return {"tree": str(tree), **json.loads(proc.stdout.strip().splitlines()[-1])}


def interleaved(
    rounds: int,
    trees: list[Path],
    parts: list[str],
    measure: Callable[[Path, str], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """``measure(tree, part)`` for every round, tree and part, in that order
    (the trees take turns within each round); each result gets its ``"round"``
    and ``"part"``, and a line ``describe(result)`` is logged."""
    results = []
    for r in range(rounds):
        for tree in trees:
            for part in parts:
                res = measure(tree, part)
                res["round"] = r
                res.setdefault("part", part)
                log(f"round {r} {tree}{' ' + part if part else ''}: {describe(res)}")
                results.append(res)
    return results
