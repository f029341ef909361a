"""How the project compiles a kernel: one decorator for every Numba function.

Every compiled function of the switch and of the host library is declared with
:func:`kernel`, so that the options that decide a first run's compile time are
chosen in one place:

- ``cache=True``: compiled once per machine, loaded from Numba's cache later.
- ``nogil=True``: the host library's wait loop runs beside Python threads
  (``torch.distributed``'s switch thread, DDP's backward).
- ``no_cfunc_wrapper=True``: Numba otherwise builds a C-ABI entry point beside
  every function, for use as a first-class function value, which nothing here
  does; skipping it took 0.3-0.6 s off each side's first-run compile.
- ``entry=False`` (``no_cpython_wrapper``): for helpers that only compiled code
  calls. A function's CPython entry point unboxes each argument from a Python
  object; for the loops' helpers (dozens of arrays, tuples of arrays) it was
  tenths of a second of compile per helper, for a door nobody uses. Numba gives
  such a function no Python entry at all: called from Python it crashes the
  process. So only functions whose every caller is compiled and never run as
  plain Python (the kernels' Python bodies are test oracles) go without one.
- ``inline=True``: Numba inlines the function into each caller before typing
  (for small per-packet helpers); a call with 30 or more arguments cannot be
  inlined (CPython 3.11 passes them as one tuple), so keep those few.

A cache index written by another version of the project is a cache miss, not
a crash: Numba unpickles each function's index before it compares the source
stamp, and an index that names a record class since renamed or removed (a
NamedTuple in a kernel's signature) raised ``AttributeError`` there, so an
upgrade over an old cache failed at start (numba/numba#6018). Importing this
module makes such an index load as empty, as a stale one does; the kernels
compile again and the index is rewritten.

And while Numba compiles, Python's cyclic garbage collector is paused:
importing this module registers a listener on Numba's ``numba:compile`` event
that pauses it from the start of the outermost compilation to its end (in this
process, for any Numba function; a cache hit fires no such event). The
compiler makes millions of short-lived objects, and the collector's passes over
them were 7 % of the emulator's first-run compile and 11 % of a worker's.

Measured with ``python -m bench compile``; docs/performance.md has the figures.

May import: numba.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from numba import njit
from numba.core import event

F = TypeVar("F", bound=Callable[..., Any])


def kernel(fn: F | None = None, *, entry: bool = True, inline: bool = False) -> Any:
    """Compile ``fn`` with the project's Numba options (see the module).
    ``@kernel``, ``@kernel(entry=False)`` (called from compiled code only) or
    ``@kernel(inline=True)`` (inlined into its compiled callers)."""
    options: dict[str, Any] = {"cache": True, "nogil": True, "no_cfunc_wrapper": True}
    if not entry:
        options["no_cpython_wrapper"] = True
    if inline:
        options["inline"] = "always"
    decorate = njit(**options)
    return decorate if fn is None else decorate(fn)


class _PauseCollector(event.Listener):
    """Pauses the cyclic garbage collector from the start of the outermost
    Numba compilation to its end (callees compile inside their caller; Numba's
    compile lock keeps one thread compiling at a time). Reference counting
    still frees what the compiler drops, so memory stays bounded."""

    def __init__(self) -> None:
        self.depth = 0
        self.resume = False

    def on_start(self, ev: event.Event) -> None:
        if self.depth == 0:
            self.resume = gc.isenabled()
            gc.disable()
        self.depth += 1

    def on_end(self, ev: event.Event) -> None:
        self.depth -= 1
        if self.depth == 0 and self.resume:
            gc.enable()


event.register("numba:compile", _PauseCollector())


def _tolerate_foreign_indexes() -> None:
    """Make an index that no longer unpickles a miss (see the module)."""
    from numba.core import caching

    load = caching.IndexDataCacheFile._load_index
    if getattr(load, "swemu_tolerant", False):
        return

    def _load_index(self: caching.IndexDataCacheFile) -> dict:
        try:
            return load(self)
        except OSError:
            raise  # the cache cannot be read: not ours to hide
        except Exception:  # a class, module or format the index names is gone
            return {}

    _load_index.swemu_tolerant = True  # type: ignore[attr-defined]
    caching.IndexDataCacheFile._load_index = _load_index


_tolerate_foreign_indexes()


class CompileWatch(event.Listener):
    """Calls ``callback`` once, when Numba first starts compiling (see
    :func:`watch_compiles`); :attr:`compiled` says whether anything did."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.compiled = False

    def on_start(self, ev: event.Event) -> None:
        if not self.compiled:
            self.compiled = True
            self.callback()

    def on_end(self, ev: event.Event) -> None:
        pass


@contextlib.contextmanager
def watch_compiles(callback: Callable[[], None] = lambda: None) -> Iterator[CompileWatch]:
    """While inside, call ``callback`` once as soon as Numba compiles anything in
    this process: a first run's cache miss (a cache hit fires no compile event).
    What says "compiling kernels (first run only)" at a first start."""
    watch = CompileWatch(callback)
    with event.install_listener("numba:compile", watch):
        yield watch


@contextlib.contextmanager
def compiling_said(
    logger: logging.Logger,
    what: str = "kernels",
    when: str = "first start only; later starts load them from the cache",
) -> Iterator[None]:
    """Around a process's kernel warm-up: on a first start (Numba's cache
    missed) log at INFO that the ``what`` are compiling (``when``: why now),
    as it begins, and how long it took (``switchml-emu serve``, which
    otherwise sat silent for the seconds of a first compile)."""
    t0 = time.monotonic()

    def say() -> None:
        logger.info("compiling %s (%s)", what, when)

    with watch_compiles(say) as watch:
        yield
    if watch.compiled:
        logger.info("compiled the %s in %.1f s", what, time.monotonic() - t0)
