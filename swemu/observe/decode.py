"""Turn a capture of SwitchML traffic into a per-slot timeline of what happened.

:class:`Decoder` reads captured datagrams a batch at a time (from
:func:`swemu.observe.pcap.read_pcap_batches`) and classifies each SwitchML packet the
way the switch of docs/protocol.md §2 sees it, returning events as soon as they are
final; :func:`timeline` does it for a whole capture; :func:`render_timeline`
draws events as a rich table, one section per (switch port, slot);
:class:`Summary` / :func:`summary` count them per worker. ``switchml-emu
decode`` streams the Decoder's events as rows.

How packets are told apart:

* **The switch's ports.** Given, or 0xBEE0–0xBEEF plus those
  :func:`infer_switch_ports` finds: the port on one side of every packet that
  parses as SwitchML (a worker's port appears only in its own packets).
* **Direction.** A datagram *to* a switch port is a worker's packet, one *from*
  a switch port is a result. When both ports are switch ports, the address
  already seen as the switch's decides.
* **Retransmission.** A worker's packet on a slot whose previous packet from the
  same worker, to the same switch port and slot, used the same set. That is the
  switch's own rule (the worker's bitmap bit is still set): normally the resend
  has the same tsi and job_number too; if they differ, the worker forgot to flip
  the set (docs/protocol.md §3) and the event carries a note saying so.
* **Multicast or unicast.** A round of a (switch, slot, set) runs from its
  first new contribution to the next new contribution after its result (the
  set was released and is used again). Its first result is the multicast, and
  copies with identical bytes to other workers within ``instant`` seconds
  belong to it (``group``, ``fanout``). Every later result of the round answers
  a retransmission: a unicast. A capture taken on a worker host only sees that
  worker's copy, so a multicast may show a fanout of 1; and if the worker's
  copy was lost on the way, the unicast that replaces it is the first result
  the capture shows and is labelled a multicast.
* **A child switch.** In a capture the emulator wrote, the MAC of a switch's
  uplink marks the packets between a child switch of a fabric and its parent
  (docs/protocol.md §7; :mod:`swemu.observe.pcap`): the uplink is the
  "worker" of such a packet and the other end the switch, whatever the
  ports. Its packets are what a worker's are -- contributions (the child's
  partial aggregates), retransmissions, and the parent's results -- and the
  event says it came from or went to a child (``child``). A capture at a
  child switch shows both its levels: its workers' packets at its own port,
  its partial aggregates going up to its parent's and the results coming back.
* **Malformed.** A datagram on the SwitchML ports that :func:`swemu.protocol.wire.decode`
  rejects (or that the capture truncated) is shown with the decoder's reason,
  never raised.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Collection, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from swemu.observe.pcap import CapturedPacket, PacketBatch, gather
from swemu.protocol import wire

if TYPE_CHECKING:
    from rich.console import JustifyMethod
    from rich.table import Table

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


@dataclass(slots=True)
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
    child: bool = False  # the worker side is a child switch's uplink (a fabric)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: addresses as ``ip:port`` strings, values as a list."""
        d = asdict(self)
        d["worker"] = format_addr(self.worker)
        d["switch"] = format_addr(self.switch)
        d["values"] = list(self.values)
        return d


def looks_like_switchml(batch: PacketBatch) -> np.ndarray:
    """Per packet of ``batch``: does its payload pass :func:`swemu.protocol.wire.decode`'s
    checks (header, msg_type 1, the length its size code says)? Computed for the
    whole batch at once."""
    b0 = gather(batch.data, batch.start, 1)[:, 0].astype(np.int64)
    return (
        (batch.length >= wire.HEADER_LEN)
        & (b0 >> 4 == wire.MSG_TYPE)
        & (batch.length == wire.HEADER_LEN + (128 << (b0 & 7)))
    )


