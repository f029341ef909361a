"""``python -m bench training``: DDP training on the emulated rack, the ``switchml``
backend against gloo's ring, same seeds and hyperparameters, interleaved.

The rack experiment (results and method in bench/TRAINING.md). It builds the
rack of ``switchml cluster`` (network namespaces, a bridge, tbf-shaped links; needs
root), runs one emulator in the switch's namespace (at niceness −10 by default, as
``switchml cluster run``: a switch has its own silicon and must not queue behind
the workers on a 2-core host) and, for every link rate and world size, launches W
training processes in the workers' namespaces once per backend and repetition,
alternating which backend goes first. Nothing but the process group's backend
differs between the two: the same model, initial weights, data, batch, learning
rate, DDP bucket size, link.

Each process trains an MLP (``layers`` linear layers, ``hidden`` wide, ReLU) on a
synthetic task that every rank generates from the same seed (no downloads):
inputs ~ N(0, 1), labels the argmax of a fixed random teacher network; each rank
takes its own shard of every global batch, one compute thread per process. Per
run it reports, from the steps after the first ``WARMUP`` (which build DDP's
buckets):

- the median step time (a step's time is its slowest rank's) and samples/s;
- the communication share: 1 − compute / step, where compute is the same step
  (forward, backward, optimizer) under ``ddp.no_sync()`` — no communication —
  measured after training;
- ``comm_s``: one allreduce of all the gradients at once, alone (no compute),
  against the link-rate bound ``ideal_comm_s`` (swemu/rack/'s
  :func:`~swemu.rack.ideal_time`: 8S/B for SwitchML, 2(W−1)/W · 8S/B for ring);
- the loss curve (mean over ranks = the global batch's loss), the time to a fixed
  loss (``target_loss``; by default, per W, the loss every run of that W reached:
  the highest of their smoothed losses at 80 % of the steps), the final loss and
  the held-out accuracy;
- CPU over the timed steps: the machine's busy fraction (all cores, irq and
  softirq included: the kernel's veth/bridge/tbf forwarding; on a shared machine
  other jobs too), the cores the workers used and the cores the emulator used.
  A point whose SwitchML allreduce alone takes more than ``LINK_BOUND`` times its
  link-rate bound (bench/CLUSTER.md's criterion) is CPU-bound, not link-bound.

The expected speedup of a step (``theory``) is Amdahl's law with the measured
compute: (compute + ring's ideal) / (compute + SwitchML's ideal); for the
communication alone it is 2(W−1)/W.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BACKENDS = ("switchml", "gloo")
MASTER_PORT = 29600
WARMUP = 3  # steps left out of the timing: DDP builds its buckets, first calls
SMOOTH = 5  # steps averaged for the time-to-loss criterion
LINK_BOUND = 1.25  # allreduce alone within this factor of its ideal: the link sets the pace
DIM = 256  # input features of the synthetic task
CLASSES = 10


def run(
    workers: Sequence[int],
    rates: Sequence[float],
    *,
    steps: int = 40,
    hidden: int = 2048,
    layers: int = 3,
    batch: int = 16,
    reps: int = 1,
    lr: float = 0.05,
    bucket_mb: float = 25.0,
    target_loss: float | None = None,
    emulator_nice: int = -10,
    window: int | None = None,
    partial: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Build the rack, run every (rate, W, repetition, backend), interleaved;
    return the configuration, every run's row, the per-point summary and the
    speedups (see the module docstring for what is measured). ``partial``: a
    file rewritten with the rows so far after every run (what a failed or
    interrupted run leaves)."""
    from swemu.rack import (
        SWITCH_CONTROL_PORT,
        SWITCH_UDP_PORT,
        Rack,
        Shaping,
        code_state,
        signals_as_exceptions,
        start_emulator,
    )

    if steps <= WARMUP + SMOOTH:
        raise ValueError(f"--steps must be more than {WARMUP + SMOOTH}")
    config = {
        "steps": steps,
        "hidden": hidden,
        "layers": layers,
        "batch": batch,
        "reps": reps,
        "lr": lr,
        "bucket_mb": bucket_mb,
        "target_loss": target_loss,
        "emulator_nice": emulator_nice,
        "window": window,
        "warmup_steps": WARMUP,
        "workers": list(workers),
        "rates_gbps": list(rates),
        "mtu": 9000,
        "packet_size": "hostlib's default (6 on the emulator: 2048 values per packet)",
    }
    code = code_state()
    results: list[dict[str, Any]] = []
    launch = 0
    with (
        signals_as_exceptions(),
        tempfile.TemporaryDirectory(prefix="training-") as tmp,
        Rack(max(workers)) as rack,
    ):
        emu, _ = start_emulator(rack, Path(tmp), nice=emulator_nice)
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
                            "MASTER_PORT": str(MASTER_PORT + launch % 1000),
                            "SWITCHML_CONTROL": f"{rack.switch_ip}:{SWITCH_CONTROL_PORT}",
                            "SWITCHML_SWITCH": f"{rack.switch_ip}:{SWITCH_UDP_PORT}",
                            "SWITCHML_BUFFER_WARNING": "0",
                            "OMP_NUM_THREADS": "1",
                            "BENCH_EMULATOR_PID": str(emu.pid),
                        }
                        if window:
                            env["SWITCHML_WINDOW"] = str(window)
                        args = {
                            "backend": backend,
                            "steps": steps,
                            "hidden": hidden,
                            "layers": layers,
                            "batch": batch,
                            "lr": lr,
                            "bucket_mb": bucket_mb,
                        }
                        ranks = launch_ranks(rack, w, env, args, Path(tmp) / f"run{launch}")
                        row = _row(ranks, backend, w, rate, batch, rep)
                        log(
                            f"{rate:g} Gbit/s W={w} rep {rep} {backend:8s}: "
                            f"{row['median_step_s'] * 1e3:.0f} ms/step, "
                            f"comm {row['comm_share']:.0%}, "
                            f"allreduce {row['comm_s'] * 1e3:.0f} ms "
                            f"(ideal {row['ideal_comm_s'] * 1e3:.0f}), "
                            f"loss {row['final_loss']:.3f}, acc {row['accuracy']:.3f}, "
                            f"busy {row['machine_busy']:.0%}, emulator "
                            f"{row['emulator_cores']:.2f} cores, workers "
                            f"{row['worker_cores']:.2f} cores"
                        )
                        results.append(row)
                        if partial is not None:
                            partial.parent.mkdir(parents=True, exist_ok=True)
                            partial.write_text(
                                json.dumps({"config": config, "code": code, "results": results})
                            )
        emu.terminate()
    _time_to_loss(results, target_loss)
    return {
        "config": config,
        "code": code,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "results": results,
        "summary": summarize(results),
    }


