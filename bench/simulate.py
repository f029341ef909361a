"""A calibrated scale model of SwitchML, ring all-reduce and a parameter server.

Theory of operation
-------------------
Everything here is a discrete-event model: time is simulated, nothing is sent.
:class:`EventLoop` is the small heap-based engine (``at(t, fn, *args)``,
``run()``) that the slow, exact models and the training-iteration model use.

**SwitchML, fast model** (:func:`switchml_allreduce`). Workers are symmetric, so
one *representative* worker is simulated against the switch: every chunk (one
packet per worker) goes through a tandem of FIFO stages — the worker's host
(``host_cost`` per packet, half to build and send, half to receive), its uplink
(serialization ``wire bytes / B``), propagation, the switch pipeline (``W /
switch_pps``: it must take in one packet from each of the W workers), the
downlink (the multicast copy, ``wire bytes / B``) and propagation back. A window
of ``K`` slots (PROTOCOL §3): the result of chunk i lets the host send chunk
i + K. Results are popped from a heap in time order, so the host and the links
serve packets in the order they really would; each stage is then the closed
form ``depart = max(arrive, previous depart) + service``. That loop is a Numba
kernel (:func:`_pipeline`, ~0.15 µs a packet): the 6.7 M packets of a 427 M-
parameter gradient take about a second, and n = 1024 workers cost nothing
extra. Loss: each link drops a packet with probability ``loss``; a worker whose
packet or result is lost resends after the fixed ``timeout`` (PROTOCOL §3,
resend unchanged), and the slot's chunk is done when the *slowest* worker has
its result, so chunk i waits ``timeout × max over workers of the failed
attempts`` (a maximum of W geometric variables, sampled per chunk from one
seeded RNG) and its result comes no earlier than an unloaded trip after its
last resend. A two-level tree adds the rack uplink, the spine pipeline and the
spine links; with one rack it is the single switch.

**SwitchML, packet-level reference** (:func:`switchml_reference`): the same
network with every worker and every packet an event in :class:`EventLoop`,
driving the project's own sans-IO engines (:class:`swemu.core.engine.SwitchEngine`
and :class:`hostlib.protocol.WorkerProtocol`), real loss and real timers. Slow
(~10 µs a packet), used by the tests to check the fast model on small cases.

**Ring all-reduce** (:func:`ring_allreduce`): 2(n − 1) steps; in each, every
node sends S/n bytes to its successor: ``α + (S/n)·f/B`` per step, f the TCP/IP/
Ethernet framing factor of the MTU. **Parameter server**
(:func:`ps_allreduce`): n workers push to S servers (each holds 1/S of the
tensor), a server sums a chunk once all n pushes have arrived and workers pull
it back. Push and pull use opposite link directions, so with chunking they
overlap; unchunked, ``T = 2·n·|shard|·f/B + 2α`` (the server link is the
bottleneck when n ≥ S).

**Training iteration** (:func:`iteration_time`): forward, then backward in
reverse layer order; gradients are packed into buckets (DDP-style, reverse
layer order) and a bucket's allreduce starts when its last layer's gradient is
ready and the previous bucket's allreduce has finished (one communication
channel).

**The emulator's loopback setup** (:func:`simulate_loopback`): the emulator
process and W worker processes share ``cores`` CPUs; the "link" is the CPU.
Each process run drains up to 64 datagrams and pays the calibrated per-call
and per-packet costs (:mod:`bench.calibrate`); runnable processes, and
``background`` CPU-bound ones standing for other load, queue for cores; the
workers' retransmission timers fire when round trips grow too long.

Units: seconds, bytes, bits per second for links.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from swemu.protocol.jit import kernel

# ------------------------------------------------------------------ framing
#: Ethernet per frame on the wire: header 14, FCS 4, preamble+SFD 8, inter-frame gap 12.
ETHERNET_FRAMING = 14 + 4 + 8 + 12
IPV4_UDP = 20 + 8
SWITCHML_HEADER = 10  # PROTOCOL §1
#: TCP/IPv4 headers with the timestamp option, as Linux sends them.
IPV4_TCP = 20 + 32
PARAM_BYTES = 4  # float32 gradients; SwitchML sends int32 of the same size


def switchml_wire_bytes(values_per_packet: int) -> int:
    """Bytes one SwitchML packet of ``values_per_packet`` int32 takes on an Ethernet link."""
    return 4 * values_per_packet + SWITCHML_HEADER + IPV4_UDP + ETHERNET_FRAMING


def switchml_overhead(values_per_packet: int) -> float:
    """Header overhead h: wire bytes per payload byte, minus 1."""
    return switchml_wire_bytes(values_per_packet) / (4 * values_per_packet) - 1.0


def tcp_wire_factor(mtu: int = 1500) -> float:
    """Wire bytes per payload byte of a bulk TCP stream at this MTU (1.062 at 1500)."""
    payload = mtu - IPV4_TCP
    return (mtu + ETHERNET_FRAMING) / payload


# ------------------------------------------------------------- event engine
class EventLoop:
    """A minimal discrete-event engine: a heap of (time, sequence, callback, args).

    Callbacks run in time order (ties in scheduling order) and may schedule more
    events; :attr:`now` is the current simulated time.
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.events = 0
        self._stopped = False

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at simulated time ``when`` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def stop(self) -> None:
        """Make :meth:`run` return after the current event (for endless sources)."""
        self._stopped = True

    def run(self, until: float = math.inf, max_events: float = math.inf) -> float:
        """Process events until none are left, :meth:`stop`, ``until`` or
        ``max_events`` more events; return the time reached."""
        heap = self._heap
        self._stopped = False
        stop_at = self.events + max_events
        while heap and heap[0][0] <= until and not self._stopped and self.events < stop_at:
            when, _, fn, args = heapq.heappop(heap)
            self.now = when
            self.events += 1
            fn(*args)
        return self.now


