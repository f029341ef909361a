"""PyTorch integration: DistributedDataParallel gradients averaged through SwitchML.

DDP keeps its process group (gloo is enough) for the rendezvous and the initial
broadcast of the parameters; a communication hook sends every gradient bucket
through the switch instead of through the process group::

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hostlib
    from hostlib.torch import register_switchml_hook

    dist.init_process_group("gloo")               # RANK, WORLD_SIZE, MASTER_*
    model = DDP(net)
    state = register_switchml_hook(model, hostlib.from_env())
    ...                                            # train as usual
    print(state.stats())                           # calls, bytes, seconds in the hook

The hook is synchronous: it returns an already completed future once the
bucket holds the average. DDP launches buckets strictly in index order on every
rank, which is what SwitchML needs (each allreduce call of a job must be the
same call on every worker). float32, float16 and bfloat16 CPU buckets are
reduced in place, with no copy (float16 and bfloat16 as 16-bit values,
docs/protocol.md §4.2; float32 too with ``register_switchml_hook(...,
values16=True)``); float64 and tensors on other devices travel as float32
through a staging copy.

16-bit gradients the way torch compresses them, through the switch: with the
``switchml`` backend, torch's own ``fp16_compress_hook`` works as it is (its
float16 buckets are 16-bit calls), and :func:`switchml_bf16_compress_hook` /
:func:`switchml_fp16_compress_hook` are the same hooks under names DDP accepts on
CPU (it refuses torch's ``bf16_compress_hook`` by name without NCCL)::

    dist.init_process_group("switchml")
    model = DDP(net)
    model.register_comm_hook(dist.group.WORLD, hostlib.torch.switchml_bf16_compress_hook)

Non-finite gradients: the switch sums integers, so NaN/Inf cannot travel. By
default ``Context.allreduce`` raises ``ValueError`` on the rank that has them,
before anything is sent, and the other ranks then fail with ``NoProgressError``
after ``no_progress`` seconds. With ``propagate_nonfinite=True`` (for fp16
training with a dynamic loss scale, where an overflow must skip the step on
every rank) each bucket carries one extra chunk holding "this rank saw a
non-finite value"; when any rank did, every rank's result is all NaN, which
``torch.amp.GradScaler`` detects as usual. It costs one packet and one copy of
the bucket per call.

Importing this module also registers the ``switchml`` torch.distributed backend
(:mod:`hostlib.torch_backend`): ``dist.init_process_group("switchml")`` makes every
DDP allreduce go through the switch with no hook, overlapping backward.

This module and :mod:`hostlib.torch_backend` are the only ones in :mod:`hostlib`
that import torch.
"""

# No ``from __future__ import annotations`` here: DDP inspects the hook's
# annotations at registration and accepts only the real objects, not strings.
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from swemu.protocol import wire

from . import torch_backend

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

    from . import Context

__all__ = [
    "SwitchMLHookState",
    "allreduce_tensor_",
    "register_switchml_hook",
    "switchml_bf16_compress_hook",
    "switchml_fp16_compress_hook",
    "switchml_hook",
]

torch_backend.register()  # dist.init_process_group("switchml")

#: floating types the hook accepts; float64 is converted for the wire
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: the types the switch takes from the tensor's own memory
DIRECT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class SwitchMLHookState:
    """The state DDP passes to :func:`switchml_hook`: the SwitchML context and
    counters of what went through it (calls, bytes of gradient, seconds spent
    inside the hook), so that a training loop can report its communication share."""

    def __init__(
        self,
        ctx: "Context",
        *,
        propagate_nonfinite: bool = False,
        values16: bool | None = None,
    ) -> None:
        self.ctx = ctx
        self.propagate_nonfinite = propagate_nonfinite
        #: float32 buckets on the 16-bit wire (None: the context's default)
        self.values16 = values16
        self.calls = 0
        self.bytes = 0  # bucket bytes as DDP holds them (fp16 counts 2 per value)
        self.seconds = 0.0

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    def reset_stats(self) -> None:
        """Zero the counters (e.g. after warm-up steps)."""
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0

    def stats(self) -> dict[str, Any]:
        """The counters as a dict: ``calls``, ``bytes``, ``seconds``."""
        return {"calls": self.calls, "bytes": self.bytes, "seconds": self.seconds}