def launch_ranks(
    rack: Any,
    w: int,
    env: dict[str, str],
    args: dict[str, Any],
    out: Path,
    module: str = "bench.training",
) -> list[dict[str, Any]]:
    """Start the W ranks of one run in their namespaces (``python -m module
    ARGS_JSON OUT_JSON``, bench/compression.py's workers too) and collect their JSON."""
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
        argv = [sys.executable, "-m", module, json.dumps(args), str(out / f"{r}.json")]
        procs.append(
            rack.popen(
                rack.worker_ns(r),
                argv,
                stdin=subprocess.DEVNULL,
                stdout=open(out / f"{r}.log", "wb"),  # noqa: SIM115 (closed with the process)
                stderr=subprocess.STDOUT,
                env=e,
            )
        )
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(1800))
        finally:
            if p.stdout is not None:
                p.stdout.close()
    return rank_reports(codes, out)


def rank_reports(codes: Sequence[int], out: Path) -> list[dict[str, Any]]:
    """The ranks' JSON reports (``out/<rank>.json``) once every rank exited 0;
    else :class:`~swemu.rack.ClusterError` with the first failed rank's last
    line of ``out/<rank>.log``."""
    if any(codes):
        from swemu.rack import ClusterError

        failed = next(r for r, c in enumerate(codes) if c)
        lines = (out / f"{failed}.log").read_text(errors="replace").strip().splitlines()
        raise ClusterError(
            f"training processes exited with {codes}; rank {failed}'s last line: "
            f"{lines[-1] if lines else '(no output)'}"
        )
    return [json.loads((out / f"{r}.json").read_text()) for r in range(len(codes))]