class Fifo:
    """A FIFO server with a busy-until time: ``serve(arrive, service) -> depart``."""

    __slots__ = ("busy", "free_at")

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy = 0.0

    def serve(self, arrive: float, service: float) -> float:
        start = max(arrive, self.free_at)
        self.free_at = start + service
        self.busy += service
        return self.free_at


# ------------------------------------------------------------------ network
@dataclass(frozen=True)
class Network:
    """Links and topology shared by all three methods.

    ``rtt`` is the worker ↔ switch round trip without serialization (propagation,
    NIC and switch latency). With ``rack_size`` set, workers sit in racks of that
    many under rack switches, which connect to one spine (``spine_rtt`` more
    round trip; rack uplinks carry ``rack_size · B / oversubscription``).
    """

    gbps: float = 100.0
    rtt: float = 10e-6
    rack_size: int | None = None
    spine_rtt: float = 2e-6
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if self.gbps <= 0 or self.rtt < 0 or self.spine_rtt < 0:
            raise ValueError("need gbps > 0 and non-negative round-trip times")
        if self.rack_size is not None and self.rack_size < 1:
            raise ValueError("rack_size must be at least 1")
        if self.oversubscription < 1:
            raise ValueError("oversubscription must be at least 1")

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8

    def racks(self, workers: int) -> int:
        """Rack switches in use (1: a single switch, no spine)."""
        if self.rack_size is None:
            return 1
        return max(1, math.ceil(workers / self.rack_size))

    def uplink_bytes_per_s(self, workers: int) -> float:
        """Capacity of one rack's uplink to the spine."""
        per_rack = min(self.rack_size or workers, workers)
        return per_rack * self.bytes_per_s / self.oversubscription


@dataclass
class Result:
    """One simulated allreduce: its time and how it got there."""

    method: str
    time: float
    nbytes: int
    workers: int
    detail: dict = field(default_factory=dict)

    @property
    def goodput_gbps(self) -> float:
        """Tensor bits per second per worker (as ``switchml run`` reports it)."""
        return self.nbytes * 8 / self.time / 1e9 if self.time > 0 else math.inf


# ----------------------------------------------------------------- SwitchML
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
    tau = switchml_wire_bytes(cfg.values_per_packet) / net.bytes_per_s
    per_pkt = 1.0 / cfg.switch_pps
    d = net.rtt / 2
    racks = net.racks(workers)
    if racks == 1:
        service = [tau, workers * per_pkt, tau]
        delay = [d, 0.0, d]
        links = 1
    else:
        r = min(net.rack_size or workers, workers)
        tau_up = switchml_wire_bytes(cfg.values_per_packet) / net.uplink_bytes_per_s(workers)
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
            "wire_bytes_per_packet": switchml_wire_bytes(cfg.values_per_packet),
            "overhead": switchml_overhead(cfg.values_per_packet),
            "retransmission_delay": float(extra.sum()) if extra.size else 0.0,
            "racks": net.racks(workers),
        },
    )


# --------------------------------------------- SwitchML packet-level reference
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

    from hostlib.protocol import Timing, WorkerProtocol
    from swemu.core.engine import EngineConfig, SwitchEngine
    from swemu.protocol import wire

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


# --------------------------------------------------------------------- ring
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
    seg = nbytes / workers * tcp_wire_factor(cfg.mtu)
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


# ---------------------------------------------------------- parameter server
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


# ------------------------------------------------------------------- models
@dataclass(frozen=True)
class Layer:
    """One layer: its gradient size (parameters) and forward FLOPs per sample."""

    name: str
    params: int
    flops: float


@dataclass(frozen=True)
class ModelProfile:
    """A model's layers (input to output) and its compute time per iteration.

    ``compute`` is forward + backward seconds for one iteration on one worker;
    layer times are proportional to their FLOPs, backward twice forward.
    """

    name: str
    layers: tuple[Layer, ...]
    compute: float
    note: str = ""

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def nbytes(self) -> int:
        return self.params * PARAM_BYTES


