"""SwitchML, fast model: one representative worker through a tandem of FIFO
stages, the window of slots, loss as resends after a timeout (a Numba kernel).

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from swemu.protocol.jit import kernel

from .network import PARAM_BYTES, Network, Result, switchml_overhead, switchml_wire_bytes


@dataclass(frozen=True)
class SwitchMLConfig:
    """SwitchML parameters (defaults: a Tofino at line rate, size code 1, no loss).

    ``window`` None picks the pool size that fills the bottleneck
    (:func:`pool_to_fill`). ``switch_pps`` is one switch's aggregate ingress
    packet rate (inf: line rate on every port, as a Tofino). ``host_cost`` is
    CPU seconds per packet on a worker (build + send + receive; 0: the host keeps
    up with the link). ``timeout`` is the fixed retransmission timeout (p4app-
    switchML: 10 ms). ``exponent_window``: float32 calls send one window of
    exponent packets first (PROTOCOL §4).
    """

    values_per_packet: int = 64
    window: int | None = None
    switch_pps: float = math.inf
    host_cost: float = 0.0
    loss: float = 0.0
    timeout: float = 10e-3
    exponent_window: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.values_per_packet < 1:
            raise ValueError("values_per_packet must be at least 1")
        if self.window is not None and not 1 <= self.window <= 16384:
            raise ValueError("window must be in 1..16384")
        if self.switch_pps <= 0 or self.host_cost < 0 or self.timeout <= 0:
            raise ValueError("need switch_pps > 0, host_cost >= 0 and timeout > 0")
        if not 0 <= self.loss < 1:
            raise ValueError("loss must be in [0, 1)")


@dataclass(frozen=True)
class _Stages:
    service: np.ndarray  # per chunk, each FIFO stage after the host
    delay: np.ndarray  # fixed latency after each stage
    links_per_way: int  # lossy links between a worker and the root switch


def _stages(workers: int, net: Network, cfg: SwitchMLConfig) -> _Stages:
    """The tandem of FIFO stages one chunk goes through after the host."""
    wire = switchml_wire_bytes(cfg.values_per_packet, net.framing)
    tau = wire / net.bytes_per_s
    per_pkt = 1.0 / cfg.switch_pps
    d = net.rtt / 2
    racks = net.racks(workers)
    if racks == 1:
        service = [tau, workers * per_pkt, tau]
        delay = [d, 0.0, d]
        links = 1
    else:
        r = min(net.rack_size or workers, workers)
        tau_up = wire / net.uplink_bytes_per_s(workers)
        ds = net.spine_rtt / 2
        # worker uplink, rack switch (r packets in), rack uplink, spine (one packet
        # per rack), spine downlink, rack switch (the spine's result in), downlink
        service = [tau, r * per_pkt, tau_up, racks * per_pkt, tau_up, per_pkt, tau]
        delay = [d, 0.0, ds, 0.0, ds, 0.0, d]
        links = 2
    return _Stages(np.array(service, np.float64), np.array(delay, np.float64), links)


def packets_per_worker(nbytes: int, cfg: SwitchMLConfig, window: int, is_float: bool) -> int:
    """Packets one worker sends for a tensor of ``nbytes`` (exponent window included)."""
    chunks = math.ceil(nbytes / (PARAM_BYTES * cfg.values_per_packet))
    if is_float and cfg.exponent_window and chunks:
        chunks += min(window, chunks)
    return chunks


def pool_to_fill(workers: int, net: Network, cfg: SwitchMLConfig) -> int:
    """Slots needed to keep the bottleneck stage busy: the round trip of a slot
    (host, every stage, every latency) divided by the bottleneck's time per packet
    — the bandwidth-delay product in packets. Capped at 16384 (PROTOCOL §2)."""
    st = _stages(workers, net, cfg)
    h = cfg.host_cost
    cycle = h + float(st.service.sum() + st.delay.sum())
    bottleneck = max(h, float(st.service.max()))
    if bottleneck <= 0:
        return 1
    return int(min(16384, max(1, math.ceil(cycle / bottleneck) + 1)))


def loss_delays(
    chunks: int, workers: int, links_per_way: int, loss: float, timeout: float, seed: int
) -> np.ndarray:
    """Extra delay of each chunk from retransmissions (see the module docstring).

    A worker's attempt fails if its packet or its result is lost on any of the
    ``2 · links_per_way`` links (probability q); failures before success are
    geometric, and the chunk waits for the slowest of the W workers:
    ``P(max ≤ k) = (1 − q^(k+1))^W``, inverted on one uniform per chunk (so a
    higher loss never gives a smaller delay for the same seed).
    """
    if loss <= 0 or chunks == 0:
        return np.zeros(0, np.float64)
    q = 1.0 - (1.0 - loss) ** (2 * links_per_way)
    u = np.random.default_rng(seed).random(chunks)
    # smallest k with (1 - q^(k+1))^W >= u  <=>  q^(k+1) <= 1 - u^(1/W)
    tail = -np.expm1(np.log(np.maximum(u, 1e-300)) / workers)  # 1 - u^(1/W), accurately
    k = np.ceil(np.log(np.maximum(tail, 1e-300)) / math.log(q)) - 1
    return np.maximum(k, 0.0) * timeout


@kernel
def _pipeline(npkts, window, h_tx, h_rx, service, delay, extra):  # pragma: no cover - jit
    """Completion time of one worker's ``npkts`` packets over a window of slots.

    The host is a FIFO server (``h_tx`` per packet built, ``h_rx`` per result);
    each stage ``j`` is a FIFO server of ``service[j]`` per chunk followed by
    ``delay[j]``. A chunk with retransmissions (``extra[c]`` > 0: the timeouts it
    waited; empty: no loss) has its result no earlier than an unloaded trip
    after its last resend: ``send + extra[c] + base``.
    Results are handled in time order from a binary heap of (time, chunk).
    """
    nst = service.shape[0]
    last = np.zeros(nst)
    keys = np.empty(window + 1)
    vals = np.empty(window + 1, np.int64)
    size = 0
    host = 0.0
    has_extra = extra.shape[0] > 0
    base = 0.0  # an unloaded trip through every stage
    for j in range(nst):
        base += service[j] + delay[j]
    first = min(window, npkts)
    for c in range(first):
        host += h_tx
        t = host
        sent = t
        for j in range(nst):
            t = max(t, last[j]) + service[j]
            last[j] = t
            t += delay[j]
        if has_extra and extra[c] > 0:
            t = max(t, sent + extra[c] + base)
        # push
        i = size
        size += 1
        while i > 0:
            p = (i - 1) >> 1
            if keys[p] <= t:
                break
            keys[i] = keys[p]
            vals[i] = vals[p]
            i = p
        keys[i] = t
        vals[i] = c
    while size > 0:
        t = keys[0]
        c = vals[0]
        # pop
        size -= 1
        kt = keys[size]
        vt = vals[size]
        i = 0
        while True:
            ch = 2 * i + 1
            if ch >= size:
                break
            if ch + 1 < size and keys[ch + 1] < keys[ch]:
                ch += 1
            if keys[ch] >= kt:
                break
            keys[i] = keys[ch]
            vals[i] = vals[ch]
            i = ch
        keys[i] = kt
        vals[i] = vt
        nxt = c + window
        if nxt < npkts:
            host = max(t, host) + h_rx + h_tx
            tt = host
            for j in range(nst):
                tt = max(tt, last[j]) + service[j]
                last[j] = tt
                tt += delay[j]
            if has_extra and extra[nxt] > 0:
                tt = max(tt, host + extra[nxt] + base)
            i = size
            size += 1
            while i > 0:
                p = (i - 1) >> 1
                if keys[p] <= tt:
                    break
                keys[i] = keys[p]
                vals[i] = vals[p]
                i = p
            keys[i] = tt
            vals[i] = nxt
        else:
            host = max(t, host) + h_rx
    return host


def switchml_allreduce(
    nbytes: int,
    workers: int,
    net: Network | None = None,
    cfg: SwitchMLConfig | None = None,
    *,
    is_float: bool = True,
) -> Result:
    """Time of one SwitchML allreduce of ``nbytes`` per worker (fast model)."""
    net = net or Network()
    cfg = cfg or SwitchMLConfig()
    if workers < 1:
        raise ValueError("workers must be at least 1")
    window = cfg.window or pool_to_fill(workers, net, cfg)
    npkts = packets_per_worker(nbytes, cfg, window, is_float)
    st = _stages(workers, net, cfg)
    extra = loss_delays(npkts, workers, st.links_per_way, cfg.loss, cfg.timeout, cfg.seed)
    h = cfg.host_cost / 2
    t = float(_pipeline(npkts, window, h, h, st.service, st.delay, extra)) if npkts else 0.0
    return Result(
        "switchml",
        t,
        nbytes,
        workers,
        {
            "window": window,
            "packets_per_worker": npkts,
            "wire_bytes_per_packet": switchml_wire_bytes(cfg.values_per_packet, net.framing),
            "overhead": switchml_overhead(cfg.values_per_packet),
            "retransmission_delay": float(extra.sum()) if extra.size else 0.0,
            "racks": net.racks(workers),
        },
    )
