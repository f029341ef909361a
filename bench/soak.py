"""``python -m bench soak``: many consecutive jobs against one long-lived emulator.

A ``switchml-emu serve`` process with its default options (docs/lifetime.md)
serves ``--jobs`` jobs one after another; each job is ``--workers`` hostlib
workers (in this process, one event loop) that join with their defaults, run
one allreduce, check it and leave. The emulator's resident memory (VmRSS of its
process) is sampled before the first job and every ``--every`` jobs: with
finished jobs freed it stays flat, and the last ``GetStats`` shows no job left
and every job released by its workers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for process {pid}")


async def _one_job(switch: str, control: str, workers: int, n: int, rng_seed: int) -> int:
    """Join, allreduce ``n`` int32 values, check the exact sum, leave; return the size code."""
    from hostlib import AsyncContext, Options

    ctxs = [
        AsyncContext(Options(switch=switch, control=control, rank=r, world_size=workers))
        for r in range(workers)
    ]
    try:
        await asyncio.gather(*(c.open() for c in ctxs))
        rng = np.random.default_rng(rng_seed)
        xs = [rng.integers(-1000, 1000, n, dtype=np.int32) for _ in ctxs]
        outs = await asyncio.gather(*(c.allreduce(x) for c, x in zip(ctxs, xs)))
        want = np.sum(xs, axis=0, dtype=np.int32)
        if not all(np.array_equal(o, want) for o in outs):
            raise AssertionError(f"job {rng_seed}: a worker got a wrong sum")
        return int(ctxs[0].options.packet_size)
    finally:
        await asyncio.gather(*(c.aclose() for c in ctxs))


def run(
    jobs: int = 1000,
    workers: int = 2,
    size: int = 64 << 10,
    every: int = 100,
    shards: int = 1,
    log=print,
) -> dict[str, Any]:
    """Serve ``jobs`` consecutive jobs; return RSS samples, timings and the final stats."""
    from swemu.launch import EmulatorProcess
    from swemu.observe.stats import fetch_stats

    n = size // 4
    samples: list[dict[str, Any]] = []
    with EmulatorProcess(shards=shards, startup_timeout=180.0) as emu:
        pid = emu.proc.pid

        def sample(done: int, t0: float) -> None:
            rss = rss_bytes(pid)
            samples.append({"jobs": done, "rss": rss, "seconds": time.monotonic() - t0})
            secs = samples[-1]["seconds"]
            log(f"{done:6d} jobs  emulator RSS {rss / 2**20:7.1f} MiB  {secs:.1f} s")

        async def soak() -> list[float]:
            t0 = time.monotonic()
            sample(0, t0)
            times = []
            code = None
            for j in range(1, jobs + 1):
                t = time.monotonic()
                code = await _one_job(emu.switch, emu.control, workers, n, j)
                times.append(time.monotonic() - t)
                if j % every == 0 or j == jobs:
                    sample(j, t0)
            log(f"size code {code} (the emulator's default for workers that leave it open)")
            return times

        times = asyncio.run(soak())
        snap = fetch_stats(emu.control)
    return {
        "jobs": jobs,
        "workers": workers,
        "size": size,
        "shards": shards,
        "rss": samples,
        "job_seconds": {  # the first job also compiles the workers' kernels: apart
            "first": float(times[0]),
            "median": float(np.median(times[1:] or times)),
            "p99": float(np.percentile(times[1:] or times, 99)),
            "total": float(np.sum(times)),
        },
        "live_jobs_at_end": len(snap["jobs"]),
        "released": snap["released"],
        "limits": snap.get("limits"),
    }


def markdown(data: dict[str, Any]) -> str:
    """The RSS samples as a table, then the totals."""
    lines = [
        f"soak: {data['jobs']} consecutive jobs of {data['workers']} workers, "
        f"{data['size'] >> 10} KiB int32 each, one emulator (default options"
        + (f", {data['shards']} shards" if data["shards"] > 1 else "")
        + ")",
        "",
        "| jobs | emulator RSS (MiB) | elapsed (s) |",
        "|---:|---:|---:|",
    ]
    for s in data["rss"]:
        lines.append(f"| {s['jobs']} | {s['rss'] / 2**20:.1f} | {s['seconds']:.1f} |")
    js = data["job_seconds"]
    lines += [
        "",
        f"per job after the first ({js['first']:.1f} s, compiling the workers' kernels): "
        f"median {js['median'] * 1e3:.1f} ms, p99 {js['p99'] * 1e3:.1f} ms; "
        f"live jobs at the end: {data['live_jobs_at_end']}; freed: "
        + ", ".join(f"{k} {v}" for k, v in sorted(data["released"].items())),
    ]
    return "\n".join(lines)