#: Effective GPU rate assumed for compute times (FLOP/s, fp32, a V100-class GPU
#: at realistic utilization). An assumption, not a paper number: change it with
#: :func:`with_compute`.
GPU_FLOPS = 10e12


def _compute(fwd_flops_per_sample: float, batch: int) -> float:
    return 3 * fwd_flops_per_sample * batch / GPU_FLOPS


def resnet50(batch: int = 64) -> ModelProfile:
    """ResNet-50 (torchvision v1.5 layout): 25.56 M parameters, batch 64 at 224²."""
    layers = [Layer("conv1", 7 * 7 * 3 * 64 + 2 * 64, 7 * 7 * 3 * 64 * 112 * 112)]
    cin = 64
    for stage, (planes, blocks, hw) in enumerate(
        ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7))
    ):
        for b in range(blocks):
            out = 4 * planes
            convs = [(cin, planes, 1), (planes, planes, 3), (planes, out, 1)]
            if b == 0:
                convs.append((cin, out, 1))  # projection shortcut
            p = sum(k * k * i * o + 2 * o for i, o, k in convs)
            fl = sum(k * k * i * o * hw * hw for i, o, k in convs)
            layers.append(Layer(f"layer{stage + 1}.{b}", p, fl))
            cin = out
    layers.append(Layer("fc", 2048 * 1000 + 1000, 2048 * 1000))
    fwd = sum(x.flops for x in layers)
    return ModelProfile("ResNet-50", tuple(layers), _compute(fwd, batch), f"batch {batch}")


def vgg19(batch: int = 64) -> ModelProfile:
    """VGG-19: 143.67 M parameters (16 convolutions, 3 fully connected), batch 64."""
    cfg = [(64, 224)] * 2 + [(128, 112)] * 2 + [(256, 56)] * 4 + [(512, 28)] * 4 + [(512, 14)] * 4
    layers = []
    cin = 3
    for i, (c, hw) in enumerate(cfg):
        layers.append(Layer(f"conv{i + 1}", 9 * cin * c + c, 9 * cin * c * hw * hw))
        cin = c
    for i, (a, b) in enumerate(((25088, 4096), (4096, 4096), (4096, 1000))):
        layers.append(Layer(f"fc{i + 1}", a * b + b, a * b))
    fwd = sum(x.flops for x in layers)
    return ModelProfile("VGG-19", tuple(layers), _compute(fwd, batch), f"batch {batch}")


def bert_base(batch: int = 32, seq: int = 128) -> ModelProfile:
    """BERT-base: 109.5 M parameters (30522-word vocabulary, 12 layers of 768),
    batch 32 of 128 tokens. Embeddings cost no FLOPs but their gradient is dense."""
    d, ff, v = 768, 3072, 30522
    layers = [Layer("embeddings", v * d + 512 * d + 2 * d + 2 * d, 0.0)]
    for i in range(12):
        attn = 4 * (d * d + d) + 2 * d
        layers.append(Layer(f"layer{i}.attention", attn, seq * (4 * d * d + 2 * seq * d)))
        ffn = d * ff + ff + ff * d + d + 2 * d
        layers.append(Layer(f"layer{i}.ffn", ffn, seq * 2 * d * ff))
    layers.append(Layer("pooler", d * d + d, d * d))
    fwd = sum(x.flops for x in layers)
    return ModelProfile(
        "BERT-base", tuple(layers), _compute(fwd, batch), f"batch {batch}×{seq} tokens"
    )


def lstm_lm(
    batch: int = 64, steps: int = 35, vocab: int = 200_000, hidden: int = 1024
) -> ModelProfile:
    """A large-vocabulary LSTM language model (our stand-in for the paper's LSTM):
    a 200k × 1024 embedding, two LSTM layers of 1024 and a full 1024 × 200k softmax,
    426.6 M parameters; batch 64 × 35 steps."""
    lstm = 4 * (hidden + hidden) * hidden + 8 * hidden
    tokens = steps
    layers = [
        Layer("embedding", vocab * hidden, 0.0),
        Layer("lstm1", lstm, tokens * 4 * 2 * hidden * hidden),
        Layer("lstm2", lstm, tokens * 4 * 2 * hidden * hidden),
        Layer("softmax", hidden * vocab + vocab, tokens * hidden * vocab),
    ]
    fwd = sum(x.flops for x in layers)
    return ModelProfile(
        "LSTM-LM", tuple(layers), _compute(fwd, batch), f"batch {batch}×{steps} steps"
    )


def paper_models() -> list[ModelProfile]:
    """The models of the reproduction, smallest first."""
    return [resnet50(), bert_base(), vgg19(), lstm_lm()]


#: The models by the names ``switchml simulate --params`` accepts.
MODELS: dict[str, Callable[[], ModelProfile]] = {
    "resnet50": resnet50,
    "bert": bert_base,
    "vgg19": vgg19,
    "lstm": lstm_lm,
}


def with_compute(model: ModelProfile, compute: float) -> ModelProfile:
    """The same model with another compute time per iteration."""
    return replace(model, compute=compute)


