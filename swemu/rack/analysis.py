"""The records summarized: medians, speedups, how far the emulation is faithful,
the Markdown table.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .netns import METHODS
from .runner import Record

FAITHFUL_EFFICIENCY = 0.8  # measured within 1.25× of the link-bound time


def _uplink_bytes(r: Record, direction: str) -> float:
    """The bytes the busiest rack uplink carried in ``direction`` (up: toward the
    root, down: from it) during the record's collective; 0 with one rack."""
    pre = f"rack{direction}"
    return max((v for k, v in r.counters.items() if k.startswith(pre)), default=0.0)


def summarize(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Medians per (rate, oversubscription, W, size, method), with ideal,
    efficiency, CPU and the busiest rack uplink's bytes in each direction."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        key = (r.rate_gbps, r.oversubscription, r.workers, r.nbytes, r.method)
        groups.setdefault(key, []).append(r)
    rows = []
    for (rate, over, w, nbytes, method), rs in sorted(groups.items()):
        med = statistics.median(r.time for r in rs)
        rows.append(
            {
                "rate_gbps": rate,
                "oversubscription": over,
                "workers": w,
                "nbytes": nbytes,
                "method": method,
                "reps": len(rs),
                "median_s": med,
                "min_s": min(r.time for r in rs),
                "max_s": max(r.time for r in rs),
                "ideal_s": rs[0].ideal,
                "efficiency": rs[0].ideal / med,
                "ok": all(r.ok for r in rs),
                "retransmissions": sum(r.retransmissions for r in rs),
                "spurious": sum(int(r.counters.get("spurious", 0)) for r in rs),
                "wire_ideal_s": statistics.median(
                    r.counters.get("busiest_link_bytes", 0) for r in rs
                )
                * 8
                / (rate * 1e9),
                "drops": sum(int(r.counters.get("drops", 0)) for r in rs),
                "udp_errors_switch": sum(int(r.counters.get("udp_errors_switch", 0)) for r in rs),
                "udp_errors_workers": sum(int(r.counters.get("udp_errors_workers", 0)) for r in rs),
                "machine_busy": statistics.median(r.counters.get("machine_busy", 0) for r in rs),
                "ours_cores": statistics.median(r.counters.get("ours_cores", 0) for r in rs),
                "emulator_cores": statistics.median(
                    r.counters.get("emulator_cores", 0) for r in rs
                ),
                # per allreduce, the busiest uplink direction (every rep's, and the median)
                "uplink_up_bytes": statistics.median(_uplink_bytes(r, "up") for r in rs),
                "uplink_down_bytes": statistics.median(_uplink_bytes(r, "down") for r in rs),
                "uplink_max_bytes": max(
                    max(_uplink_bytes(r, "up"), _uplink_bytes(r, "down")) for r in rs
                ),
            }
        )
    return rows


def _key(r: dict[str, Any], method: str | None = None) -> tuple:
    return (
        r["rate_gbps"],
        r.get("oversubscription", 1.0),
        r["workers"],
        r["nbytes"],
        method or r["method"],
    )


def speedups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SwitchML's speedup over ring, PS and the flat switch per (rate,
    oversubscription, W, size), with the theory: time(other) / time(SwitchML)."""
    by = {_key(r): r for r in rows}
    out = []
    for (rate, over, w, nbytes, method), r in sorted(by.items()):
        if method != "switchml":
            continue
        entry: dict[str, Any] = {
            "rate_gbps": rate,
            "oversubscription": over,
            "workers": w,
            "nbytes": nbytes,
        }
        for other in ("ring", "ps", "flat"):
            o = by.get(_key(r, other))
            if o:
                entry[f"vs_{other}"] = o["median_s"] / r["median_s"]
                entry[f"vs_{other}_theory"] = o["ideal_s"] / r["ideal_s"]
        out.append(entry)
    return out


def faithful_up_to(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per method, the highest rate up to which every measured point (all W and
    sizes, at this and every lower rate) came within 1.25× of its link-bound
    time — i.e. the link, not the CPU, set the pace. None: not even the lowest."""
    out: dict[str, float | None] = {}
    for method in sorted({r["method"] for r in rows}):
        best = None
        for rate in sorted({r["rate_gbps"] for r in rows if r["method"] == method}):
            pts = [r for r in rows if r["method"] == method and r["rate_gbps"] == rate]
            if all(p["efficiency"] >= FAITHFUL_EFFICIENCY for p in pts):
                best = rate
            else:
                break
        out[method] = best
    return out


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    mark = "" if r["ok"] else " WRONG"
    return f"{r['median_s'] * 1e3:.0f} ({r['ideal_s'] * 1e3:.0f}){mark}"