def _row(
    ranks: list[dict[str, Any]], backend: str, w: int, rate: float, batch: int, rep: int
) -> dict[str, Any]:
    """One run's figures from its ranks' reports."""
    from swemu.rack import ideal_time

    steps = [max(v) for v in zip(*(r["step_s"] for r in ranks))]
    med = statistics.median(steps[WARMUP:])
    compute = max(r["compute_s"] for r in ranks)
    losses = [statistics.fmean(v) for v in zip(*(r["loss"] for r in ranks))]
    nbytes = 4 * ranks[0]["params"]
    wall = max(r["window_s"] for r in ranks)
    r0 = ranks[0]
    row: dict[str, Any] = {
        "backend": backend,
        "workers": w,
        "rate_gbps": rate,
        "rep": rep,
        "median_step_s": med,
        "step_s": steps,
        "samples_per_s": batch * w / med,
        "compute_s": compute,
        "comm_share": max(0.0, 1 - compute / med),
        "comm_s": statistics.median(
            max(r["comm_t"][i][1] for r in ranks) - max(r["comm_t"][i][0] for r in ranks)
            for i in range(len(r0["comm_t"]))
        ),
        "ideal_comm_s": ideal_time(
            "switchml" if backend == "switchml" else "ring", w, nbytes, rate
        ),
        "loss": losses,
        "final_loss": statistics.fmean(losses[-SMOOTH:]),
        "accuracy": r0["accuracy"],
        "params": r0["params"],
        "grad_bytes": nbytes,
        "machine_busy": r0["machine_busy"],
        "emulator_cores": r0["emulator_cpu_s"] / wall,
        "worker_cores": sum(r["cpu_s"] for r in ranks) / wall,
    }
    if "switch" in r0:
        sw = r0["switch"]
        row["switch_calls_per_step"] = sw["calls"] / max(1, len(steps) - WARMUP)
        row["switch_thread_s_per_step"] = sw["seconds"] / max(1, len(steps) - WARMUP)
        # per rank: the slowest rank's is the step's communication alone; an earlier
        # rank's also holds its wait for the slowest to finish backward (the skew)
        row["switch_thread_s_per_step_by_rank"] = [
            r["switch"]["seconds"] / max(1, len(steps) - WARMUP) for r in ranks
        ]
        row["retransmissions"] = sum(r["last_call"]["retransmissions"] for r in ranks)
        row["sent"] = sum(r["last_call"]["sent"] for r in ranks)
        # in the timed steps, all ranks together (the allreduce alone: the two above)
        row["step_retransmissions"] = sum(r["switch"].get("retransmissions", 0) for r in ranks)
        row["step_spurious"] = sum(r["switch"].get("spurious", 0) for r in ranks)
    return row


def _smoothed(losses: Sequence[float]) -> list[float]:
    """The mean of the last ``SMOOTH`` losses at every step (fewer at the start)."""
    return [statistics.fmean(losses[max(0, i + 1 - SMOOTH) : i + 1]) for i in range(len(losses))]


