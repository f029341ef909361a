"""The emulator at a glance: a pure ``render(snapshot, history)`` for rich.

:func:`render` draws one snapshot (see :mod:`swemu.observe.stats`) as a rich
renderable: the switch's addresses and limits, its rates and a goodput
sparkline of the last minute, then one panel per job (workers and addresses,
pool, slots in use per shadow set, rates, results, retransmissions, drops by
reason, the slowest worker); a switch of a fabric (docs/protocol.md §7) adds
its parent, its children and each level's packets to the header, and a job's
level in its tree (its parent and uplink counters, or the child switches among
its members) to the job's panel. It reads nothing but its arguments, so the same
function serves ``switchml-emu serve --tui`` (snapshots from the engine on a
loop timer), ``switchml-emu top`` (snapshots over gRPC), ``switchml-emu
stats`` (one snapshot, no history) and the tests (``Console(record=True)``).

Rates come from :class:`History`, which keeps the totals of the snapshots of
the last minute: a rate is the difference of the two latest snapshots'
counters over the difference of their ``time`` (the emulator's monotonic
clock). A job whose counters went down was registered again; its new counts
are taken as the delta.

Goodput is payload aggregated: each contribution that was not a
retransmission (the ``aggregated`` counter) carries ``4 · 32 << size_code``
bytes of values, which the switch summed into its pool.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

Snapshot = dict[str, Any]

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
#: Job counters whose per-second rate the view shows.
RATE_KEYS = ("pkts_in", "pkts_out", "multicast", "unicast", "retransmissions", "goodput_bytes")
DROP_REASONS = (
    ("drop_malformed", "malformed"),
    ("drop_wrong_size", "wrong size"),
    ("drop_slot_range", "slot range"),
)
#: Drop reasons shown only once they happened: a packet sent to the wrong
#: data-plane process exists only with ``serve --shards``.
RARE_DROP_REASONS = (("drop_wrong_shard", "wrong shard"),)


#: Why jobs were freed (a snapshot's ``released``), as the view names them.
FREED_REASONS = (
    ("explicit", "released"),  # every worker closed its context
    ("idle", "expired"),  # idle timeout
    ("evicted", "evicted"),  # idle, and a new job needed the room
    ("replaced", "replaced"),  # rank 0 registered the session again
)


def freed_text(released: dict[str, int]) -> Text:
    """``freed N (released a, expired b, …)``: jobs no longer on the switch, by
    reason (only the reasons that happened)."""
    total = sum(int(v) for v in released.values())
    t = _pairs(("freed", fmt_count(total)))
    parts = [(label, int(released.get(k, 0))) for k, label in FREED_REASONS]
    parts += [(k, int(v)) for k, v in released.items() if k not in dict(FREED_REASONS)]
    shown = [f"{label} {fmt_count(n)}" for label, n in parts if n]
    if shown:
        t.append(" (" + ", ".join(shown) + ")", style="dim")
    return t


def _drop_reasons(counts: dict[str, int]) -> tuple[tuple[str, str], ...]:
    """The drop reasons to show for these counters (the rare ones when non-zero)."""
    return DROP_REASONS + tuple((k, label) for k, label in RARE_DROP_REASONS if counts.get(k))


def payload_bytes(size_code: int) -> int:
    """Bytes of values in one packet of ``size_code`` (docs/protocol.md §1)."""
    return 4 * (32 << size_code)


def job_totals(job: dict[str, Any]) -> dict[str, int]:
    """The counters of one snapshot job that rates are computed from."""
    c = job["counters"]
    out = {k: int(c.get(k, 0)) for k in RATE_KEYS if k != "goodput_bytes"}
    out["goodput_bytes"] = int(c.get("aggregated", 0)) * payload_bytes(job["size_code"])
    return out


@dataclass
class _Sample:
    time: float
    jobs: dict[tuple[int, int], dict[str, int]]  # (session_id, index) -> job_totals
    switch_pkts_in: int


@dataclass
class History:
    """Totals of recent snapshots (``window`` seconds), for rates and the sparkline."""

    window: float = 60.0
    samples: deque[_Sample] = field(default_factory=deque)

    def add(self, snap: Snapshot) -> None:
        """Record a snapshot; a snapshot not newer than the last one is ignored."""
        t = float(snap["time"])
        if self.samples and t <= self.samples[-1].time:
            return
        jobs = {(j["session_id"], j["index"]): job_totals(j) for j in snap["jobs"]}
        self.samples.append(_Sample(t, jobs, int(snap["counters"].get("pkts_in", 0))))
        while len(self.samples) > 2 and t - self.samples[1].time >= self.window:
            self.samples.popleft()

    @staticmethod
    def _delta(new: _Sample, old: _Sample) -> dict[tuple[int, int], dict[str, int]]:
        out = {}
        for key, cur in new.jobs.items():
            prev = old.jobs.get(key, {})
            # a counter that went down belongs to a job registered again: count from 0
            out[key] = {k: v - prev.get(k, 0) if v >= prev.get(k, 0) else v for k, v in cur.items()}
        return out

    def _interval_rates(self, new: _Sample, old: _Sample) -> dict[Any, dict[str, float]]:
        dt = new.time - old.time
        rates: dict[Any, dict[str, float]] = {}
        total = dict.fromkeys(RATE_KEYS, 0.0)
        for key, d in self._delta(new, old).items():
            rates[key] = {k: v / dt for k, v in d.items()}
            for k, v in rates[key].items():
                total[k] += v
        rates[None] = total
        return rates

    def rates(self) -> dict[Any, dict[str, float]] | None:
        """Per-second rates between the two latest snapshots: ``rates[(sid, index)]``
        per job and ``rates[None]`` summed over jobs; None before two snapshots."""
        if len(self.samples) < 2:
            return None
        return self._interval_rates(self.samples[-1], self.samples[-2])

    def goodput_series(self) -> list[tuple[float, float, float]]:
        """``(start, end, goodput in bit/s)`` for every interval between snapshots."""
        return [
            (a.time, b.time, 8 * self._interval_rates(b, a)[None]["goodput_bytes"])
            for a, b in pairwise(self.samples)
        ]


def sparkline(
    series: list[tuple[float, float, float]], now: float, width: int, span: float = 60.0
) -> tuple[str, float]:
    """``width`` block characters for the values of ``series`` over ``[now - span, now]``,
    scaled to their peak; a column no interval covers (before the history starts)
    is blank. Returns the line and the peak."""
    if width <= 0:
        return "", 0.0
    step = span / width
    cols: list[float | None] = []
    for c in range(width):
        mid = now - span + (c + 0.5) * step
        lo, hi = mid - step / 2, mid + step / 2
        # the intervals overlapping this column, weighted by their overlap
        acc = weight = 0.0
        for start, end, value in series:
            ov = min(end, hi) - max(start, lo)
            if ov > 0:
                acc += value * ov
                weight += ov
        cols.append(acc / weight if weight > 0 else None)
    peak = max((v for v in cols if v is not None), default=0.0)
    top = len(SPARK_BLOCKS) - 1
    chars = []
    for v in cols:
        if v is None:
            chars.append(" ")
        elif peak <= 0:
            chars.append(SPARK_BLOCKS[0])
        else:
            chars.append(SPARK_BLOCKS[min(top, round(v / peak * top))])
    return "".join(chars), peak


# ------------------------------------------------------------------ formatting
def fmt_count(n: int) -> str:
    """A counter as the view shows it: ``1,234,567``."""
    return f"{int(n):,}"


def fmt_rate(x: float) -> str:
    """Packets per second as the view shows them."""
    return f"{x:,.0f}"


def fmt_gbps(bits_per_s: float) -> str:
    """Bits per second as Gbit/s with three decimals."""
    return f"{bits_per_s / 1e9:.3f}"


def fmt_bytes(n: int) -> str:
    """A size in binary units: ``4.2 MiB``."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{int(x)} B" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    raise AssertionError("unreachable")


