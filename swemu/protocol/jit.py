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
- ``linked=False``: compiled callers call the kernel's one compiled copy by its
  symbol instead of linking it in. Numba links a compiled callee's LLVM module
  into every caller and optimizes and generates machine code for it again
  there, at every level: the switch's kernel was optimized three times
  (``process_batch``, then in ``switch_batch``, then in ``drain``), the
  worker's result matcher twice. For the few big kernels called once per
  batch (the switch's kernel, the receive and send loops, the worker's result
  matcher) that was about 1 s of each side's first-run CPU; the price is one
  call that LLVM cannot inline, per batch. Small per-packet helpers stay
  linked (or ``inline``).

  How: the project registers such a kernel's compiled function for its callers
  without its library (:func:`_call_by_symbol`) and makes its symbol known to
  the process (llvmlite's ``add_symbol``). A caller loaded from the cache names
  a symbol from the process that compiled it (Numba numbers functions in the
  order they compile), so each caller carries, in what Numba runs before it
  loads one from the cache (``reload_init``), which kernel and signature it
  calls: loading the caller loads (or compiles) that kernel first and gives it
  the symbol the caller names. (A caller that links in another one inherits
  its list; for a library loaded from the cache, which Numba rebuilds without
  it, the list is put back.)

  A cached caller is a miss, and compiles again, when the kernel it calls no
  longer fits it (another return type after an edit, or it no longer compiles
  for those types), when this version of the project cannot rebuild the entry
  (another version wrote it), and when it would still call a symbol nobody
  defined (checked before LLVM loads it: LLVM aborts the process on one). If
  the Numba internals this uses are not there (another Numba version), every
  kernel is linked as Numba does.

Two helpers for the same reason: :func:`min2` and :func:`max2`, since Numba's
builtin ``min``/``max`` compile a library of their own per pair of argument
types and per kernel.

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

May import: numba (and llvmlite, which it brings).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from numba import njit
from numba.core import event

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger(__name__)


def kernel(
    fn: F | None = None, *, entry: bool = True, inline: bool = False, linked: bool = True
) -> Any:
    """Compile ``fn`` with the project's Numba options (see the module).
    ``@kernel``, ``@kernel(entry=False)`` (called from compiled code only),
    ``@kernel(inline=True)`` (inlined into its compiled callers) or
    ``@kernel(linked=False)`` (compiled callers call its one copy by symbol)."""
    options: dict[str, Any] = {"cache": True, "nogil": True, "no_cfunc_wrapper": True}
    if not entry:
        options["no_cpython_wrapper"] = True
    if inline:
        options["inline"] = "always"
    if inline and not linked:
        raise ValueError("a kernel is either inlined into its callers or called by symbol")
    decorate = njit(**options)

    def compile_it(f: F) -> Any:
        if not linked:
            if "." in f.__qualname__:  # _Resolve finds the kernel by module and name
                raise ValueError(
                    f"{f.__qualname__}: only a module-level kernel is called by symbol"
                )
            _BY_SYMBOL.add((f.__module__, f.__qualname__))
            # how Numba's mangled names of its compiled versions begin
            parts = f"{f.__module__}.{f.__qualname__}".split(".")
            _SYMBOL_PREFIXES.append("_ZN" + "".join(f"{len(p)}{p}" for p in parts))
        return decorate(f)

    return compile_it if fn is None else compile_it(fn)


@kernel(inline=True)
def min2(a, b):
    """``min(a, b)`` of two scalars (Python's: ``a`` unless ``b < a``), inlined:
    Numba's builtin ``min``/``max`` compile a library of their own per pair of
    argument types, and per kernel (nine of a worker warm-up's compilations)."""
    return b if b < a else a


@kernel(inline=True)
def max2(a, b):
    """``max(a, b)`` of two scalars (Python's: ``a`` unless ``b > a``), inlined
    (see :func:`min2`)."""
    return b if b > a else a


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


# ------------------------------------------------ kernels called by symbol
_BY_SYMBOL: set[tuple[str, str]] = set()  # (module, name) of the linked=False kernels
_SYMBOL_PREFIXES: list[str] = []  # their symbols' beginnings (_unresolved)


class _Stale(Exception):
    """A cached caller's callee no longer fits it: the caller is a cache miss."""


def _define(symbol: str, library: Any, name: str) -> None:
    """Make ``symbol`` resolve to the function ``name`` of the compiled ``library``."""
    from llvmlite import binding as ll

    ll.add_symbol(symbol, library.get_pointer_to_function(name))


@dataclass(frozen=True)
class _Resolve:
    """What a caller of a ``linked=False`` kernel runs before Numba loads the
    caller from the cache (it is pickled with it): load or compile the kernel
    ``module.name`` for ``argtypes`` and let ``symbol``, the name the caller
    calls, resolve to it."""

    module: str
    name: str
    argtypes: tuple
    restype: Any
    symbol: str

    def __call__(self) -> None:
        what = f"{self.module}.{self.name}"
        try:
            dispatcher = getattr(importlib.import_module(self.module), self.name)
            dispatcher.compile(self.argtypes)
            cres = dispatcher.overloads[self.argtypes]
        except Exception as exc:  # gone, or no longer compiles for these types
            raise _Stale(f"{what}{self.argtypes}: {exc}") from exc
        if cres.fndesc.restype != self.restype:
            raise _Stale(f"{what} now returns {cres.fndesc.restype}, not {self.restype}")
        _define(self.symbol, cres.library, cres.fndesc.mangled_name)


def _unresolved(module: Any) -> list[str]:
    """The symbols of ``linked=False`` kernels that the LLVM ``module`` (of a
    library loaded from the cache) calls and this process cannot resolve."""
    from llvmlite import binding as ll

    if not _SYMBOL_PREFIXES:
        return []
    prefixes = tuple(_SYMBOL_PREFIXES)
    return [
        fn.name
        for fn in module.functions
        if fn.is_declaration and fn.name.startswith(prefixes) and not ll.address_of_symbol(fn.name)
    ]


def _call_by_symbol(fndesc: Any, library: Any) -> Any:
    """Numba's own implementation of a call to a compiled function
    (``numba.core.imputils.user_function``), given no library to link: the
    caller declares the function; and the caller records how to resolve it
    when it is loaded from the cache (:class:`_Resolve`)."""
    from numba.core.imputils import user_function

    _define(fndesc.mangled_name, library, fndesc.mangled_name)
    resolve = _Resolve(
        fndesc.modname, fndesc.qualname, tuple(fndesc.argtypes), fndesc.restype, fndesc.mangled_name
    )
    call = user_function(fndesc, ())

    def imp(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        context.active_code_library._reload_init.add(resolve)
        return call(context, builder, sig, args)

    imp.signature = call.signature  # type: ignore[attr-defined]
    imp.libs = ()  # type: ignore[attr-defined]
    return imp


def _install_calls_by_symbol() -> bool:
    """Register ``linked=False`` kernels through :func:`_call_by_symbol`, and
    make a :class:`_Stale` cached caller a miss. False (and Numba's linking
    for every kernel) if this Numba lacks an internal it takes."""
    try:
        from numba.core import base, caching, codegen, imputils

        insert = base.BaseContext.insert_user_function
        load = caching.Cache.load_overload
        finalize = codegen.CPUCodeLibrary._finalize_final_module
    except (ImportError, AttributeError):
        return False
    uses = (
        (imputils, "user_function"),
        (base.BaseContext, "active_code_library"),
    )
    if not all(hasattr(where, name) for where, name in uses):
        return False
    if getattr(insert, "swemu_by_symbol", False):
        return True

    def insert_user_function(self: Any, func: Any, fndesc: Any, libs: Any = ()) -> None:
        if len(libs) == 1 and (fndesc.modname, fndesc.qualname) in _BY_SYMBOL:
            impl = _call_by_symbol(fndesc, libs[0])
            self._defns[func].append(impl, impl.signature)
        else:
            insert(self, func, fndesc, libs)

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        try:
            cres = load(self, sig, target_context)
        except OSError:
            raise  # the cache cannot be read: not ours to hide
        except Exception as exc:  # _Stale, or an entry another version wrote
            _log.debug("cache entry of %s%s not used: %s", self._name, sig, exc)
            return None
        if cres is None:
            return None
        # Numba rebuilds a cached library without what it runs before a load; a
        # caller compiled now links this library and must inherit how to resolve
        # the symbols it calls
        cres.library._reload_init.update(getattr(cres, "reload_init", ()))
        return cres

    def finalize_loaded(self: Any) -> None:
        if self._shared_module is not None:  # loaded from the cache: its calls first
            missing = _unresolved(self._shared_module)
            if missing:  # LLVM would abort the process on them
                raise _Stale(f"{', '.join(missing)} unresolved")
        finalize(self)

    insert_user_function.swemu_by_symbol = True  # type: ignore[attr-defined]
    base.BaseContext.insert_user_function = insert_user_function
    caching.Cache.load_overload = load_overload
    codegen.CPUCodeLibrary._finalize_final_module = finalize_loaded
    return True


BY_SYMBOL = _install_calls_by_symbol()  # whether linked=False kernels are called by symbol


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