def _time_to_loss(rows: list[dict[str, Any]], target: float | None) -> None:
    """Add ``target_loss``, ``steps_to_target`` and ``time_to_target_s`` to every
    row: the wall time from the end of the warm-up to the first step at which the
    smoothed loss is at or below the target (None if never). Without a given
    target, one per W: the highest smoothed loss at 80 % of the steps among that
    W's runs, so that every run of the W reaches it and both backends are timed
    to the same loss."""
    for w in {r["workers"] for r in rows}:
        group = [r for r in rows if r["workers"] == w]
        if target is None:
            at = int(0.8 * len(group[0]["loss"])) - 1
            goal = max(_smoothed(r["loss"])[at] for r in group)
        else:
            goal = target
        for r in group:
            r["target_loss"] = goal
            hit = next((i for i, v in enumerate(_smoothed(r["loss"])) if v <= goal), None)
            r["steps_to_target"] = None if hit is None else hit + 1
            r["time_to_target_s"] = (
                None if hit is None or hit < WARMUP else sum(r["step_s"][WARMUP : hit + 1])
            )


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (rate, W): each backend's medians over repetitions, the speedup
    (gloo's median step / SwitchML's, and the spread of the per-repetition
    ratios), the theory, and the CPU figures."""
    out = []
    for rate, w in sorted({(r["rate_gbps"], r["workers"]) for r in rows}):
        point: dict[str, Any] = {"rate_gbps": rate, "workers": w}
        for b in BACKENDS:
            mine = [
                r
                for r in rows
                if r["backend"] == b and r["rate_gbps"] == rate and r["workers"] == w
            ]
            if not mine:
                continue

            def med(key: str, mine: list[dict[str, Any]] = mine) -> Any:
                vals = [r[key] for r in mine if r.get(key) is not None]
                return statistics.median(vals) if vals else None

            point[b] = {
                k: med(k)
                for k in (
                    "median_step_s",
                    "samples_per_s",
                    "compute_s",
                    "comm_share",
                    "comm_s",
                    "ideal_comm_s",
                    "final_loss",
                    "accuracy",
                    "time_to_target_s",
                    "steps_to_target",
                    "machine_busy",
                    "emulator_cores",
                    "worker_cores",
                    "switch_thread_s_per_step",
                )
            }
            point[b]["reps"] = len(mine)
            point["target_loss"] = mine[0]["target_loss"]
        if "switchml" in point and "gloo" in point:
            sw, gl = point["switchml"], point["gloo"]
            point["speedup"] = gl["median_step_s"] / sw["median_step_s"]
            pairs = [
                (a, b)
                for a in rows
                for b in rows
                if a["rate_gbps"] == b["rate_gbps"] == rate
                and a["workers"] == b["workers"] == w
                and a["rep"] == b["rep"]
                and a["backend"] == "gloo"
                and b["backend"] == "switchml"
            ]
            ratios = [a["median_step_s"] / b["median_step_s"] for a, b in pairs]
            point["speedup_min"], point["speedup_max"] = min(ratios), max(ratios)
            point["comm_speedup"] = gl["comm_s"] / sw["comm_s"]
            point["comm_theory"] = 2 * (w - 1) / w
            compute = statistics.fmean([sw["compute_s"], gl["compute_s"]])
            point["step_theory"] = (compute + gl["ideal_comm_s"]) / (compute + sw["ideal_comm_s"])
            slow = sw["comm_s"] / sw["ideal_comm_s"]
            point["switchml_allreduce_vs_ideal"] = slow
            point["bound"] = "link" if slow <= LINK_BOUND else "CPU"
            if gl["time_to_target_s"] and sw["time_to_target_s"]:
                point["time_to_target_speedup"] = gl["time_to_target_s"] / sw["time_to_target_s"]
        out.append(point)
    return out


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.0f}"


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def markdown(data: dict[str, Any]) -> str:
    """The table of bench/TRAINING.md: one line per (rate, W), both backends side
    by side (medians over the repetitions; the speedup's range is that of the
    per-repetition ratios)."""
    c = data["config"]
    lines = [
        f"DDP training, MLP {c['layers']} layers x {c['hidden']}, batch {c['batch']} per rank, "
        f"{c['steps']} steps ({c['warmup_steps']} untimed), {c['reps']} rep(s), "
        f"bucket_cap_mb {c['bucket_mb']:g}",
        "",
        "| Gbit/s | W | step ms switchml / gloo | samples/s switchml / gloo "
        "| speedup (min–max) | step theory "
        "| allreduce alone ms switchml (ideal) / gloo (ideal) | allreduce speedup (2(W−1)/W) "
        "| comm share switchml / gloo | time to loss s switchml / gloo | loss switchml / gloo "
        "| accuracy switchml / gloo | cores switchml (emulator) / gloo | allreduce bound by |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in data["summary"]:
        sw, gl = p.get("switchml", {}), p.get("gloo", {})

        def pair(key: str, spec: str, sw: dict = sw, gl: dict = gl) -> str:
            return f"{_fmt(sw.get(key), spec)} / {_fmt(gl.get(key), spec)}"

        speed = (
            f"{p['speedup']:.2f}× ({p['speedup_min']:.2f}–{p['speedup_max']:.2f})"
            if "speedup" in p
            else "–"
        )
        cores_sw = (
            None
            if sw.get("worker_cores") is None
            else sw["worker_cores"] + (sw.get("emulator_cores") or 0.0)
        )
        lines.append(
            f"| {p['rate_gbps']:g} | {p['workers']} "
            f"| {_ms(sw.get('median_step_s'))} / {_ms(gl.get('median_step_s'))} "
            f"| {pair('samples_per_s', '.0f')} | {speed} | {_fmt(p.get('step_theory'), '.2f')}× "
            f"| {_ms(sw.get('comm_s'))} ({_ms(sw.get('ideal_comm_s'))}) / "
            f"{_ms(gl.get('comm_s'))} ({_ms(gl.get('ideal_comm_s'))}) "
            f"| {_fmt(p.get('comm_speedup'), '.2f')}× ({_fmt(p.get('comm_theory'), '.2f')}×) "
            f"| {pair('comm_share', '.0%')} | {pair('time_to_target_s', '.1f')} "
            f"| {pair('final_loss', '.3f')} | {pair('accuracy', '.3f')} "
            f"| {_fmt(cores_sw, '.2f')} ({_fmt(sw.get('emulator_cores'), '.2f')}) / "
            f"{_fmt(gl.get('worker_cores'), '.2f')} | {p.get('bound', '–')} |"
        )
    targets = sorted({(p["workers"], p["target_loss"]) for p in data["summary"]})
    lines += [
        "",
        "Target losses (per W): " + ", ".join(f"W = {w}: {t:.3f}" for w, t in targets),
    ]
    return "\n".join(lines)


def write_outputs(data: dict[str, Any], out: Path, *, plot: bool = True) -> list[Path]:
    """training.json and training.md first, then (``plot``, and matplotlib is
    there) training.png: the results never depend on the plot."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "training.json", out / "training.md"]
    paths[0].write_text(json.dumps(data, indent=1))
    paths[1].write_text(markdown(data) + "\n")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return paths
    if plot:
        paths.append(out / "training.png")
        plot_speedup(data, paths[-1])
    return paths


