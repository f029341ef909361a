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


def summarize(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Medians per (rate, W, size, method), with ideal, efficiency and CPU."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault((r.rate_gbps, r.workers, r.nbytes, r.method), []).append(r)
    rows = []
    for (rate, w, nbytes, method), rs in sorted(groups.items()):
        med = statistics.median(r.time for r in rs)
        rows.append(
            {
                "rate_gbps": rate,
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
            }
        )
    return rows


def speedups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """SwitchML's speedup over ring and PS per (rate, W, size), with the theory."""
    by = {(r["rate_gbps"], r["workers"], r["nbytes"], r["method"]): r for r in rows}
    out = []
    for (rate, w, nbytes, method), r in sorted(by.items()):
        if method != "switchml":
            continue
        entry: dict[str, Any] = {"rate_gbps": rate, "workers": w, "nbytes": nbytes}
        for other in ("ring", "ps"):
            o = by.get((rate, w, nbytes, other))
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
    by = {(r["rate_gbps"], r["workers"], r["nbytes"], r["method"]): r for r in rows}
    head = (
        "| rate | W | size | SwitchML ms (ideal) | ring ms (ideal) | PS ms (ideal) "
        "| link ms (ideal) | speedup vs ring (theory) | vs PS (theory) "
        "| machine busy SwitchML / ring | our cores SwitchML (emulator) / ring |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for rate, w, nbytes in sorted({k[:3] for k in by}):
        pt = {m: by.get((rate, w, nbytes, m)) for m in METHODS}
        sw, ring = pt["switchml"], pt["ring"]
        lines.append(
            f"| {rate:g} Gb/s | {w} | {_mib(nbytes)} | {_cell(sw)} | {_cell(ring)} "
            f"| {_cell(pt['ps'])} | {_cell(pt['link'])} | {_speed(sw, ring)} "
            f"| {_speed(sw, pt['ps'])} | {_busy(sw)} / {_busy(ring)} "
            f"| {_cores(sw, True)} / {_cores(ring)} |"
        )
    return head + "\n".join(lines) + "\n"