def infer_switch_ports(
    sport: np.ndarray, dport: np.ndarray, known: Collection[int] = ()
) -> set[int]:
    """The switch's UDP ports, from the ports of packets that parse as SwitchML.

    Every SwitchML packet has a switch port on one side; a worker's port only
    appears in that worker's packets. So the port found in the most packets is
    a switch port; the packets it explains are set aside and the search goes on
    until every packet is explained (several switch ports: shards, or several
    switches). Packets already explained by ``known`` ports are left out. A tie
    (one worker: its port and the switch's appear equally often) goes to a port
    in 0xBEE0-0xBEEF, then to the destination of the earliest packet, which a
    worker sends: the switch never speaks first.
    """
    sport = np.asarray(sport, np.int64)
    dport = np.asarray(dport, np.int64)
    known_arr = np.fromiter(known, np.int64)
    left = ~(np.isin(sport, known_arr) | np.isin(dport, known_arr))
    sport, dport = sport[left], dport[left]
    found: set[int] = set()
    while sport.size:
        # a packet counts once for a port, also when both its ports are that port
        ports = np.concatenate([sport, dport[dport != sport]])
        counts = np.bincount(ports, minlength=0x10000)
        best = np.flatnonzero(counts == counts.max())
        if best.size > 1:
            in_range = best[(best & wire.UDP_PORT_MASK) == wire.UDP_PORT_BASE]
            if in_range.size:
                best = in_range
            elif int(dport[0]) in best:
                best = np.array([dport[0]])
        port = int(best[0])
        found.add(port)
        keep = (sport != port) & (dport != port)
        sport, dport = sport[keep], dport[keep]
    return found


@dataclass
class _Multicast:
    """The one multicast of a (switch, slot, set) round, as far as the capture shows it."""

    group: int
    ts: float
    payload: bytes
    workers: set[Address]
    members: list[Event]


