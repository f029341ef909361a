"""The emulated racks of ``switchml cluster run --racks`` in the model: the
two-level tree's prediction of a measured fabric, calibrated on the same run.

What a run tells the model (:class:`RackRun`): the host links' rate, the racks'
size and their uplinks' oversubscription, the workers, the tensor, the packet
size and the window of its jobs, and what a packet takes on a shaped link as
Linux's tbf counts it (the IP packet and its 14-byte Ethernet header: no FCS,
preamble or gap, :data:`TBF_FRAMING`). One number is fitted
(:func:`fit_host_cost`): the per-packet cost of a worker's host that makes the
one-switch model (:class:`~swemu.model.network.Network` without racks) take the
time the run measured for its flat switch -- one switch serving every worker
over the same links, in the same invocation. Everything a 2-core machine adds
beyond the links (the workers' and the switch's CPU, scheduling) lands in that
one cost. The fabric's prediction (:func:`predict`) is then the two-level tree
(``Network(rack_size=hosts, oversubscription=...)``: worker uplink, rack
switch, rack uplink, root, and back) with that cost; the ring's is
:func:`~swemu.model.ring.ring_allreduce` over the same racks (one ring edge
per rack uplink and direction).

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .network import Network
from .ring import RingConfig, ring_allreduce
from .switchml import SwitchMLConfig, packets_per_worker, switchml_allreduce

#: What tbf adds to an IP packet: the Ethernet header (it counts the frame it
#: queues, without FCS, preamble and inter-frame gap).
TBF_FRAMING = 14


@dataclass(frozen=True)
class RackRun:
    """One measured point of ``switchml cluster run --racks R``.

    ``rtt``: a round trip worker ↔ switch outside serialization (the kernel's
    veth and bridge path and the processes' wake-ups; the window hides it
    unless it is many packet times). A rack switch ↔ root round trip is taken
    to be the same.
    """

    rate_gbps: float
    workers: int
    hosts: int
    oversubscription: float
    nbytes: int
    values_per_packet: int
    window: int
    mtu: int = 9000
    rtt: float = 200e-6

    def network(self, two_level: bool) -> Network:
        """The links of the run: one switch, or racks of ``hosts`` under a root."""
        return Network(
            gbps=self.rate_gbps,
            rtt=self.rtt,
            rack_size=self.hosts if two_level else None,
            spine_rtt=self.rtt,
            oversubscription=self.oversubscription if two_level else 1.0,
            framing=TBF_FRAMING,
        )

    def switchml(self, host_cost: float, two_level: bool) -> float:
        """The model's time of one allreduce (seconds)."""
        cfg = SwitchMLConfig(
            values_per_packet=self.values_per_packet, window=self.window, host_cost=host_cost
        )
        return switchml_allreduce(self.nbytes, self.workers, self.network(two_level), cfg).time

    def ring(self) -> float:
        """The model's time of gloo's ring over the racks (ranks rack by rack)."""
        net = self.network(two_level=True)
        return ring_allreduce(self.nbytes, self.workers, net, RingConfig(mtu=self.mtu)).time


def fit_host_cost(run: RackRun, measured_one_switch: float) -> float:
    """The per-packet host cost (seconds) with which the one-switch model takes
    ``measured_one_switch``; 0 when the links alone already take that long. The
    model's time grows with the cost, so a bisection finds it."""
    if run.switchml(0.0, two_level=False) >= measured_one_switch:
        return 0.0
    packets = packets_per_worker(
        run.nbytes, SwitchMLConfig(values_per_packet=run.values_per_packet), run.window, True
    )
    lo, hi = 0.0, 2.0 * measured_one_switch / max(1, packets)  # a host that slow is too slow
    for _ in range(50):
        mid = (lo + hi) / 2
        if run.switchml(mid, two_level=False) < measured_one_switch:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Prediction:
    """The model beside one measured point (seconds)."""

    host_cost: float  # fitted on the one switch's measurement
    one_switch: float  # the one-switch model with that cost (= the measurement, or the links)
    fabric: float  # the two-level tree with that cost
    links_only: float  # the two-level tree with free hosts: the links' bound
    ring: float  # gloo's ring over the same racks


def predict(run: RackRun, measured_one_switch: float) -> Prediction:
    """The two-level tree's prediction of the fabric, calibrated on the one
    switch measured in the same run (see the module)."""
    cost = fit_host_cost(run, measured_one_switch)
    return Prediction(
        host_cost=cost,
        one_switch=run.switchml(cost, two_level=False),
        fabric=run.switchml(cost, two_level=True),
        links_only=run.switchml(0.0, two_level=True),
        ring=run.ring(),
    )


def predict_rows(
    rows: list[dict[str, Any]],
    *,
    hosts: int,
    values_per_packet: int,
    window_of: Callable[[int], int],
    mtu: int = 9000,
) -> dict[tuple, float]:
    """The prediction of every fabric point of ``switchml cluster run --racks``'s
    summary ``rows`` (its JSON's ``summary``: medians per rate, oversubscription,
    W, size and method) that has the flat switch measured beside it: written
    into the rows (the fabric's ``model_s``, ``model_host_cost_s``,
    ``model_links_s``; the ring's ``model_s``) and returned as ``{(rate,
    oversubscription, W, size): seconds}``. ``window_of(W)``: the jobs' window."""

    def key(r: dict[str, Any], method: str) -> tuple:
        return (r["rate_gbps"], r.get("oversubscription", 1.0), r["workers"], r["nbytes"], method)

    by = {key(r, r["method"]): r for r in rows}
    out = {}
    for (rate, over, w, nbytes, method), row in by.items():
        flat = by.get((rate, over, w, nbytes, "flat"))
        if method != "switchml" or flat is None:
            continue
        run = RackRun(rate, w, hosts, over, nbytes, values_per_packet, window_of(w), mtu)
        p = predict(run, flat["median_s"])
        row.update(model_s=p.fabric, model_host_cost_s=p.host_cost, model_links_s=p.links_only)
        ring = by.get((rate, over, w, nbytes, "ring"))
        if ring is not None:
            ring["model_s"] = p.ring
        out[(rate, over, w, nbytes)] = p.fabric
    return out
