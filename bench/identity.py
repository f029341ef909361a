"""Worker identity: a switch that knows workers by IP alone vs by (IP, port).

p4app-switchML's Tofino program knows a worker by its IP and sends each result to
the source port of the packet that completed the slot; ``serve --identify-by ip``
does the same, and the host library then has all workers of a job send from and
listen on one shared port (``worker_port``). This measures that path against the
emulator's default (IP, port) identity, side by side in one invocation: W worker
processes, rank r on 127.0.0.(2 + r), each joined to one emulator per mode; every
repetition runs each mode once (interleaved). Reported: the median time of the
slowest worker per mode, the ratio to the (IP, port) mode, the retransmissions,
and whether the first call's results were right.

Modes: ``ip-port`` (the default emulator: results to each worker's registered
port; on loopback one broadcast datagram per result), ``ip-port-unicast`` (the
same with ``SWEMU_BROADCAST=0``: one datagram per worker, as ``ip`` sends), ``ip``
(``--identify-by ip``, the shared worker port) and, with ``--per-worker-ports``,
``ip-own-ports``: ``--identify-by ip`` with workers on their own ports (the host
library before the shared port: W-1 of W workers get each result only by
retransmission).

Run: ``python -m bench identity [--workers 3] [--size 4Mi] [--size-code 3] [--reps 10]``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import resource
import socket
import statistics
import time
from typing import Any

import numpy as np

from .allreduce import run_once, stop_group

IP_PORT, IP_PORT_UNICAST, IP, IP_OWN_PORTS = "ip-port", "ip-port-unicast", "ip", "ip-own-ports"


def _worker(rank: int, w: int, targets: list, worker_port: int, code: int, conn: Any) -> None:
    """Join every target ``(name, switch, control, shared port?)`` from 127.0.0.(2 + rank),
    then answer the driver's ``(name, bytes)`` as :func:`bench.allreduce.run_once` expects."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import hostlib
    from swemu.protocol.worker import testdata

    ip = f"127.0.0.{2 + rank}"
    ctxs = {}
    for name, switch, control, share in targets:
        # ip-own-ports: a "shared" port of its own per rank, so that results sent
        # to the triggering packet's source port miss the other ranks (as with the
        # ephemeral ports the host library used before)
        port = worker_port if share else worker_port + 1 + rank
        ctxs[name] = hostlib.connect(
            switch,
            control,
            rank=rank,
            world_size=w,
            packet_size=code,
            bind=ip,
            worker_port=port,
            no_progress=120.0,
        ).open()
        ctxs[name].allreduce(np.ones(4096, np.float32))  # warm up kernels and the path
    conn.send("ready")
    first = next(iter(ctxs.values()))
    tick = np.zeros(1, np.int32)
    checked: set[tuple[str, int]] = set()
    arrays: dict[int, tuple] = {}
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        name, nbytes = cmd
        if nbytes not in arrays:
            x = testdata.worker_input(rank, nbytes // 4, 0, np.float32)
            arrays = {nbytes: (x, np.empty_like(x))}
        x, out = arrays[nbytes]
        first.allreduce(tick, out=tick)  # line the workers up through the switch
        c0, t0 = time.process_time(), time.perf_counter()
        ctxs[name].allreduce(x, out=out)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        verdict = None
        if (name, nbytes) not in checked:
            checked.add((name, nbytes))
            verdict = testdata.check_result(out, w, 0, 32 << code)[0]
        conn.send((dt, ctxs[name].last_stats.get("retransmissions", 0), cpu, verdict))
    conn.send({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    for c in ctxs.values():
        c.close()


def _free_port(ip: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _env(**values: str):
    """Set environment variables while a child process is started."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(
    workers: int,
    nbytes: int,
    code: int,
    reps: int,
    per_worker_ports: bool = False,
    log=print,
) -> dict[str, Any]:
    """Measure every mode ``reps`` times, interleaved; return plain data."""
    from swemu.launch import EmulatorProcess

    modes = [
        (IP_PORT, (), {}, True),
        (IP_PORT_UNICAST, (), {"SWEMU_BROADCAST": "0"}, True),
        (IP, ("--identify-by", "ip"), {}, True),
    ]
    if per_worker_ports:
        modes.append((IP_OWN_PORTS, ("--identify-by", "ip"), {}, False))
    with contextlib.ExitStack() as stack:
        targets = []
        for name, args, env, share in modes:
            with _env(**env):
                emu = stack.enter_context(EmulatorProcess(*args))
            targets.append((name, emu.switch, emu.control, share))
        port = _free_port("127.0.0.2")
        ctx = mp.get_context("spawn")
        pipes, procs = [], []
        for r in range(workers):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, workers, targets, port, code, b), daemon=True)
            p.start()
            pipes.append(a)
            procs.append(p)
        for a in pipes:
            if not a.poll(600):
                raise RuntimeError("a worker did not start")
            a.recv()
        times: dict[str, list[float]] = {m[0]: [] for m in modes}
        retx: dict[str, list[int]] = {m[0]: [] for m in modes}
        right: dict[str, bool] = {}
        for rep in range(reps):
            for name, *_ in modes:
                call = run_once(pipes, name, nbytes)
                times[name].append(call["time"])
                retx[name].append(call["retransmissions"])
                if call["verified"] is not None:
                    right[name] = call["verified"]
            log(f"repetition {rep + 1}/{reps} done")
        stop_group(pipes, procs)
    base = statistics.median(times[IP_PORT])
    unicast = statistics.median(times[IP_PORT_UNICAST])
    rows = []
    for name, *_ in modes:
        med = statistics.median(times[name])
        rows.append(
            {
                "mode": name,
                "median_s": med,
                "ratio": med / base,
                "ratio_to_unicast": med / unicast,
                # medians of the ratios within each repetition (the machine's phases
                # hit both calls of a repetition alike)
                "paired_ratio": statistics.median(
                    t / b for t, b in zip(times[name], times[IP_PORT])
                ),
                "paired_ratio_to_unicast": statistics.median(
                    t / b for t, b in zip(times[name], times[IP_PORT_UNICAST])
                ),
                "retransmissions": statistics.median(retx[name]),
                "all_s": times[name],
                "verified": right.get(name, False),
            }
        )
    return {"workers": workers, "bytes": nbytes, "size_code": code, "reps": reps, "modes": rows}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"W={data['workers']} on 127.0.0.2-{1 + data['workers']}, "
        f"{data['bytes'] / 2**20:g} MiB float32, size code {data['size_code']}, "
        f"medians of {data['reps']} (interleaved):",
        "",
        "| mode | median (ms) | / ip-port | / ip-port-unicast | retransmissions | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["modes"]:
        lines.append(
            f"| {r['mode']} | {r['median_s'] * 1e3:.1f} | {r['ratio']:.2f} "
            f"(paired {r['paired_ratio']:.2f}) | {r['ratio_to_unicast']:.2f} "
            f"(paired {r['paired_ratio_to_unicast']:.2f}) | {r['retransmissions']:.0f} | "
            f"{'ok' if r['verified'] else 'WRONG'} |"
        )
    lines += [
        "",
        "paired: the median of the per-repetition ratios. ip-port sends each result once "
        "to 127.255.255.255 (loopback broadcast); ip-port-unicast and ip send one copy per "
        "worker, as a switch does.",
    ]
    return "\n".join(lines) + "\n"
