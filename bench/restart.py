"""``python -m bench restart``: what a switch restart costs a running job.

One long-lived emulator and W worker processes allreducing a tensor in a loop,
each call's end time-stamped. The emulator is SIGKILLed at a random point of a
call and started again on the same ports (``--rounds`` times, the job going on
meanwhile). For each restart: how long the emulator took to serve again (from
the kill: process start, cache load, ports bound), and how long the job lost
(from the kill to the first call every rank completed after the new emulator
serves: a call whose last results were already on their way when the switch
died can still end just after the kill and says nothing about the restart; a
call's normal duration is in the table too). The workers' side of it is restart recovery
(docs/protocol.md §5): no result for 0.5 s, ``Status``, ``Resume``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import random
import statistics
import time
from typing import Any


def _rank(rank: int, world: int, control: str, n: int, out: Any, stop: Any) -> None:
    """One rank: calls until the call number ``stop`` holds (-1: not yet said;
    every rank stops after the same call)."""
    import numpy as np

    import hostlib

    x = np.ones(n, np.float32) * (rank + 1)
    with hostlib.connect(control=control, rank=rank, world_size=world, session_id=0x5EB) as ctx:
        y = np.empty_like(x)
        ctx.allreduce(x, out=y)  # warm
        call = 0
        while stop.value < 0 or call <= stop.value:
            ctx.allreduce(x, out=y)
            out.put((rank, call, time.monotonic(), bool(y[0] == world * (world + 1) / 2)))
            call += 1


def run(workers: int = 4, size: int = 16 << 20, rounds: int = 5, seed: int = 1) -> dict:
    """Restart the emulator ``rounds`` times under a running job (see the module)."""
    from swemu.launch import EmulatorProcess

    rng = random.Random(seed)
    emu = EmulatorProcess().start()
    ports = (emu.data[1], emu.control_addr[1])
    mp = multiprocessing.get_context("spawn")
    out, stop = mp.Queue(), mp.Value("q", -1)
    procs = [
        mp.Process(target=_rank, args=(r, workers, emu.control, size // 4, out, stop))
        for r in range(workers)
    ]
    for p in procs:
        p.start()
    done: dict[int, dict[int, float]] = {}  # call -> rank -> end time
    wrong = 0

    def drain(until: float) -> None:
        nonlocal wrong
        while time.monotonic() < until:
            try:
                rank, call, t, ok = out.get(timeout=0.05)
            except queue.Empty:
                continue
            done.setdefault(call, {})[rank] = t
            wrong += not ok

    def complete_after(t: float) -> float | None:
        ends = [max(r.values()) for r in done.values() if len(r) == workers]
        later = [e for e in ends if e > t]
        return min(later) if later else None

    records = []
    try:
        drain(time.monotonic() + 5.0)  # calls under way, timed
        for _ in range(rounds):
            drain(time.monotonic() + rng.uniform(0.5, 1.5))
            kill = time.monotonic()
            emu.kill()
            emu = EmulatorProcess(port=ports[0], control_port=ports[1]).start()
            serving = time.monotonic()
            deadline = serving + 60
            while complete_after(serving) is None and time.monotonic() < deadline:
                drain(time.monotonic() + 0.1)
            first = complete_after(serving)
            records.append(
                {
                    "emulator_start_s": serving - kill,
                    "job_lost_s": (first - kill) if first is not None else None,
                }
            )
        drain(time.monotonic() + 1.0)
    finally:
        stop.value = max(done, default=0) + 2  # every rank stops after that call
        drain(time.monotonic() + 2.0)
        for p in procs:
            p.join(20)
            if p.is_alive():
                p.kill()
        emu.stop()
    complete = sorted(max(r.values()) for r in done.values() if len(r) == workers)
    gaps = [b - a for a, b in itertools.pairwise(complete)]
    return {
        "workers": workers,
        "size": size,
        "call_s": statistics.median(gaps) if gaps else None,
        "calls": len(complete),
        "wrong": wrong,
        "restarts": records,
    }


def markdown(data: dict) -> str:
    rows = [
        f"| {i + 1} | {r['emulator_start_s']:.2f} | "
        + (f"{r['job_lost_s']:.2f} |" if r["job_lost_s"] is not None else "— |")
        for i, r in enumerate(data["restarts"])
    ]
    call = data["call_s"]
    return "\n".join(
        [
            f"W = {data['workers']}, {data['size'] >> 20} MiB float32 per call, "
            f"a call {call * 1000:.0f} ms (median); {data['calls']} calls, "
            f"{data['wrong']} wrong results",
            "",
            "| restart | emulator serving again (s after the kill) "
            "| job's next complete call (s after the kill) |",
            "|---|---|---|",
            *rows,
        ]
    )
