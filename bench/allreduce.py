"""Allreduce benchmark: SwitchML through the emulator vs gloo ring vs a parameter server.

For each world size W one group of W worker processes is started. Every worker
joins one SwitchML job per packet size code (through one emulator process) and
one torch.distributed gloo group, then executes the driver's commands: the
methods run interleaved in the same invocation (for each repetition, for each
size, every method once), each timed call preceded by a barrier so that the
workers start together. A call's time is the slowest worker's; the report is
the median over repetitions, and every method's ratio to gloo's ring
``all_reduce`` of the same size in the same run.

* ``switchml-<code>``: ``hostlib`` allreduce of float32 through the emulator;
* ``gloo``: ``torch.distributed.all_reduce`` (gloo, ring);
* ``ps``: the parameter-server pattern, gloo ``reduce`` to rank 0 + ``broadcast``.

``--shards S`` starts the emulator with ``serve --shards S`` (S data-plane
processes; the workers spread their slots over the S ports), to compare 1 vs 2.

Memory is reported too: the emulator's RSS before and after the run (it must not
grow with tensor size or traffic) and each worker's peak RSS next to its
tensors' size.

Run: ``python -m bench allreduce [--workers 2,4,8] [--sizes 1Mi,16Mi,64Mi]
[--codes 1,3,6,7] [--reps 5] [--shards 1] [--out DIR]``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
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


def _worker(
    rank: int, w: int, targets: list[tuple[str, str, str, int]], master: int | None, conn: Any
) -> None:
    """A benchmark worker: joins every SwitchML target ``(name, switch, control,
    size code)`` and, with ``master``, a gloo group; then runs the driver's
    commands ``(method, bytes)`` and answers each with its time."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import hostlib

    dist = torch = None
    if master is not None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{master}", rank=rank, world_size=w
        )
    ctxs = {}
    for name, switch, control, code in targets:
        ctxs[name] = hostlib.connect(
            switch, control, rank=rank, world_size=w, packet_size=code, no_progress=60.0
        ).open()
        ctxs[name].allreduce(np.ones(4096, np.float32))  # warm up kernels and the path
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
            x = np.random.default_rng(rank).standard_normal(nbytes // 4).astype(np.float32)
            t = torch.from_numpy(x.copy()) if torch is not None else None
            arrays[nbytes] = (x, np.empty_like(x), t)
        x, out, t = arrays[nbytes]
        if dist is not None:
            dist.barrier()
        else:
            first.allreduce(tick, out=tick)  # line the workers up through the switch
        t0 = time.perf_counter()
        if method == GLOO:
            dist.all_reduce(t)
        elif method == PS:
            dist.reduce(t, dst=0)
            dist.broadcast(t, src=0)
        else:
            ctxs[method].allreduce(x, out=out)
        dt = time.perf_counter() - t0
        stats = ctxs[method].last_stats if method in ctxs else {}
        conn.send((dt, stats.get("retransmissions", 0)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    conn.send({"peak_rss": peak})
    for c in ctxs.values():
        c.close()
    if dist is not None:
        dist.destroy_process_group()


def start_group(w: int, targets: list[tuple[str, str, str, int]], gloo: bool) -> tuple:
    """Start W benchmark workers; return (pipes, processes) once all are ready."""
    ctx = mp.get_context("spawn")
    master = _free_port() if gloo else None
    pipes, procs = [], []
    for r in range(w):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(r, w, targets, master, b), daemon=True)
        p.start()
        pipes.append(a)
        procs.append(p)
    for a in pipes:
        if not a.poll(300):
            raise RuntimeError(f"W={w}: a worker did not start")
        a.recv()
    return pipes, procs


def run_once(pipes: list, method: str, nbytes: int) -> tuple[float, int]:
    """One collective call: (the slowest worker's time, retransmissions of all)."""
    for a in pipes:
        a.send((method, nbytes))
    got = [a.recv() for a in pipes]
    return max(t for t, _ in got), sum(r for _, r in got)


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
) -> dict:
    """Run the whole matrix against an emulator with ``shards`` data-plane
    processes; return the results as plain data."""
    from swemu.launch import EmulatorProcess

    methods = [f"switchml-{c}" for c in codes] + [GLOO, PS]
    results: list[dict] = []
    memory: dict[str, Any] = {}
    with EmulatorProcess("--max-pool-memory", "4GiB", shards=shards) as emu:
        memory["emulator_rss_start"] = _rss(emu.proc.pid)
        targets = [(f"switchml-{c}", emu.switch, emu.control, c) for c in codes]
        for w in workers:
            pipes, procs = start_group(w, targets, gloo=True)
            times: dict[tuple[str, int], list[float]] = {}
            for rep in range(reps):
                for size in sizes:
                    for m in methods:
                        times.setdefault((m, size), []).append(run_once(pipes, m, size)[0])
                log(f"W={w}: repetition {rep + 1}/{reps} done")
            memory[f"worker_peak_rss_W{w}"] = stop_group(pipes, procs)
            for size in sizes:
                gloo = statistics.median(times[(GLOO, size)])
                for m in methods:
                    med = statistics.median(times[(m, size)])
                    results.append(
                        {
                            "workers": w,
                            "bytes": size,
                            "method": m,
                            "median_s": med,
                            "all_s": times[(m, size)],
                            "goodput_gbps": size * 8 / med / 1e9,
                            "ratio_to_gloo": med / gloo,
                        }
                    )
        memory["emulator_rss_end"] = _rss(emu.proc.pid)
    memory["largest_tensor_bytes"] = max(sizes)
    return {"results": results, "memory": memory, "reps": reps, "codes": codes, "shards": shards}


def markdown(data: dict) -> str:
    """The results as a markdown table (time in ms, ratio to gloo)."""
    lines = [
        "| W | size | method | median (ms) | goodput (Gbit/s) | time / gloo |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        lines.append(
            f"| {r['workers']} | {r['bytes'] / 2**20:g} MiB | {r['method']} | "
            f"{r['median_s'] * 1e3:.1f} | {r['goodput_gbps']:.2f} | "
            f"{r['ratio_to_gloo']:.2f} |"
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
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(markdown(data))
    plot(data, paths[2])
    return paths
