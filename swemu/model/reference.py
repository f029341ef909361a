"""SwitchML, packet-level reference: every worker and every packet an event,
driving the project's own sans-IO engines; slow, used to check the fast model.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import math

import numpy as np

from .network import EventLoop, Fifo, Network, Result, switchml_wire_bytes
from .switchml import SwitchMLConfig, pool_to_fill


def switchml_reference(
    nbytes: int,
    workers: int,
    net: Network | None = None,
    cfg: SwitchMLConfig | None = None,
    *,
    seed: int = 0,
) -> Result:
    """Every packet of every worker through our real sans-IO engines (single switch).

    int32 data (no exponent window); per-link loss from ``random.Random(seed)``;
    fixed timeout ``cfg.timeout`` (the hostlib timer with its floor and cap set
    to it). For tests: about 10 µs of real time per packet.
    """
    import random

    from swemu.core.engine import EngineConfig, SwitchEngine
    from swemu.protocol import wire
    from swemu.protocol.worker.protocol import Timing, WorkerProtocol

    net = net or Network()
    cfg = cfg or SwitchMLConfig()
    if net.racks(workers) != 1:
        raise ValueError("the packet-level reference models a single switch")
    window = cfg.window or pool_to_fill(workers, net, cfg)
    size_code = int(math.log2(cfg.values_per_packet // 32))
    if 32 << size_code != cfg.values_per_packet:
        raise ValueError("values_per_packet must be 32 << size code for the reference")
    rng = random.Random(seed)
    ev = EventLoop()
    tau = switchml_wire_bytes(cfg.values_per_packet) / net.bytes_per_s
    d = net.rtt / 2
    per_pkt = 1.0 / cfg.switch_pps
    h = cfg.host_cost / 2
    eng = SwitchEngine(EngineConfig(pool_size=window, max_jobs=1))
    addrs = [(0x0A000001 + r, 40000 + r) for r in range(workers)]
    rank_of = {a: r for r, a in enumerate(addrs)}
    for r, (ip, port) in enumerate(addrs):
        eng.register(
            session_id=1,
            rank=r,
            num_workers=workers,
            ipv4=ip,
            udp_port=port,
            packet_size=size_code,
            pool_size=window,
        )
    timing = Timing(
        timeout=cfg.timeout,
        max_timeout=cfg.timeout,
        backoff_after=1 << 30,
        no_progress=1e9,
    )
    n = nbytes // 4
    ops = []
    for r in range(workers):
        proto = WorkerProtocol(
            num_workers=workers, size_code=size_code, window=window, timing=timing
        )
        ops.append(proto.allreduce(np.full(n, r + 1, np.int32), None, 0.0))
    host = [Fifo() for _ in range(workers)]
    up = [Fifo() for _ in range(workers)]
    down = [Fifo() for _ in range(workers)]
    switch = Fifo()
    timer_version = [0] * workers
    done_at = [0.0] * workers
    plen = wire.packet_len(size_code)
    buf = np.zeros((1, plen + 1), np.uint8)
    lens = np.zeros(1, np.int32)
    ok = np.ones(1, np.uint8)
    sent = [0]

    def send(r: int, pkts: list[bytes], ready: float) -> None:
        for data in pkts:
            sent[0] += 1
            t = up[r].serve(ready, tau)
            if rng.random() < cfg.loss:
                continue
            ev.at(t + d, at_switch, r, data)

    def at_switch(r: int, data: bytes) -> None:
        t = switch.serve(ev.now, per_pkt)
        ev.at(t, switch_done, r, data)

    def switch_done(r: int, data: bytes) -> None:
        _, out = eng.receive_datagram(data, addrs[r], ev.now)
        for pkt, dst in out:
            w = rank_of[dst]
            t = down[w].serve(ev.now, tau)
            if rng.random() < cfg.loss:
                continue
            ev.at(t + d, at_worker, w, pkt)

    def arm(r: int) -> None:
        timer_version[r] += 1
        if not ops[r].done:
            ev.at(ops[r].get_timer(), on_timer, r, timer_version[r])

    def at_worker(r: int, data: bytes) -> None:
        op = ops[r]
        start = max(ev.now, host[r].free_at)
        buf[0, : len(data)] = np.frombuffer(data, np.uint8)
        lens[0] = len(data)
        pkts = [bytes(p) for p in op.packets(op.receive(buf, lens, ok, 1, start))]
        ready = host[r].serve(ev.now, h + h * len(pkts))
        send(r, pkts, ready)
        if op.done and not done_at[r]:
            done_at[r] = ready
        arm(r)

    def on_timer(r: int, version: int) -> None:
        if version != timer_version[r] or ops[r].done:
            return
        op = ops[r]
        pkts = [bytes(p) for p in op.packets(op.handle_timer(ev.now))]
        ready = host[r].serve(ev.now, h * len(pkts))
        send(r, pkts, ready)
        arm(r)

    for r, op in enumerate(ops):
        pkts = [bytes(p) for p in op.packets(op.initial(0.0))]
        t = 0.0
        for p in pkts:
            t = host[r].serve(0.0, h)
            send(r, [p], t)
        arm(r)
    ev.run()
    if not all(op.done for op in ops):
        raise RuntimeError("the reference simulation stalled")
    retx = int(sum(op.counters[2] for op in ops))
    return Result(
        "switchml-reference",
        max(done_at),
        nbytes,
        workers,
        {"window": window, "sent": sent[0], "retransmissions": retx, "events": ev.events},
    )
