"""``python -m bench training``: DDP training on the emulated rack, the ``switchml``
backend against gloo's ring, same seeds and hyperparameters, interleaved.

**A start** (issue 20's rack experiment): it builds the rack of ``switchml cluster``
(network namespaces, a bridge, tbf-shaped links; needs root), runs one emulator in
the switch's namespace and, for every link rate and world size, launches W training
processes in the workers' namespaces once per backend and repetition, alternating
the backends. Each process trains a wide MLP on a synthetic task that every rank
generates from the same seed (no downloads): inputs ~ N(0, 1), labels the argmax of
a fixed random teacher network; each rank takes its own shard of every batch. It
reports the median step time, samples/s, the final training loss and held-out
accuracy, and the communication share (1 − a step's time without communication,
measured with ``no_sync()`` at the end, / the step's time).

Not yet here (see the closing report of issue 20): the PNG plot beside the
link-rate theory, time to a fixed loss, bench/TRAINING.md with a full run, and the
CPU-limit analysis of ``bench/cluster.py`` (its CPU samplers could be reused).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKENDS = ("switchml", "gloo")
MASTER_PORT = 29600


def run(
    workers: list[int],
    rates: list[float],
    *,
    steps: int = 40,
    hidden: int = 2048,
    layers: int = 3,
    batch: int = 64,
    reps: int = 1,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build the rack, run every (rate, W, backend, repetition), return the rows."""
    from .cluster import (
        SWITCH_CONTROL_PORT,
        SWITCH_UDP_PORT,
        Rack,
        Shaping,
        _start_emulator,
        signals_as_exceptions,
    )

    results: list[dict[str, Any]] = []
    launch = 0
    with (
        signals_as_exceptions(),
        tempfile.TemporaryDirectory(prefix="training-") as tmp,
        Rack(max(workers)) as rack,
    ):
        emu, _ = _start_emulator(rack, Path(tmp))
        for rate in rates:
            rack.shape(Shaping(rate))
            for w in workers:
                for rep in range(reps):
                    order = BACKENDS if rep % 2 == 0 else BACKENDS[::-1]
                    for backend in order:
                        launch += 1
                        env = {
                            "WORLD_SIZE": str(w),
                            "MASTER_ADDR": rack.worker_ip(0),
                            "MASTER_PORT": str(MASTER_PORT + launch),
                            "SWITCHML_CONTROL": f"{rack.switch_ip}:{SWITCH_CONTROL_PORT}",
                            "SWITCHML_SWITCH": f"{rack.switch_ip}:{SWITCH_UDP_PORT}",
                            "OMP_NUM_THREADS": "1",
                        }
                        args = [backend, steps, hidden, layers, batch]
                        ranks = _launch(rack, w, env, args, Path(tmp) / f"run{launch}")
                        row = _row(ranks, backend, w, rate, batch)
                        log(
                            f"{rate:g} Gbit/s W={w} {backend:8s}: "
                            f"{row['median_step_s'] * 1e3:.0f} ms/step, "
                            f"comm {row['comm_share']:.0%}, loss {row['final_loss']:.3f}, "
                            f"accuracy {row['accuracy']:.3f}"
                        )
                        results.append(row)
        emu.terminate()
    return {
        "config": {"steps": steps, "hidden": hidden, "layers": layers, "batch": batch},
        "results": results,
        "speedups": _speedups(results),
    }


def _launch(rack, w: int, env: dict[str, str], args: list[Any], out: Path) -> list[dict]:
    from swemu.launch import child_env

    out.mkdir()
    procs = []
    for r in range(w):
        e = child_env(
            **env,
            RANK=str(r),
            LOCAL_RANK="0",
            GLOO_SOCKET_IFNAME=rack.worker_if(r),
        )
        argv = [sys.executable, "-m", "bench.training", *map(str, args), str(out / f"{r}.json")]
        procs.append(rack.popen(rack.worker_ns(r), argv, stdin=subprocess.DEVNULL, env=e))
    codes = [p.wait(1800) for p in procs]
    if any(codes):
        raise RuntimeError(f"training processes exited with {codes}")
    return [json.loads((out / f"{r}.json").read_text()) for r in range(w)]


