"""Goodput under injected loss, as a ratio to the lossless run of the same invocation.

One emulator per loss level (``--loss-in P --loss-out P``, seeded), all running
at once; one group of W worker processes joined to every one of them. For each
repetition every level runs once (interleaved), so the machine's noise hits
all levels alike. The report is the median time per level, its goodput, the
ratio to the lossless level and the retransmissions it took.

Run: ``python -m bench loss [--levels 0,0.001,0.01,0.05] [--workers 4] [--size 16Mi]``.
"""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

from .allreduce import run_once, start_group, stop_group


def run(
    levels: list[float], workers: int, nbytes: int, code: int, reps: int, log=print
) -> dict[str, Any]:
    """Measure every loss level ``reps`` times, interleaved; return plain data."""
    from swemu.launch import EmulatorProcess

    with contextlib.ExitStack() as stack:
        targets = []
        for p in levels:
            emu = stack.enter_context(
                EmulatorProcess("--loss-in", str(p), "--loss-out", str(p), "--seed", "1")
            )
            targets.append((f"loss-{p:g}", emu.switch, emu.control, code))
        pipes, procs = start_group(workers, targets, gloo=False)
        times: dict[str, list[float]] = {name: [] for name, *_ in targets}
        retx: dict[str, list[int]] = {name: [] for name, *_ in targets}
        wrong: set[str] = set()
        for rep in range(reps):
            for name, *_ in targets:
                call = run_once(pipes, name, nbytes)
                t, r = call["time"], call["retransmissions"]
                if call["verified"] is False:
                    wrong.add(name)
                times[name].append(t)
                retx[name].append(r)
            log(f"repetition {rep + 1}/{reps} done")
        stop_group(pipes, procs)
    base = statistics.median(times[targets[0][0]])
    rows = []
    for (name, *_), p in zip(targets, levels):
        med = statistics.median(times[name])
        rows.append(
            {
                "loss": p,
                "median_s": med,
                "goodput_gbps": nbytes * 8 / med / 1e9,
                "goodput_ratio": base / med,
                "retransmissions": statistics.median(retx[name]),
                "all_s": times[name],
                "verified": name not in wrong,
            }
        )
    return {"workers": workers, "bytes": nbytes, "size_code": code, "reps": reps, "levels": rows}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"W={data['workers']}, {data['bytes'] / 2**20:g} MiB float32, size code "
        f"{data['size_code']}, loss in both directions, medians of {data['reps']}:",
        "",
        "| loss | median (ms) | goodput (Gbit/s) | goodput / lossless | retransmissions | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["levels"]:
        lines.append(
            f"| {r['loss'] * 100:g}% | {r['median_s'] * 1e3:.1f} | "
            f"{r['goodput_gbps']:.2f} | {r['goodput_ratio']:.2f} | "
            f"{r['retransmissions']:.0f} | {'ok' if r['verified'] else 'WRONG'} |"
        )
    return "\n".join(lines) + "\n"
