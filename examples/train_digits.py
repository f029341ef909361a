"""Data-parallel training of a small network on scikit-learn's digits, through SwitchML or gloo.

Run one copy per worker, with RANK and WORLD_SIZE set; ``switchml run`` does that
(and starts a local emulator)::

    switchml run --workers 4 -- python examples/train_digits.py --comm switchml
    switchml run --workers 4 -- python examples/train_digits.py --comm gloo
    switchml run --workers 4 -- python examples/train_digits.py --comm switchml,gloo

torch.distributed with gloo always does the rendezvous and DDP's initial
broadcast of the parameters (MASTER_ADDR 127.0.0.1, MASTER_PORT from
``--master-port``, else $MASTER_PORT, else derived from $SWITCHML_SESSION_ID so
that concurrent ``switchml run`` jobs do not collide). ``--comm`` picks how the
gradients are averaged:

- ``switchml``: the :mod:`hostlib.torch` hook, through the switch
  (``hostlib.from_env()``);
- ``gloo``: a hook doing a blocking ``dist.all_reduce`` over gloo, timed like
  the SwitchML hook, so that the two compare step for step;
- ``gloo-ddp``: DDP's own asynchronous gloo allreduce, overlapped with the
  backward pass (no hook, so no communication time is reported).

A comma-separated list (``switchml,gloo``) trains once per method, back to back
in the same processes, for a side-by-side comparison in one run.

Seeds, the train/test split and the batches are fixed: a run depends only on
the arguments and the world size. Rank 0 prints the final test accuracy, the
mean time per step and the share of the step spent inside the communication
hook; ``--json FILE`` writes them, with the per-rank figures, as an object
keyed by method (``{"switchml": {...}, "gloo": {...}}``).
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations
# at registration and accepts only the real objects, not strings.
import argparse
import gc
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

#: derived MASTER_PORTs lie in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's
#: ephemeral range (32768-60999), so no client socket of this host holds them
PORT_BASE = 20000
PORT_SPAN = 12000
METHODS = ("switchml", "gloo", "gloo-ddp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--comm",
        default="switchml",
        help=f"gradient averaging: {', '.join(METHODS)}, or a comma-separated list",
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=10, help="first steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", type=int, default=256, help="MLP hidden width")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    args.comm = [c.strip() for c in args.comm.split(",") if c.strip()]
    unknown = [c for c in args.comm if c not in METHODS]
    if unknown or not args.comm:
        p.error(f"--comm takes {', '.join(METHODS)} (comma-separated), got {unknown or 'nothing'}")
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    return args


def master_port(explicit: int | None, env: dict[str, str]) -> int:
    """--master-port, else $MASTER_PORT, else a port derived from the SwitchML session id
    (the same on every rank of a ``switchml run`` job, different across jobs)."""
    if explicit:
        return explicit
    if env.get("MASTER_PORT"):
        return int(env["MASTER_PORT"])
    session = env.get("SWITCHML_SESSION_ID")
    if session:
        return PORT_BASE + (int(session) >> 1) % PORT_SPAN  # session ids are odd
    return 29500  # torchrun's default


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The digits (1797 8x8 images), scaled to [0, 1], split 75/25 stratified by ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return (
        torch.from_numpy(xtr),
        torch.from_numpy(ytr).long(),
        torch.from_numpy(xte),
        torch.from_numpy(yte).long(),
    )


def make_model(kind: str, hidden: int) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(64, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 10),
        )
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
    )


class TimedGloo:
    """State of the ``gloo`` hook: seconds and calls inside it."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0

    def reset_stats(self) -> None:
        self.calls, self.bytes, self.seconds = 0, 0, 0.0