class Decoder:
    """Classify a capture's SwitchML packets batch by batch, in capture order.

    Feed it :class:`swemu.observe.pcap.PacketBatch` es (from
    :func:`swemu.observe.pcap.read_pcap_batches`); each :meth:`feed` returns the events
    that are final, and :meth:`finish` the rest. An event is held back until its
    multicast can have no more copies (the capture's clock passed its time plus
    ``instant``) so that its ``fanout`` is final when it is returned; at most
    ``hold`` events are held.

    ``ports`` are the switch's UDP ports; by default they are 0xBEE0-0xBEEF
    plus those :func:`infer_switch_ports` finds in each batch (a switch on any
    port, e.g. ``serve --port 48890``). Fields are read from the whole batch
    with numpy; Python runs per SwitchML packet only for the classification
    rules, which depend on the packets before.
    """

    def __init__(
        self,
        *,
        ports: Collection[int] | None = None,
        values_shown: int = 4,
        instant: float = 1e-3,
        hold: int = 1 << 16,
    ) -> None:
        if values_shown < 0 or instant < 0 or hold < 1:
            raise ValueError("values_shown and instant must not be negative, hold positive")
        self.infer = ports is None
        self._is_port = np.zeros(0x10000, bool)
        if ports is None:
            self._is_port[wire.UDP_PORT_BASE : wire.UDP_PORT_BASE + 16] = True
        else:
            for port in ports:
                if not 0 <= port <= 0xFFFF:
                    raise ValueError(f"port {port} is not a UDP port")
                self._is_port[port] = True
        self.values_shown = values_shown
        self.instant = instant
        self.hold = hold
        self.switches: set[Address] = set()
        self.inferred: set[int] = set()
        self._t0: float | None = None
        self._max_ts = -np.inf
        # (worker, switch, slot) -> the worker's last packet there: (set, tsi, job_number)
        self._last_sent: dict[tuple[Address, Address, int], tuple[int, int, int]] = {}
        # (switch, slot, set) -> this round's multicast (None: not seen yet)
        self._rounds: dict[tuple[Address, int, int], _Multicast | None] = {}
        self._groups = 0
        self._pending: deque[tuple[float, Event]] = deque()

    @property
    def ports(self) -> list[int]:
        """The UDP ports taken for the switch's so far."""
        return np.flatnonzero(self._is_port).tolist()

    def feed(self, batch: PacketBatch) -> list[Event]:
        """Decode one batch; return the events that are now final, in capture order."""
        n = len(batch)
        if n:
            self._decode(batch)
            self._max_ts = max(self._max_ts, float(batch.ts.max()))
        out = []
        pending = self._pending
        horizon = self._max_ts - self.instant
        while pending and (pending[0][0] < horizon or len(pending) > self.hold):
            out.append(pending.popleft()[1])
        return out

    def finish(self) -> list[Event]:
        """The events still held back (the capture ended)."""
        out = [ev for _, ev in self._pending]
        self._pending.clear()
        return out

    def _decode(self, batch: PacketBatch) -> None:
        sport, dport = batch.src_port, batch.dst_port
        valid = looks_like_switchml(batch)
        none = np.zeros(len(batch), bool)
        up_src = none if batch.src_uplink is None else batch.src_uplink
        up_dst = none if batch.dst_uplink is None else batch.dst_uplink
        marked = up_src | up_dst  # a child switch's uplink at one end: the direction is plain
        if self.infer and (valid & ~marked).any():
            known = self.ports
            plain = valid & ~marked
            new = infer_switch_ports(sport[plain], dport[plain], known)
            if new:
                self.inferred |= new
                self._is_port[list(new)] = True
        to_sw = (self._is_port[dport] & ~up_dst) | up_src
        from_sw = (self._is_port[sport] & ~up_src) | up_dst
        rows = np.flatnonzero(to_sw | from_sw)
        if rows.size == 0:
            return
        # the switch's addresses, from the packets whose direction is plain
        plain = rows[to_sw[rows] != from_sw[rows]]
        side_ip = np.where(to_sw[plain], batch.dst_ip[plain], batch.src_ip[plain])
        side_port = np.where(to_sw[plain], dport[plain], sport[plain])
        for key in np.unique((side_ip << 16) | side_port).tolist():
            self.switches.add((key >> 16, key & 0xFFFF))

        # every header field of the batch's SwitchML rows at once
        hdr = gather(batch.data, batch.start[rows], wire.HEADER_LEN)
        fields = hdr.view(wire.HEADER_DTYPE).reshape(-1)
        pi = fields["pool_index"].astype(np.int64)
        k = self.values_shown
        vals = (
            gather(batch.data, batch.start[rows] + wire.HEADER_LEN, 4 * k)
            .view(wire.VALUE_DTYPE)
            .reshape(-1, k)
        )
        cols = (
            batch.frame[rows],
            batch.ts[rows],
            batch.src_ip[rows],
            sport[rows],
            batch.dst_ip[rows],
            dport[rows],
            batch.length[rows],
            batch.truncated[rows],
            valid[rows],
            to_sw[rows],
            from_sw[rows],
            marked[rows],
            fields["type_size"] & 7,
            fields["job_number"],
            fields["tsi"],
            (pi >> 15) & 1,
            pi & wire.SLOT_MASK,
            fields["e0"],
            fields["e1"],
            batch.start[rows],
        )
        values = vals.tolist()
        data = batch.data
        switches, last_sent, rounds = self.switches, self._last_sent, self._rounds
        pending = self._pending
        instant = self.instant
        for j, row in enumerate(zip(*(c.tolist() for c in cols))):
            (frame, ts, sip, sp, dip, dp, length, trunc, ok, t_sw, f_sw, child) = row[:12]
            src, dst = (sip, sp), (dip, dp)
            if t_sw and f_sw:  # both ends on switch ports: trust what the rest says
                t_sw = not (src in switches and dst not in switches)
            worker, switch = (src, dst) if t_sw else (dst, src)
            if self._t0 is None:
                self._t0 = ts
            rel = round(ts - self._t0, 9)  # captures resolve µs or ns: drop float noise
            direction = TO_SWITCH if t_sw else FROM_SWITCH
            ev = Event(frame, rel, direction, worker, switch, MALFORMED, length, child=child)
            pending.append((ts, ev))
            if not ok:
                s = int(cols[-1][j])
                try:
                    wire.decode(data[s : s + length].tobytes())
                    reason = "not a SwitchML packet"  # unreachable: the checks agree
                except wire.PacketError as exc:
                    reason = str(exc)
                ev.note = ("truncated in the capture: " if trunc else "") + reason
                continue
            code, job, tsi, set_, slot, e0, e1, start = row[12:]
            ev.size_code, ev.job_number, ev.tsi = code, job, tsi
            ev.set, ev.slot, ev.e0, ev.e1 = set_, slot, e0, e1
            ev.values = tuple(values[j][: 32 << code])
            if tsi >= wire.EXP_TSI_BASE:
                ev.note = f"exponent packet of chunk {tsi - wire.EXP_TSI_BASE}"
            if child:
                said = "a child switch's partial aggregate" if t_sw else "to a child switch"
                ev.note = f"{said}; {ev.note}" if ev.note else said
            rkey = (switch, slot, set_)

            if t_sw:
                key = (worker, switch, slot)
                prev = last_sent.get(key)
                if prev is not None and prev[0] == set_:
                    ev.kind = RETRANSMISSION
                    if prev[1:] != (tsi, job):
                        ev.note = (
                            f"set {set_} not flipped (or the session was registered again): "
                            f"the switch takes this for a retransmission of tsi {prev[1]} "
                            f"job {prev[2]}"
                        )
                else:
                    ev.kind = CONTRIBUTION
                    if rounds.get(rkey) is not None:
                        rounds[rkey] = None  # the set was released and is used again
                last_sent[key] = (set_, tsi, job)
                continue

            # A round of (slot, set) has one multicast, one copy per worker; any
            # other result of the round answers a retransmission: a unicast.
            payload = data[start : start + length].tobytes()
            mc = rounds.get(rkey)
            if mc is None:
                mc = rounds[rkey] = _Multicast(self._groups, ts, payload, {worker}, [ev])
                self._groups += 1
            elif worker not in mc.workers and payload == mc.payload and ts - mc.ts <= instant:
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


