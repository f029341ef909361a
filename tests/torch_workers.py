"""Worker functions of tests/test_torch.py, run as separate processes.

Module-level, so that multiprocessing's spawn can import them by name. Each
returns plain numpy arrays (bf16 widened to float32, which is exact) so that
the test process can check them without torch distributed state.
"""

# No ``from __future__ import annotations``: DDP inspects hook annotations.
import copy
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import hostlib
from hostlib.torch import SwitchMLHookState, allreduce_tensor_, switchml_hook


def _net(dtype: torch.dtype) -> nn.Module:
    """A small MLP whose layers have gradients of different magnitudes, so that
    the block exponents differ from chunk to chunk; the same on every rank."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(64, 96), nn.Tanh(), nn.Linear(96, 40), nn.Tanh(), nn.Linear(40, 10)
    )
    with torch.no_grad():
        net[0].weight.mul_(4.0)
        net[4].weight.mul_(0.05)
    return net.to(dtype)


def _batch(rank: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(24, 64, generator=gen) * (1 + rank)
    y = torch.randint(0, 10, (24,), generator=gen)
    return x.to(dtype), y


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).reshape(-1).numpy().copy()


def _recording(inner, log: list[dict[str, Any]]):
    """Wrap a hook so that it records each bucket's local input and averaged output."""

    def hook(state, bucket):
        entry = {"index": bucket.index(), "input": _np(bucket.buffer())}
        log.append(entry)

        def record(fut):
            entry["output"] = _np(fut.value())
            return fut.value()

        return inner(state, bucket).then(record)

    return hook


def _one_backward(ddp: DDP, rank: int, dtype: torch.dtype) -> np.ndarray:
    x, y = _batch(rank, dtype)
    loss = nn.functional.cross_entropy(ddp(x).float(), y)
    loss.backward()
    return np.concatenate([_np(p.grad) for p in ddp.module.parameters()])


def hook_vs_gloo(ctx: hostlib.Context, store: str) -> dict[str, Any]:
    """One backward pass on a fixed batch per rank, averaged by the SwitchML hook in
    float32, float16 and bfloat16, and in float32 also by gloo (DDP's default
    hook); plus the non-finite flag of ``allreduce_tensor_`` with an Inf on rank 0 only."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=ctx.rank, world_size=2)
    out: dict[str, Any] = {}
    try:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            net = _net(dtype)
            entry: dict[str, Any] = {}
            if dtype == torch.float32:  # the half types are checked against the exact mean
                gloo_log: list[dict[str, Any]] = []
                ddp = DDP(copy.deepcopy(net))
                ddp.register_comm_hook(None, _recording(default_hooks.allreduce_hook, gloo_log))
                entry["gloo_grads"] = _one_backward(ddp, ctx.rank, dtype)
                entry["gloo"] = gloo_log

            sw_log: list[dict[str, Any]] = []
            state = SwitchMLHookState(ctx)
            ddp = DDP(copy.deepcopy(net))
            ddp.register_comm_hook(state, _recording(switchml_hook, sw_log))
            sw_grads = _one_backward(ddp, ctx.rank, dtype)
            entry["switchml"] = sw_log
            entry["switchml_grads"] = sw_grads
            entry["grad_dtype"] = str(next(ddp.module.parameters()).grad.dtype)
            entry["stats"] = state.stats()
            out[str(dtype).removeprefix("torch.")] = entry
        # an overflow on one rank must reach every rank (and not hang the others)
        t = torch.full((1000,), 0.5, dtype=torch.float16)
        if ctx.rank == 0:
            t[123] = float("inf")
        allreduce_tensor_(ctx, t, propagate_nonfinite=True)
        finite = torch.full((300,), 0.25 * (ctx.rank + 1), dtype=torch.bfloat16)
        allreduce_tensor_(ctx, finite, propagate_nonfinite=True)
        out["nonfinite"] = {"overflowed": _np(t), "finite": _np(finite)}
    finally:
        dist.destroy_process_group()
    return out
