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
    any rank is re-raised in the test with the rank named; a rank that exits
    without a result fails the test at once, with its exit status and the end
    of its stderr (:class:`Workers`, for a test that waits for some ranks only).

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
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
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
    stderr_fd: int | None = None,
) -> None:
    from swemu.launch import die_with_parent

    die_with_parent(parent)  # a test session killed outright takes its ranks along
    if stderr_fd is not None:  # kept by the parent, for the report of a rank that dies
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
    try:
        import hostlib

        with hostlib.connect(switch, control, rank=rank, world_size=n, **kwargs) as ctx:
            value = fn(ctx, *args)
        results.put((rank, True, value))
    except BaseException as exc:  # reported to the test, with the rank
        results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class _PassedFd:
    """A file descriptor handed to a ``spawn`` child with its arguments (the
    child gets a duplicate: multiprocessing's ``DupFd``, as for sockets)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction

        return (_passed_fd, (reduction.DupFd(self.fd),))


def _passed_fd(dup: Any) -> int:
    return dup.detach()


class Workers:
    """n ranks of ``fn(ctx, *args)`` in n processes, each with a joined
    :class:`hostlib.Context` (``**kwargs`` go to :func:`hostlib.connect`).

    :meth:`results` waits for their return values and fails as soon as a rank
    it waits for exits without one, with the rank's exit status and the end of
    its stderr (kept in a file while the rank runs, and copied to this
    process's stderr by :meth:`close`). Use as a context manager."""

    #: the end of a rank's stderr quoted in a failure
    TAIL_CHARS = 4000

    def __init__(
        self, switch: str, control: str, n: int, fn: Callable, *args: Any, **kwargs: Any
    ) -> None:
        mp = multiprocessing.get_context("spawn")
        self.n = n
        self._queue = mp.Queue()
        # unnamed files: nothing is left behind, however this process ends
        self._stderr = [tempfile.TemporaryFile() for _ in range(n)]  # noqa: SIM115 (closed in close())
        self._got: dict[int, Any] = {}
        self.procs = [
            mp.Process(
                target=_rank_main,
                args=(os.getpid(), r, n, switch, control, fn, args, kwargs, self._queue),
                kwargs={"stderr_fd": _PassedFd(self._stderr[r].fileno())},
                daemon=True,
            )
            for r in range(n)
        ]
        try:
            for p in self.procs:
                p.start()
        except BaseException:
            self.close()
            raise

    def results(self, timeout: float, ranks: Iterable[int] | None = None) -> dict[int, Any]:
        """The return values of ``ranks`` (all by default) by rank, once each
        has returned. :class:`WorkerFailed` with every rank's exception once
        the others have answered, or as soon as one of them exits without a
        result, or after ``timeout`` seconds (with the exceptions so far)."""
        wanted = set(range(self.n) if ranks is None else ranks)
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while wanted - set(self._got) - set(errors):
            try:
                rank, ok, value = self._queue.get(timeout=0.05)
            except queue.Empty:
                pending = sorted(wanted - set(self._got) - set(errors))
                dead = [r for r in pending if self.procs[r].exitcode is not None]
                if dead and self._queue.empty():  # nothing of theirs is on the way
                    why = f"rank {dead[0]} exited without a result: {self.report(dead[0])}"
                elif time.monotonic() > deadline:
                    why = f"no result of ranks {pending} within {timeout:g} s; " + "; ".join(
                        self.report(r) for r in pending
                    )
                else:
                    continue
                raise WorkerFailed(
                    "\n".join([f"switchml_workers: {why}", *errors.values()])
                ) from None
            if ok:
                self._got[rank] = value
            else:
                errors[rank] = f"rank {rank}: {value}"
        if errors:
            raise WorkerFailed("\n".join(errors[r] for r in sorted(errors)))
        return {r: self._got[r] for r in sorted(wanted)}

    def exitcodes(self, timeout: float) -> list[int | None]:
        """Every rank's exit status, after waiting at most ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        return [p.exitcode for p in self.procs]

    def report(self, rank: int) -> str:
        """Rank ``rank``'s exit status (or that it still runs) and the end of its stderr."""
        code = self.procs[rank].exitcode
        state = "still running" if code is None else f"exit status {code}"
        err = self.stderr(rank)
        if not err.strip():
            return f"rank {rank}: {state}, its stderr is empty"
        return f"rank {rank}: {state}, its stderr:\n{err[-self.TAIL_CHARS :]}"

    def close(self) -> None:
        """Stop the ranks (5 s to end, then killed), copy their stderr to this
        process's, and remove the files."""
        deadline = time.monotonic() + 5
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        for r in range(self.n):
            err = self.stderr(r)
            if err:
                sys.stderr.write(f"--- stderr of rank {r} ---\n{err}")
            self._stderr[r].close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stderr(self, rank: int) -> str:
        """What rank ``rank`` wrote to stderr so far."""
        f = self._stderr[rank]
        if f.closed:
            return ""
        return os.pread(f.fileno(), 1 << 30, 0).decode(errors="replace")


def run_workers(
    switch: str,
    control: str,
    n: int,
    fn: Callable,
    *args: Any,
    timeout: float = 120.0,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` as n ranks in n processes; return their results
    (:class:`Workers`: a rank that raises or dies fails it at once)."""
    with Workers(switch, control, n, fn, *args, **kwargs) as ranks:
        got = ranks.results(timeout)
    return [got[r] for r in range(n)]


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
