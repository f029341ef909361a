"""The worker program of ``switchml run`` without a command: allreduce
deterministic inputs, check every result, report timings as one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

RESULT_PREFIX = "SWITCHML_RESULT "


def main() -> int:
    import hostlib
    from hostlib.testdata import check_result, worker_input
    from swemu import wire

    dtype = np.dtype(os.environ.get("SWITCHML_RUN_DTYPE", "float32"))
    nbytes = int(os.environ.get("SWITCHML_RUN_SIZE", str(16 << 20)))
    iters = int(os.environ.get("SWITCHML_RUN_ITERS", "5"))
    n = nbytes // dtype.itemsize
    ctx = hostlib.from_env()
    rank, w = ctx.rank, ctx.world_size
    report = {"rank": rank, "iters": []}
    try:
        with ctx:
            nvals = wire.values_per_packet(ctx.options.packet_size)  # known once joined
            tick = np.zeros(1, np.int32)
            ctx.allreduce(worker_input(rank, 4096, 0, dtype))  # warm up kernels and the path
            out = np.empty(n, dtype)
            for it in range(iters):
                x = worker_input(rank, n, it, dtype)
                ctx.allreduce(tick, out=tick)  # line the workers up through the switch
                t0 = time.perf_counter()
                ctx.allreduce(x, out=out)
                dt = time.perf_counter() - t0
                ok, worst = check_result(out, w, it, nvals)
                report["iters"].append({"time": dt, "ok": ok, "worst": worst, **ctx.last_stats})
    except hostlib.SwitchMLError as exc:
        report["error"] = str(exc)
        print(RESULT_PREFIX + json.dumps(report), flush=True)
        return 2
    print(RESULT_PREFIX + json.dumps(report), flush=True)
    return 0 if all(i["ok"] for i in report["iters"]) else 1


if __name__ == "__main__":
    sys.exit(main())
