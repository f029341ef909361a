"""The worker program of ``switchml run`` without a command: allreduce
deterministic inputs, check every result, report each iteration as one JSON
line as it finishes (the launcher's table grows row by row) and a last line
with the whole report.

``python -m cli.worker --warm-up [DTYPE]`` is the launcher's one compile step
instead: it compiles (or loads from Numba's cache) every kernel a worker uses,
once, so that the N workers started after it load them from the cache rather
than each compiling the same kernels at the same time; with a DTYPE (int32 or
float32, the built-in workers' ``--dtype``) only that type's test data
kernels (the library's own are warmed for both, as each worker's context does)
and not the event loop's path, which those workers do not take. It prints
:data:`COMPILING` when the cache missed (a first run), then ``WARM <seconds>``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import numpy as np

RESULT_PREFIX = "SWITCHML_RESULT "
ITER_PREFIX = "SWITCHML_ITER "
COMPILING = "SWITCHML_COMPILING"
WARM_PREFIX = "SWITCHML_WARM "


def main() -> int:
    import hostlib
    from swemu.protocol import wire
    from swemu.protocol.worker.testdata import check_result, worker_input

    dtype = np.dtype(os.environ.get("SWITCHML_RUN_DTYPE", "float32"))
    nbytes = int(os.environ.get("SWITCHML_RUN_SIZE", str(16 << 20)))
    iters = int(os.environ.get("SWITCHML_RUN_ITERS", "5"))
    n = nbytes // dtype.itemsize
    ctx = hostlib.from_env()
    rank, w = ctx.rank, ctx.world_size
    report: dict = {"rank": rank, "iters": []}
    phase = "the warm-up allreduce"
    it = -1
    try:
        with ctx:
            nvals = wire.values_per_packet(ctx.options.packet_size)  # known once joined
            tick = np.zeros(1, np.int32)
            ctx.allreduce(worker_input(rank, 4096, 0, dtype))  # warm up kernels and the path
            out = np.empty(n, dtype)
            for it in range(iters):
                x = worker_input(rank, n, it, dtype)
                phase = f"the line-up before iteration {it}"
                ctx.allreduce(tick, out=tick)  # line the workers up through the switch
                phase = f"iteration {it}"
                t0 = time.perf_counter()
                ctx.allreduce(x, out=out)
                dt = time.perf_counter() - t0
                ok, worst = check_result(out, w, it, nvals)
                row = {"time": dt, "ok": ok, "worst": worst, **ctx.last_stats}
                report["iters"].append(row)
                print(ITER_PREFIX + json.dumps({"rank": rank, "iter": it, **row}), flush=True)
    except (hostlib.SwitchMLError, OSError) as exc:  # one line in the report, not a traceback
        report["error"] = _in_table_terms(str(exc), phase)
        report["failed_iter"] = it if it >= 0 else None
        print(RESULT_PREFIX + json.dumps(report), flush=True)
        return 2
    print(RESULT_PREFIX + json.dumps(report), flush=True)
    return 0 if all(i["ok"] for i in report["iters"]) else 1


def _in_table_terms(message: str, phase: str) -> str:
    """The library counts every allreduce call of the context ("allreduce
    #47"), the warm-up and the line-up calls included; the launcher's table
    counts iterations. Say which iteration, in the table's numbering."""
    return re.sub(r"^allreduce #\d+", phase, message)


def warm_up(dtypes: tuple[str, ...] = ("int32", "float32"), pump: bool = True) -> int:
    """Compile or load every kernel of a ``switchml run`` worker (its test data
    kernels for ``dtypes``), in this one process. Says :data:`COMPILING` as soon as Numba compiles
    anything (its ``numba:compile`` event fires only on a cache miss). ``pump``:
    the event loop's path too (a user's command may take it); the built-in
    workers (:func:`main`) only block (``hostlib.Context``), so without it."""
    t0 = time.perf_counter()
    from hostlib import fastpath
    from swemu.protocol import fastio
    from swemu.protocol.jit import watch_compiles
    from swemu.protocol.worker.protocol import warmup
    from swemu.protocol.worker.testdata import check_result, worker_input

    with watch_compiles(lambda: print(COMPILING, flush=True)):
        warmup()  # both dtypes, as each worker's context does (hostlib.client)
        if fastio.AVAILABLE:
            fastpath.warmup(pump=pump)
        for dtype in dtypes:  # the built-in workers' inputs and checks
            x = worker_input(0, 64, 0, np.dtype(dtype))
            check_result(x, 1, 0, 64)
    print(f"{WARM_PREFIX}{time.perf_counter() - t0:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--warm-up"]:
        # with a DTYPE: the built-in workers' warm-up; without: a user's command's
        dtypes = tuple(sys.argv[2:])
        sys.exit(warm_up(dtypes or ("int32", "float32"), pump=not dtypes))
    sys.exit(main())