def _speed(s: dict[str, Any] | None, o: dict[str, Any] | None) -> str:
    if not s or not o:
        return "–"
    return f"{o['median_s'] / s['median_s']:.2f}× ({o['ideal_s'] / s['ideal_s']:.2f}×)"


def _busy(r: dict[str, Any] | None) -> str:
    return f"{r['machine_busy'] * 100:.0f}%" if r else "–"


def _cores(r: dict[str, Any] | None, emulator: bool = False) -> str:
    if not r:
        return "–"
    return f"{r['ours_cores']:.2f}" + (f" ({r['emulator_cores']:.2f})" if emulator else "")


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per (rate, W, size): every method's median (and ideal) in ms,
    SwitchML's speedups with their theory, the machine's CPU busy fraction and
    the cores our processes used (the emulator's in brackets) during SwitchML
    and ring."""
    by = {_key(r): r for r in rows}
    head = (
        "| rate | W | size | SwitchML ms (ideal) | ring ms (ideal) | PS ms (ideal) "
        "| link ms (ideal) | speedup vs ring (theory) | vs PS (theory) "
        "| machine busy SwitchML / ring | our cores SwitchML (emulator) / ring |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for rate, over, w, nbytes in sorted({k[:4] for k in by}):
        pt = {m: by.get((rate, over, w, nbytes, m)) for m in METHODS}
        sw, ring = pt["switchml"], pt["ring"]
        lines.append(
            f"| {rate:g} Gb/s | {w} | {_mib(nbytes)} | {_cell(sw)} | {_cell(ring)} "
            f"| {_cell(pt['ps'])} | {_cell(pt['link'])} | {_speed(sw, ring)} "
            f"| {_speed(sw, pt['ps'])} | {_busy(sw)} / {_busy(ring)} "
            f"| {_cores(sw, True)} / {_cores(ring)} |"
        )
    return head + "\n".join(lines) + "\n"


def _per_tensor(r: dict[str, Any] | None) -> str:
    if not r:
        return "–"
    return f"{r['uplink_up_bytes'] / r['nbytes']:.2f} / {r['uplink_down_bytes'] / r['nbytes']:.2f}"


def _over(over: float) -> str:
    return f"{over:g}:1"


def _predicted(r: dict[str, Any] | None) -> str:
    if not r or not r.get("model_s"):
        return "–"
    return f"{r['model_s'] * 1e3:.0f} ({r['model_s'] / r['median_s'] - 1:+.0%})"


def fabric_table(rows: Sequence[dict[str, Any]], hosts: int) -> str:
    """Several racks: one line per (rate, oversubscription, W, size) with the
    fabric's (SwitchML through the racks' child switches), gloo's ring's and the
    flat switch's medians (and ideals) in ms, the fabric's speedup over the ring
    (theory), its time over the flat switch's, the bytes the busiest rack uplink
    carried per direction (up / down) per tensor byte for the fabric and the ring,
    and the scale model's predictions of the fabric and the ring with their
    errors, where the rows have them (``model_s``: :func:`swemu.model.racks.predict_rows`)."""
    by = {_key(r): r for r in rows}
    head = (
        "| rate | uplink (oversub.) | W | size | fabric ms (ideal) | ring ms (ideal) "
        "| one switch ms (ideal) | fabric vs ring (theory) | fabric / one switch "
        "| uplink bytes / S, fabric ↑ / ↓ | ring ↑ / ↓ | model ms, fabric (error) / ring (error) "
        "| machine busy fabric / ring / one switch |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for key in sorted({k[:4] for k in by}):
        rate, over, w, nbytes = key
        sw, ring, flat = (by.get((*key, m)) for m in ("switchml", "ring", "flat"))
        ratio = f"{sw['median_s'] / flat['median_s']:.2f}" if sw and flat else "–"
        lines.append(
            f"| {rate:g} Gb/s | {rate * hosts / over:g} Gb/s ({_over(over)}) | {w} "
            f"| {_mib(nbytes)} | {_cell(sw)} | {_cell(ring)} | {_cell(flat)} "
            f"| {_speed(sw, ring)} | {ratio} | {_per_tensor(sw)} | {_per_tensor(ring)} "
            f"| {_predicted(sw)} / {_predicted(ring)} "
            f"| {_busy(sw)} / {_busy(ring)} / {_busy(flat)} |"
        )
    return head + "\n".join(lines) + "\n"
