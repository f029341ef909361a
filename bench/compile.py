"""``python -m bench compile``: what the first run compiles, per kernel, in CPU seconds.

A first ``switchml run`` compiles in two processes side by side (see
docs/running.md): the local emulator (the data plane's kernels; a tree from
before 2026-12-06 the engine's Python path too) and one warm-up process
(``python -m cli.worker --warm-up``, the workers' kernels). This benchmark
does the same two compile steps, each in a fresh process with an empty
``NUMBA_CACHE_DIR``, and records every Numba compilation (its
``numba:compile`` events) with the CPU time it took, inclusive (with the
kernels it compiled on the way: callees are compiled, and then linked into
and optimized again with, each caller) and exclusive. CPU seconds, not wall:
a loaded machine stretches wall time more than CPU time.

``--tree`` measures other source trees too (an export of an older commit, say),
interleaved with this one, each part in its own process.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PARTS = ("emulator", "worker")


def _child(part: str, dtype: str) -> dict[str, Any]:
    """Run one compile step here, with a listener on Numba's compile events."""
    from numba.core import event

    t_start = time.process_time()
    stack: list[list[Any]] = []
    rows: list[dict[str, Any]] = []

    class _Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            stack.append([ev.data["dispatcher"], ev.data["args"], time.process_time(), 0.0])

        def on_end(self, ev: event.Event) -> None:
            disp, args, t0, inner = stack.pop()
            incl = time.process_time() - t0
            if stack:
                stack[-1][3] += incl
            fn = disp.py_func
            rows.append(
                {
                    "kernel": f"{fn.__module__}.{fn.__qualname__}",
                    "args": str(args),
                    "incl_s": incl,
                    "excl_s": incl - inner,
                }
            )

    event.register("numba:compile", _Listener())
    # decided before the clock starts: it imports the whole server
    warms_engine = part == "emulator" and _server_warms_engine()
    t0 = time.process_time()
    w0 = time.perf_counter()
    if part == "emulator":  # what swemu.serving.server.Emulator does before it binds a port
        import asyncio

        try:
            from swemu.core.engine import warmup
            from swemu.serving.dataplane import warmup as dataplane_warmup
        except ImportError:  # an older --tree: swemu.engine, swemu.dataplane
            warmup = importlib.import_module("swemu.engine").warmup
            dataplane_warmup = importlib.import_module("swemu.dataplane").warmup

        dataplane_warmup(asyncio.new_event_loop())
        if warms_engine:  # an older --tree compiled the engine's Python path too
            warmup()
    else:
        # the launcher's warm-up step, run as its command line would run it
        # (``python -m cli.worker --warm-up DTYPE``), in this process
        import runpy

        for module in ("cli.worker", "cli._worker"):  # an older --tree has cli._worker
            if importlib.util.find_spec(module) is None:
                continue
            sys.argv = [module, "--warm-up", dtype]
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
            break
    return {
        "part": part,
        "cpu_s": time.process_time() - t0,
        "wall_s": time.perf_counter() - w0,
        "import_cpu_s": t0 - t_start,
        "compiles": len(rows),
        "rows": rows,
    }


def _server_warms_engine() -> bool:
    """Whether this tree's server compiles the engine's Python path at start
    (``swemu.core.engine.warmup``) besides the data plane's kernels, as the
    code before 2026-12-06 did."""
    import inspect

    for name in ("swemu.serving.server", "swemu.server"):
        try:
            src = inspect.getsource(importlib.import_module(name))
        except ImportError:
            continue
        return "warmup()" in src.replace("dataplane_warmup(", "")
    return True


def _one(tree: Path, part: str, dtype: str, timeout: float) -> dict[str, Any]:
    """One compile step of ``tree`` in a fresh process and an empty cache."""
    from .trees import run_child  # here: the child runs this file as a script

    with tempfile.TemporaryDirectory(prefix="swemu-bench-numba-") as cache:
        return run_child(
            Path(__file__).resolve(),
            tree,
            [part, dtype],
            timeout,
            env={"NUMBA_CACHE_DIR": cache},
            what=part,
        )


def run(
    rounds: int = 1,
    trees: list[Path] | None = None,
    dtype: str = "float32",
    timeout: float = 900.0,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Each compile step of each tree, ``rounds`` times, interleaved."""
    from .trees import interleaved

    results = interleaved(
        rounds,
        [ROOT, *(trees or [])],
        list(PARTS),
        lambda tree, part: _one(tree, part, dtype, timeout),
        lambda res: f"{res['cpu_s']:.1f} s CPU, {res['compiles']} compilations",
        log,
    )
    return {"dtype": dtype, "cpus": os.cpu_count(), "results": results}


def markdown(data: dict[str, Any], top: int = 15) -> str:
    """Totals per tree and step, then the costliest kernels of this tree."""
    out = [
        f"Compile steps of a first `switchml run` (--dtype {data['dtype']}), each in a fresh "
        f"process with an empty Numba cache; CPU seconds; {data['cpus']} CPUs",
        "",
        "| round | tree | step | CPU (s) | wall (s) | compilations |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        out.append(
            f"| {r['round']} | {r['tree']} | {r['part']} | {r['cpu_s']:.1f} | "
            f"{r['wall_s']:.1f} | {r['compiles']} |"
        )
    mine = [r for r in data["results"] if r["tree"] == str(ROOT) and r["round"] == 0]
    for r in mine:
        out += [
            "",
            f"{r['part']} ({r['tree']}): the {top} costliest compilations "
            "(inclusive: with the callees compiled on the way)",
            "",
            "| kernel | exclusive CPU (s) | inclusive CPU (s) |",
            "|---|---|---|",
        ]
        for row in sorted(r["rows"], key=lambda x: -x["excl_s"])[:top]:
            out.append(f"| `{row['kernel']}` | {row['excl_s']:.2f} | {row['incl_s']:.2f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_child(sys.argv[2], sys.argv[3])))