def _row(ranks: list[dict], backend: str, w: int, rate: float, batch: int) -> dict[str, Any]:
    steps = [max(v) for v in zip(*(r["step_s"] for r in ranks))]
    warm = steps[min(3, len(steps) - 1) :]  # the first steps build DDP's buckets
    med = statistics.median(warm)
    compute = max(r["compute_s"] for r in ranks)
    return {
        "backend": backend,
        "workers": w,
        "rate_gbps": rate,
        "median_step_s": med,
        "samples_per_s": batch * w / med,
        "comm_share": max(0.0, 1 - compute / med),
        "final_loss": ranks[0]["loss"][-1],
        "accuracy": ranks[0]["accuracy"],
        "params": ranks[0]["params"],
    }


def _speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["rate_gbps"], r["workers"]) for r in rows})
    for rate, w in keys:
        med = {
            b: statistics.median(
                r["median_step_s"]
                for r in rows
                if r["backend"] == b and r["rate_gbps"] == rate and r["workers"] == w
            )
            for b in BACKENDS
        }
        out.append({"rate_gbps": rate, "workers": w, "speedup": med["gloo"] / med["switchml"]})
    return out


def markdown(data: dict[str, Any]) -> str:
    c = data["config"]
    lines = [
        f"DDP training, MLP {c['layers']} x {c['hidden']}, batch {c['batch']} per rank, "
        f"{c['steps']} steps",
        "",
        "| Gbit/s | W | backend | step (ms) | samples/s | comm share | loss | accuracy |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["results"]:
        lines.append(
            f"| {r['rate_gbps']:g} | {r['workers']} | {r['backend']} | "
            f"{r['median_step_s'] * 1e3:.0f} | {r['samples_per_s']:.0f} | "
            f"{r['comm_share']:.0%} | {r['final_loss']:.3f} | {r['accuracy']:.3f} |"
        )
    lines.append("")
    for s in data["speedups"]:
        lines.append(
            f"{s['rate_gbps']:g} Gbit/s, W = {s['workers']}: switchml {s['speedup']:.2f}x gloo"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------- worker
def _data(n: int, dim: int, seed: int) -> tuple[Any, Any]:
    """``n`` samples of the synthetic task (the same on every rank for a seed)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    teacher = [torch.randn(dim, 256, generator=g) / dim**0.5, torch.randn(256, 10, generator=g)]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return x, y


def _worker(argv: list[str]) -> None:
    """One rank: ``python -m bench.training BACKEND STEPS HIDDEN LAYERS BATCH OUT``."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import hostlib.torch  # noqa: F401  (registers the backend)

    backend = argv[0]
    steps, hidden, layers, batch = (int(a) for a in argv[1:5])
    out = Path(argv[5])
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, w = dist.get_rank(), dist.get_world_size()
    dim = 256
    torch.manual_seed(0)
    mods: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(*mods))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    x, y = _data(steps * batch * w, dim, seed=1)
    step_s, losses = [], []
    for s in range(steps):
        lo = (s * w + rank) * batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[lo : lo + batch]), y[lo : lo + batch])
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
    compute = []
    for _ in range(5):  # the same step without communication
        t0 = time.perf_counter()
        with ddp.no_sync():
            nn.functional.cross_entropy(ddp(x[:batch]), y[:batch]).backward()
        opt.zero_grad()
        compute.append(time.perf_counter() - t0)
    tx, ty = _data(2000, dim, seed=2)
    with torch.no_grad():
        accuracy = float((ddp.module(tx).argmax(dim=1) == ty).float().mean())
    out.write_text(
        json.dumps(
            {
                "step_s": step_s,
                "loss": losses,
                "compute_s": statistics.median(compute),
                "accuracy": accuracy,
                "params": sum(p.numel() for p in ddp.parameters()),
                "pid": os.getpid(),
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1:])
