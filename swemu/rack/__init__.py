"""The paper's experiment on one machine: emulated racks with rate-limited links.

Topology of one rack (all inside network namespaces this module creates, named
with a per-run prefix ``swml<pid>-``)::

    ns <p>w0: veth <p>0w 10.201.0.10 ─┐                 ┌─ ns <p>sw: bridge <p>br 10.201.0.1
    ns <p>w1: veth <p>1w 10.201.0.11 ─┼── port <p>0s ───┤   (the emulator serves here)
    ...                               └── port <p>1s ───┘

Every worker has one veth pair to the switch namespace, whose far end is a port of
a Linux bridge; each direction is shaped with ``tc tbf`` on its egress (worker end:
worker→switch, bridge port: switch→worker), optionally with ``netem`` delay/loss
under it. The emulator listens on the bridge's address, so SwitchML packets cross
the worker's two shaped links exactly as they would cross a ToR switch's ports, and
the workers' gloo TCP traffic crosses the same bridge (uplink of the sender,
downlink of the receiver). Nothing leaves the namespaces: the addresses
(10.201.0.0/24 by default) exist only there, and there is no route out.

R racks of H workers (``Rack(W, racks=R)``, worker i in rack i // H) are R such
racks, each switch namespace ``<p>sw<k>`` with its bridge ``<p>b<k>`` on
10.201.k.0/24, under a root namespace; each rack's **uplink** is one more veth
pair, shaped each direction at H × rate / oversubscription::

    rack 0: w0..w3 ── ns <p>sw0: bridge <p>b0 10.201.0.1  (child emulator, serve --parent)
                          │  routes; veth <p>u0 10.201.2.10   ← tbf: rack 0 → root
                          │
                          │                    ← tbf on port <p>r0: root → rack 0
                      ns <p>root: bridge <p>rb 10.201.2.1  (root emulator)
                          │                    ← tbf on port <p>r1: root → rack 1
                          │
                          │  routes; veth <p>u1 10.201.2.11   ← tbf: rack 1 → root
    rack 1: w4..w7 ── ns <p>sw1: bridge <p>b1 10.201.1.1  (child emulator, serve --parent)

    ``flat``: every worker also has a veth <p>{i}f 10.201.3.(10+i) to a port <p>{i}t of
    bridge <p>fb 10.201.3.1 in ns <p>flat: one switch serving every worker (the baseline)

Workers route to the other racks through their rack's switch, which routes through
its uplink; a child emulator serves on its bridge's address and its uplink sockets
bind there too, so the root reaches them over the uplinks (docs/protocol.md §7).
Ring traffic between racks crosses the uplinks as SwitchML's partial aggregates
and results do; the flat switch's links carry only its own job.

:class:`Rack` builds and removes the namespaces; :func:`run_benchmark` starts the
switches (:func:`start_switches`: the emulator in the switch namespace; with
several racks the root and a child per rack; the flat switch) and one rack worker
(``python -m cli.rack_worker``, a hostlib program) per worker namespace, then
measures SwitchML, gloo ring allreduce, a parameter server, one shaped link and
the flat switch, interleaved, with CPU and link counters sampled around every
timed collective. :func:`summarize`, :func:`markdown_table` (:func:`fabric_table`
with several racks) and :func:`plot_speedup` turn the records into the artefacts
``switchml cluster run`` writes. :func:`cleanup_leftovers`
removes what killed runs left behind.

Needs root (``ip netns``), iproute2's ``ip`` and ``tc``, and the ``tbf`` qdisc
(``netem`` only for ``delay``/``loss``).

One module per job: :mod:`.netns` (namespaces, leftovers, signals), :mod:`.rack`
(building and shaping the rack), :mod:`.cpu` (CPU counters), :mod:`.runner`
(the run and its records), :mod:`.analysis` (summaries, the table), :mod:`.plot`, :mod:`.results`
(the JSON). ``switchml cluster`` is the command; the training benchmarks
(``python -m bench training``) build on :class:`Rack` and :func:`start_emulator`.

May import: swemu.protocol, swemu.launch. The emulator and the workers (hostlib
programs: ``cli.rack_worker``) are started by command lines, not imported.
"""

from __future__ import annotations

from .analysis import (
    FAITHFUL_EFFICIENCY,
    fabric_table,
    faithful_up_to,
    markdown_table,
    speedups,
    summarize,
)
from .cpu import CPUSample, machine_cpu, process_cpu, udp_errors
from .netns import (
    ETH_HEADER,
    GLOO_PORT,
    METHODS,
    PREFIX_RE,
    SWITCH_CONTROL_PORT,
    SWITCH_UDP_PORT,
    ClusterError,
    Interrupted,
    cleanup_leftovers,
    default_prefix,
    leftovers,
    list_namespaces,
    namespaces_permitted,
    netns_pids,
    signals_as_exceptions,
)
from .plot import plot_speedup
from .rack import Rack, Shaping
from .results import code_state, write_json
from .runner import (
    BenchConfig,
    Record,
    ideal_time,
    run_benchmark,
    start_emulator,
    start_switches,
)

__all__ = [
    "ETH_HEADER",
    "FAITHFUL_EFFICIENCY",
    "GLOO_PORT",
    "METHODS",
    "PREFIX_RE",
    "SWITCH_CONTROL_PORT",
    "SWITCH_UDP_PORT",
    "BenchConfig",
    "CPUSample",
    "ClusterError",
    "Interrupted",
    "Rack",
    "Record",
    "Shaping",
    "cleanup_leftovers",
    "code_state",
    "default_prefix",
    "fabric_table",
    "faithful_up_to",
    "ideal_time",
    "leftovers",
    "list_namespaces",
    "machine_cpu",
    "markdown_table",
    "namespaces_permitted",
    "netns_pids",
    "plot_speedup",
    "process_cpu",
    "run_benchmark",
    "signals_as_exceptions",
    "speedups",
    "start_emulator",
    "start_switches",
    "summarize",
    "udp_errors",
    "write_json",
]
