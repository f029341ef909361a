"""The emulator's loopback setup: the emulator and the workers share CPUs, the
"link" is the CPU, with the calibrated per-call and per-packet costs.

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .network import EventLoop, Result


@dataclass(frozen=True)
class _ProcessCosts:
    """CPU seconds of one process kind (the emulator or a worker) in the loopback model."""

    wakeup: float
    call: float
    kernel: float
    recv: float
    send: float

    @classmethod
    def of(cls, cal: Any, *, switch: bool) -> _ProcessCosts:
        """The calibrated costs, times the in-situ factor measured for that process
        kind (1 if the calibration has none)."""
        f = getattr(cal, "switch_in_situ" if switch else "host_in_situ", 1.0) or 1.0
        call, kernel = (
            (cal.switch_call, cal.switch_kernel) if switch else (cal.host_call, cal.host_kernel)
        )
        return cls(cal.wakeup * f, call * f, kernel * f, cal.recv * f, cal.send * f)


@dataclass(frozen=True)
class LoopbackTiming:
    """The worker's retransmission timer as ``swemu.protocol.worker.protocol.Timing`` has it:
    ``timeout`` first and as a floor, then ``srtt + 4·rttvar`` (RFC 6298, no
    samples from retransmitted packets), doubled every ``backoff_after``
    consecutive timeouts of a slot, up to ``max_timeout``; a duplicate result
    raises the floor to twice the timeout in use (at most once per timeout),
    which decays back slowly."""

    timeout: float = 0.02
    backoff_after: int = 3
    max_timeout: float = 0.5


def simulate_loopback(
    cal: Any,
    *,
    workers: int,
    nbytes: int,
    size_code: int = 6,
    window: int = 128,
    is_float: bool = True,
    cores: int = 2,
    background: float = 0.0,
    timeslice: float | None = None,
    batch: int = 64,
    timing: LoopbackTiming | None = None,
) -> Result:
    """Predict one ``switchml run`` allreduce on this machine: the emulator process
    and ``workers`` worker processes on ``cores`` CPUs, over loopback.

    A process runs when it has datagrams queued (or, a worker, a timer due) and a
    core is free; runnable processes wait in one FIFO run queue. A run is one
    readiness callback of the real adapters: it drains up to ``batch`` datagrams
    and costs (from ``cal``, a :class:`swemu.model.calibrate.Calibration`) a wakeup if
    the process was asleep, one kernel call, per datagram a receive and the
    kernel's per-packet work, then one send per packet produced — each delivered
    to its receiver's queue as it is sent. Workers run their retransmission timer
    (:class:`LoopbackTiming`): when the CPU is scarce, round trips exceed the
    timeout and workers resend; the switch answers a duplicate of a complete
    slot with a unicast (PROTOCOL §2), all of which costs CPU too. The RTT
    estimate is warmed by one call first (the real run's warm-up call), and the
    second call is reported.

    Other load on the machine is ``background`` CPU-bound processes in the same
    run queue, each taking a ``timeslice`` per turn (a fractional one runs only
    that fraction of the time); default timeslice: CFS's, ``max(6 ms · (1 +
    log2 cores) / runnable, 0.75 ms · (1 + log2 cores))``. They delay every
    wakeup of the emulator and the workers, which is what makes round trips
    exceed the retransmission timeout on a busy machine.
    """
    timing = timing or LoopbackTiming()
    if cores < 1 or background < 0:
        raise ValueError("need cores >= 1 and background >= 0")
    if timeslice is None:
        scale = 1 + math.log2(cores)
        timeslice = max(6e-3 * scale / (background + workers + 1), 0.75e-3 * scale)
    rtt = [[0.0, 0.0, 0.0, 0.0, -math.inf] for _ in range(workers + 1)]  # hostlib's K.R_*
    args = (cal, workers, nbytes, size_code, window, is_float, cores, background, timeslice)
    first = _loopback_call(*args, batch, timing, rtt)
    res = _loopback_call(*args, batch, timing, rtt)
    res.detail["first_call"] = first.time
    res.detail["first_call_retransmissions"] = first.detail["retransmissions"]
    return res


def _loopback_call(
    cal: Any,
    workers: int,
    nbytes: int,
    size_code: int,
    window: int,
    is_float: bool,
    cores: int,
    background: float,
    timeslice: float,
    batch: int,
    timing: LoopbackTiming,
    rtt: list[list[float]],
) -> Result:
    """One allreduce of :func:`simulate_loopback`; ``rtt`` (per worker: srtt,
    rttvar, samples) carries over between calls, as in ``WorkerProtocol``."""
    cost = (_ProcessCosts.of(cal, switch=True), _ProcessCosts.of(cal, switch=False))
    nvals = 32 << size_code
    chunks = math.ceil(nbytes / (4 * nvals))
    npkts = chunks + (min(window, chunks) if is_float else 0)
    ev = EventLoop()
    nproc = workers + 1  # 0: the emulator, 1..W: the workers
    hogs = math.ceil(background)  # other load: ids nproc .. nproc + hogs - 1
    duty = background - math.floor(background)  # the last hog's share, if fractional
    # queues: the switch's hold (worker, chunk), a worker's hold chunk ids
    queue: list[list] = [[] for _ in range(nproc)]
    asleep = [True] * nproc
    queued = [False] * nproc
    running = [False] * nproc
    started = [False] * nproc
    runq: list[int] = []
    free = [cores]
    # the switch: which workers contributed to each chunk, and whether it is complete
    contributed = np.zeros((npkts, nproc), bool)
    arrived = np.zeros(npkts, np.int32)
    # each worker: per chunk first send time, deadline, timeout, timeouts, state
    first_sent = np.zeros((nproc, npkts))
    deadline = np.full((nproc, npkts), math.inf)
    rto = np.zeros((nproc, npkts))
    tries = np.zeros((nproc, npkts), np.int32)
    got = np.zeros((nproc, npkts), bool)
    received = [0] * nproc
    next_chunk = [min(window, npkts)] * nproc
    timer_at = [math.inf] * nproc
    done_at = [0.0] * nproc
    cpu = [0.0] * nproc
    stats = {"retransmissions": 0, "unicasts": 0, "duplicates_at_workers": 0, "runs": 0}

    def make_runnable(p: int) -> None:
        if not queued[p] and not running[p]:
            queued[p] = True
            runq.append(p)

    def dispatch() -> None:
        while free[0] > 0 and runq:
            p = runq.pop(0)
            free[0] -= 1
            if p >= nproc:
                ev.after(timeslice, hog_done, p)
                continue
            queued[p] = False
            run(p)

    def hog_done(h: int) -> None:
        free[0] += 1
        if duty and h == nproc + hogs - 1:  # the fractional one sleeps in between
            ev.after(timeslice * (1 / duty - 1), hog_wake, h)
        else:
            runq.append(h)
        dispatch()

    def hog_wake(h: int) -> None:
        if not all(done_at[1:]):
            runq.append(h)
            dispatch()

    def new_rto(p: int) -> float:
        srtt, var, n, floor, _ = rtt[p]
        floor = max(timing.timeout, floor)
        if n == 0:
            return min(floor, timing.max_timeout)
        return min(max(floor, srtt + 4 * var), timing.max_timeout)

    def sent_new(p: int, c: int, now: float) -> None:
        first_sent[p, c] = now
        rto[p, c] = new_rto(p)
        deadline[p, c] = now + rto[p, c]

    def run(p: int) -> None:
        # One readiness (or timer) callback: receive a batch, one kernel call,
        # then one sendto per packet it produced, each delivered as it is sent.
        running[p] = True
        stats["runs"] += 1
        now = ev.now
        out: list[tuple[int, Any]] = []  # (destination process, item)
        pc = cost[0 if p == 0 else 1]
        pre = pc.wakeup if asleep[p] else 0.0
        asleep[p] = False
        if p == 0:
            items = queue[0][:batch]
            del queue[0][:batch]
            pre += pc.call + len(items) * (pc.recv + pc.kernel)
            for w, c in items:
                if contributed[c, w]:  # a retransmission
                    if arrived[c] == workers:
                        out.append((w, c))  # complete: unicast to the sender
                        stats["unicasts"] += 1
                    continue
                contributed[c, w] = True
                arrived[c] += 1
                if arrived[c] == workers:  # the last packet: multicast
                    out.extend((v, c) for v in range(1, nproc))
        elif not started[p]:
            started[p] = True  # a worker's first run: build the first window
            for c in range(min(window, npkts)):
                sent_new(p, c, now)
                out.append((0, (p, c)))
            pre += pc.call + len(out) * pc.kernel
        else:
            items = queue[p][:batch]
            del queue[p][:batch]
            pre += pc.call + len(items) * (pc.recv + pc.kernel)
            for c in items:
                if got[p, c]:
                    stats["duplicates_at_workers"] += 1
                    st = rtt[p]  # a spurious timeout: raise the floor (hostlib's _spurious)
                    cur = new_rto(p)
                    if now - st[4] >= cur:
                        st[3], st[4] = min(2 * cur, timing.max_timeout), now
                    continue
                got[p, c] = True
                received[p] += 1
                if tries[p, c] == 0:  # Karn: only packets sent once give samples
                    sample = now - first_sent[p, c]
                    st = rtt[p]
                    if st[2] == 0:
                        st[0], st[1] = sample, sample / 2
                    else:
                        st[1] = 0.75 * st[1] + 0.25 * abs(st[0] - sample)
                        st[0] = 0.875 * st[0] + 0.125 * sample
                    st[2] += 1
                    if st[3] > timing.timeout:
                        st[3] -= (st[3] - timing.timeout) / 8192
                deadline[p, c] = math.inf
                if next_chunk[p] < npkts:
                    n = next_chunk[p]
                    next_chunk[p] += 1
                    sent_new(p, n, now)
                    out.append((0, (p, n)))
            # the timer: resend every expired packet unchanged
            expired = np.flatnonzero(deadline[p] <= now)
            for c in expired.tolist():
                tries[p, c] += 1
                if tries[p, c] % timing.backoff_after == 0:
                    rto[p, c] = min(rto[p, c] * 2, timing.max_timeout)
                deadline[p, c] = now + rto[p, c]
                out.append((0, (p, c)))
                stats["retransmissions"] += 1
        t = now + pre
        step = pc.send
        for dst, item in out:
            t += step
            ev.at(t, deliver, dst, item)
        cpu[p] += t - now
        ev.at(t, finish, p)

    def deliver(dst: int, item: Any) -> None:
        queue[dst].append(item)
        make_runnable(dst)
        dispatch()

    def timer(p: int, when: float) -> None:
        if timer_at[p] != when or done_at[p]:
            return  # superseded
        timer_at[p] = math.inf
        make_runnable(p)
        dispatch()

    def finish(p: int) -> None:
        free[0] += 1
        running[p] = False
        if p:
            if received[p] == npkts and not done_at[p]:
                done_at[p] = ev.now
                if all(done_at[1:]):
                    ev.stop()  # the background load would run forever
            if not done_at[p]:
                when = float(deadline[p].min())
                if when < timer_at[p]:
                    timer_at[p] = when
                    ev.at(when, timer, p, when)
        if queue[p] or (p and not done_at[p] and deadline[p].min() <= ev.now):
            make_runnable(p)
        else:
            asleep[p] = True
        dispatch()

    for p in range(1, nproc):
        make_runnable(p)
    runq.extend(range(nproc, nproc + hogs))
    ev.at(0.0, dispatch)
    # a retransmission storm that never drains (a timeout far below the CPU-bound
    # round trip, no backoff) is a livelock: stop at 100x the events of a clean run
    ev.run(until=3600.0, max_events=100 * (2 * workers * npkts + 100))
    if not all(done_at[1:]):
        raise RuntimeError(
            f"the loopback model made no end after {ev.events} events ({ev.now:.3g} s "
            f"simulated, {stats['retransmissions']} retransmissions): the timeout is far "
            "below the round trip this CPU allows"
        )
    return Result(
        "switchml-loopback",
        max(done_at[1:]),
        nbytes,
        workers,
        {
            "packets_per_worker": npkts,
            "cpu_switch": cpu[0],
            "cpu_worker": max(cpu[1:]),
            "cores": cores,
            "background": background,
            "timeslice": timeslice,
            "events": ev.events,
            **stats,
        },
    )
