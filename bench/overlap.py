"""``python -m bench overlap``: DDP step time with the switchml backend, communication
overlapping backward vs waiting for each bucket, side by side in one run.

A local emulator (each switch-to-worker link shaped to ``--link-gbps``, 1 by
default, so that communication waits on the link as on a network rather than on
the CPU) and W worker processes (started as ``switchml run`` starts them:
RANK, WORLD_SIZE, MASTER_ADDR/PORT, SWITCHML_CONTROL/SWITCH) train an MLP of
``layers`` square layers with DDP over ``dist.init_process_group("switchml")``,
no hook. Every rank runs the same schedule of rounds, interleaved so that load
drifts hit every mode alike:

- ``compute``: forward and backward under ``ddp.no_sync()`` (no communication;
  the forward pass alone is the ``forward`` row);
- ``allreduce``: one ``dist.all_reduce`` of all the gradients (communication only);
- ``overlap off``: a DDP step, each bucket's allreduce waited for when it is
  launched (``SwitchMLProcessGroup.overlap = False``, i.e. ``SWITCHML_OVERLAP=0``);
- ``overlap on``: a DDP step, buckets reduced by the group's background thread
  while backward continues (the default).

A step's time is the slowest rank's; the table gives medians and the ratio
off/on (> 1: overlap helps). With communication C and compute B of similar size,
perfect overlap approaches max(B, C) instead of B + C; on a machine whose cores
the emulator and the workers share, the CPU they compete for caps the gain.
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

MODES = ("compute", "allreduce", "overlap off", "overlap on")
#: of the compute mode's steps: the forward pass alone (which nothing can overlap)
FORWARD = "forward"


def run(
    workers: int = 2,
    hidden: int = 768,
    layers: int = 8,
    batch: int = 384,
    steps: int = 4,
    rounds: int = 6,
    bucket_mb: float = 2.0,
    link_gbps: float = 1.0,
    log: Callable[[str], None] = print,
) -> dict:
    """Start an emulator (``--link-gbps``: each switch-to-worker link's rate, 0 =
    loopback speed) and the workers, wait for them, and return the medians."""
    from swemu.launch import CHILD_CWD, EmulatorProcess, child_env, spawn, torchrun_envs, wait_all

    emu_args = ["--link-gbps", str(link_gbps)] if link_gbps else []
    with tempfile.TemporaryDirectory(prefix="overlap-") as tmp, EmulatorProcess(*emu_args) as emu:
        log(f"emulator: data {emu.switch}, control {emu.control}; {workers} workers")
        launcher = torchrun_envs(workers)
        procs = []
        for rank in range(workers):
            env = child_env(
                **launcher[rank],
                SWITCHML_CONTROL=emu.control,
                SWITCHML_SWITCH=emu.switch,
                SWITCHML_BUFFER_WARNING="0",
            )
            args = [hidden, layers, batch, steps, rounds, bucket_mb, f"{tmp}/rank{rank}.json"]
            procs.append(
                spawn(
                    [sys.executable, "-m", "bench.overlap", *map(str, args)],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    cwd=CHILD_CWD,
                )
            )
        codes = wait_all(procs, 1800)
        if any(codes):
            raise RuntimeError(f"overlap workers exited with {codes}")
        ranks = [json.loads(Path(f"{tmp}/rank{r}.json").read_text()) for r in range(workers)]
    data = summarize(ranks, workers, hidden, layers, batch, steps, rounds, bucket_mb)
    data["link_gbps"] = link_gbps
    return data


def summarize(ranks: list[dict], workers: int, *config: float) -> dict:
    """Per mode: the slowest rank's time of each step, its median and quartiles."""
    hidden, layers, batch, steps, rounds, bucket_mb = config
    r0 = ranks[0]
    rows = []
    for mode in (FORWARD, *MODES):
        per_step = [max(vals) for vals in zip(*(r["times"][mode] for r in ranks))]
        q = statistics.quantiles(per_step, n=4) if len(per_step) > 1 else per_step * 3
        rows.append(
            {
                "mode": mode,
                "median_s": statistics.median(per_step),
                "p25_s": q[0],
                "p75_s": q[2],
                "steps": len(per_step),
            }
        )
    med = {r["mode"]: r["median_s"] for r in rows}
    return {
        "workers": workers,
        "hidden": hidden,
        "layers": layers,
        "batch": batch,
        "params": r0["params"],
        "buckets": r0["buckets"],
        "steps_per_round": steps,
        "rounds": rounds,
        "bucket_mb": bucket_mb,
        "packet_size": r0["packet_size"],
        "rows": rows,
        "ratio_off_on": med["overlap off"] / med["overlap on"],
        "comm_over_compute": med["allreduce"] / med["compute"],
        "ideal_ratio": (med["compute"] + med["allreduce"]) / max(med["compute"], med["allreduce"]),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
    }