# -------------------------------------------------------- training iteration
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


# ------------------------------------------------------------ the emulator
@dataclass(frozen=True)
class _ProcessCosts:
    """CPU seconds of one process kind (the emulator or a worker) in the loopback model."""

    wakeup: float
    call: float
    kernel: float
    recv: float
    send: float

    @classmethod
    def of(cls, cal: Any, *, switch: bool) -> _ProcessCosts:
        """The calibrated costs, times the in-situ factor measured for that process
        kind (1 if the calibration has none)."""
        f = getattr(cal, "switch_in_situ" if switch else "host_in_situ", 1.0) or 1.0
        call, kernel = (
            (cal.switch_call, cal.switch_kernel) if switch else (cal.host_call, cal.host_kernel)
        )
        return cls(cal.wakeup * f, call * f, kernel * f, cal.recv * f, cal.send * f)


@dataclass(frozen=True)
class LoopbackTiming:
    """The worker's retransmission timer as ``hostlib.protocol.Timing`` has it:
    ``timeout`` first and as a floor, then ``srtt + 4·rttvar`` (RFC 6298, no
    samples from retransmitted packets), doubled every ``backoff_after``
    consecutive timeouts of a slot, up to ``max_timeout``; a duplicate result
    raises the floor to twice the timeout in use (at most once per timeout),
    which decays back slowly."""

    timeout: float = 0.02
    backoff_after: int = 3
    max_timeout: float = 0.5


def simulate_loopback(
    cal: Any,
    *,
    workers: int,
    nbytes: int,
    size_code: int = 6,
    window: int = 128,
    is_float: bool = True,
    cores: int = 2,
    background: float = 0.0,
    timeslice: float | None = None,
    batch: int = 64,
    timing: LoopbackTiming | None = None,
) -> Result:
    """Predict one ``switchml run`` allreduce on this machine: the emulator process
    and ``workers`` worker processes on ``cores`` CPUs, over loopback.

    A process runs when it has datagrams queued (or, a worker, a timer due) and a
    core is free; runnable processes wait in one FIFO run queue. A run is one
    readiness callback of the real adapters: it drains up to ``batch`` datagrams
    and costs (from ``cal``, a :class:`bench.calibrate.Calibration`) a wakeup if
    the process was asleep, one kernel call, per datagram a receive and the
    kernel's per-packet work, then one send per packet produced — each delivered
    to its receiver's queue as it is sent. Workers run their retransmission timer
    (:class:`LoopbackTiming`): when the CPU is scarce, round trips exceed the
    timeout and workers resend; the switch answers a duplicate of a complete
    slot with a unicast (PROTOCOL §2), all of which costs CPU too. The RTT
    estimate is warmed by one call first (the real run's warm-up call), and the
    second call is reported.

    Other load on the machine is ``background`` CPU-bound processes in the same
    run queue, each taking a ``timeslice`` per turn (a fractional one runs only
    that fraction of the time); default timeslice: CFS's, ``max(6 ms · (1 +
    log2 cores) / runnable, 0.75 ms · (1 + log2 cores))``. They delay every
    wakeup of the emulator and the workers, which is what makes round trips
    exceed the retransmission timeout on a busy machine.
    """
    timing = timing or LoopbackTiming()
    if cores < 1 or background < 0:
        raise ValueError("need cores >= 1 and background >= 0")
    if timeslice is None:
        scale = 1 + math.log2(cores)
        timeslice = max(6e-3 * scale / (background + workers + 1), 0.75e-3 * scale)
    rtt = [[0.0, 0.0, 0.0, 0.0, -math.inf] for _ in range(workers + 1)]  # hostlib's K.R_*
    args = (cal, workers, nbytes, size_code, window, is_float, cores, background, timeslice)
    first = _loopback_call(*args, batch, timing, rtt)
    res = _loopback_call(*args, batch, timing, rtt)
    res.detail["first_call"] = first.time
    res.detail["first_call_retransmissions"] = first.detail["retransmissions"]
    return res


