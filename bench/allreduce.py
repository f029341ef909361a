"""Allreduce benchmark: SwitchML through the emulator vs gloo ring vs a parameter server.

For each world size W one group of W worker processes is started. Every worker
joins one SwitchML job per packet size code (through one emulator process) and
one torch.distributed gloo group, then executes the driver's commands: the
methods run interleaved in the same invocation (for each repetition, for each
size, every method once), each timed call preceded by a barrier so that the
workers start together. A call's time is the slowest worker's; the report is
the median over repetitions, and every method's ratio to gloo's ring
``all_reduce`` of the same size in the same run.

* ``switchml-<code>``: ``hostlib`` allreduce through the emulator (float32 by
  default; ``--dtype int32`` sends exact integers, no quantization: the
  transport's own cost);
* ``gloo``: ``torch.distributed.all_reduce`` (gloo, ring);
* ``ps``: the parameter-server pattern, gloo ``reduce`` to rank 0 + ``broadcast``.

``--shards S`` starts the emulator with ``serve --shards S`` (S data-plane
processes; the workers spread their slots over the S ports), to compare 1 vs 2.

CPU is reported next to time: per call, the CPU time of all W workers (their
processes, every thread) plus the emulator's (all its threads and shard
processes, from ``/proc``; Linux only), as a median over repetitions and as a
ratio to gloo's. On a machine with fewer cores than processes every method is
CPU-bound, and the time ratio follows the CPU ratio; where it does not, the
difference is waiting (scheduling, timeouts).

Memory is reported too: the emulator's RSS before and after the run (it must not
grow with tensor size or traffic) and each worker's peak RSS next to its
tensors' size.

Run: ``python -m bench allreduce [--workers 2,4,8] [--sizes 1Mi,16Mi,64Mi]
[--codes 1,3,6,7] [--reps 5] [--shards 1] [--dtype float32] [--out DIR]``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

GLOO = "gloo"
PS = "ps"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _cpu_seconds(pids: list[int]) -> float | None:
    """CPU time used so far by these processes, all threads (``/proc``, ns
    resolution); None where ``/proc`` has no schedstat or a process is gone."""
    total = 0
    try:
        for pid in pids:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the emulator and its shards)."""
    children: dict[int, list[int]] = {}
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(name))
    except OSError:
        return [pid]
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _worker(
    rank: int,
    w: int,
    targets: list[tuple[str, str, str, int]],
    master: int | None,
    conn: Any,
    dtype: str = "float32",
) -> None:
    """A benchmark worker: joins every SwitchML target ``(name, switch, control,
    size code)`` and, with ``master``, a gloo group; then runs the driver's
    commands ``(method, bytes)`` and answers each with (time, retransmissions,
    CPU time of this process, verdict).

    The inputs are :mod:`hostlib.testdata`'s (rank r sends ``(r + 1) * base``),
    so each worker checks its result on its own: the first call of every
    (method, size) is checked after it is timed (exact for int32 and for gloo,
    whose float32 sums of these inputs are exact too; within PROTOCOL.md §4's
    bound for SwitchML's float32). The verdict is True or False then, and None
    for later calls (gloo sums in place, so its tensor keeps growing)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import hostlib
    from hostlib import testdata

    dist = torch = None
    if master is not None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{master}", rank=rank, world_size=w
        )
    ctxs = {}
    nvals = {name: 32 << code for name, _, _, code in targets}
    checked: set[tuple[str, int]] = set()
    for name, switch, control, code in targets:
        ctxs[name] = hostlib.connect(
            switch, control, rank=rank, world_size=w, packet_size=code, no_progress=60.0
        ).open()
        ctxs[name].allreduce(np.ones(4096, dtype))  # warm up kernels and the path
    conn.send("ready")
    arrays: dict[int, tuple] = {}
    tick = np.zeros(1, np.int32)
    first = next(iter(ctxs.values()), None)
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        method, nbytes = cmd
        if nbytes not in arrays:
            arrays.clear()
            x = testdata.worker_input(rank, nbytes // 4, 0, dtype)
            t = torch.from_numpy(x.copy()) if torch is not None else None
            arrays[nbytes] = (x, np.empty_like(x), t)
        x, out, t = arrays[nbytes]
        if t is not None and (method, nbytes) not in checked:
            t.copy_(torch.from_numpy(x))  # gloo and ps share it: a fresh input to check
        if dist is not None:
            dist.barrier()
        else:
            first.allreduce(tick, out=tick)  # line the workers up through the switch
        c0 = time.process_time()
        t0 = time.perf_counter()
        if method == GLOO:
            dist.all_reduce(t)
        elif method == PS:
            dist.reduce(t, dst=0)
            dist.broadcast(t, src=0)
        else:
            ctxs[method].allreduce(x, out=out)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        stats = ctxs[method].last_stats if method in ctxs else {}
        verdict = None
        if (method, nbytes) not in checked:
            checked.add((method, nbytes))
            y = out if method in ctxs else t.numpy()
            verdict = testdata.check_result(y, w, 0, nvals.get(method, 256))[0]
        conn.send((dt, stats.get("retransmissions", 0), cpu, verdict))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    conn.send({"peak_rss": peak})
    for c in ctxs.values():
        c.close()
    if dist is not None:
        dist.destroy_process_group()


def start_group(
    w: int, targets: list[tuple[str, str, str, int]], gloo: bool, dtype: str = "float32"
) -> tuple:
    """Start W benchmark workers; return (pipes, processes) once all are ready."""
    ctx = mp.get_context("spawn")
    master = _free_port() if gloo else None
    pipes, procs = [], []
    for r in range(w):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(r, w, targets, master, b, dtype), daemon=True)
        p.start()
        pipes.append(a)
        procs.append(p)
    for a in pipes:
        if not a.poll(300):
            raise RuntimeError(f"W={w}: a worker did not start")
        a.recv()
    return pipes, procs


def run_once(pipes: list, method: str, nbytes: int, switch_pids: list[int] = ()) -> dict:
    """One collective call: the slowest worker's time, the retransmissions and
    CPU seconds of all workers, the CPU seconds the switch used meanwhile
    (None without ``/proc``), and whether every worker's result was right
    (None if the workers did not check this call)."""
    s0 = _cpu_seconds(list(switch_pids))
    for a in pipes:
        a.send((method, nbytes))
    got = [a.recv() for a in pipes]
    s1 = _cpu_seconds(list(switch_pids))
    return {
        "time": max(g[0] for g in got),
        "retransmissions": sum(g[1] for g in got),
        "cpu_workers": sum(g[2] for g in got),
        "cpu_switch": s1 - s0 if s0 is not None and s1 is not None else None,
        "verified": None if any(g[3] is None for g in got) else all(g[3] for g in got),
    }


def stop_group(pipes: list, procs: list) -> int:
    """Stop the workers; return their largest peak RSS."""
    for a in pipes:
        a.send(None)
    peaks = [a.recv()["peak_rss"] for a in pipes]
    for p in procs:
        p.join(30)
    return max(peaks)


def _rss(pid: int) -> int:
    """Resident memory of a process and its children (the data-plane shards)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(_rss(int(c)) for c in children)