def markdown(data: dict) -> str:
    """The table, and what the ratio means."""
    lines = [
        f"DDP step time, switchml backend: W = {data['workers']}, MLP {data['layers']} x "
        f"{data['hidden']} ({data['params'] / 1e6:.2f} M parameters, "
        f"{data['params'] * 4 / 2**20:.1f} MiB of gradients in {data['buckets']} buckets), "
        f"batch {data['batch']}, size code {data['packet_size']}, "
        f"links {data['link_gbps'] or 'unlimited'} Gbit/s; "
        f"{data['cpus']} CPUs, load {data['load']:.1f}",
        "",
        "| mode | median (ms) | p25 (ms) | p75 (ms) | steps |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['mode']} | {r['median_s'] * 1e3:.1f} | {r['p25_s'] * 1e3:.1f} | "
            f"{r['p75_s'] * 1e3:.1f} | {r['steps']} |"
        )
    lines += [
        "",
        f"overlap off / on: {data['ratio_off_on']:.2f}x "
        f"(communication / compute {data['comm_over_compute']:.2f}; backward and "
        f"allreduce overlapping perfectly: {data['ideal_ratio']:.2f}x)",
    ]
    return "\n".join(lines)


def write_outputs(data: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "overlap.json", out / "overlap.md"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(markdown(data) + "\n")
    return paths


# --------------------------------------------------------------------- worker
def _worker(argv: list[str]) -> None:
    """One rank (``python -m bench.overlap HIDDEN LAYERS BATCH STEPS ROUNDS BUCKET_MB OUT``)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import hostlib.torch  # noqa: F401  (registers the backend)

    hidden, layers, batch, steps, rounds = (int(a) for a in argv[:5])
    bucket_mb, out = float(argv[5]), Path(argv[6])
    torch.set_num_threads(1)
    dist.init_process_group("switchml")
    pg = dist.group.WORLD
    rank = dist.get_rank()
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    net = nn.Sequential(*mods)
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, hidden, generator=gen)
    flat = torch.zeros(sum(p.numel() for p in net.parameters()))

    def step(mode: str) -> float:
        t0 = time.perf_counter()
        if mode == "allreduce":
            dist.all_reduce(flat)
        elif mode == "compute":
            with ddp.no_sync():
                loss = ddp(x).square().mean()
                times[FORWARD].append(time.perf_counter() - t0)
                loss.backward()
            opt.zero_grad(set_to_none=False)
        else:
            pg.overlap = mode == "overlap on"
            ddp(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {m: [] for m in (*MODES, FORWARD)}
    for mode in ("overlap on", "overlap off", "compute", "allreduce"):  # warm-up
        step(mode)
        step(mode)
    calls = pg.switchml_stats()["calls"]
    step("overlap on")
    buckets = pg.switchml_stats()["calls"] - calls  # one allreduce per DDP bucket
    times = {m: [] for m in times}  # the warm-up's are dropped
    for r in range(rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            dist.barrier()  # gloo: every rank starts the round together
            for _ in range(steps):
                times[mode].append(step(mode))
    report = {
        "times": times,
        "params": int(flat.numel()),
        "buckets": buckets,
        "packet_size": pg.context.options.packet_size,
        "switch": pg.switchml_stats(),
    }
    out.write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1:])
