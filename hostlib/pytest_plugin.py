"""pytest plugin: test your own distributed code against a real emulator.

Installed with the package (entry point ``pytest11``), it provides:

``switchml_emulator``
    a fixture that starts ``switchml-emu serve`` on free loopback ports for the
    test and yields an object with ``.switch`` and ``.control`` (``HOST:PORT``
    strings for :func:`hostlib.connect`), and ``.process`` (the child process);

``switchml_workers``
    a fixture returning ``run(n, fn, *args, timeout=120, **connect_kwargs)``:
    runs ``fn(ctx, *args)`` as ranks 0..n-1 in n separate processes, each with a
    joined :class:`hostlib.Context`, and returns the n return values in rank
    order. ``fn`` must be importable (a module-level function). An exception in
    any rank is re-raised in the test with the rank named.

The emulator and the ranks end with the test session however it ends: a
pytest process killed outright (a CI timeout's SIGKILL) takes them along
(:func:`swemu.launch.spawn`, :func:`swemu.launch.die_with_parent`).

Example::

    def double_sum(ctx, n):
        return ctx.allreduce(np.full(n, ctx.rank + 1, np.int32))

    def test_sum(switchml_workers):
        results = switchml_workers(4, double_sum, 1000)
        assert all((r == 10).all() for r in results)
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class WorkerFailed(AssertionError):
    """A rank of ``switchml_workers`` raised or died."""


def _rank_main(
    parent: int,
    rank: int,
    n: int,
    switch: str,
    control: str,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    results: multiprocessing.Queue,
) -> None:
    from swemu.launch import die_with_parent

    die_with_parent(parent)  # a test session killed outright takes its ranks along
    try:
        import hostlib

        with hostlib.connect(switch, control, rank=rank, world_size=n, **kwargs) as ctx:
            value = fn(ctx, *args)
        results.put((rank, True, value))
    except BaseException as exc:  # reported to the test, with the rank
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_workers(
    switch: str,
    control: str,
    n: int,
    fn: Callable,
    *args: Any,
    timeout: float = 120.0,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` as n ranks in n processes; return their results."""
    mp = multiprocessing.get_context("spawn")
    results = mp.Queue()
    procs = [
        mp.Process(
            target=_rank_main,
            args=(os.getpid(), r, n, switch, control, fn, args, kwargs, results),
            daemon=True,
        )
        for r in range(n)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(n):
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in out]
                raise WorkerFailed(
                    f"switchml_workers: no result within {timeout:g} s (ranks exited without "
                    f"a result: {dead})"
                ) from None
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    if errors:
        raise WorkerFailed("\n".join(errors))
    return [out[r] for r in range(n)]


class _Emulator:
    def __init__(self, process: Any) -> None:
        self.process = process
        self.switch: str = process.switch
        self.control: str = process.control


@pytest.fixture
def switchml_emulator() -> Iterator[_Emulator]:
    """A real emulator on free loopback ports, stopped after the test."""
    from swemu.launch import EmulatorProcess

    with EmulatorProcess() as proc:
        yield _Emulator(proc)


@pytest.fixture
def switchml_workers(switchml_emulator: _Emulator) -> Callable[..., list[Any]]:
    """``run(n, fn, *args, **connect_kwargs)``: n ranks of ``fn`` against the emulator."""

    def run(n: int, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        return run_workers(
            switchml_emulator.switch, switchml_emulator.control, n, fn, *args, **kwargs
        )

    return run
