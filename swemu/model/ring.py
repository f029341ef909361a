"""Ring all-reduce: 2(n − 1) steps of S/n bytes to the successor.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

from dataclasses import dataclass

from .network import IPV4_TCP, EventLoop, Network, Result, tcp_wire_factor


@dataclass(frozen=True)
class RingConfig:
    """Ring all-reduce: per-step latency ``alpha`` (software + network), the MTU
    (framing), and ``efficiency``: the fraction of the line rate the transport
    reaches (1: a perfect TCP/NCCL stack)."""

    alpha: float = 20e-6
    mtu: int = 1500
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.alpha < 0 or not 0 < self.efficiency <= 1 or self.mtu <= IPV4_TCP:
            raise ValueError("need alpha >= 0, 0 < efficiency <= 1 and a sensible MTU")


def ring_allreduce(
    nbytes: int, workers: int, net: Network | None = None, cfg: RingConfig | None = None
) -> Result:
    """Ring all-reduce (reduce-scatter then all-gather), one representative node.

    Each of the 2(n − 1) steps sends one S/n segment over the slowest ring edge:
    a worker link, or a rack uplink when the ring crosses racks (one ring edge per
    rack uses it), plus ``alpha`` and the spine's extra latency across racks.
    """
    net = net or Network()
    cfg = cfg or RingConfig()
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if workers == 1:
        return Result("ring", 0.0, nbytes, 1, {"steps": 0})
    rate = net.bytes_per_s * cfg.efficiency
    alpha = cfg.alpha
    if net.racks(workers) > 1:
        rate = min(rate, net.uplink_bytes_per_s(workers) * cfg.efficiency)
        alpha += net.spine_rtt / 2
    seg = nbytes / workers * tcp_wire_factor(cfg.mtu, net.framing)
    step = alpha + seg / rate
    ev = EventLoop()
    steps = 2 * (workers - 1)
    done = [0]

    def step_done() -> None:
        done[0] += 1
        if done[0] < steps:
            ev.after(step, step_done)

    ev.after(step, step_done)
    t = ev.run()
    return Result("ring", t, nbytes, workers, {"steps": steps, "step_time": step})
