"""Turn a capture of SwitchML traffic into a per-slot timeline of what happened.

:func:`timeline` reads captured datagrams (from :func:`swemu.pcap.read_pcap`)
and classifies each SwitchML packet the way the switch of PROTOCOL.md §2 sees
it; :func:`render_timeline` draws the events as a rich table, one section per
(switch port, slot); :func:`summary` counts them per worker. The
``switchml-emu decode`` command is a thin wrapper around these three.

How packets are told apart:

* **Direction.** The switch listens on ports 0xBEE0–0xBEEF: a datagram *to* one
  of them is a worker's packet, one *from* one of them is a result. When both
  ports are in that range, the address already seen as the switch's decides.
* **Retransmission.** A worker's packet on a slot whose previous packet from the
  same worker, to the same switch port and slot, used the same set. That is the
  switch's own rule (the worker's bitmap bit is still set): normally the resend
  has the same tsi and job_number too; if they differ, the worker forgot to flip
  the set (PROTOCOL.md §3) and the event carries a note saying so.
* **Multicast or unicast.** A round of a (switch, slot, set) runs from its
  first new contribution to the next new contribution after its result (the
  set was released and is used again). Its first result is the multicast, and
  copies with identical bytes to other workers within ``instant`` seconds
  belong to it (``group``, ``fanout``). Every later result of the round answers
  a retransmission: a unicast. A capture taken on a worker host only sees that
  worker's copy, so a multicast may show a fanout of 1; and if the worker's
  copy was lost on the way, the unicast that replaces it is the first result
  the capture shows and is labelled a multicast.
* **Malformed.** A datagram on the SwitchML ports that :func:`swemu.wire.decode`
  rejects (or that the capture truncated) is shown with the decoder's reason,
  never raised.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from . import wire
from .pcap import CapturedPacket

CONTRIBUTION = "contribution"
RETRANSMISSION = "retransmission"
MULTICAST = "result (multicast)"
UNICAST = "result (unicast)"
MALFORMED = "malformed"
KINDS = (CONTRIBUTION, RETRANSMISSION, MULTICAST, UNICAST, MALFORMED)

TO_SWITCH = "to_switch"
FROM_SWITCH = "from_switch"

_KIND_STYLE = {
    CONTRIBUTION: "green",
    RETRANSMISSION: "yellow",
    MULTICAST: "cyan",
    UNICAST: "magenta",
    MALFORMED: "bold red",
}

Address = tuple[int, int]


def is_switchml_port(port: int) -> bool:
    """True for the switch's ports 0xBEE0–0xBEEF (``port & 0xFFF0 == 0xBEE0``)."""
    return port & wire.UDP_PORT_MASK == wire.UDP_PORT_BASE


def format_addr(addr: Address) -> str:
    """``(ip, port)`` as ``a.b.c.d:port``."""
    return f"{wire.int_to_ipv4(addr[0])}:{addr[1]}"