def _loopback_call(
    cal: Any,
    workers: int,
    nbytes: int,
    size_code: int,
    window: int,
    is_float: bool,
    cores: int,
    background: float,
    timeslice: float,
    batch: int,
    timing: LoopbackTiming,
    rtt: list[list[float]],
) -> Result:
    """One allreduce of :func:`simulate_loopback`; ``rtt`` (per worker: srtt,
    rttvar, samples) carries over between calls, as in ``WorkerProtocol``."""
    cost = (_ProcessCosts.of(cal, switch=True), _ProcessCosts.of(cal, switch=False))
    nvals = 32 << size_code
    chunks = math.ceil(nbytes / (4 * nvals))
    npkts = chunks + (min(window, chunks) if is_float else 0)
    ev = EventLoop()
    nproc = workers + 1  # 0: the emulator, 1..W: the workers
    hogs = math.ceil(background)  # other load: ids nproc .. nproc + hogs - 1
    duty = background - math.floor(background)  # the last hog's share, if fractional
    # queues: the switch's hold (worker, chunk), a worker's hold chunk ids
    queue: list[list] = [[] for _ in range(nproc)]
    asleep = [True] * nproc
    queued = [False] * nproc
    running = [False] * nproc
    started = [False] * nproc
    runq: list[int] = []
    free = [cores]
    # the switch: which workers contributed to each chunk, and whether it is complete
    contributed = np.zeros((npkts, nproc), bool)
    arrived = np.zeros(npkts, np.int32)
    # each worker: per chunk first send time, deadline, timeout, timeouts, state
    first_sent = np.zeros((nproc, npkts))
    deadline = np.full((nproc, npkts), math.inf)
    rto = np.zeros((nproc, npkts))
    tries = np.zeros((nproc, npkts), np.int32)
    got = np.zeros((nproc, npkts), bool)
    received = [0] * nproc
    next_chunk = [min(window, npkts)] * nproc
    timer_at = [math.inf] * nproc
    done_at = [0.0] * nproc
    cpu = [0.0] * nproc
    stats = {"retransmissions": 0, "unicasts": 0, "duplicates_at_workers": 0, "runs": 0}

    def make_runnable(p: int) -> None:
        if not queued[p] and not running[p]:
            queued[p] = True
            runq.append(p)

    def dispatch() -> None:
        while free[0] > 0 and runq:
            p = runq.pop(0)
            free[0] -= 1
            if p >= nproc:
                ev.after(timeslice, hog_done, p)
                continue
            queued[p] = False
            run(p)

    def hog_done(h: int) -> None:
        free[0] += 1
        if duty and h == nproc + hogs - 1:  # the fractional one sleeps in between
            ev.after(timeslice * (1 / duty - 1), hog_wake, h)
        else:
            runq.append(h)
        dispatch()

    def hog_wake(h: int) -> None:
        if not all(done_at[1:]):
            runq.append(h)
            dispatch()

    def new_rto(p: int) -> float:
        srtt, var, n, floor, _ = rtt[p]
        floor = max(timing.timeout, floor)
        if n == 0:
            return min(floor, timing.max_timeout)
        return min(max(floor, srtt + 4 * var), timing.max_timeout)

    def sent_new(p: int, c: int, now: float) -> None:
        first_sent[p, c] = now
        rto[p, c] = new_rto(p)
        deadline[p, c] = now + rto[p, c]

    def run(p: int) -> None:
        # One readiness (or timer) callback: receive a batch, one kernel call,
        # then one sendto per packet it produced, each delivered as it is sent.
        running[p] = True
        stats["runs"] += 1
        now = ev.now
        out: list[tuple[int, Any]] = []  # (destination process, item)
        pc = cost[0 if p == 0 else 1]
        pre = pc.wakeup if asleep[p] else 0.0
        asleep[p] = False
        if p == 0:
            items = queue[0][:batch]
            del queue[0][:batch]
            pre += pc.call + len(items) * (pc.recv + pc.kernel)
            for w, c in items:
                if contributed[c, w]:  # a retransmission
                    if arrived[c] == workers:
                        out.append((w, c))  # complete: unicast to the sender
                        stats["unicasts"] += 1
                    continue
                contributed[c, w] = True
                arrived[c] += 1
                if arrived[c] == workers:  # the last packet: multicast
                    out.extend((v, c) for v in range(1, nproc))
        elif not started[p]:
            started[p] = True  # a worker's first run: build the first window
            for c in range(min(window, npkts)):
                sent_new(p, c, now)
                out.append((0, (p, c)))
            pre += pc.call + len(out) * pc.kernel
        else:
            items = queue[p][:batch]
            del queue[p][:batch]
            pre += pc.call + len(items) * (pc.recv + pc.kernel)
            for c in items:
                if got[p, c]:
                    stats["duplicates_at_workers"] += 1
                    st = rtt[p]  # a spurious timeout: raise the floor (hostlib's _spurious)
                    cur = new_rto(p)
                    if now - st[4] >= cur:
                        st[3], st[4] = min(2 * cur, timing.max_timeout), now
                    continue
                got[p, c] = True
                received[p] += 1
                if tries[p, c] == 0:  # Karn: only packets sent once give samples
                    sample = now - first_sent[p, c]
                    st = rtt[p]
                    if st[2] == 0:
                        st[0], st[1] = sample, sample / 2
                    else:
                        st[1] = 0.75 * st[1] + 0.25 * abs(st[0] - sample)
                        st[0] = 0.875 * st[0] + 0.125 * sample
                    st[2] += 1
                    if st[3] > timing.timeout:
                        st[3] -= (st[3] - timing.timeout) / 8192
                deadline[p, c] = math.inf
                if next_chunk[p] < npkts:
                    n = next_chunk[p]
                    next_chunk[p] += 1
                    sent_new(p, n, now)
                    out.append((0, (p, n)))
            # the timer: resend every expired packet unchanged
            expired = np.flatnonzero(deadline[p] <= now)
            for c in expired.tolist():
                tries[p, c] += 1
                if tries[p, c] % timing.backoff_after == 0:
                    rto[p, c] = min(rto[p, c] * 2, timing.max_timeout)
                deadline[p, c] = now + rto[p, c]
                out.append((0, (p, c)))
                stats["retransmissions"] += 1
        t = now + pre
        step = pc.send
        for dst, item in out:
            t += step
            ev.at(t, deliver, dst, item)
        cpu[p] += t - now
        ev.at(t, finish, p)

    def deliver(dst: int, item: Any) -> None:
        queue[dst].append(item)
        make_runnable(dst)
        dispatch()

    def timer(p: int, when: float) -> None:
        if timer_at[p] != when or done_at[p]:
            return  # superseded
        timer_at[p] = math.inf
        make_runnable(p)
        dispatch()

    def finish(p: int) -> None:
        free[0] += 1
        running[p] = False
        if p:
            if received[p] == npkts and not done_at[p]:
                done_at[p] = ev.now
                if all(done_at[1:]):
                    ev.stop()  # the background load would run forever
            if not done_at[p]:
                when = float(deadline[p].min())
                if when < timer_at[p]:
                    timer_at[p] = when
                    ev.at(when, timer, p, when)
        if queue[p] or (p and not done_at[p] and deadline[p].min() <= ev.now):
            make_runnable(p)
        else:
            asleep[p] = True
        dispatch()

    for p in range(1, nproc):
        make_runnable(p)
    runq.extend(range(nproc, nproc + hogs))
    ev.at(0.0, dispatch)
    # a retransmission storm that never drains (a timeout far below the CPU-bound
    # round trip, no backoff) is a livelock: stop at 100x the events of a clean run
    ev.run(until=3600.0, max_events=100 * (2 * workers * npkts + 100))
    if not all(done_at[1:]):
        raise RuntimeError(
            f"the loopback model made no end after {ev.events} events ({ev.now:.3g} s "
            f"simulated, {stats['retransmissions']} retransmissions): the timeout is far "
            "below the round trip this CPU allows"
        )
    return Result(
        "switchml-loopback",
        max(done_at[1:]),
        nbytes,
        workers,
        {
            "packets_per_worker": npkts,
            "cpu_switch": cpu[0],
            "cpu_worker": max(cpu[1:]),
            "cores": cores,
            "background": background,
            "timeslice": timeslice,
            "events": ev.events,
            **stats,
        },
    )


