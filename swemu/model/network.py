"""The network of the model: wire framing, the event loop, FIFO stages, links, and
the :class:`Result` every model returns.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Ethernet per frame on the wire: header 14, FCS 4, preamble+SFD 8, inter-frame gap 12.
ETHERNET_FRAMING = 14 + 4 + 8 + 12
IPV4_UDP = 20 + 8
SWITCHML_HEADER = 10  # PROTOCOL §1
#: TCP/IPv4 headers with the timestamp option, as Linux sends them.
IPV4_TCP = 20 + 32
PARAM_BYTES = 4  # float32 gradients; SwitchML sends int32 of the same size


def switchml_wire_bytes(values_per_packet: int, framing: int = ETHERNET_FRAMING) -> int:
    """Bytes one SwitchML packet of ``values_per_packet`` int32 takes on an Ethernet link
    (``framing``: what the link adds to an IP packet; 14 where only the header counts,
    as Linux's tbf counts)."""
    return 4 * values_per_packet + SWITCHML_HEADER + IPV4_UDP + framing


def switchml_overhead(values_per_packet: int) -> float:
    """Header overhead h: wire bytes per payload byte, minus 1."""
    return switchml_wire_bytes(values_per_packet) / (4 * values_per_packet) - 1.0


def tcp_wire_factor(mtu: int = 1500, framing: int = ETHERNET_FRAMING) -> float:
    """Wire bytes per payload byte of a bulk TCP stream at this MTU (1.062 at 1500)."""
    payload = mtu - IPV4_TCP
    return (mtu + framing) / payload


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
    ``framing``: the bytes a link adds to each IP packet (a real Ethernet's
    header, FCS, preamble and gap; 14 for links shaped by Linux's tbf, which
    counts the header only).
    """

    gbps: float = 100.0
    rtt: float = 10e-6
    rack_size: int | None = None
    spine_rtt: float = 2e-6
    oversubscription: float = 1.0
    framing: int = ETHERNET_FRAMING

    def __post_init__(self) -> None:
        if self.gbps <= 0 or self.rtt < 0 or self.spine_rtt < 0:
            raise ValueError("need gbps > 0 and non-negative round-trip times")
        if self.rack_size is not None and self.rack_size < 1:
            raise ValueError("rack_size must be at least 1")
        if self.oversubscription < 1:
            raise ValueError("oversubscription must be at least 1")
        if self.framing < 0:
            raise ValueError("framing must not be negative")

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