def allreduce_tensor_(
    ctx: "Context",
    tensor: torch.Tensor,
    *,
    average: bool = True,
    propagate_nonfinite: bool = False,
    values16: bool | None = None,
) -> torch.Tensor:
    """Sum (or, with ``average``, average) a floating tensor over all workers, in place.

    Every worker must call it with a tensor of the same shape and dtype, in the
    same order of calls. A contiguous float32, float16 or bfloat16 CPU tensor goes
    to the switch as it is (a numpy view of its memory; the 16-bit ones as 16-bit
    values, and float32 too with ``values16``: docs/protocol.md §4.2); anything
    else is staged through a float32 copy. See the module docstring for
    ``propagate_nonfinite``. Returns ``tensor``.
    """
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(f"SwitchML reduces floating tensors, got {tensor.dtype}")
    w = ctx.world_size
    direct = (
        not propagate_nonfinite
        and tensor.dtype in DIRECT_DTYPES
        and tensor.device.type == "cpu"
        and tensor.is_contiguous()
    )
    if direct:
        arr, bf16 = torch_backend.tensor_memory(tensor)
        ctx.allreduce(arr, out=arr, values16=values16, bfloat16=bf16)
        if average and w > 1:
            tensor.detach().div_(w)
        return tensor
    # a private, contiguous float32 copy: the wire format of every other case
    stage = tensor.detach().reshape(-1).to("cpu", torch.float32, copy=True).numpy()
    if propagate_nonfinite:
        total = _reduce_with_flag(ctx, stage)
    else:
        total = ctx.allreduce(stage, out=stage)
    result = torch.from_numpy(total)
    if average and w > 1:
        result /= w
    with torch.no_grad():
        tensor.copy_(result.reshape(tensor.shape))
    return tensor


def _reduce_with_flag(ctx: "Context", values: np.ndarray) -> np.ndarray:
    """Sum ``values`` (flat float32) plus a one-chunk "non-finite" flag.

    The flag gets a chunk of its own so that its magnitude (1.0) never sets the
    block exponent of gradient values. The values of a rank with NaN/Inf are
    sent as zeros; if any rank raised the flag, every rank returns all NaN.
    """
    n = values.size
    nvals = wire.values_per_packet(ctx.options.packet_size)
    padded = -(-n // nvals) * nvals
    stage = np.zeros(padded + nvals, np.float32)
    bad = not bool(np.isfinite(values).all())
    if bad:
        stage[padded] = 1.0
    else:
        stage[:n] = values
    ctx.allreduce(stage, out=stage)
    if stage[padded] > 0.5:
        return np.full(n, np.nan, np.float32)
    return stage[:n].copy()


def switchml_hook(
    state: SwitchMLHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket.buffer()`` over all workers through
    SwitchML (in place) and return a completed future holding it.

    Register with ``ddp_model.register_comm_hook(SwitchMLHookState(ctx), switchml_hook)``
    or :func:`register_switchml_hook`. Errors of the allreduce (a dead peer, an
    unreachable switch) propagate out of ``loss.backward()``.
    """
    start = time.perf_counter()
    buf = bucket.buffer()
    allreduce_tensor_(
        state.ctx,
        buf,
        average=True,
        propagate_nonfinite=state.propagate_nonfinite,
        values16=state.values16,
    )
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    state.calls += 1
    state.bytes += buf.numel() * buf.element_size()
    state.seconds += time.perf_counter() - start
    return fut


def register_switchml_hook(
    ddp_model: "DistributedDataParallel",
    ctx: "Context",
    *,
    propagate_nonfinite: bool = False,
    values16: bool | None = None,
) -> SwitchMLHookState:
    """Make ``ddp_model`` average its gradients through SwitchML; return the hook state.
    ``values16=True`` sends float32 buckets as 16-bit values (docs/protocol.md §4.2:
    half the bytes, no cast on the worker; float16/bfloat16 buckets always are).

    ``ctx`` must be a job of as many workers as the model's process group, one
    rank each; the ranks need not match, since SwitchML sums are the same on
    every worker. The context is joined here so that a misconfigured switch
    fails now rather than in the first backward pass.
    """
    group = getattr(ddp_model, "process_group", None)
    if group is not None and group.size() != ctx.world_size:
        raise ValueError(
            f"the DDP process group has {group.size()} ranks but the SwitchML job has "
            f"{ctx.world_size} workers"
        )
    ctx.open()
    state = SwitchMLHookState(ctx, propagate_nonfinite=propagate_nonfinite, values16=values16)
    ddp_model.register_comm_hook(state, switchml_hook)
    return state


def _compress_hook(
    dtype: torch.dtype, process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's compression hooks' recipe: the bucket cast to ``dtype`` and divided
    by the group's size, summed by ``all_reduce`` (through the switch on a
    ``switchml`` group: 16-bit values), copied back into the bucket."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(group.size())

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


def switchml_fp16_compress_hook(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``fp16_compress_hook`` (float16 buckets, divided by W first), for a
    ``switchml`` process group: 16 bits a value through the switch, both ways."""
    return _compress_hook(torch.float16, process_group, bucket)


def switchml_bf16_compress_hook(
    process_group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_hook`` (bfloat16 buckets, divided by W first), for a
    ``switchml`` process group; DDP refuses torch's own by name without NCCL."""
    return _compress_hook(torch.bfloat16, process_group, bucket)