# ----------------------------------------------------------- reproduction
#: The paper's (Sapio et al., NSDI 2021) headline claims the reproduction is held against.
PAPER_CLAIMS = {
    "allreduce_10g": "up to 80% faster than ring all-reduce at 10 Gbps (network-bound models)",
    "allreduce_100g": "up to 67% faster than ring all-reduce at 100 Gbps",
    "training": "up to 5.5x training throughput end to end",
    "scaling": "constant allreduce time as workers are added (p4app-switchML)",
}


def three_methods(
    nbytes: int,
    workers: int,
    net: Network,
    sml: SwitchMLConfig | None = None,
    ring: RingConfig | None = None,
    ps: PSConfig | None = None,
) -> dict[str, Result]:
    """The allreduce time of each method for one setting."""
    return {
        "switchml": switchml_allreduce(nbytes, workers, net, sml or SwitchMLConfig()),
        "ring": ring_allreduce(nbytes, workers, net, ring or RingConfig()),
        "ps": ps_allreduce(nbytes, workers, net, ps or PSConfig(servers=workers)),
    }


def compare(
    *,
    params: int,
    workers: int,
    gbps: float,
    rtt_us: float = 10.0,
    rack_size: int | None = None,
    values_per_packet: int = 64,
    loss: float = 0.0,
    ps_servers: int | None = None,
    window: int | None = None,
    timeout_ms: float = 10.0,
    switch_pps: float | None = None,
    host_cost_us: float = 0.0,
    alpha_us: float = 20.0,
) -> tuple[Network, dict[str, Result]]:
    """One allreduce of ``params`` float32 gradients by the three methods, from
    the units a user types (µs, ms, Gbit/s; ``window`` None: the pool that fills
    the link, ``switch_pps`` None: line rate, ``ps_servers`` None: one server per
    worker): ``switchml simulate allreduce``."""
    net = Network(gbps=gbps, rtt=rtt_us * 1e-6, rack_size=rack_size)
    cfg = SwitchMLConfig(
        values_per_packet=values_per_packet,
        window=window,
        loss=loss,
        timeout=timeout_ms * 1e-3,
        switch_pps=switch_pps or math.inf,
        host_cost=host_cost_us * 1e-6,
    )
    res = three_methods(
        params * PARAM_BYTES,
        workers,
        net,
        cfg,
        RingConfig(alpha=alpha_us * 1e-6),
        PSConfig(servers=ps_servers or workers, chunk=512 << 10, alpha=alpha_us * 1e-6),
    )
    return net, res