def fmt_duration(s: float) -> str:
    """Seconds as ``H:MM:SS``."""
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _pairs(*items: tuple[str, str], style: str = "bold") -> Text:
    """``label value  label value …`` with the values emphasised."""
    t = Text()
    for i, (label, value) in enumerate(items):
        if i:
            t.append("   ")
        t.append(f"{label} ")
        t.append(value, style=style)
    return t


def slowest_worker(job: dict[str, Any]) -> tuple[int, int, float] | None:
    """``(rank, last, share)`` of the worker most often last to complete a slot
    (``last`` counter; ties go to the lower rank), or None before any completion."""
    workers = job["workers"]
    total = sum(w.get("last", 0) for w in workers)
    if not workers or total == 0:
        return None
    w = max(workers, key=lambda w: (w.get("last", 0), -w["rank"]))
    return w["rank"], w["last"], w["last"] / total


def fault_totals(snap: Snapshot) -> dict[str, int] | None:
    """Injected faults by kind, switch-wide plus every job's; None when the
    snapshot says nothing about faults (an emulator without fault injection)."""
    parts = [snap.get("faults")] + [j.get("faults") for j in snap["jobs"]]
    if all(p is None for p in parts) and not snap.get("fault_configs"):
        return None
    total: dict[str, int] = {}
    for p in parts:
        for k, v in (p or {}).items():
            total[k] = total.get(k, 0) + int(v)
    return total