def run(
    workers: list[int],
    sizes: list[int],
    codes: list[int],
    reps: int,
    log=print,
    shards: int = 1,
    dtype: str = "float32",
) -> dict:
    """Run the whole matrix against an emulator with ``shards`` data-plane
    processes; return the results as plain data."""
    from swemu.launch import EmulatorProcess

    if dtype not in ("float32", "int32"):
        raise ValueError(f"dtype must be float32 or int32, not {dtype!r}")
    methods = [f"switchml-{c}" for c in codes] + [GLOO, PS]
    results: list[dict] = []
    memory: dict[str, Any] = {}
    with EmulatorProcess("--max-pool-memory", "4GiB", shards=shards) as emu:
        memory["emulator_rss_start"] = _rss(emu.proc.pid)
        switch_pids = _descendants(emu.proc.pid)
        targets = [(f"switchml-{c}", emu.switch, emu.control, c) for c in codes]
        for w in workers:
            pipes, procs = start_group(w, targets, gloo=True, dtype=dtype)
            calls: dict[tuple[str, int], list[dict]] = {}
            for rep in range(reps):
                for size in sizes:
                    for m in methods:
                        calls.setdefault((m, size), []).append(
                            run_once(pipes, m, size, switch_pids)
                        )
                log(f"W={w}: repetition {rep + 1}/{reps} done")
            memory[f"worker_peak_rss_W{w}"] = stop_group(pipes, procs)
            for size in sizes:
                gloo = _summary(calls[(GLOO, size)])
                for m in methods:
                    row = _summary(calls[(m, size)])
                    row.update(
                        workers=w,
                        bytes=size,
                        method=m,
                        goodput_gbps=size * 8 / row["median_s"] / 1e9,
                        ratio_to_gloo=row["median_s"] / gloo["median_s"],
                        cpu_ratio_to_gloo=(
                            row["cpu_s"] / gloo["cpu_s"]
                            if row["cpu_s"] is not None and gloo["cpu_s"]
                            else None
                        ),
                    )
                    if row["verified"] is False:
                        log(f"W={w} {size} B {m}: WRONG RESULT")
                    results.append(row)
        memory["emulator_rss_end"] = _rss(emu.proc.pid)
    memory["largest_tensor_bytes"] = max(sizes)
    return {
        "results": results,
        "memory": memory,
        "reps": reps,
        "codes": codes,
        "shards": shards,
        "dtype": dtype,
        "cpus": os.cpu_count(),
    }


