"""The project's kernel decorator (``swemu.protocol.jit.kernel``): a kernel
declared ``linked=False`` is called by symbol from compiled callers, never
compiled into them, and callers loaded from Numba's cache still find it, in a
new process and after the kernel changed. Each step is its own process on one
cache directory, as separate runs of a user's program are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from swemu.launch import child_env

CALLER = """\
from swemu.protocol.jit import kernel
from callee import scale


@kernel
def twice(a):
    return scale(a, 2) + scale(a, 3)


@kernel
def once(a, k):
    return scale(a, k)


@kernel
def through(a, k):  # once is linked in, scale called by symbol
    return once(a, k) + once(a, k + 1)
"""

CALLEE = """\
from swemu.protocol.jit import kernel


@kernel(linked=False)
def scale(a, k):
    s = 0
    for i in range(a.shape[0]):
        a[i] *= k
        s += a[i]
    return s{tail}
"""

MAIN = """\
import numpy as np
from numba import njit
import caller

for i in range({bump}):  # other functions first: Numba numbers functions as they compile
    njit(lambda x, i=i: x + i)(1)
a = np.arange(4)
fn = caller.{fn}
total = fn(a) if fn is caller.twice else fn(a, 2)
compiled = sum(fn.stats.cache_misses.values()) > 0
print(repr(total), a.tolist(), "compiled" if compiled else "cached")
if compiled:
    sig = fn.signatures[0]
    llvm = fn.inspect_llvm(sig)
    callee = [line for line in llvm.splitlines() if "scale" in line and "@_ZN" in line]
    declared = [line for line in callee if line.startswith("declare")]
    defined = [line for line in callee if line.startswith("define")]
    print("by symbol" if declared and not defined else "linked")  # (inlined: neither)
"""


def _run(tmp: Path, bump: int = 0, fn: str = "twice") -> list[str]:
    env = child_env(NUMBA_CACHE_DIR=str(tmp / "cache"))
    env["PYTHONPATH"] = os.pathsep.join((str(tmp), env["PYTHONPATH"]))
    (tmp / "main.py").write_text(MAIN.format(bump=bump, fn=fn))
    proc = subprocess.run(
        [sys.executable, str(tmp / "main.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout.split("\n")


def test_a_kernel_called_by_symbol_is_found_by_cached_callers_and_after_it_changed(tmp_path):
    (tmp_path / "caller.py").write_text(CALLER)
    (tmp_path / "callee.py").write_text(CALLEE.format(tail=""))
    # 2 * [0, 1, 2, 3] sums to 12, then 3 * [0, 2, 4, 6] to 36
    expect = "48 [0, 6, 12, 18] "

    first = _run(tmp_path)  # compiles both; the caller declares scale, does not link it
    assert first[:2] == [expect + "compiled", "by symbol"], first

    again = _run(tmp_path)  # loads both: the caller's symbol resolves to the cached scale
    assert again[0] == expect + "cached", again

    # scale edited (same types): it compiles again, in a process that numbered
    # other functions first, so under another symbol; the cached caller still
    # calls it (the new one: the new behaviour)
    (tmp_path / "callee.py").write_text(CALLEE.format(tail=" + 100"))
    edited = _run(tmp_path, bump=3)
    assert edited[0] == "248 [0, 6, 12, 18] cached", edited

    # scale now returns a float: the cached caller does not fit it, it compiles again
    (tmp_path / "callee.py").write_text(CALLEE.format(tail=" * 0.5"))
    retyped = _run(tmp_path, bump=5)
    assert retyped[:2] == ["24.0 [0, 6, 12, 18] compiled", "by symbol"], retyped
    assert _run(tmp_path)[0] == "24.0 [0, 6, 12, 18] cached"


def test_only_a_module_level_kernel_can_be_called_by_symbol():
    import pytest

    from swemu.protocol.jit import kernel

    def outer() -> None:
        @kernel(linked=False)
        def inner(x):
            return x

    with pytest.raises(ValueError, match="module-level"):
        outer()
    with pytest.raises(ValueError, match="either inlined"):
        kernel(inline=True, linked=False)


def test_the_project_calls_its_big_kernels_by_symbol():
    """The kernels this is for: Numba's internals it uses are there (else
    every kernel is linked, and a first run compiles about 1 s more per side)."""
    import hostlib.fastpath  # noqa: F401
    import swemu.core.kernels
    import swemu.protocol.worker.kernels  # noqa: F401
    from swemu.protocol import jit

    assert jit.BY_SYMBOL
    assert {
        ("swemu.core.kernels", "process_batch"),
        ("swemu.protocol.fastio", "recv_rows"),
        ("swemu.protocol.fastio", "send_batch_gso"),
        ("swemu.protocol.worker.kernels", "on_results"),
        ("hostlib.fastpath", "send_slots"),
    } <= jit._BY_SYMBOL


def test_a_cache_entry_that_cannot_be_rebuilt_is_a_miss(tmp_path):
    """An entry another version of the project wrote (here: one cut short) is
    compiled again, not an error at every start."""
    (tmp_path / "caller.py").write_text(CALLER)
    (tmp_path / "callee.py").write_text(CALLEE.format(tail=""))
    assert _run(tmp_path)[0] == "48 [0, 6, 12, 18] compiled"
    (entry,) = (tmp_path / "cache").rglob("caller.twice-*.nbc")
    entry.write_bytes(entry.read_bytes()[:40])
    assert _run(tmp_path)[0] == "48 [0, 6, 12, 18] compiled"
    assert _run(tmp_path)[0] == "48 [0, 6, 12, 18] cached"


def test_a_caller_that_linked_a_cached_callee_of_a_kernel_called_by_symbol_finds_it(tmp_path):
    """``through`` links ``once``, which calls ``scale`` by symbol. Compiled
    while ``once`` came from the cache, ``through`` must still carry how to
    find ``scale`` (Numba rebuilds a cached library without it): a later
    process that loads ``through`` before anything else crashed on the
    unresolved symbol (an emulator started with a capture: ``step`` links
    ``switch_batch``, which calls ``process_batch``)."""
    (tmp_path / "caller.py").write_text(CALLER)
    (tmp_path / "callee.py").write_text(CALLEE.format(tail=""))
    assert _run(tmp_path, fn="once")[:2] == ["12 [0, 2, 4, 6] compiled", "by symbol"]
    assert _run(tmp_path, fn="through")[0] == "48 [0, 6, 12, 18] compiled"
    assert _run(tmp_path, fn="through")[0] == "48 [0, 6, 12, 18] cached"