def _faults_text(faults: dict[str, int] | None, label: str = "faults injected") -> Text:
    """Only the kinds that happened: ``0`` when none did, ``off`` without fault injection."""
    if faults is None:
        return _pairs(("faults", "off"))
    items = [(k.replace("_", " "), fmt_count(v)) for k, v in sorted(faults.items()) if v]
    if not items:
        return _pairs((label, "0"))
    return Text(f"{label}: ").append_text(_pairs(*items, style="bold red"))


#: A job's uplink counters (docs/protocol.md §7), as the view names them.
UP_COUNTERS = (
    ("up_sent", "sent"),
    ("up_retransmissions", "resent"),
    ("up_results", "results"),
    ("up_ignored", "ignored"),
)


def _up_pairs(counts: dict[str, int]) -> Text:
    return _pairs(*((label, fmt_count(counts.get(k, 0))) for k, label in UP_COUNTERS))


def fabric_lines(snap: Snapshot) -> list[Text]:
    """The switch's place in a fabric (docs/protocol.md §7): its parent (a
    child) or none (a root) and its children; then each level's packets summed
    over its jobs: in from workers, in from child switches, up to the parent."""
    f = snap["fabric"]
    where = Text("fabric: ")
    if f.get("parent"):
        where.append_text(_pairs(("child of", f["parent"])))
        if f.get("parent_instance"):
            where.append(f" (instance {f['parent_instance']:x})", style="dim")
        if f.get("always_up"):
            where.append(", every job goes up", style="dim")
    else:
        where.append("root", style="bold")
    children = f.get("children") or []
    where.append("   ").append_text(
        _pairs(("children", ", ".join(children) if children else "none"))
    )
    from_workers = from_children = 0
    up: dict[str, int] = {}
    for job in snap["jobs"]:
        for w in job["workers"]:
            if w.get("child"):
                from_children += int(w.get("pkts_in", 0))
            else:
                from_workers += int(w.get("pkts_in", 0))
        for k, _ in UP_COUNTERS:
            up[k] = up.get(k, 0) + int(job["counters"].get(k, 0))
    levels = Text("levels: in ").append_text(
        _pairs(
            ("from workers", fmt_count(from_workers)),
            ("from child switches", fmt_count(from_children)),
        )
    )
    if f.get("parent"):
        levels.append("   up to the parent: ").append_text(_up_pairs(up))
    return [where, levels]


def job_level_text(job: dict[str, Any]) -> Text | None:
    """A job's level in its fabric tree: below the top (its parent, its uplink
    and the uplink's counters), or the top with child switches among its
    members; None for a job of a switch alone."""
    children = sum(1 for w in job["workers"] if w.get("child"))
    if job.get("parent"):
        t = _pairs(("up to", job["parent"]))
        if job.get("uplink"):
            t.append(f" from {job['uplink']}", style="dim")
        return t.append("   ").append_text(_up_pairs(job["counters"]))
    if children:
        return _pairs(
            (
                "top of the tree",
                f"{children} child switches, {len(job['workers']) - children} workers",
            )
        )
    return None