def gloo_hook(state: TimedGloo, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Blocking gloo allreduce of the bucket, averaged: the baseline of the SwitchML hook."""
    start = time.perf_counter()
    buf = bucket.buffer()
    dist.all_reduce(buf)
    buf.div_(state.world_size)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    state.calls += 1
    state.bytes += buf.numel() * buf.element_size()
    state.seconds += time.perf_counter() - start
    return fut


def batches(n_train: int, world: int, rank: int, batch: int, seed: int):
    """Index tensors of this rank's share of each global batch: every epoch is a
    seeded permutation, cut into global batches of ``world * batch`` samples."""
    gen = torch.Generator().manual_seed(seed + 1)
    per_step = world * batch
    while True:
        perm = torch.randperm(n_train, generator=gen)
        for start in range(0, n_train - per_step + 1, per_step):
            yield perm[start + rank * batch : start + (rank + 1) * batch]


def train(
    args: argparse.Namespace,
    comm: str,
    data: tuple[torch.Tensor, ...],
    switchml_ctx: Any = None,
) -> dict[str, Any]:
    """Train from scratch with gradients averaged by ``comm``; evaluate; gather the
    per-rank figures (the process group must be up)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = data
    model = DDP(make_model(args.model, args.hidden), bucket_cap_mb=args.bucket_cap_mb)
    if comm == "switchml":
        from hostlib.torch import register_switchml_hook

        hook_state: Any = register_switchml_hook(model, switchml_ctx)
    elif comm == "gloo":
        hook_state = TimedGloo(world)
        model.register_comm_hook(hook_state, gloo_hook)
    else:
        hook_state = None

    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    feed = batches(len(xtr), world, rank, args.batch_size, args.seed)
    step_seconds = 0.0
    cpu_start = time.process_time()
    losses = []
    for step in range(args.steps):
        if step == args.warmup:
            step_seconds = 0.0
            cpu_start = time.process_time()
            if hook_state is not None:
                hook_state.reset_stats()
        idx = next(feed)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        step_seconds += time.perf_counter() - start
        losses.append(loss.item())
    cpu_seconds = time.process_time() - cpu_start

    model.eval()
    with torch.no_grad():
        correct = int((model(xte).argmax(1) == yte).sum())
    # every replica must hold the same parameters: the averages are the same everywhere
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(copies, flat)
    divergence = max(float((c - copies[0]).abs().max()) for c in copies)

    timed = args.steps - args.warmup
    mine = {
        "rank": rank,
        "step_time_s": step_seconds / timed,
        "cpu_time_s": cpu_seconds / timed,  # this process's CPU (all threads) per step
        "comm_time_s": hook_state.seconds / timed if hook_state else None,
        "comm_share": hook_state.seconds / step_seconds if hook_state else None,
        "hook_calls_per_step": hook_state.calls / timed if hook_state else None,
        "hook_bytes_per_step": hook_state.bytes / timed if hook_state else None,
        "test_correct": correct,
        "final_loss": float(np.mean(losses[-20:])),
    }
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, mine)

    def mean(key: str) -> float | None:
        vals = [r[key] for r in per_rank]
        return None if vals[0] is None else float(np.mean(vals))

    return {
        "comm": comm,
        "workers": world,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_size": args.batch_size,
        "model": args.model,
        "params": int(flat.numel()),
        "seed": args.seed,
        "test_accuracy": correct / len(yte),
        "test_size": len(yte),
        "step_time_s": mean("step_time_s"),
        "cpu_time_s": mean("cpu_time_s"),
        "comm_time_s": mean("comm_time_s"),
        "comm_share": mean("comm_share"),
        "hook_calls_per_step": mean("hook_calls_per_step"),
        "hook_bytes_per_step": mean("hook_bytes_per_step"),
        "final_loss": mean("final_loss"),
        "replica_max_diff": divergence,
        "switchml": {
            "switch": switchml_ctx.options.switch,
            "session_id": switchml_ctx.session_id,
            "packet_size": switchml_ctx.options.packet_size,
            "window": switchml_ctx.options.window,
        }
        if comm == "switchml"
        else None,
        "per_rank": per_rank,
    }


def summary(result: dict[str, Any]) -> str:
    comm = (
        f"communication {result['comm_share']:.0%} of the step "
        f"({result['comm_time_s'] * 1e3:.2f} ms in the hook, "
        f"{result['hook_bytes_per_step'] / 1024:.1f} KiB per step)"
        if result["comm_share"] is not None
        else "communication overlapped by DDP (not timed)"
    )
    return (
        f"train_digits: {result['workers']} workers, --comm {result['comm']}, "
        f"{result['steps']} steps of {result['batch_size']}/worker, {result['model']} "
        f"({result['params']} parameters)\n"
        f"  test accuracy {result['test_accuracy']:.4f} "
        f"({round(result['test_accuracy'] * result['test_size'])}/{result['test_size']}), "
        f"final loss {result['final_loss']:.4f}, replicas differ by "
        f"{result['replica_max_diff']:.3g}\n"
        f"  {result['step_time_s'] * 1e3:.2f} ms per step (mean of ranks, after "
        f"{result['warmup']} warm-up steps; {result['cpu_time_s'] * 1e3:.2f} ms CPU per "
        f"worker), {comm}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ)
    if "RANK" not in env or "WORLD_SIZE" not in env:
        print(
            "train_digits: RANK and WORLD_SIZE are not set; start it with "
            "`switchml run --workers N -- python examples/train_digits.py`",
            file=sys.stderr,
        )
        return 2
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(master_port(args.master_port, env))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    data = load_data(args.seed)
    ctx = None
    results: dict[str, dict[str, Any]] = {}
    try:
        if "switchml" in args.comm:
            import hostlib

            ctx = hostlib.from_env()
        for comm in args.comm:
            results[comm] = train(args, comm, data, ctx)
            if rank == 0:
                print(summary(results[comm]), flush=True)
        # Tear gloo down together: no rank may leave while a peer still has a
        # collective or a store request in flight (rank 0 hosts the TCPStore).
        dist.barrier()
    finally:
        if ctx is not None:
            ctx.close()
        # Free the DDP models (their reducers hold the process group) and destroy
        # it now, while the interpreter is whole: a gloo thread that touches a
        # Python object during interpreter shutdown aborts the process
        # ("terminate called without an active exception", exit -6).
        gc.collect()
        dist.destroy_process_group()
    if rank == 0 and "switchml" in results and "gloo" in results:
        sw, gl = results["switchml"], results["gloo"]
        print(
            f"switchml vs gloo: {sw['step_time_s'] / gl['step_time_s']:.2f}x the step time, "
            f"{sw['comm_time_s'] / gl['comm_time_s']:.2f}x the time in the hook, test accuracy "
            f"{100 * (sw['test_accuracy'] - gl['test_accuracy']):+.2f} points",
            flush=True,
        )
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
