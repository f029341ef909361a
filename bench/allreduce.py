"""Allreduce benchmark: SwitchML through the emulator vs gloo ring vs a parameter server.

Each method is measured under the conditions a user would give it alone, and the
methods take turns in one invocation, so the machine's noise hits them alike:

* For each world size W two groups of W worker processes are started: one
  joins a SwitchML job per packet size code (through one emulator process),
  the other only a ``torch.distributed`` gloo group. A group waits on its pipe
  (no CPU) while the other one works, and the emulator is stopped (``SIGSTOP``,
  it and its shard processes) during gloo's and the parameter server's calls:
  nothing of SwitchML's runs or polls while gloo is timed.
* Every call gets the same input: ``swemu.protocol.worker.testdata``'s (rank r sends
  ``(r + 1) * base``; no subnormals), copied into gloo's tensor before each call
  (gloo sums in place, so a reused tensor would grow W-fold per call), and
  never modified by SwitchML (it writes a separate output array: one allocated
  once per size, as a training loop's would be, or a new result per call).
* Each timed call is preceded by a barrier of the method's own kind (gloo's
  ``barrier``; for SwitchML a one-element allreduce through the same job): the
  clock starts when the worker leaves it, stops when the call returns, and a
  call's time is the slowest worker's. Nothing else is timed (no copy, no check).
* For each repetition, for each size, every method runs once; the order of the
  methods alternates between repetitions. The report is the median over
  repetitions, and every method's ratio to gloo's ring ``all_reduce`` of the
  same size in the same run, two ways: the ratio of the medians, and the median
  of the per-repetition ratios (``paired``: each call against gloo's call of
  the same repetition, seconds apart). On a shared machine whose speed drifts
  over tens of seconds, whole repetitions are slow for every method alike; the
  paired ratio cancels that drift, the ratio of medians does not.

Methods:

* ``switchml-<code>``: ``hostlib`` allreduce through the emulator (float32 by
  default; ``--dtype int32`` sends exact integers, no quantization: the
  transport's own cost; ``--dtype float16`` sends 16-bit values, docs/protocol.md
  §4.2, against gloo's ring on float16 tensors), into an ``out=`` array
  allocated once per size;
* ``switchml-<code>-new``: the same call without ``out=`` (``y =
  ctx.allreduce(x)``, a new result each call, the previous one dropped after
  the call as a loop that rebinds its result does): the call most users make
  (``--forms out,new``, the default, measures both). The first two calls of
  each size are not timed: they allocate the two blocks a loop's results then
  take turns in (:mod:`hostlib.results`), as ``out=``'s allocation is not timed;
* ``gloo``: ``torch.distributed.all_reduce`` (gloo, ring);
* ``ps``: the parameter-server pattern, gloo ``reduce`` to rank 0 + ``broadcast``.

``--shards S`` starts the emulator with ``serve --shards S`` (S data-plane
processes; the workers spread their slots over the S ports), to compare 1 vs 2.

``--neighbour on`` runs a CPU-bound neighbour process (a busy Python loop, nice 0)
during every method's calls; ``--neighbour both`` measures every repetition
quiet and loaded (the neighbour stopped and running, alternately), and reports
each method's ratio to gloo in both conditions and how much the ratio grows
under load.

CPU is reported next to time: per call, the CPU time of all W workers (their
processes, every thread) plus the emulator's (all its threads and shard
processes, from ``/proc``; Linux only; zero during gloo's calls, since it is
stopped), as a median over repetitions and as a ratio to gloo's. On a machine
with fewer cores than processes every method is CPU-bound, and the time ratio
follows the CPU ratio; where it does not, the difference is waiting
(scheduling, timeouts).

Memory is reported too: the emulator's RSS before and after the run (it must not
grow with tensor size or traffic) and each worker's peak RSS next to its
tensors' size. The load average before and after the run goes into the report.

Run: ``python -m bench allreduce [--workers 2,4,8] [--sizes 1Mi,16Mi,64Mi]
[--codes 1,3,6,7] [--forms out,new] [--reps 5] [--shards 1] [--dtype float32]
[--neighbour off] [--out DIR]``. Why the gloo baseline is measured this way (and what the earlier
harness got wrong): ``python -m bench gloo-baseline`` (:mod:`bench.gloo_baseline`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

GLOO = "gloo"
PS = "ps"
#: how a gloo call's input is prepared: FRESH copies the test input into the
#: tensor before every call (the benchmark); INPLACE reuses one tensor that
#: gloo's in-place sum grows W-fold per call (the old harness); RANDN copies a
#: random-normal input before every call (a plain script's)
FRESH, INPLACE, RANDN = "fresh", "inplace", "randn"
QUIET, LOADED = "quiet", "loaded"
#: the suffix of a SwitchML method called without ``out=``
NEW = "-new"
#: how SwitchML's result is given: into ``out=`` (allocated once) or new per call
FORMS = ("out", "new")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU time used so far by these processes, all threads (``/proc``, ns
    resolution); None where ``/proc`` has no schedstat or a process is gone."""
    total = 0
    try:
        for pid in pids:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the emulator and its shards)."""
    children: dict[int, list[int]] = {}
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(name))
    except OSError:
        return [pid]
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


@contextlib.contextmanager
def stopped(pids: Sequence[int]) -> Iterator[None]:
    """Stop these processes (``SIGSTOP``) for the duration of the block, so that
    they take no CPU at all, then let them go on (``SIGCONT``). Used to keep the
    emulator off the CPUs while gloo is timed; its timers catch up afterwards."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