def plot_speedup(data: dict[str, Any], path: Path) -> None:
    """Left: the step speedup vs W per rate, beside the link-rate theory of the
    communication (2(W−1)/W) and of the whole step (Amdahl, measured compute).
    Right: the step times vs W against compute + the ideal communication."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = [p for p in data["summary"] if "speedup" in p]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    ws = sorted({p["workers"] for p in summary}) or [2, 4, 8]
    grid = [x / 10 for x in range(10, 10 * max(ws) + 1)]
    ax.plot(grid, [2 * (x - 1) / x for x in grid], "k--", label="communication: 2(W−1)/W")
    for i, rate in enumerate(sorted({p["rate_gbps"] for p in summary})):
        pts = [p for p in summary if p["rate_gbps"] == rate]
        color = f"C{i}"
        ax.errorbar(
            [p["workers"] for p in pts],
            [p["speedup"] for p in pts],
            yerr=[
                [p["speedup"] - p["speedup_min"] for p in pts],
                [p["speedup_max"] - p["speedup"] for p in pts],
            ],
            marker="o",
            color=color,
            capsize=3,
            label=f"{rate:g} Gb/s measured",
        )
        ax.plot(
            [p["workers"] for p in pts],
            [p["step_theory"] for p in pts],
            ":",
            marker="x",
            color=color,
            label=f"{rate:g} Gb/s step theory",
        )
        for b, style in (("switchml", "-"), ("gloo", "--")):
            bx.plot(
                [p["workers"] for p in pts],
                [p[b]["median_step_s"] * 1e3 for p in pts],
                style,
                marker="o",
                color=color,
                label=f"{b} {rate:g} Gb/s",
            )
            bx.plot(
                [p["workers"] for p in pts],
                [(p[b]["compute_s"] + p[b]["ideal_comm_s"]) * 1e3 for p in pts],
                style,
                color=color,
                alpha=0.35,
                label=f"{b} {rate:g} Gb/s: compute + ideal",
            )
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("workers W")
    ax.set_ylabel("step time gloo / switchml")
    ax.set_title("DDP step speedup of SwitchML over gloo ring")
    ax.set_xticks(sorted({1, *ws}))
    ax.legend(fontsize=7)
    bx.set_xlabel("workers W")
    bx.set_ylabel("median step (ms)")
    bx.set_title("step time vs compute + link-rate-bound allreduce")
    bx.set_xticks(ws)
    bx.legend(fontsize=6)
    c = data["config"]
    fig.suptitle(
        f"Emulated rack, MLP {c['layers']}×{c['hidden']}, batch {c['batch']}/rank "
        "(medians; bars: per-repetition min–max)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------- worker
def build_model(hidden: int, layers: int, seed: int = 0) -> Any:
    """The MLP every rank starts from: ``layers`` linear layers (DIM → hidden …
    → CLASSES) with ReLU, initialised from ``seed`` (the same weights everywhere)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    mods: list[nn.Module] = [nn.Linear(DIM, hidden), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, CLASSES))
    return nn.Sequential(*mods)