@dataclass
class Event:
    """One SwitchML packet of a capture, decoded and classified.

    Header fields are None for a malformed packet; ``values`` holds the first
    few values only. ``group`` numbers the multicast a result belongs to and
    ``fanout`` counts the workers it reached in the capture.
    """

    frame: int  # record number in the capture file (from 1)
    time: float  # seconds since the first SwitchML packet of the capture
    direction: str  # TO_SWITCH or FROM_SWITCH
    worker: Address
    switch: Address
    kind: str
    length: int
    size_code: int | None = None
    job_number: int | None = None
    tsi: int | None = None
    set: int | None = None
    slot: int | None = None
    e0: int | None = None
    e1: int | None = None
    values: tuple[int, ...] = ()
    group: int | None = None
    fanout: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: addresses as ``ip:port`` strings, values as a list."""
        d = asdict(self)
        d["worker"] = format_addr(self.worker)
        d["switch"] = format_addr(self.switch)
        d["values"] = list(self.values)
        return d


def _direction(pkt: CapturedPacket, switches: set[Address]) -> str | None:
    to_sw, from_sw = is_switchml_port(pkt.dst[1]), is_switchml_port(pkt.src[1])
    if to_sw and from_sw:  # both ends on 0xBEEx: trust what the rest of the capture says
        return FROM_SWITCH if pkt.src in switches and pkt.dst not in switches else TO_SWITCH
    if to_sw:
        return TO_SWITCH
    return FROM_SWITCH if from_sw else None


@dataclass
class _Multicast:
    """The one multicast of a (switch, slot, set) round, as far as the capture shows it."""

    group: int
    ts: float
    payload: bytes
    workers: set[Address]
    members: list[Event]


def timeline(
    packets: Iterable[CapturedPacket], *, values_shown: int = 4, instant: float = 1e-3
) -> list[Event]:
    """Decode and classify the SwitchML packets of a capture, in capture order.

    ``instant`` is how far apart (in seconds) the copies of one multicast may
    be; ``values_shown`` how many values each event keeps.
    """
    pkts = list(packets)
    switches: set[Address] = set()
    for p in pkts:  # the switch's addresses, from the unambiguous packets
        to_sw, from_sw = is_switchml_port(p.dst[1]), is_switchml_port(p.src[1])
        if to_sw != from_sw:
            switches.add(p.dst if to_sw else p.src)

    events: list[Event] = []
    t0: float | None = None
    # (worker, switch, slot) -> the worker's last packet there: (set, tsi, job_number)
    last_sent: dict[tuple[Address, Address, int], tuple[int, int, int]] = {}
    # (switch, slot, set) -> this round's multicast (None: not seen yet)
    rounds: dict[tuple[Address, int, int], _Multicast | None] = {}
    n_groups = 0

    for i, p in enumerate(pkts):
        direction = _direction(p, switches)
        if direction is None:
            continue
        if t0 is None:
            t0 = p.ts
        to_sw = direction == TO_SWITCH
        worker, switch = (p.src, p.dst) if to_sw else (p.dst, p.src)
        rel = round(p.ts - t0, 9)  # captures resolve µs or ns: drop float noise
        ev = Event(p.frame or i + 1, rel, direction, worker, switch, MALFORMED, len(p.payload))
        events.append(ev)
        try:
            pkt = wire.decode(p.payload)
        except wire.PacketError as exc:
            ev.note = ("truncated in the capture: " if p.truncated else "") + str(exc)
            continue
        ev.size_code, ev.job_number, ev.tsi = pkt.size_code, pkt.job_number, pkt.tsi
        ev.set, ev.slot, ev.e0, ev.e1 = pkt.set, pkt.slot, pkt.e0, pkt.e1
        ev.values = tuple(int(v) for v in pkt.values[:values_shown])
        if pkt.tsi >= wire.EXP_TSI_BASE:
            ev.note = f"exponent packet of chunk {pkt.tsi - wire.EXP_TSI_BASE}"
        rkey = (switch, pkt.slot, pkt.set)

        if to_sw:
            key = (worker, switch, pkt.slot)
            prev = last_sent.get(key)
            if prev is not None and prev[0] == pkt.set:
                ev.kind = RETRANSMISSION
                if prev[1:] != (pkt.tsi, pkt.job_number):
                    ev.note = (
                        f"set {pkt.set} not flipped (or the session was registered again): "
                        f"the switch takes this for a retransmission of tsi {prev[1]} "
                        f"job {prev[2]}"
                    )
            else:
                ev.kind = CONTRIBUTION
                if rounds.get(rkey) is not None:
                    rounds[rkey] = None  # the set was released and is used again: a new round
            last_sent[key] = (pkt.set, pkt.tsi, pkt.job_number)
            continue

        # A round of (slot, set) has one multicast, one copy per worker; any
        # other result of the round answers a retransmission: a unicast.
        payload = bytes(p.payload)
        mc = rounds.get(rkey)
        if mc is None:
            mc = rounds[rkey] = _Multicast(n_groups, p.ts, payload, {worker}, [ev])
            n_groups += 1
        elif worker not in mc.workers and payload == mc.payload and p.ts - mc.ts <= instant:
            mc.workers.add(worker)
            mc.members.append(ev)
        else:
            ev.kind = UNICAST
            ev.fanout = 1
            continue
        ev.kind = MULTICAST
        ev.group = mc.group
        for member in mc.members:
            member.fanout = len(mc.members)
    return events


def _slot_key(ev: Event) -> tuple[bool, int, int, int]:
    # sections in (port, slot) order; malformed events (no slot) last
    return (ev.slot is None, ev.switch[1], -1 if ev.slot is None else ev.slot, ev.switch[0])


_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("port:slot", "right"),
    ("time ms", "right"),
    ("frame", "right"),
    ("dir", "left"),
    ("worker", "left"),
    ("set", "right"),
    ("job", "right"),
    ("tsi", "right"),
    ("e0/e1", "right"),
    ("values", "left"),
    ("kind", "left"),
    ("note", "left"),
)


def render_timeline(
    events: list[Event], *, slot: int | None = None, limit: int | None = None
) -> Table:
    """A rich table of ``events``, one section per (switch port, slot).

    ``slot`` keeps one slot's events; ``limit`` keeps the first ``limit`` events
    (in capture order, after the slot filter). Malformed packets, which have no
    slot, come last and are left out when ``slot`` is given.
    """
    shown = [e for e in events if slot is None or e.slot == slot]
    total = len(shown)
    if limit is not None:
        shown = shown[: max(limit, 0)]
    by_slot: dict[tuple[bool, int, int, int], list[Event]] = defaultdict(list)
    for ev in shown:
        by_slot[_slot_key(ev)].append(ev)

    table = Table(title=f"SwitchML timeline: {len(shown)} of {total} events", title_justify="left")
    for name, justify in _COLUMNS:
        table.add_column(name, justify=justify, no_wrap=name != "note")
    keys = sorted(by_slot)
    for n, key in enumerate(keys):
        rows = by_slot[key]
        for j, ev in enumerate(rows):
            label = ""
            if j == 0:
                label = "malformed" if ev.slot is None else f"{ev.switch[1]:#x}:{ev.slot}"
            kind = ev.kind
            if ev.kind == MULTICAST:
                kind += f" #{ev.group} x{ev.fanout}"
            table.add_row(
                label,
                f"{ev.time * 1e3:.3f}",
                str(ev.frame),
                "→ switch" if ev.direction == TO_SWITCH else "← switch",
                format_addr(ev.worker),
                _opt(ev.set),
                _opt(ev.job_number),
                _opt(ev.tsi),
                "" if ev.e0 is None else f"{ev.e0}/{ev.e1}",
                _values(ev),
                Text(kind, style=_KIND_STYLE[ev.kind]),
                ev.note,
                end_section=j == len(rows) - 1 and n < len(keys) - 1,
            )
    if len(shown) < total:
        table.caption = f"{total - len(shown)} more events not shown (--limit)"
    return table


def _opt(x: int | None) -> str:
    return "" if x is None else str(x)


def _values(ev: Event) -> str:
    if ev.kind == MALFORMED:
        return f"{ev.length} bytes"
    more = ", …" if ev.size_code is not None and len(ev.values) < 32 << ev.size_code else ""
    return "[" + ", ".join(map(str, ev.values)) + more + "]"


def summary(events: list[Event]) -> dict[str, Any]:
    """Counts of a timeline, JSON-ready: per worker, results, malformed packets.

    Per worker ``packets`` counts what the worker sent (malformed ones too),
    ``results_*`` what it received. ``results.multicast`` counts multicasts
    (one per group), ``results.multicast_packets`` their copies.
    """
    per_worker: dict[Address, Counter[str]] = defaultdict(Counter)
    fields = {
        CONTRIBUTION: "contributions",
        RETRANSMISSION: "retransmissions",
        MULTICAST: "results_multicast",
        UNICAST: "results_unicast",
    }
    for ev in events:
        c = per_worker[ev.worker]
        if ev.direction == TO_SWITCH:
            c["packets"] += 1
        if ev.kind == MALFORMED:
            c["malformed"] += 1
        else:
            c[fields[ev.kind]] += 1
    names = (
        "packets",
        "contributions",
        "retransmissions",
        "results_multicast",
        "results_unicast",
        "malformed",
    )
    multicast = [e for e in events if e.kind == MULTICAST]
    return {
        "events": len(events),
        "duration": max((e.time for e in events), default=0.0),
        "switches": sorted({format_addr(e.switch) for e in events}),
        "slots": len({(e.switch, e.slot) for e in events if e.slot is not None}),
        "workers": {
            format_addr(w): {n: c[n] for n in names} for w, c in sorted(per_worker.items())
        },
        "results": {
            "multicast": len({e.group for e in multicast}),
            "multicast_packets": len(multicast),
            "unicast": sum(e.kind == UNICAST for e in events),
        },
        "retransmissions": sum(e.kind == RETRANSMISSION for e in events),
        "malformed": sum(e.kind == MALFORMED for e in events),
    }