class Neighbour:
    """A CPU-bound neighbour: one process spinning a Python loop at nice 0,
    stopped (``SIGSTOP``) while the machine is to be quiet. Use as a context
    manager; :meth:`load` switches it on and off."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Neighbour:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        self.load(False)
        return self

    def load(self, on: bool) -> None:
        """Run the neighbour (True) or stop it (False)."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT if on else signal.SIGSTOP)

    def cpu_seconds(self) -> float | None:
        return _cpu_seconds([self.proc.pid]) if self.proc is not None else None

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process dies on SIGCONT
            self.proc.wait(10)
            self.proc = None


def _worker(
    rank: int,
    w: int,
    targets: list[tuple[str, str, str, int]],
    master: int | None,
    conn: Any,
    dtype: str = "float32",
) -> None:
    """A benchmark worker: joins every SwitchML target ``(name, switch, control,
    size code[, window])`` and, with ``master``, a gloo group; then runs the driver's
    commands ``(method, bytes[, input mode])`` and answers each with (time,
    retransmissions, CPU time of this process, verdict).

    Before each timed call the workers line up: through gloo's ``barrier`` for
    gloo's methods, through a one-element allreduce of the same SwitchML job
    for SwitchML's. Only the call itself is timed.

    The inputs are :mod:`swemu.protocol.worker.testdata`'s (rank r sends ``(r + 1) * base``),
    so each worker checks its result on its own: the first call of every
    (method, size, mode) is checked after it is timed (exact for int32 and for
    gloo, whose float32 sums of these inputs are exact too; within
    docs/protocol.md §4's bound for SwitchML's float32). The verdict is True or
    False then, and None for later calls and for inputs that cannot be checked
    (:data:`INPLACE`, :data:`RANDN`). Input modes are those of gloo's tensor
    (:data:`FRESH` unless said); SwitchML reads its input and writes a separate
    output, so its input is the same at every call."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from swemu.protocol.worker import testdata

    dist = torch = None
    if master is not None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{master}", rank=rank, world_size=w
        )
    ctxs = {}
    # values per packet: twice as many at 16 bits (float16 goes on the 16-bit wire)
    per_packet = 64 if np.dtype(dtype) == np.float16 else 32
    nvals = {name: per_packet << code for name, _, _, code, *_ in targets}
    itemsize = np.dtype(dtype).itemsize
    if targets:
        import hostlib

        for name, switch, control, code, *window in targets:
            ctxs[name] = hostlib.connect(
                switch,
                control,
                rank=rank,
                world_size=w,
                packet_size=code,
                window=window[0] if window and window[0] else None,
                no_progress=60.0,
            ).open()
            ctxs[name].allreduce(np.ones(4096, dtype))  # warm up kernels and the path
    conn.send("ready")
    # per size, made when first needed and kept: the test input, SwitchML's
    # output, gloo's tensor, a random-normal input, the tensor reused in place
    arrays: dict[tuple[str, int], Any] = {}

    def array(kind: str, nbytes: int) -> Any:
        key = (kind, nbytes)
        if key not in arrays:
            if kind == "x":
                arrays[key] = testdata.worker_input(rank, nbytes // itemsize, 0, dtype)
            elif kind == "out":
                arrays[key] = np.zeros_like(array("x", nbytes))  # touched: no page faults
            elif kind == "randn":
                rng = np.random.default_rng(rank)
                randn = rng.standard_normal(nbytes // itemsize, np.float32)
                arrays[key] = torch.from_numpy(randn.astype(dtype))
            elif kind == "t":
                arrays[key] = torch.from_numpy(array("x", nbytes).copy())
            else:  # INPLACE: initialised once, then left to gloo's in-place sums
                arrays[key] = torch.from_numpy(array("x", nbytes).copy())
        return arrays[key]

    tick = np.zeros(1, np.int32)
    # per (method, size) called without out=: its last result, held until the next
    held: dict[tuple[str, int], np.ndarray] = {}
    checked: set[tuple] = set()
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        method, nbytes = cmd[:2]
        mode = cmd[2] if len(cmd) > 2 else FRESH
        x = array("x", nbytes)
        ctx_name = method.removesuffix(NEW)
        if ctx_name in ctxs:
            out = array("out", nbytes)
            if method.endswith(NEW) and (method, nbytes) not in held:
                # a loop's first two calls: they make the two blocks its results
                # then take turns in (hostlib.results); not timed, like out='s
                # allocation
                for _ in range(2):
                    held[method, nbytes] = ctxs[ctx_name].allreduce(x)
            ctxs[ctx_name].allreduce(tick, out=tick)  # line the workers up through the switch
        else:
            if mode == INPLACE:
                t = array(INPLACE, nbytes)
            else:
                t = array("t", nbytes)
                t.copy_(array("randn", nbytes) if mode == RANDN else torch.from_numpy(x))
            dist.barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if method == GLOO:
            dist.all_reduce(t)
        elif method == PS:
            dist.reduce(t, dst=0)
            dist.broadcast(t, src=0)
        elif method.endswith(NEW):
            # the previous result of this method is dropped when this one returns
            held[method, nbytes] = ctxs[ctx_name].allreduce(x)
        else:
            ctxs[method].allreduce(x, out=out)
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        stats = ctxs[ctx_name].last_stats if ctx_name in ctxs else {}
        verdict = None
        check = cmd[3] if len(cmd) > 3 else (method, nbytes, mode) not in checked
        if check and mode == FRESH:
            checked.add((method, nbytes, mode))
            if method.endswith(NEW):
                y = held[method, nbytes]
            else:
                y = out if method in ctxs else t.numpy()
            verdict = testdata.check_result(y, w, 0, nvals.get(ctx_name, 256))[0]
            del y  # a result held here would keep its block from the next call
        conn.send((dt, stats.get("retransmissions", 0), cpu, verdict))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grown = [float(v.abs().max()) for (k, _), v in arrays.items() if k == INPLACE]
    conn.send({"peak_rss": peak, "inplace_max_abs": max(grown, default=None)})
    for c in ctxs.values():
        c.close()
    if dist is not None:
        dist.destroy_process_group()


def start_group(
    w: int,
    targets: list[tuple[str, str, str, int]],
    gloo: bool,
    dtype: str = "float32",
    target: Any = None,
) -> tuple:
    """Start W benchmark workers (``target``: the worker function, :func:`_worker`
    unless given); return (pipes, processes) once all are ready."""
    ctx = mp.get_context("spawn")
    master = _free_port() if gloo else None
    pipes, procs = [], []
    for r in range(w):
        a, b = ctx.Pipe()
        p = ctx.Process(
            target=target or _worker, args=(r, w, targets, master, b, dtype), daemon=True
        )
        p.start()
        pipes.append(a)
        procs.append(p)
    for a in pipes:
        if not a.poll(300):
            raise RuntimeError(f"W={w}: a worker did not start")
        a.recv()
    return pipes, procs


def run_once(
    pipes: list,
    method: str,
    nbytes: int,
    switch_pids: Sequence[int] = (),
    mode: str | None = None,
    check: bool | None = None,
) -> dict:
    """One collective call: the slowest worker's time, the retransmissions and
    CPU seconds of all workers, the CPU seconds the switch used meanwhile
    (None without ``/proc``), and whether every worker's result was right
    (None if the workers did not check this call). ``mode``: how gloo's input
    is prepared (:data:`FRESH` when None); ``check``: whether the workers check
    the result (None: the first call of each method, size and mode)."""
    s0 = _cpu_seconds(list(switch_pids))
    cmd: tuple = (method, nbytes)
    if mode is not None or check is not None:
        cmd += (mode or FRESH,) + (() if check is None else (check,))
    for a in pipes:
        a.send(cmd)
    got = [a.recv() for a in pipes]
    s1 = _cpu_seconds(list(switch_pids))
    return {
        "time": max(g[0] for g in got),
        "retransmissions": sum(g[1] for g in got),
        "cpu_workers": sum(g[2] for g in got),
        "cpu_switch": s1 - s0 if s0 is not None and s1 is not None else None,
        "verified": None if any(g[3] is None for g in got) else all(g[3] for g in got),
    }


def stop_group_info(pipes: list, procs: list) -> list[dict]:
    """Stop the workers; return what each reported when leaving (``peak_rss``,
    ``inplace_max_abs``)."""
    for a in pipes:
        a.send(None)
    info = [a.recv() for a in pipes]
    for p in procs:
        p.join(30)
    return info


def stop_group(pipes: list, procs: list) -> int:
    """Stop the workers; return their largest peak RSS."""
    return max(i["peak_rss"] for i in stop_group_info(pipes, procs))


def _rss(pid: int) -> int:
    """Resident memory of a process and its children (the data-plane shards)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(_rss(int(c)) for c in children)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(
    workers: list[int],
    sizes: list[int],
    codes: list[int],
    reps: int,
    log=print,
    shards: int = 1,
    dtype: str = "float32",
    neighbour: str = "off",
    forms: Sequence[str] = FORMS,
    windows: Sequence[int] = (0,),
) -> dict:
    """Run the whole matrix against an emulator with ``shards`` data-plane
    processes; return the results as plain data. ``neighbour``: ``off``,
    ``on`` (a CPU-bound process runs throughout) or ``both`` (every
    repetition quiet and loaded); ``forms``: SwitchML's calls into ``out=``
    (``out``), without it (``new``), or both; ``windows``: each size code's
    jobs with these windows (slots per worker; 0: the library's default for
    the code), each a method of its own (``switchml-7`` with the default,
    ``switchml-7w63`` with 63 slots)."""
    from swemu.launch import EmulatorProcess

    if dtype not in ("float32", "int32", "float16"):
        raise ValueError(f"dtype must be float32, int32 or float16, not {dtype!r}")
    if dtype == "float16" and max(workers) > 8:
        raise ValueError("float16's test data is exact for at most 8 workers")
    loads = {"off": [QUIET], "on": [LOADED], "both": [QUIET, LOADED]}.get(neighbour)
    if loads is None:
        raise ValueError(f"neighbour must be off, on or both, not {neighbour!r}")
    if not forms or set(forms) - set(FORMS):
        raise ValueError(f"forms must be some of {', '.join(FORMS)}, not {forms!r}")
    if not windows or any(k < 0 for k in windows):
        raise ValueError(f"windows must be 0 (the default) or slot counts, not {windows!r}")
    jobs = [(f"switchml-{c}" + (f"w{k}" if k else ""), c, k) for c in codes for k in windows]
    methods = [name + ("" if form == "out" else NEW) for name, _, _ in jobs for form in forms] + [
        GLOO,
        PS,
    ]
    results: list[dict] = []
    memory: dict[str, Any] = {}
    loadavg_start = _loadavg()
    with contextlib.ExitStack() as stack:
        emu = stack.enter_context(EmulatorProcess("--max-pool-memory", "4GiB", shards=shards))
        nb = stack.enter_context(Neighbour()) if LOADED in loads else None
        memory["emulator_rss_start"] = _rss(emu.proc.pid)
        switch_pids = _descendants(emu.proc.pid)
        targets = [(name, emu.switch, emu.control, c, k) for name, c, k in jobs]
        for w in workers:
            sw_group = start_group(w, targets, gloo=False, dtype=dtype)
            gloo_group = start_group(w, [], gloo=True, dtype=dtype)
            calls: dict[tuple[str, str, int], list[dict]] = {}
            for rep in range(reps):
                for load in loads if rep % 2 == 0 else loads[::-1]:
                    if nb is not None:
                        nb.load(load == LOADED)
                    for size in sizes:
                        for m in methods if rep % 2 == 0 else methods[::-1]:
                            # the first call of each (load, method, size) is checked
                            first = (load, m, size) not in calls
                            if m in (GLOO, PS):
                                with stopped(switch_pids):
                                    call = run_once(
                                        gloo_group[0], m, size, switch_pids, FRESH, first
                                    )
                            else:
                                call = run_once(sw_group[0], m, size, switch_pids, FRESH, first)
                            calls.setdefault((load, m, size), []).append(call)
                if nb is not None:
                    nb.load(False)
                log(f"W={w}: repetition {rep + 1}/{reps} done")
            memory[f"worker_peak_rss_W{w}"] = max(stop_group(*sw_group), stop_group(*gloo_group))
            for load in loads:
                for size in sizes:
                    gloo = _summary(calls[(load, GLOO, size)])
                    for m in methods:
                        row = _summary(calls[(load, m, size)])
                        row.update(
                            load=load,
                            workers=w,
                            bytes=size,
                            method=m,
                            goodput_gbps=size * 8 / row["median_s"] / 1e9,
                            ratio_to_gloo=row["median_s"] / gloo["median_s"],
                            paired_ratio_to_gloo=paired_ratio(
                                calls[(load, m, size)], calls[(load, GLOO, size)]
                            ),
                            cpu_ratio_to_gloo=(
                                row["cpu_s"] / gloo["cpu_s"]
                                if row["cpu_s"] is not None and gloo["cpu_s"]
                                else None
                            ),
                        )
                        if row["verified"] is False:
                            log(f"W={w} {size} B {m} ({load}): WRONG RESULT")
                        results.append(row)
        memory["emulator_rss_end"] = _rss(emu.proc.pid)
    memory["largest_tensor_bytes"] = max(sizes)
    if len(loads) == 2:  # how much each ratio grows under load
        quiet = {(r["workers"], r["bytes"], r["method"]): r for r in results if r["load"] == QUIET}
        for r in results:
            if r["load"] == LOADED:
                q = quiet[(r["workers"], r["bytes"], r["method"])]
                r["loaded_over_quiet"] = r["ratio_to_gloo"] / q["ratio_to_gloo"]
    return {
        "results": results,
        "memory": memory,
        "reps": reps,
        "codes": codes,
        "windows": list(windows),
        "shards": shards,
        "dtype": dtype,
        "neighbour": neighbour,
        "forms": list(forms),
        "cpus": os.cpu_count(),
        "loadavg_start": loadavg_start,
        "loadavg_end": _loadavg(),
    }


