"""A training iteration: backward in reverse layer order, gradients in DDP-style
buckets, one communication channel.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .network import PARAM_BYTES, EventLoop, Fifo
from .zoo import ModelProfile


def buckets(model: ModelProfile, bucket_bytes: int) -> list[tuple[int, int]]:
    """Gradient buckets in reverse layer order: ``(bytes, index of the earliest
    layer in it)``; a bucket closes once it holds at least ``bucket_bytes``."""
    out: list[tuple[int, int]] = []
    acc = 0
    for i in range(len(model.layers) - 1, -1, -1):
        acc += model.layers[i].params * PARAM_BYTES
        if acc >= bucket_bytes or i == 0:
            out.append((acc, i))
            acc = 0
    return out


@dataclass
class Iteration:
    """One training iteration: its time and the part communication added."""

    time: float
    compute: float
    comm: float  # sum of the buckets' allreduce times
    exposed: float  # time - compute: communication not hidden behind backward
    buckets: int


def iteration_time(
    model: ModelProfile,
    allreduce: Callable[[int], float],
    *,
    bucket_bytes: int = 25 << 20,
    forward_fraction: float = 1 / 3,
) -> Iteration:
    """Simulate forward, backward and the overlapped bucket allreduces.

    ``allreduce(nbytes) -> seconds`` is the method's time for one bucket.
    Backward runs from the last layer to the first; a bucket's allreduce starts
    when its earliest layer's gradient is ready and the previous bucket's
    allreduce is done. The iteration ends when both are finished.
    """
    ev = EventLoop()
    total_flops = sum(layer.flops for layer in model.layers) or 1.0
    fwd = model.compute * forward_fraction
    bwd = model.compute - fwd
    plan = buckets(model, bucket_bytes)
    bucket_of = {first: k for k, (_, first) in enumerate(plan)}
    channel = Fifo()
    cache: dict[int, float] = {}
    comm_total = [0.0]
    end = [0.0]

    def comm_done() -> None:
        end[0] = max(end[0], ev.now)

    def layer_done(i: int) -> None:
        end[0] = max(end[0], ev.now)
        k = bucket_of.get(i)
        if k is not None:
            size = plan[k][0]
            if size not in cache:
                cache[size] = allreduce(size)
            comm_total[0] += cache[size]
            ev.at(channel.serve(ev.now, cache[size]), comm_done)
        if i > 0:
            layer = model.layers[i - 1]
            ev.after(bwd * layer.flops / total_flops, layer_done, i - 1)

    last = model.layers[-1]
    ev.at(fwd + bwd * last.flops / total_flops, layer_done, len(model.layers) - 1)
    t = ev.run()
    return Iteration(t, model.compute, comm_total[0], t - model.compute, len(plan))