def what_if_grid(
    *,
    params: int,
    gbps: Sequence[float],
    workers: Sequence[int],
    rtt_us: float = 10.0,
    values_per_packet: int = 64,
    rack_size: int | None = None,
    cal: Any = None,
    loss: float = 0.0,
    ps_servers: int | None = None,
) -> list[dict]:
    """:func:`what_if` for every link rate × worker count (``switchml simulate
    what-if``), rates outermost."""
    return [
        what_if(
            nbytes=params * PARAM_BYTES,
            gbps=g,
            workers=n,
            rtt=rtt_us * 1e-6,
            values_per_packet=values_per_packet,
            rack_size=rack_size,
            cal=cal,
            loss=loss,
            ps_servers=ps_servers,
        )
        for g in gbps
        for n in workers
    ]


def reproduction(
    *,
    gbps: Sequence[float] = (10.0, 100.0),
    workers: int = 8,
    models: Sequence[ModelProfile] | None = None,
    values_per_packet: Sequence[int] = (64, 256),
    rtt: float = 10e-6,
) -> list[dict]:
    """Rows of the reproduction table: per link rate and model, the allreduce time
    of the whole gradient and the iteration time of each method, and SwitchML's
    speedup over the ring. PS is sharded over ``workers`` dedicated servers."""
    rows = []
    for g in gbps:
        net = Network(gbps=g, rtt=rtt)
        for model in models or paper_models():
            ring_cfg = RingConfig()
            ps_cfg = PSConfig(servers=workers, chunk=512 << 10)

            def ring_t(nb: int, _net: Network = net, _c: RingConfig = ring_cfg) -> float:
                return ring_allreduce(nb, workers, _net, _c).time

            def ps_t(nb: int, _net: Network = net, _c: PSConfig = ps_cfg) -> float:
                return ps_allreduce(nb, workers, _net, _c).time

            row: dict[str, Any] = {
                "gbps": g,
                "workers": workers,
                "model": model.name,
                "params_m": model.params / 1e6,
                "compute_ms": model.compute * 1e3,
                "ring_ms": ring_t(model.nbytes) * 1e3,
                "ps_ms": ps_t(model.nbytes) * 1e3,
            }
            it_ring = iteration_time(model, ring_t)
            it_ps = iteration_time(model, ps_t)
            row["ring_iter_ms"] = it_ring.time * 1e3
            row["ps_iter_ms"] = it_ps.time * 1e3
            for v in values_per_packet:
                cfg = SwitchMLConfig(values_per_packet=v)

                def sml_t(nb: int, _net: Network = net, _c: SwitchMLConfig = cfg) -> float:
                    return switchml_allreduce(nb, workers, _net, _c).time

                t = sml_t(model.nbytes)
                it = iteration_time(model, sml_t)
                row[f"sml{v}_ms"] = t * 1e3
                row[f"sml{v}_iter_ms"] = it.time * 1e3
                row[f"sml{v}_speedup"] = row["ring_ms"] / (t * 1e3)
                row[f"sml{v}_train_speedup"] = it_ring.time / it.time
            rows.append(row)
    return rows