def paired_ratio(calls: list[dict], gloo_calls: list[dict]) -> float:
    """The median over repetitions of a call's time over gloo's call of the same
    repetition (the lists are in repetition order, one call each)."""
    return statistics.median(c["time"] / g["time"] for c, g in zip(calls, gloo_calls, strict=True))


def _summary(calls: list[dict]) -> dict:
    """Medians over one method's repetitions: time, and CPU per call (workers,
    switch, both; during gloo's calls the switch is stopped)."""
    times = [c["time"] for c in calls]
    workers = statistics.median(c["cpu_workers"] for c in calls)
    switch = [c["cpu_switch"] for c in calls]
    sw = statistics.median(switch) if None not in switch else None
    return {
        "median_s": statistics.median(times),
        "all_s": times,
        "cpu_workers_s": workers,
        "cpu_switch_s": sw,
        "cpu_s": statistics.median(c["cpu_workers"] + (c["cpu_switch"] or 0.0) for c in calls)
        if sw is not None
        else None,
        "retransmissions": sum(c["retransmissions"] for c in calls),
        # False if a checked call was wrong; None if none was checked
        "verified": None
        if all(c["verified"] is None for c in calls)
        else all(c["verified"] is not False for c in calls),
    }


def markdown(data: dict) -> str:
    """The results as a markdown table: time in ms, ratio to gloo, and CPU per
    call (all workers + the switch) with its ratio to gloo's; with the
    neighbour in both conditions, the load of each row and how much the
    loaded ratio exceeds the quiet one."""
    both = any("loaded_over_quiet" in r for r in data["results"])
    la0, la1 = data.get("loadavg_start"), data.get("loadavg_end")
    head = (
        f"dtype {data.get('dtype', 'float32')}, {data.get('cpus', '?')} CPUs, "
        f"median of {data['reps']} repetitions"
    )
    if data.get("neighbour", "off") != "off":
        head += f", CPU-bound neighbour: {data['neighbour']}"
    if la0 and la1:
        head += f"; load average {la0[0]:.2f} at start, {la1[0]:.2f} at the end"
    lines = [
        head,
        "",
        "| W | size | method | "
        + ("load | " if data.get("neighbour", "off") != "off" else "")
        + "median (ms) | goodput (Gbit/s) | time / gloo | paired "
        + ("| loaded / quiet " if both else "")
        + "| CPU / call (ms) | CPU / gloo's | result |",
    ]
    lines.append("|" + "---|" * (lines[-1].count("|") - 1))
    for r in data["results"]:
        cpu = r.get("cpu_s")
        cpu_ratio = r.get("cpu_ratio_to_gloo")
        lq = r.get("loaded_over_quiet")
        lines.append(
            f"| {r['workers']} | {r['bytes'] / 2**20:g} MiB | {r['method']} | "
            + (f"{r.get('load', QUIET)} | " if data.get("neighbour", "off") != "off" else "")
            + f"{r['median_s'] * 1e3:.1f} | {r['goodput_gbps']:.2f} | "
            f"{r['ratio_to_gloo']:.2f} | "
            + (f"{r['paired_ratio_to_gloo']:.2f} | " if "paired_ratio_to_gloo" in r else "| ")
            + ((f"{lq:.2f} | " if lq is not None else "| ") if both else "")
            + (f"{cpu * 1e3:.0f}" if cpu is not None else "n/a")
            + " | "
            + (f"{cpu_ratio:.2f}" if cpu_ratio is not None else "n/a")
            + " | "
            + {True: "ok", False: "WRONG", None: "unchecked"}[r.get("verified")]
            + " |"
        )
    m = data["memory"]
    lines += [
        "",
        f"Emulator RSS: {m['emulator_rss_start'] / 2**20:.0f} MiB at start, "
        f"{m['emulator_rss_end'] / 2**20:.0f} MiB at the end.",
        "Worker peak RSS (largest tensor "
        f"{m['largest_tensor_bytes'] / 2**20:g} MiB): "
        + ", ".join(
            f"{k.split('_')[-1]}: {v / 2**20:.0f} MiB"
            for k, v in m.items()
            if k.startswith("worker_peak")
        ),
    ]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """Time relative to gloo per method and size, one panel per W (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = sorted({r["workers"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 4), squeeze=False)
    for ax, w in zip(axes[0], ws):
        rows = [  # the quiet rows where there are both
            r
            for r in data["results"]
            if r["workers"] == w and r.get("load", QUIET) == data["results"][0].get("load", QUIET)
        ]
        methods = sorted({r["method"] for r in rows})
        sizes = sorted({r["bytes"] for r in rows})
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            ys = [
                next(r["ratio_to_gloo"] for r in rows if r["method"] == m and r["bytes"] == s)
                for s in sizes
            ]
            ax.bar(np.arange(len(sizes)) + i * width, ys, width, label=m)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(np.arange(len(sizes)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{s / 2**20:g} MiB" for s in sizes])
        ax.set_title(f"W = {w}")
        ax.set_ylabel("time / gloo ring (lower is better)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(data: dict, out: Path, name: str = "allreduce") -> list[Path]:
    """Write the results as JSON and markdown, then the plot; return the paths
    written. Without matplotlib (the ``bench`` extra) the plot is skipped with a
    warning on stderr: the results are never lost to it."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(data, indent=2))
    paths[1].write_text(markdown(data))
    try:
        plot(data, paths[2])
    except ImportError as exc:
        from swemu.options import explain

        print(f"warning: no plot: {explain(exc, 'plotting')}", file=sys.stderr)
        return paths[:2]
    return paths