def _header(snap: Snapshot, rates: dict[str, float] | None, history: History | None) -> Group:
    lim = snap.get("limits") or {}
    jobs = snap["jobs"]
    title = Text("switchml-emu", style="bold cyan")
    if snap.get("version"):
        title.append(f" {snap['version']}", style="cyan")
    parts = [title]
    if snap.get("data_address"):
        parts.append(
            _pairs(
                ("data udp", snap["data_address"]),
                ("control grpc", snap.get("control_address", "?")),
            )
        )
    if "uptime" in snap:
        parts.append(_pairs(("up", fmt_duration(snap["uptime"]))))
    line1 = Text("   ").join(parts)

    max_jobs = lim.get("max_jobs")
    glob = snap["counters"]
    totals = {k: 0 for k, _ in DROP_REASONS + RARE_DROP_REASONS}
    for j in jobs:
        for k in totals:
            totals[k] += j["counters"].get(k, 0)
    line2 = _pairs(("jobs", f"{len(jobs)}/{max_jobs}" if max_jobs else str(len(jobs))))
    if "released" in snap:
        line2.append("   ").append_text(freed_text(snap["released"]))
    line2.append("   ").append_text(
        _pairs(
            (
                "pool memory",
                f"{fmt_bytes(snap['memory_in_use'])} / {fmt_bytes(snap['max_pool_memory'])}",
            ),
            ("switch pkts in", fmt_count(glob.get("pkts_in", 0))),
        )
    )
    drops = Text("drops: ").append_text(
        _pairs(
            ("unknown source", fmt_count(glob.get("drop_unknown_source", 0))),
            *((label, fmt_count(totals[k])) for k, label in _drop_reasons(totals)),
        )
    )
    line3 = Text("   ").join([drops, _faults_text(fault_totals(snap))])
    cap = snap.get("capture")
    if cap:
        c = _pairs(("capture", f"{fmt_count(cap.get('packets', 0))} pkts"))
        if cap.get("dropped"):
            c.append(f" ({fmt_count(cap['dropped'])} not recorded, full)", style="yellow")
        line3 = Text("   ").join([line3, c])
    lines: list[RenderableType] = [line1, line2, line3]
    if snap.get("fabric") is not None:
        lines += fabric_lines(snap)
    if rates is not None:
        lines.append(
            _pairs(
                ("in", f"{fmt_rate(rates['pkts_in'])} pkt/s"),
                ("out", f"{fmt_rate(rates['pkts_out'])} pkt/s"),
                ("goodput", f"{fmt_gbps(8 * rates['goodput_bytes'])} Gbit/s"),
                style="bold green",
            )
        )
    if history is not None and history.samples:
        line, peak = sparkline(
            history.goodput_series(), history.samples[-1].time, 60, history.window
        )
        spark = Text(f"goodput, last {history.window:.0f} s ")
        spark.append(f"▕{line}▏", style="green")
        spark.append(f" peak {fmt_gbps(peak)} Gbit/s")
        lines.append(spark)
    return Group(*lines)


