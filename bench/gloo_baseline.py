"""Why was ``bench allreduce``'s gloo slower than a plain gloo loop? gloo alone, under
every condition the old harness imposed and with each one removed, in one run.

The old harness (before the split into per-method worker groups, see
:mod:`bench.allreduce`) timed gloo in the same worker processes that held open
SwitchML jobs, with the emulator running, on one tensor that gloo's in-place sum
grew W-fold per call, on :mod:`swemu.protocol.worker.testdata` inputs. A plain script times
gloo in processes of its own on a fresh random-normal input each call. This
diagnostic starts both kinds of worker groups side by side (W processes each,
one emulator) and times gloo's ring ``all_reduce`` of the same size under each
variant below, the variants taking turns within every round (the order rotates
from round to round) and SwitchML's call of the old harness among them, so the
interleaving is the same as there:

=========================  ==========  ===========  =========
variant                    processes   input        emulator
=========================  ==========  ===========  =========
``old``                    SwitchML's  in place     running
``old+fresh``              SwitchML's  fresh copy   running
``old+randn``              SwitchML's  random copy  running
``old+stopped``            SwitchML's  in place     stopped
``old+fresh+stopped``      SwitchML's  fresh copy   stopped
``own+fresh``              gloo's own  fresh copy   running
``own+fresh+stopped``      gloo's own  fresh copy   stopped (the benchmark now)
``own+randn+stopped``      gloo's own  random copy  stopped (a plain script)
=========================  ==========  ===========  =========

"SwitchML's" processes have joined a SwitchML job (their sockets open) and run
SwitchML's calls between gloo's; "gloo's own" never joined one. "Stopped" is
``SIGSTOP`` on the emulator and its shards for the call. Each call is preceded
by gloo's barrier; the time is the slowest worker's; the report is the median
per variant, its CPU per call, and its ratio to ``old``.

Run: ``python -m bench gloo-baseline [--workers 4] [--size 64Mi] [--code 6]
[--rounds 9] [--out DIR]``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any

from .allreduce import (
    FRESH,
    GLOO,
    INPLACE,
    PS,
    RANDN,
    _descendants,
    _loadavg,
    run_once,
    start_group,
    stop_group_info,
    stopped,
)


def _old_worker(
    rank: int,
    w: int,
    targets: list[tuple[str, str, str, int]],
    master: int | None,
    conn: Any,
    dtype: str = "float32",
) -> None:
    """The old harness's worker loop, as it was (minus the result checks, which
    were never timed): SwitchML jobs and gloo in one process, gloo's barrier
    before every call, the arrays of a size made again whenever the size changes
    (SwitchML's output left untouched until its call), and one tensor shared by
    gloo and the parameter server that their in-place sums grow."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np
    import torch
    import torch.distributed as dist

    import hostlib
    from swemu.protocol.worker import testdata

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{master}", rank=rank, world_size=w
    )
    ctxs = {}
    for name, switch, control, code in targets:
        ctxs[name] = hostlib.connect(
            switch, control, rank=rank, world_size=w, packet_size=code, no_progress=60.0
        ).open()
        ctxs[name].allreduce(np.ones(4096, dtype))
    conn.send("ready")
    arrays: dict[int, tuple] = {}
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        method, nbytes = cmd[:2]
        if nbytes not in arrays:
            arrays.clear()
            x = testdata.worker_input(rank, nbytes // 4, 0, dtype)
            arrays[nbytes] = (x, np.empty_like(x), torch.from_numpy(x.copy()))
        x, out, t = arrays[nbytes]
        dist.barrier()
        c0, t0 = time.process_time(), time.perf_counter()
        if method == GLOO:
            dist.all_reduce(t)
        elif method == PS:
            dist.reduce(t, dst=0)
            dist.broadcast(t, src=0)
        else:
            ctxs[method].allreduce(x, out=out)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        conn.send((dt, 0, cpu, None))
    conn.send({"peak_rss": 0, "inplace_max_abs": None})
    for c in ctxs.values():
        c.close()
    dist.destroy_process_group()


#: the size codes of the old harness's default matrix
OLD_CODES = (1, 3, 6, 7)
OLD_MATRIX, OLD_MATRIX_SW = "old-matrix", "old-matrix switchml"

#: name -> (worker group, input mode, emulator stopped?)
VARIANTS: dict[str, tuple[str, str, bool]] = {
    "old": ("switchml", INPLACE, False),
    "old+fresh": ("switchml", FRESH, False),
    "old+randn": ("switchml", RANDN, False),
    "old+stopped": ("switchml", INPLACE, True),
    "old+fresh+stopped": ("switchml", FRESH, True),
    "own+fresh": ("own", FRESH, False),
    "own+fresh+stopped": ("own", FRESH, True),
    "own+randn+stopped": ("own", RANDN, True),
}


def run(
    workers: int = 4,
    nbytes: int = 64 << 20,
    code: int = 6,
    rounds: int = 9,
    log=print,
    matrix: bool = True,
) -> dict[str, Any]:
    """Time gloo under every variant of :data:`VARIANTS` (and SwitchML's call
    of the old harness) ``rounds`` times, interleaved; return plain data."""
    from swemu.launch import EmulatorProcess

    sw = f"switchml-{code}"
    items = [*VARIANTS, sw]
    # the old harness's default matrix, in its order, in a group of its own
    matrix_sizes = sorted({1 << 20, 16 << 20, nbytes})
    matrix_methods = [f"switchml-{c}" for c in OLD_CODES] + [GLOO, PS]
    calls: dict[str, list[dict]] = {k: [] for k in [OLD_MATRIX, *items, OLD_MATRIX_SW]}
    loadavg_start = _loadavg()
    with EmulatorProcess("--max-pool-memory", "4GiB") as emu:
        switch_pids = _descendants(emu.proc.pid)
        target = [(sw, emu.switch, emu.control, code)]
        groups = {
            "switchml": start_group(workers, target, gloo=True),
            "own": start_group(workers, [], gloo=True),
        }
        if matrix:
            old_targets = [(f"switchml-{c}", emu.switch, emu.control, c) for c in OLD_CODES]
            groups["matrix"] = start_group(workers, old_targets, gloo=True, target=_old_worker)
        for rnd in range(rounds):
            for size in matrix_sizes if matrix else ():
                for m in matrix_methods:
                    call = run_once(groups["matrix"][0], m, size, switch_pids)
                    if size == nbytes and m == GLOO:
                        calls[OLD_MATRIX].append(call)
                    elif size == nbytes and m == sw:
                        calls[OLD_MATRIX_SW].append(call)
            shift = rnd % len(items)
            for name in items[shift:] + items[:shift]:
                if name == sw:
                    calls[name].append(run_once(groups["switchml"][0], sw, nbytes, switch_pids))
                    continue
                group, mode, stop = VARIANTS[name]
                with stopped(switch_pids) if stop else contextlib.nullcontext():
                    calls[name].append(
                        run_once(groups[group][0], GLOO, nbytes, switch_pids, mode=mode)
                    )
            log(f"round {rnd + 1}/{rounds} done")
        info = {g: stop_group_info(*p) for g, p in groups.items()}
    grown = [i["inplace_max_abs"] for i in info["switchml"] if i["inplace_max_abs"] is not None]
    base = statistics.median(c["time"] for c in calls["old"])
    rows = []
    for name in [OLD_MATRIX, *items, OLD_MATRIX_SW]:
        if not calls[name]:
            continue
        times = [c["time"] for c in calls[name]]
        med = statistics.median(times)
        group, mode, stop = VARIANTS.get(name, ("switchml", "-", False))
        if name in (OLD_MATRIX, OLD_MATRIX_SW):
            group, mode = "old harness's", INPLACE if name == OLD_MATRIX else "-"
        rows.append(
            {
                "variant": name,
                "processes": group,
                "input": mode,
                "emulator": "stopped" if stop else "running",
                "median_s": med,
                "min_s": min(times),
                "max_s": max(times),
                "all_s": times,
                "ratio_to_old": med / base,
                "cpu_workers_s": statistics.median(c["cpu_workers"] for c in calls[name]),
                "cpu_switch_s": statistics.median(c["cpu_switch"] or 0.0 for c in calls[name]),
                "verified": next(
                    (c["verified"] for c in calls[name] if c["verified"] is not None), None
                ),
            }
        )
    return {
        "workers": workers,
        "bytes": nbytes,
        "code": code,
        "rounds": rounds,
        "rows": rows,
        "inplace_max_abs": max(grown, default=None),
        "loadavg_start": loadavg_start,
        "loadavg_end": _loadavg(),
    }


def markdown(data: dict[str, Any]) -> str:
    """One row per variant: median, range, CPU per call and ratio to ``old``."""
    la0, la1 = data["loadavg_start"], data["loadavg_end"]
    lines = [
        f"gloo ring all_reduce, W={data['workers']}, {data['bytes'] / 2**20:g} MiB float32, "
        f"medians of {data['rounds']} interleaved rounds"
        + (f"; load average {la0[0]:.2f} at start, {la1[0]:.2f} at the end" if la0 and la1 else ""),
        "",
        "| variant | processes | input | emulator | median (ms) | min–max (ms) "
        "| time / old | CPU / call: workers (ms) | emulator (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['variant']} | {r['processes']} | {r['input']} | {r['emulator']} | "
            f"{r['median_s'] * 1e3:.1f} | {r['min_s'] * 1e3:.0f}–{r['max_s'] * 1e3:.0f} | "
            f"{r['ratio_to_old']:.2f} | {r['cpu_workers_s'] * 1e3:.0f} | "
            f"{r['cpu_switch_s'] * 1e3:.1f} |"
        )
    if data["inplace_max_abs"] is not None:
        lines += [
            "",
            f"Largest |value| of the in-place tensor at the end: {data['inplace_max_abs']:.3g}",
        ]
    return "\n".join(lines) + "\n"