def _summary(calls: list[dict]) -> dict:
    """Medians over one method's repetitions: time, and CPU per call (workers,
    switch, both; during gloo's calls the switch idles, and what it uses is
    counted all the same)."""
    times = [c["time"] for c in calls]
    workers = statistics.median(c["cpu_workers"] for c in calls)
    switch = [c["cpu_switch"] for c in calls]
    sw = statistics.median(switch) if None not in switch else None
    return {
        "median_s": statistics.median(times),
        "all_s": times,
        "cpu_workers_s": workers,
        "cpu_switch_s": sw,
        "cpu_s": statistics.median(c["cpu_workers"] + (c["cpu_switch"] or 0.0) for c in calls)
        if sw is not None
        else None,
        "retransmissions": sum(c["retransmissions"] for c in calls),
        # False if a checked call was wrong; None if none was checked
        "verified": None
        if all(c["verified"] is None for c in calls)
        else all(c["verified"] is not False for c in calls),
    }


def markdown(data: dict) -> str:
    """The results as a markdown table: time in ms, ratio to gloo, and CPU per
    call (all workers + the switch) with its ratio to gloo's."""
    lines = [
        f"dtype {data.get('dtype', 'float32')}, {data.get('cpus', '?')} CPUs, "
        f"median of {data['reps']} repetitions",
        "",
        "| W | size | method | median (ms) | goodput (Gbit/s) | time / gloo "
        "| CPU / call (ms) | CPU / gloo's | result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        cpu = r.get("cpu_s")
        cpu_ratio = r.get("cpu_ratio_to_gloo")
        lines.append(
            f"| {r['workers']} | {r['bytes'] / 2**20:g} MiB | {r['method']} | "
            f"{r['median_s'] * 1e3:.1f} | {r['goodput_gbps']:.2f} | "
            f"{r['ratio_to_gloo']:.2f} | "
            + (f"{cpu * 1e3:.0f}" if cpu is not None else "n/a")
            + " | "
            + (f"{cpu_ratio:.2f}" if cpu_ratio is not None else "n/a")
            + " | "
            + {True: "ok", False: "WRONG", None: "unchecked"}[r.get("verified")]
            + " |"
        )
    m = data["memory"]
    lines += [
        "",
        f"Emulator RSS: {m['emulator_rss_start'] / 2**20:.0f} MiB at start, "
        f"{m['emulator_rss_end'] / 2**20:.0f} MiB at the end.",
        "Worker peak RSS (largest tensor "
        f"{m['largest_tensor_bytes'] / 2**20:g} MiB): "
        + ", ".join(
            f"{k.split('_')[-1]}: {v / 2**20:.0f} MiB"
            for k, v in m.items()
            if k.startswith("worker_peak")
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """Time relative to gloo per method and size, one panel per W (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = sorted({r["workers"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 4), squeeze=False)
    for ax, w in zip(axes[0], ws):
        rows = [r for r in data["results"] if r["workers"] == w]
        methods = sorted({r["method"] for r in rows})
        sizes = sorted({r["bytes"] for r in rows})
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [
                next(r["ratio_to_gloo"] for r in rows if r["method"] == m and r["bytes"] == s)
                for s in sizes
            ]
            ax.bar(np.arange(len(sizes)) + i * width, ys, width, label=m)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{s / 2**20:g} MiB" for s in sizes])
        ax.set_title(f"W = {w}")
        ax.set_ylabel("time / gloo ring (lower is better)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(data: dict, out: Path, name: str = "allreduce") -> list[Path]:
    """Write the results as JSON and markdown, then the plot; return the paths
    written. Without matplotlib (the ``bench`` extra) the plot is skipped with a
    warning on stderr: the results are never lost to it."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(markdown(data))
    try:
        plot(data, paths[2])
    except ImportError as exc:
        from cli.extras import explain

        print(f"warning: no plot: {explain(exc, 'plotting')}", file=sys.stderr)
        return paths[:2]
    return paths
