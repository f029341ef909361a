"""Start child processes that die with their parent, in an environment that can
import the project and write Numba's cache.

Process hygiene
---------------
A launcher may die any way at all: Ctrl-C, SIGTERM, its terminal closing
(SIGHUP), or SIGKILL, which runs none of its code. So the guarantee is set up
in each child, by the kernel: :func:`spawn` starts a child with
``PR_SET_PDEATHSIG`` = SIGTERM (Linux), so it is sent SIGTERM the moment the
thread that started it ends; :func:`die_with_parent` does the same from inside
a child started some other way (multiprocessing). The emulator handles SIGTERM
by shutting down in order (its shard processes exit when their pipe to it
closes); workers and user commands get the ordinary SIGTERM. Call :func:`spawn`
from a thread that lives as long as the child should, the main thread
normally: the kernel ties the signal to the starting *thread*.

Numba's cache
-------------
Kernels compile on first use and are cached on disk (``cache=True``), beside
the sources when that directory is writable. :func:`numba_cache_env` points
child processes at a per-user cache directory otherwise, before they import
Numba.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: ``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process
#: when the thread that created it ends (``man 2 prctl``)
PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# resolved here, in the parent: the child between fork and exec only calls it
_prctl = _load_prctl()


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent ends, and
    end now if the parent (``parent_pid``, as seen before the fork) is already
    gone. Call it first thing in a child; a no-op off Linux."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl: the signal will never come
        os.kill(os.getpid(), sig)


#: the child's first program where ``PR_SET_PDEATHSIG`` is available: it sets the
#: death signal, ends at once if its parent is already gone, resets the listed
#: signals to their default action and, if asked, unblocks every signal, then
#: becomes the command (the settings survive ``execv``); only ``os``, ``signal``
#: and ``ctypes``
_EXEC_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "for s in map(int, filter(None, sys.argv[2].split(','))):\n"
    "    try:\n"
    "        signal.signal(s, signal.SIG_DFL)\n"
    "    except (OSError, ValueError):\n"
    "        pass\n"
    "if sys.argv[3] == '1':\n"
    "    signal.pthread_sigmask(signal.SIG_SETMASK, ())\n"
    "os.execv(sys.argv[4], sys.argv[4:])\n"
)

#: what ``Popen(restore_signals=True)`` resets, and the Python interpreter that
#: runs :data:`_EXEC_WITH_PARENT` sets to "ignored" again (an ignored signal
#: stays ignored across ``execv``)
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)


def spawn(cmd: Sequence[str], *, default_signals: bool = False, **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` for a child that is sent SIGTERM when this
    process (precisely: the calling thread) ends, however it ends, SIGKILL
    included. Keyword arguments go to Popen.

    ``default_signals``: the child starts with every signal at its default
    action and none blocked, whatever this process inherited. Without it the
    child inherits what Popen passes on: a background job of a non-interactive
    shell ignores SIGINT and SIGQUIT, ``nohup`` SIGHUP, and so do its
    children -- as the shell meant, for a launcher; a test that interrupts its
    child must not depend on it.

    The death signal is set by a small Python program that then execs the
    command (same process, same pid), not by a ``preexec_fn``: a
    ``preexec_fn`` makes Popen fork the whole interpreter and run Python in
    the child before ``exec``, and in a process whose threads are inside gRPC
    (a launcher that talks to the emulator, a test) gRPC's fork handlers
    aborted such children (SIGABRT before the command ran). Without one,
    Popen uses ``vfork``/``exec`` and no fork handler runs. A command that
    cannot be found raises :class:`FileNotFoundError` here, as Popen would."""
    argv = list(cmd)
    if _prctl is None or not argv:
        return subprocess.Popen(argv, **kwargs)
    path = argv[0]
    if os.sep not in path:
        env = kwargs.get("env")
        search = (env if env is not None else os.environ).get("PATH", os.defpath)
        found = shutil.which(path, path=search)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        path = found
    elif not os.path.isfile(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    elif not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    if default_signals:
        reset = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})
    else:
        reset = list(_RESTORED) if kwargs.get("restore_signals", True) else []
    wrapper = [
        sys.executable,
        "-c",
        _EXEC_WITH_PARENT,
        str(os.getpid()),
        ",".join(str(int(s)) for s in reset),
        "1" if default_signals else "0",
        path,
        *argv[1:],
    ]
    return subprocess.Popen(wrapper, **kwargs)


def wait_all(procs: Sequence[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for every process (each at most ``timeout`` seconds) and return
    their exit codes in order; if waiting fails (a timeout, Ctrl-C), kill and
    reap the ones still running before the exception goes on."""
    try:
        return [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# where child processes of ours start: ``python -m`` puts the working directory
# first on sys.path, and a user's ``random.py`` (or a scratch ``nt.py``, which
# pathlib's import probes for) would shadow the standard library in the child.
# The project root is on the children's path anyway (child_env).
CHILD_CWD = str(Path(__file__).resolve().parents[2])


def child_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: this one, with the project importable
    and Numba's cache where it can be written (:func:`numba_cache_env`)."""
    env = dict(os.environ)
    env.update(numba_cache_env())
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def numba_cache_env() -> dict[str, str]:
    """``{"NUMBA_CACHE_DIR": ...}`` when child processes need it, else ``{}``.

    Numba caches compiled kernels beside the sources (``__pycache__``) when
    that directory is writable, which is the fast path for a checkout or a
    user install. For a read-only install (a system site-packages, a
    container image) the cache goes to ``$XDG_CACHE_HOME/switchml-emu/numba``
    (``~/.cache/...``), or to a per-user temporary directory when even that
    cannot be written: never nowhere, so that only the first run compiles.
    A ``NUMBA_CACHE_DIR`` the user set is kept.
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return {}
    package = Path(__file__).resolve().parent
    if _writable(package / "__pycache__") or _writable(package):
        return {}
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for candidate in (
        os.path.join(base, "switchml-emu", "numba"),
        os.path.join(tempfile.gettempdir(), f"switchml-emu-numba-{os.getuid()}"),
    ):
        with contextlib.suppress(OSError):
            os.makedirs(candidate, exist_ok=True)
        if _writable(Path(candidate)):
            return {"NUMBA_CACHE_DIR": candidate}
    return {}


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