def scaling(
    *,
    model: ModelProfile | None = None,
    gbps: float = 100.0,
    workers: Sequence[int] = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    rack_size: int = 32,
    values_per_packet: int = 256,
) -> list[dict]:
    """Allreduce time of one model's gradient as workers are added: one switch up
    to ``rack_size`` workers, then a two-level tree of racks of ``rack_size``."""
    model = model or resnet50()
    rows = []
    for n in workers:
        net = Network(gbps=gbps, rack_size=rack_size if n > rack_size else None)
        res = three_methods(
            model.nbytes,
            n,
            net,
            SwitchMLConfig(values_per_packet=values_per_packet),
            ps=PSConfig(servers=max(1, n // 8), chunk=512 << 10),
        )
        rows.append(
            {
                "workers": n,
                "racks": net.racks(n),
                **{f"{k}_ms": r.time * 1e3 for k, r in res.items()},
            }
        )
    return rows


def reproduction_markdown(rows: list[dict], scale: list[dict] | None = None) -> str:
    """The reproduction (and scaling) tables as markdown."""
    lines = [
        "| Gbps | model | params (M) | compute (ms) | ring (ms) | PS (ms) "
        "| SwitchML 256 B (ms) | SwitchML 1 KB (ms) | allreduce speedup 256 B / 1 KB "
        "| training speedup 256 B / 1 KB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gbps']:g} | {r['model']} | {r['params_m']:.1f} | {r['compute_ms']:.0f} "
            f"| {r['ring_ms']:.1f} | {r['ps_ms']:.1f} | {r['sml64_ms']:.1f} | {r['sml256_ms']:.1f} "
            f"| {r['sml64_speedup']:.2f}x / {r['sml256_speedup']:.2f}x "
            f"| {r['sml64_train_speedup']:.2f}x / {r['sml256_train_speedup']:.2f}x |"
        )
    if scale:
        lines += [
            "",
            "| workers | racks | SwitchML (ms) | ring (ms) | PS (ms) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in scale:
            lines.append(
                f"| {r['workers']} | {r['racks']} | {r['switchml_ms']:.2f} "
                f"| {r['ring_ms']:.2f} | {r['ps_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot_speedup(
    rows: list[dict], path: str, scale: list[dict] | None = None, values_per_packet: int = 256
) -> None:
    """Bars of SwitchML's speedup over the ring (allreduce and training) per model
    at each link rate, the paper's claims as dashed lines; with ``scale``, a last
    panel of allreduce time against the number of workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["gbps"] for r in rows})
    panels = len(rates) + (1 if scale else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))
    axes = np.atleast_1d(axes)
    claims = {10.0: 1.80, 100.0: 1.67}
    big = 4 * values_per_packet
    keys = [
        ("sml64_speedup", "allreduce, 256 B packets"),
        (f"sml{values_per_packet}_speedup", f"allreduce, {big} B packets"),
        ("sml64_train_speedup", "training iteration, 256 B packets"),
        (f"sml{values_per_packet}_train_speedup", f"training iteration, {big} B packets"),
    ]
    for ax, g in zip(axes, rates):
        sub = [r for r in rows if r["gbps"] == g]
        x = np.arange(len(sub))
        w = 0.2
        for k, (key, label) in enumerate(keys):
            ax.bar(x + (k - 1.5) * w, [r[key] for r in sub], w, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if g in claims:
            ax.axhline(
                claims[g],
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"paper: allreduce up to {claims[g]:.2f}x (+{claims[g] - 1:.0%})",
            )
        ax.set_ylim(0, 2.1)
        ax.set_xticks(x, [r["model"] for r in sub])
        ax.set_title(f"{g:g} Gbps, {sub[0].get('workers', 8)} workers")
        ax.set_ylabel("speedup over ring all-reduce")
        ax.legend(fontsize=7, loc="lower center", ncol=2, framealpha=0.9)
    if scale:
        ax = axes[-1]
        n = [r["workers"] for r in scale]
        for key, label in (
            ("switchml_ms", "SwitchML"),
            ("ring_ms", "ring"),
            ("ps_ms", "PS (n/8 servers)"),
        ):
            ax.plot(n, [r[key] for r in scale], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers (racks of 32 above 32)")
        ax.set_ylabel("allreduce time (ms)")
        ax.set_title("ResNet-50 gradient, 100 Gbps")
        ax.legend(fontsize=8)
    fig.suptitle("SwitchML vs ring all-reduce vs parameter server (bench.simulate model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ what-if
def what_if(
    *,
    nbytes: int,
    gbps: float,
    workers: int,
    rtt: float = 10e-6,
    values_per_packet: int = 64,
    rack_size: int | None = None,
    cal: Any = None,
    loss: float = 0.0,
    ps_servers: int | None = None,
) -> dict:
    """Predicted allreduce time of the three methods for one setting, the pool
    size that fills the link, and what it would take to emulate it with our code:
    emulator shards (the switch's packet rate over all ports ÷ one shard's
    measured packet rate) and worker cores (each worker's packet rate × its
    measured per-packet cost)."""
    net = Network(gbps=gbps, rtt=rtt, rack_size=rack_size)
    cfg = SwitchMLConfig(values_per_packet=values_per_packet, loss=loss)
    res = three_methods(
        nbytes,
        workers,
        net,
        cfg,
        ps=PSConfig(servers=ps_servers or workers, chunk=512 << 10),
    )
    pool = pool_to_fill(workers, net, cfg)
    link_pps = net.bytes_per_s / switchml_wire_bytes(values_per_packet)
    out = {
        "nbytes": nbytes,
        "gbps": gbps,
        "workers": workers,
        "values_per_packet": values_per_packet,
        "rtt_us": rtt * 1e6,
        "times_ms": {k: r.time * 1e3 for k, r in res.items()},
        "speedup_vs_ring": res["ring"].time / res["switchml"].time,
        "pool_to_fill": pool,
        "link_pps": link_pps,
        "switch_pps": link_pps * workers,
    }
    if cal is not None:
        # isolated per-packet costs at this packet size, times the in-situ factors
        # measured in a real multi-process run (kernel only: no socket I/O at all)
        v = values_per_packet
        out["shard_pps"] = cal.shard_pps_at(v) / cal.switch_in_situ
        out["shard_pps_kernel_only"] = cal.shard_pps_kernel_only_at(v)
        out["host_packet"] = cal.host_packet_at(v) * cal.host_in_situ
        out["shards"] = math.ceil(link_pps * workers / out["shard_pps"])
        out["shards_kernel_only"] = math.ceil(link_pps * workers / out["shard_pps_kernel_only"])
        out["worker_cores"] = math.ceil(link_pps * out["host_packet"])
    return out