def _job_panel(job: dict[str, Any], rates: dict[str, float] | None) -> Panel:
    c = job["counters"]
    code = job["size_code"]
    pend, hold = job["slots_pending"], job["slots_holding"]
    rows: list[RenderableType] = [
        Text("slots in use  ").append_text(
            _pairs(
                *((f"set {s}:", f"{pend[s]} pending, {hold[s]} holding") for s in range(len(pend)))
            )
        )
    ]
    if rates is not None:
        rows.append(
            Text("rates         ").append_text(
                _pairs(
                    ("in", f"{fmt_rate(rates['pkts_in'])} pkt/s"),
                    ("out", f"{fmt_rate(rates['pkts_out'])} pkt/s"),
                    ("goodput", f"{fmt_gbps(8 * rates['goodput_bytes'])} Gbit/s"),
                    ("retx", f"{fmt_rate(rates['retransmissions'])}/s"),
                    style="bold green",
                )
            )
        )
    rows.append(
        Text("packets       ").append_text(
            _pairs(
                ("in", fmt_count(c.get("pkts_in", 0))),
                ("aggregated", fmt_count(c.get("aggregated", 0))),
                ("retransmissions", fmt_count(c.get("retransmissions", 0))),
                ("out", fmt_count(c.get("pkts_out", 0))),
            )
        )
    )
    rows.append(
        Text("results       ")
        .append_text(
            _pairs(
                ("multicast", fmt_count(c.get("multicast", 0))),
                *(
                    # multicasts sent once to the job's loopback-broadcast port
                    [("broadcast", fmt_count(c["broadcast"]))] if c.get("broadcast") else []
                ),
                ("unicast", fmt_count(c.get("unicast", 0))),
            )
        )
        .append(" (retransmissions answered)", style="dim")
    )
    rows.append(
        Text("drops         ").append_text(
            _pairs(*((label, fmt_count(c.get(k, 0))) for k, label in _drop_reasons(c)))
        )
    )
    if "faults" in job:
        rows.append(Text("faults        ").append_text(_faults_text(job["faults"], "injected")))
    level = job_level_text(job)
    if level is not None:
        rows.append(Text("fabric        ").append_text(level))
    slow = slowest_worker(job)
    rows.append(
        Text("slowest       ").append_text(
            Text("—")
            if slow is None
            else _pairs(
                ("rank", str(slow[0])),
                ("last in", f"{fmt_count(slow[1])} slots ({slow[2]:.0%})"),
                style="bold yellow",
            )
        )
    )
    table = Table(box=None, pad_edge=False, header_style="bold dim")
    for name in ("rank", "address", "pkts in", "retransmissions", "last", "drops"):
        table.add_column(name, justify="left" if name == "address" else "right")
    for w in job["workers"]:
        addr = f"{w['ip']}:{w['udp_port']}" if w["ip"] is not None else "(not registered)"
        if w.get("child"):
            addr = f"child switch {w['child']} ({addr})"
        style = "yellow" if slow is not None and w["rank"] == slow[0] else None
        table.add_row(
            str(w["rank"]),
            addr,
            fmt_count(w.get("pkts_in", 0)),
            fmt_count(w.get("retransmissions", 0)),
            fmt_count(w.get("last", 0)),
            fmt_count(w.get("drops", 0)),
            style=style,
        )
    rows.append(table)
    title = (
        f"job {job['session_id']} · {job['num_workers']} workers · size code {code} "
        f"({32 << code} values) · pool {fmt_count(job['pool_size'])} slots · "
        f"{fmt_bytes(job['memory_bytes'])}"
    )
    return Panel(Group(*rows), title=title, title_align="left", border_style="blue")


def render(
    snapshot: Snapshot, history: History | None = None, *, max_jobs: int | None = 8
) -> RenderableType:
    """The whole view of one snapshot; ``history`` (which should already hold
    ``snapshot``) adds rates and the sparkline. At most ``max_jobs`` job panels
    are drawn (None: all), in registration order; a line counts the others."""
    rates = history.rates() if history is not None else None
    parts: list[RenderableType] = [
        _header(snapshot, None if rates is None else rates[None], history)
    ]
    jobs = snapshot["jobs"]
    shown = jobs if max_jobs is None else jobs[:max_jobs]
    for job in shown:
        jr = None
        if rates is not None:
            jr = rates.get((job["session_id"], job["index"]), dict.fromkeys(RATE_KEYS, 0.0))
        parts.append(_job_panel(job, jr))
    if len(shown) < len(jobs):
        parts.append(Text(f"… and {len(jobs) - len(shown)} more jobs", style="dim"))
    if not jobs:
        parts.append(Text("no jobs registered", style="dim"))
    return Group(*parts)


def render_stats(snapshot: Snapshot) -> RenderableType:
    """One snapshot in full (``switchml-emu stats``): every job, the socket
    layer's counters and the released jobs, no rates."""
    dp = snapshot.get("data_plane") or {}
    extra: list[RenderableType] = []
    if dp:
        extra.append(
            Text("data plane: ").append_text(
                _pairs(*((k.replace("_", " "), fmt_count(v)) for k, v in sorted(dp.items())))
            )
        )
    rel = snapshot.get("released") or {}
    if rel:
        lim = snapshot.get("limits") or {}
        rules = []
        if "idle_timeout" in lim:
            idle = lim["idle_timeout"]
            rules.append(f"idle timeout {'never' if idle is None else f'{idle:g} s'}")
        if "evict_after" in lim:
            ev = lim["evict_after"]
            rules.append(f"evict after {'never' if ev is None else f'{ev:g} s idle'}")
        extra.append(
            Text("jobs freed: ")
            .append_text(_pairs(*((label, fmt_count(rel.get(k, 0))) for k, label in FREED_REASONS)))
            .append("   " + ", ".join(rules) if rules else "", style="dim")
        )
    return Group(render(snapshot, None, max_jobs=None), *extra)