def compute_seconds(ddp: Any, opt: Any, x: Any, y: Any, batch: int, reps: int) -> float:
    """The median time of ``reps`` training steps without communication
    (``ddp.no_sync()``: the replicas may differ afterwards, so it runs last)."""
    import time

    from torch import nn

    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with ddp.no_sync():
            nn.functional.cross_entropy(ddp(x[:batch]), y[:batch]).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def task_data(n: int, seed: int) -> tuple[Any, Any]:
    """``n`` samples of the synthetic task (the same on every rank for a seed)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    teacher = [
        torch.randn(DIM, 256, generator=g) / DIM**0.5,
        torch.randn(256, CLASSES, generator=g),
    ]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return x, y


def machine_and_emulator() -> tuple[float, float, float]:
    """(busy, total) CPU seconds of the machine and the emulator's CPU seconds."""
    from swemu.rack import machine_cpu, process_cpu

    busy, total = machine_cpu()
    pid = int(os.environ.get("BENCH_EMULATOR_PID") or 0)
    return busy, total, process_cpu(pid) if pid else 0.0


def _worker(argv: list[str]) -> None:
    """One rank: ``python -m bench.training CONFIG_JSON OUT``."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import hostlib.torch  # noqa: F401  (registers the backend)

    cfg = json.loads(argv[0])
    out = Path(argv[1])
    steps, hidden, layers, batch = cfg["steps"], cfg["hidden"], cfg["layers"], cfg["batch"]
    torch.set_num_threads(1)
    dist.init_process_group(cfg["backend"])
    rank, w = dist.get_rank(), dist.get_world_size()
    # gradients as views of DDP's buckets: no copy into and out of the buckets around
    # every allreduce (the same for both backends; PyTorch's advice for speed)
    ddp = nn.parallel.DistributedDataParallel(
        build_model(hidden, layers), bucket_cap_mb=cfg["bucket_mb"], gradient_as_bucket_view=True
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=0.9)
    x, y = task_data(steps * batch * w, seed=1)
    pg = dist.group.WORLD
    step_s, losses = [], []
    for s in range(steps):
        if s == WARMUP:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            mach0 = machine_and_emulator()
            if hasattr(pg, "reset_stats"):
                pg.reset_stats()
        lo = (s * w + rank) * batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[lo : lo + batch]), y[lo : lo + batch])
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
    cpu_s, window_s = time.process_time() - cpu0, time.perf_counter() - wall0
    mach1 = machine_and_emulator()
    report: dict[str, Any] = {}
    if hasattr(pg, "switchml_stats"):
        report["switch"] = pg.switchml_stats()
    tx, ty = task_data(2000, seed=2)
    with torch.no_grad():
        accuracy = float((ddp.module(tx).argmax(dim=1) == ty).float().mean())
    # communication alone: every gradient in one allreduce, as the backend does it
    # (timestamps on the machine's monotonic clock, which all ranks share: the
    # launcher takes the last start to the last end, so that a rank leaving the
    # barrier early does not count its wait for the others)
    flat = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()])
    comm = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        comm.append((t0, time.perf_counter()))
    if hasattr(pg, "context"):  # the last of those calls, as hostlib counted it
        report["last_call"] = pg.context.last_stats
    dist.barrier()
    compute = compute_seconds(ddp, opt, x, y, batch, reps=9)
    out.write_text(
        json.dumps(
            {
                **report,
                "step_s": step_s,
                "loss": losses,
                "compute_s": compute,
                "comm_t": comm,
                "accuracy": accuracy,
                "params": sum(p.numel() for p in ddp.parameters()),
                "cpu_s": cpu_s,
                "window_s": window_s,
                "machine_busy": min(1.0, (mach1[0] - mach0[0]) / max(mach1[1] - mach0[1], 1e-9)),
                "emulator_cpu_s": mach1[2] - mach0[2],
                "pid": os.getpid(),
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1:])
