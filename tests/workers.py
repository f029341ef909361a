"""Worker functions run as separate processes by the end-to-end tests.

Module-level, so that multiprocessing's spawn can import them by name.
"""

from __future__ import annotations

import os
import time

import numpy as np

import hostlib
from hostlib import fastpath

#: ``no_progress`` of the ranks of tests that kill a switch under them: the
#: restart is an emulator's start, which a loaded 2-core machine may make several
#: times the 1.3 s it takes on an idle one (and a root's, more for the children).
RESTART_PATIENCE = 30.0

LENGTHS = [0, 1, 63, 64, 65, 1000, 10**6]


def rank_input(rank: int, n: int, call: int, dtype=np.int32) -> np.ndarray:
    rng = np.random.default_rng(1000 * call + rank)
    if np.dtype(dtype) == np.int32:
        return rng.integers(-(2**20), 2**20, n, dtype=np.int64).astype(np.int32)
    mags = 2.0 ** rng.integers(-20, 20, size=n // 300 + 1).repeat(300)[:n]
    x = (rng.standard_normal(n) * mags).astype(np.float32)
    x[: min(n, 600)] = 0  # all-zero chunks at the start
    return x


def int_lengths(ctx: hostlib.Context) -> list[np.ndarray]:
    """Consecutive int32 allreduces of many lengths (set parity across calls), and one
    in place."""
    outs = []
    for call, n in enumerate(LENGTHS):
        x = rank_input(ctx.rank, n, call)
        outs.append(ctx.allreduce(x.reshape(-1, 1) if n % 5 == 0 else x).reshape(-1))
    x = rank_input(ctx.rank, 777, 99)
    assert ctx.allreduce(x, out=x) is x
    outs.append(x)
    return outs


def float_random(ctx: hostlib.Context, n: int) -> np.ndarray:
    return ctx.allreduce(rank_input(ctx.rank, n, 0, np.float32))


def configs(ctx: hostlib.Context, cases: list[tuple[int, int]]) -> list[np.ndarray]:
    """One job per (packet size code, window), joined one after the other."""
    o = ctx.options
    outs = []
    for code, window in cases:
        with hostlib.connect(
            o.switch,
            o.control,
            rank=o.rank,
            world_size=o.world_size,
            packet_size=code,
            window=window,
        ) as c:
            for call in range(2):
                outs.append(c.allreduce(rank_input(o.rank, 5000 + 37 * code, call)))
    return outs


def die_or_wait(ctx: hostlib.Context, victim: int) -> str:
    """The victim rank dies in the middle of a large allreduce; the others must fail."""
    # 64 MiB: long enough (>= ~100 ms on any machine) that the victim dies inside it
    x = np.ones(16 << 20, np.int32)
    ctx.allreduce(np.ones(10, np.int32))  # everyone is in
    if ctx.rank == victim:
        import sys
        import threading

        print(f"rank {ctx.rank} dies in the next allreduce", file=sys.stderr, flush=True)
        threading.Timer(0.01, lambda: os._exit(17)).start()
        ctx.allreduce(x)
        time.sleep(60)
    t0 = time.monotonic()
    try:
        ctx.allreduce(x)
    except hostlib.NoProgressError as exc:
        return f"{time.monotonic() - t0:.2f}|{exc}"
    return "no error"


def int_and_float(ctx: hostlib.Context, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One int32 and one float32 allreduce of n values (the sharded emulator's test)."""
    y = ctx.allreduce(rank_input(ctx.rank, n, 0))
    return y, ctx.allreduce(rank_input(ctx.rank, n, 1, np.float32))


def pooled_results(ctx: hostlib.Context, n: int, calls: int) -> dict:
    """``calls`` allreduces of int32 and float32 ``n``-arrays without ``out=``, the
    result rebound each call as a training loop does; then two results held at
    once. Returns the checks' inputs: the results of the held pair, the results of
    every rebound call's copy, and the pool's counters."""
    rebound = []
    y = None
    for call in range(calls):
        dtype = np.int32 if call % 2 == 0 else np.float32
        y = ctx.allreduce(rank_input(ctx.rank, n, call, dtype))
        rebound.append(y.copy())
    del y
    a = ctx.allreduce(rank_input(ctx.rank, n, 100, np.int32))
    b = ctx.allreduce(rank_input(ctx.rank, n, 101, np.int32))
    pool = ctx.results
    return {
        "rebound": rebound,
        "held": (a, b),
        "distinct": not np.shares_memory(a, b),
        "allocated": pool.allocated,
        "reused": pool.reused,
    }


def restart_loop(
    ctx: hostlib.Context, iters: int, n: int, dtype: str, progress, go=None
) -> list[str]:
    """``iters`` allreduces of ``rank_input`` through a switch that the test kills
    and starts again meanwhile; reports ``(rank, call, "start"|"done")`` on the
    ``progress`` queue, waits for ``go`` (an Event) before the first call, and
    returns one line per result that differs from what an uninterrupted job
    gives: the exact sum (int32), or bit for bit ``quant.simulate_allreduce``
    of every rank's input (float32)."""
    from swemu.protocol.worker import quant

    wrong = []
    dt = np.dtype(dtype)
    nvals = 32 << ctx.options.packet_size
    progress.put((ctx.rank, -1, "joined"))
    if go is not None:
        go.wait(120)
    for call in range(iters):
        x = rank_input(ctx.rank, n, call, dt)
        progress.put((ctx.rank, call, "start"))
        y = ctx.allreduce(x)
        progress.put((ctx.rank, call, "done"))
        inputs = [rank_input(r, n, call, dt) for r in range(ctx.world_size)]
        if dt == np.int32:
            want = np.sum([v.astype(np.int64) for v in inputs], axis=0).astype(np.int32)
        else:
            want = quant.simulate_allreduce(inputs, nvals)
        if not np.array_equal(y, want):
            bad = np.flatnonzero(y != want)
            wrong.append(
                f"call {call}: {bad.size} values differ, chunks {sorted(set(bad // nvals))}"
            )
    if ctx._actx.can_block and fastpath.pump.signatures:
        # a blocking context's recoveries leave the sockets to its own loop: the
        # event loop's path, which it does not warm up, must not have run (and
        # compiled, on a first run, in the middle of a call)
        wrong.append("the event loop's compiled path (fastpath.pump) ran")
    return wrong


def fabric_rank(
    rank: int, world: int, control: str, session_id: int, calls: int, n: int, out
) -> None:
    """One rank of a job on a fabric (tests/test_fabric_e2e.py): it registers at its
    own switch's control plane only; int32, float32 and float16 calls (the last on
    the 16-bit wire, docs/protocol.md §4.2) of ``rank_input``, each checked
    against what one switch would give (the exact sum, and bit for bit
    ``quant.simulate_allreduce`` or ``simulate_allreduce16``). Puts ``(session,
    rank, wrong lines)`` or ``(session, rank, traceback)`` on ``out``."""
    import traceback

    from swemu.launch import die_with_parent
    from swemu.protocol import wire
    from swemu.protocol.worker import quant

    die_with_parent(os.getppid())
    try:
        wrong = []
        with hostlib.connect(
            control=control, rank=rank, world_size=world, session_id=session_id, window=32
        ) as ctx:
            nvals = 32 << ctx.options.packet_size
            for call in range(calls):
                dt = (np.int32, np.float32, np.float16)[call % 3]
                if dt == np.float16:
                    xs = [half_input(r, n).astype(np.float16) for r in range(world)]
                    y = ctx.allreduce(xs[rank])
                    nv16 = wire.values16_per_packet(ctx.options.packet_size)
                    want = quant.simulate_allreduce16(xs, nv16)
                    y, want = y.view(np.uint16), want.view(np.uint16)  # bit for bit
                else:
                    y = ctx.allreduce(rank_input(rank, n, call, dt))
                    xs = [rank_input(r, n, call, dt) for r in range(world)]
                if dt == np.int32:
                    want = np.sum([x.astype(np.int64) for x in xs], axis=0).astype(np.int32)
                elif dt == np.float32:
                    want = quant.simulate_allreduce(xs, nvals)
                if not np.array_equal(y, want):
                    wrong.append(
                        f"call {call} ({np.dtype(dt)}): {np.count_nonzero(y != want)} differ"
                    )
        out.put((session_id, rank, wrong))
    except BaseException:
        out.put((session_id, rank, traceback.format_exc()))


def fabric_loop(rank, world, control, session_id, iters, n, dtype, progress, out) -> None:
    """``restart_loop`` for one rank of a fabric's job, registered at its own
    switch (``control``); puts ``(session, rank, wrong lines or traceback)``."""
    import traceback

    from swemu.launch import die_with_parent

    die_with_parent(os.getppid())
    try:
        with hostlib.connect(
            control=control,
            rank=rank,
            world_size=world,
            session_id=session_id,
            window=24,
            no_progress=RESTART_PATIENCE,
        ) as ctx:
            out.put((session_id, rank, restart_loop(ctx, iters, n, dtype, progress)))
    except BaseException:
        out.put((session_id, rank, traceback.format_exc()))


def half_input(rank: int, n: int) -> np.ndarray:
    """:func:`rank_input`'s float32 values scaled into float16's range."""
    return rank_input(rank, n, 0, np.float32) * np.float32(2.0**-10)


def values16_calls(ctx: hostlib.Context, n: int) -> dict:
    """The 16-bit wire (docs/protocol.md §4.2): a float16 tensor by default, float32
    asked for, bfloat16 bit patterns, and float16 kept on the 32-bit wire; each with
    what the worker sent (packets)."""
    from swemu.protocol.worker.quant import bfloat16_bits

    x = half_input(ctx.rank, n)
    out: dict = {"available": ctx.values16_available}
    out["float16"] = ctx.allreduce(x.astype(np.float16))
    # the first call with 16-bit data compiles their kernels (hostlib.client
    # _warmup16_once), and a worker that finishes first resends meanwhile: count
    # the packets of a later one
    ctx.allreduce(x.astype(np.float16))
    out["float16_sent"] = ctx.last_stats["sent"]
    out["float32"] = ctx.allreduce(x, values16=True)
    out["float32_sent"] = ctx.last_stats["sent"]
    out["bfloat16"] = ctx.allreduce(bfloat16_bits(x), bfloat16=True)
    out["float16_on_32"] = ctx.allreduce(x.astype(np.float16), values16=False)
    out["float16_on_32_sent"] = ctx.last_stats["sent"]
    out["int32"] = ctx.allreduce(np.arange(n, dtype=np.int32))  # exact, in the same job
    return out


def float16_once(ctx: hostlib.Context, n: int) -> int:
    """One float16 allreduce of ``n`` values; the session id (to read its counters)."""
    ctx.allreduce(np.full(n, 0.5, np.float16))
    return ctx.session_id
