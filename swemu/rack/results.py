"""The JSON a run writes: configuration, records, rows and the code's state.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .analysis import faithful_up_to, speedups
from .runner import BenchConfig, Record


def code_state() -> dict[str, Any]:
    """The commit of this checkout and its modified tracked files (read-only git),
    so that a result names the code that produced it."""
    git = ["git", "-C", str(Path(__file__).resolve().parent.parent)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "-uno"], capture_output=True, text=True)
    return {
        "commit": head.stdout.strip() or None,
        "modified_files": [line[3:] for line in dirty.stdout.splitlines()]
        if dirty.returncode == 0
        else None,
    }


def write_json(
    path: str | Path,
    config: BenchConfig,
    records: Sequence[Record],
    rows: Sequence[dict[str, Any]],
    *,
    complete: bool = True,
    code: dict[str, Any] | None = None,
) -> None:
    """Everything: configuration, machine (with its load: it may be shared), every
    measurement, the summary; ``complete`` is False for what a failed run saved.
    ``code``: :func:`code_state` taken when the run started (default: now)."""
    doc = {
        "complete": complete,
        "code": code if code is not None else code_state(),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()},
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "loadavg_at_end": os.getloadavg(),
        },
        "records": [asdict(r) for r in records],
        "summary": list(rows),
        "speedups": speedups(rows),
        "faithful_up_to_gbps": faithful_up_to(rows),
    }
    Path(path).write_text(json.dumps(doc, indent=1))
