"""Parameter server: n workers push to S servers, which sum and send back.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .network import EventLoop, Fifo, Network, Result, tcp_wire_factor


@dataclass(frozen=True)
class PSConfig:
    """Parameter server: ``servers`` dedicated machines, each holding 1/servers of
    the tensor; ``chunk`` bytes per push/pull message (None: the whole shard, so
    pull starts after push ends); ``alpha`` per message."""

    servers: int = 1
    chunk: int | None = None
    alpha: float = 20e-6
    mtu: int = 1500
    efficiency: float = 1.0

    def __post_init__(self) -> None:
        if self.servers < 1 or (self.chunk is not None and self.chunk < 1):
            raise ValueError("need servers >= 1 and chunk >= 1")
        if self.alpha < 0 or not 0 < self.efficiency <= 1:
            raise ValueError("need alpha >= 0 and 0 < efficiency <= 1")


def ps_allreduce(
    nbytes: int, workers: int, net: Network | None = None, cfg: PSConfig | None = None
) -> Result:
    """Push (n → S servers), sum, pull (S → n), chunk by chunk through two FIFO phases.

    A push round of one chunk per server keeps both a worker's uplink (S chunks
    out) and a server's downlink (n chunks in) busy, as a stream: it lasts
    ``max(S, n) · chunk · f / B``; the pull round is the mirror image on the other
    link direction, so consecutive rounds overlap push and pull.
    """
    net = net or Network()
    cfg = cfg or PSConfig()
    if workers < 1:
        raise ValueError("workers must be at least 1")
    shard = nbytes / cfg.servers
    chunk = float(cfg.chunk) if cfg.chunk else shard
    rounds = max(1, math.ceil(shard / chunk)) if shard else 0
    rate = net.bytes_per_s * cfg.efficiency
    f = tcp_wire_factor(cfg.mtu)
    fan = max(cfg.servers, workers)
    per_round = fan * chunk * f / rate
    if net.racks(workers) > 1:
        # a rack's uplink carries its workers' pushes to servers outside the rack
        per_round = max(
            per_round,
            min(net.rack_size or workers, workers)
            * cfg.servers
            * chunk
            * f
            / (net.uplink_bytes_per_s(workers) * cfg.efficiency),
        )
    lat = cfg.alpha + net.rtt / 2 + (net.spine_rtt / 2 if net.racks(workers) > 1 else 0.0)
    ev = EventLoop()
    push, pull = Fifo(), Fifo()
    end = [0.0]

    def round_pushed(k: int) -> None:
        t = pull.serve(ev.now, per_round)
        ev.at(t + lat, round_pulled, k)

    def round_pulled(k: int) -> None:
        end[0] = max(end[0], ev.now)

    for k in range(rounds):
        t = push.serve(0.0, per_round)
        ev.at(t + lat, round_pushed, k)
    ev.run()
    return Result(
        "ps",
        end[0],
        nbytes,
        workers,
        {"servers": cfg.servers, "rounds": rounds, "round_time": per_round},
    )