def _batches(packets: Iterable[CapturedPacket], size: int = 4096) -> Iterator[PacketBatch]:
    chunk: list[CapturedPacket] = []
    first = 1
    for p in packets:
        chunk.append(p)
        if len(chunk) == size:
            yield PacketBatch.from_packets(chunk, first)
            first += len(chunk)
            chunk = []
    if chunk:
        yield PacketBatch.from_packets(chunk, first)


def decode_batches(batches: Iterable[PacketBatch], decoder: Decoder) -> Iterator[Event]:
    """The events of ``batches``, each as soon as it is final (see :class:`Decoder`)."""
    for batch in batches:
        yield from decoder.feed(batch)
    yield from decoder.finish()


def timeline(
    packets: Iterable[CapturedPacket],
    *,
    ports: Collection[int] | None = None,
    values_shown: int = 4,
    instant: float = 1e-3,
) -> list[Event]:
    """Decode and classify the SwitchML packets of a capture, in capture order.

    ``ports`` are the switch's UDP ports (default: 0xBEE0-0xBEEF and those
    inferred, see :class:`Decoder`); ``instant`` is how far apart (in seconds)
    the copies of one multicast may be; ``values_shown`` how many values each
    event keeps.
    """
    decoder = Decoder(ports=ports, values_shown=values_shown, instant=instant)
    return list(decode_batches(_batches(packets), decoder))


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
    from rich.table import Table
    from rich.text import Text

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
                format_addr(ev.worker) + (" (child)" if ev.child else ""),
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


_KIND_FIELD = {
    CONTRIBUTION: "contributions",
    RETRANSMISSION: "retransmissions",
    MULTICAST: "results_multicast",
    UNICAST: "results_unicast",
}


class Summary:
    """Counts of a timeline, kept up to date one event at a time (:meth:`add`),
    so that a decoder streaming its events can still report the whole capture."""

    NAMES = (
        "packets",
        "contributions",
        "retransmissions",
        "results_multicast",
        "results_unicast",
        "malformed",
    )

    def __init__(self) -> None:
        self.per_worker: dict[Address, Counter[str]] = defaultdict(Counter)
        self.kinds: Counter[str] = Counter()
        self.events = 0
        self.duration = 0.0
        self.switches: set[Address] = set()
        self.slots: set[tuple[Address, int]] = set()
        self.groups: set[int] = set()
        self.children: set[Address] = set()

    def add(self, ev: Event) -> None:
        """Count one event."""
        self.events += 1
        self.duration = max(self.duration, ev.time)
        self.switches.add(ev.switch)
        self.kinds[ev.kind] += 1
        if ev.child:
            self.children.add(ev.worker)
        c = self.per_worker[ev.worker]
        if ev.direction == TO_SWITCH:
            c["packets"] += 1
        if ev.kind == MALFORMED:
            c["malformed"] += 1
        else:
            c[_KIND_FIELD[ev.kind]] += 1
            self.slots.add((ev.switch, ev.slot))
        if ev.group is not None:
            self.groups.add(ev.group)

    def result(self) -> dict[str, Any]:
        """The counts, JSON-ready (see :func:`summary`)."""
        return {
            "events": self.events,
            "duration": self.duration,
            "switches": sorted(format_addr(s) for s in self.switches),
            "slots": len(self.slots),
            "workers": {
                format_addr(w): {n: c[n] for n in self.NAMES}
                for w, c in sorted(self.per_worker.items())
            },
            "results": {
                "multicast": len(self.groups),
                "multicast_packets": self.kinds[MULTICAST],
                "unicast": self.kinds[UNICAST],
            },
            "retransmissions": self.kinds[RETRANSMISSION],
            "malformed": self.kinds[MALFORMED],
            "children": sorted(format_addr(c) for c in self.children),
        }


def summary(events: Iterable[Event]) -> dict[str, Any]:
    """Counts of a timeline, JSON-ready: per worker, results, malformed packets.

    Per worker ``packets`` counts what the worker sent (malformed ones too),
    ``results_*`` what it received; ``children`` lists the "workers" that are
    child switches' uplinks. ``results.multicast`` counts multicasts
    (one per group), ``results.multicast_packets`` their copies.
    """
    s = Summary()
    for ev in events:
        s.add(ev)
    return s.result()
