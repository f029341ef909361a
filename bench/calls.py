"""``python -m bench calls``: what calling the compiled loops costs, and their signatures.

Every readiness callback of the emulator calls the compiled drain once, and
every blocking allreduce the worker's compiled wait at least once: what the
call itself costs (building its arguments in Python, Numba's dispatcher typing
and unboxing them, the loop's setup) is paid per wakeup, whatever the packets.
This benchmark calls each entry point where it has nothing to do, so that
little else is timed:

* ``emulator drain``: :meth:`DataPlane._drain_fast` on an empty socket (no
  serve slice: ``SWEMU_SLICE_MS=0``);
* ``worker pump``: :meth:`FastIO.pump` on an empty socket;
* ``worker wait``: :meth:`FastIO.wait` for a call whose results are in (it
  returns at once);
* ``worker call``: :meth:`WorkerProtocol.allreduce`, the Python side of
  starting a call (4096 float32 values).

It also reports each tree's compiled functions by parameter count (every
Numba dispatcher in the switch's and the worker's packages). ``--tree`` runs
the same for other source trees (an export of an older commit, say), each
part in its own process, interleaved round by round.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swemu.protocol", "swemu.core", "swemu.serving", "hostlib")


def _timed(fn: Callable[[], Any], n: int) -> float:
    """Microseconds per call of ``fn``: the median of five runs of ``n`` calls."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(runs)[2]


def _signatures() -> list[tuple[str, int]]:
    """(name, parameter count) of every Numba dispatcher in :data:`PACKAGES`."""
    from numba.core.registry import CPUDispatcher

    found: dict[str, int] = {}
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names = [pkg_name] + [
            f"{pkg_name}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg
        ]
        for name in names:
            try:
                mod = importlib.import_module(name)
            except Exception:  # an optional extra (torch, tensorflow) or a plugin
                continue
            for value in vars(mod).values():
                if isinstance(value, CPUDispatcher):
                    fn = value.py_func
                    key = f"{fn.__module__}.{fn.__qualname__}"
                    found[key] = len(inspect.signature(fn).parameters)
    return sorted(found.items(), key=lambda kv: -kv[1])


def _child(n: int) -> dict[str, Any]:
    """Time the entry points of the tree on ``PYTHONPATH``, in this process."""
    import asyncio
    import socket

    import numpy as np

    from hostlib import fastpath
    from swemu.core.engine import EngineConfig, SwitchEngine
    from swemu.protocol.worker.protocol import WorkerProtocol
    from swemu.serving.dataplane import DataPlane

    out: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    data = DataPlane(SwitchEngine(EngineConfig(pool_size=64, max_jobs=4)), sock, loop)
    data.compile()
    out["emulator drain"] = _timed(data._drain_fast, n)

    wsock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    wsock.bind(("127.0.0.1", 0))
    wsock.setblocking(False)
    fd = wsock.fileno()
    proto = WorkerProtocol(num_workers=2, size_code=6, window=64)
    x = np.ones(4096, np.float32)
    y = np.empty_like(x)
    op = proto.allreduce(x, y, 0.0)
    batch = np.zeros((64, proto.rows.shape[1] + 1), np.uint8)
    io = fastpath.FastIO(
        batch, np.zeros(64, np.int32), np.zeros(64, np.uint8), proto.rows, 0x7F000001, [9], 4, True
    )
    call = op.state if hasattr(op, "state") else op.result_args  # today / before the records
    clock = np.zeros(3)
    io.pump(fd, 0.0, call)
    io.wait(fd, clock, 0, 1.0, call)
    out["worker pump"] = _timed(lambda: io.pump(fd, 0.0, call), n)
    out["worker wait"] = _timed(lambda: io.wait(fd, clock, 0, 1.0, call), n)
    out["worker call"] = _timed(lambda: proto.allreduce(x, y, 0.0), n)
    sigs = _signatures()
    return {"per_call_us": out, "signatures": sigs[:8], "kernels": len(sigs)}


def _one(tree: Path, n: int, timeout: float) -> dict[str, Any]:
    """The entry points of ``tree`` timed in a process of their own."""
    from .trees import run_child  # here: the child runs this file as a script

    return run_child(Path(__file__).resolve(), tree, [str(n)], timeout, env={"SWEMU_SLICE_MS": "0"})


def run(
    rounds: int = 3,
    trees: list[Path] | None = None,
    calls: int = 2000,
    timeout: float = 900.0,
    log: Callable[[str], None] = lambda m: None,
) -> dict[str, Any]:
    """Each tree once per round, interleaved; kernels compiled (or loaded) first."""
    from .trees import interleaved

    results = interleaved(
        rounds,
        [ROOT, *(trees or [])],
        [""],
        lambda tree, _: _one(tree, calls, timeout),
        lambda res: ", ".join(f"{k} {v:.1f} µs" for k, v in res["per_call_us"].items()),
        log,
    )
    return {"calls": calls, "cpus": os.cpu_count(), "results": results}


def markdown(data: dict[str, Any]) -> str:
    """Per tree: the median over rounds of each entry point's µs per call, then
    its compiled functions with the most parameters."""
    trees = list(dict.fromkeys(r["tree"] for r in data["results"]))
    names = list(data["results"][0]["per_call_us"])
    out = [
        f"Cost of one call from Python, where the loop has nothing to do (µs; median of "
        f"the rounds, each the median of 5 × {data['calls']} calls; {data['cpus']} CPUs)",
        "",
        "| tree | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for tree in trees:
        rows = [r for r in data["results"] if r["tree"] == tree]
        cells = []
        for name in names:
            vals = sorted(r["per_call_us"][name] for r in rows)
            cells.append(f"{vals[len(vals) // 2]:.1f}")
        out.append(f"| {tree} | " + " | ".join(cells) + " |")
    for tree in trees:
        first = next(r for r in data["results"] if r["tree"] == tree)
        out += [
            "",
            f"{tree}: {first['kernels']} compiled functions; the most parameters:",
            "",
            "| function | parameters |",
            "|---|---|",
        ]
        out += [f"| `{name}` | {count} |" for name, count in first["signatures"]]
    return "\n".join(out) + "\n"


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_child(int(sys.argv[2]))))
