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
and the worker's :class:`~swemu.protocol.worker.protocol.WorkerProtocol`), real
loss and real timers. Slow (~10 µs a packet), used by the tests to check the fast
model on small cases.

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
and per-packet costs (:mod:`.calibrate`); runnable processes, and
``background`` CPU-bound ones standing for other load, queue for cores; the
workers' retransmission timers fire when round trips grow too long.

Units: seconds, bytes, bits per second for links.

One module per job: :mod:`.network` (framing, event loop, links, results),
:mod:`.switchml` (the fast model), :mod:`.reference` (the packet-level
reference), :mod:`.ring`, :mod:`.ps`, :mod:`.zoo` (the models' profiles),
:mod:`.iteration` (training iterations), :mod:`.loopback` (the emulator's
loopback setup), :mod:`.calibrate` (what a packet costs here, measured),
:mod:`.reports` (the reproduction and its report), :mod:`.racks` (the two-level
tree's prediction of ``switchml cluster run --racks``, calibrated on its run).
The names below are the package's public ones; ``switchml simulate`` is the
command.

May import: swemu.protocol, swemu.core, swemu.launch (the reference drives both
sides' sans-IO engines, the switch's and the worker's of swemu.protocol.worker;
the calibration runs them, an emulator, and hostlib workers by their command line).
"""

from __future__ import annotations

from .iteration import Iteration, buckets, iteration_time
from .loopback import LoopbackTiming, simulate_loopback
from .network import (
    ETHERNET_FRAMING,
    IPV4_TCP,
    IPV4_UDP,
    PARAM_BYTES,
    SWITCHML_HEADER,
    EventLoop,
    Fifo,
    Network,
    Result,
    switchml_overhead,
    switchml_wire_bytes,
    tcp_wire_factor,
)
from .ps import PSConfig, ps_allreduce
from .reference import switchml_reference
from .reports import (
    PAPER_CLAIMS,
    compare,
    plot_speedup,
    reproduction,
    reproduction_markdown,
    scaling,
    three_methods,
    what_if,
    what_if_grid,
)
from .ring import RingConfig, ring_allreduce
from .switchml import (
    SwitchMLConfig,
    loss_delays,
    packets_per_worker,
    pool_to_fill,
    switchml_allreduce,
)
from .zoo import (
    GPU_FLOPS,
    MODELS,
    Layer,
    ModelProfile,
    bert_base,
    lstm_lm,
    paper_models,
    resnet50,
    vgg19,
    with_compute,
)

__all__ = [
    "ETHERNET_FRAMING",
    "GPU_FLOPS",
    "IPV4_TCP",
    "IPV4_UDP",
    "MODELS",
    "PAPER_CLAIMS",
    "PARAM_BYTES",
    "SWITCHML_HEADER",
    "EventLoop",
    "Fifo",
    "Iteration",
    "Layer",
    "LoopbackTiming",
    "ModelProfile",
    "Network",
    "PSConfig",
    "Result",
    "RingConfig",
    "SwitchMLConfig",
    "bert_base",
    "buckets",
    "compare",
    "iteration_time",
    "loss_delays",
    "lstm_lm",
    "packets_per_worker",
    "paper_models",
    "plot_speedup",
    "pool_to_fill",
    "ps_allreduce",
    "reproduction",
    "reproduction_markdown",
    "resnet50",
    "ring_allreduce",
    "scaling",
    "simulate_loopback",
    "switchml_allreduce",
    "switchml_overhead",
    "switchml_reference",
    "switchml_wire_bytes",
    "tcp_wire_factor",
    "three_methods",
    "vgg19",
    "what_if",
    "what_if_grid",
    "with_compute",
]
