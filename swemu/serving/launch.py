"""Start child processes that die with their parent, and an emulator among them.

Used by ``switchml run`` (its embedded emulator and its workers), the pytest
plugin, the end-to-end tests and the benchmarks: one place that knows how to
start ``switchml-emu serve`` on free ports, wait until it serves, and stop it.

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

The emulator's temporary directory (``swemu-<pid>-*``, only its ready file)
is removed as soon as the ready file is read, by the emulator's own process if
it stops before that, and any left by a launcher that was killed during the
emulator's start-up (``<pid>`` no longer alive) is swept at the next start.

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
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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
#: death signal, ends at once if its parent is already gone, then becomes the
#: command (the setting survives ``execv``); only ``os``, ``signal`` and ``ctypes``
_EXEC_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def spawn(cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """:class:`subprocess.Popen` for a child that is sent SIGTERM when this
    process (precisely: the calling thread) ends, however it ends, SIGKILL
    included. Keyword arguments go to Popen.

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
    wrapper = [sys.executable, "-c", _EXEC_WITH_PARENT, str(os.getpid()), path, *argv[1:]]
    return subprocess.Popen(wrapper, **kwargs)


class EmulatorProcess:
    """A ``switchml-emu serve`` child process on free loopback ports.

    ``switch`` and ``control`` are ``HOST:PORT`` strings ready for
    :func:`hostlib.connect`. Use as a context manager, or call :meth:`start`
    and :meth:`stop`. ``shards`` > 1 runs the data plane in that many
    processes (``serve --shards``): ``switch`` is shard 0's address and
    ``data_ports`` lists every shard's port (workers learn them at registration).
    """

    def __init__(
        self,
        *args: str,
        host: str = "127.0.0.1",
        shards: int = 1,
        startup_timeout: float = 300.0,
        log_level: str = "warning",
        stderr=None,
    ) -> None:
        self.extra = list(args)
        self.shards = shards
        self.host = host
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.stderr = stderr
        self.proc: subprocess.Popen | None = None
        self.data: tuple[str, int] = ("", 0)
        self.control_addr: tuple[str, int] = ("", 0)
        self.data_ports: list[int] = []
        self._dir: str | None = None
        self._ready: Path | None = None
        self._deadline = 0.0

    @property
    def switch(self) -> str:
        return f"{self.data[0]}:{self.data[1]}"

    @property
    def control(self) -> str:
        return f"{self.control_addr[0]}:{self.control_addr[1]}"

    def start(self) -> EmulatorProcess:
        """Start the emulator and wait until it serves (:meth:`begin`, then
        :meth:`poll_ready` until true)."""
        self.begin()
        while not self.poll_ready():
            time.sleep(0.02)
        return self

    def begin(self) -> None:
        """Start the emulator process; :meth:`poll_ready` says when it serves.
        ``startup_timeout`` counts from here and is generous because a first
        run compiles the kernels (about 40 s on an idle core, minutes on a
        busy one); an emulator that exits is noticed at once."""
        sweep_stale_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        self._ready = Path(self._dir) / "ready.json"
        cmd = [
            sys.executable,
            "-m",
            "cli.emulator_child",  # serve, then remove self._dir (see its docstring)
            self._dir,
            "serve",
            "--host",
            self.host,
            "--port",
            "0",
            "--control-port",
            "0",
            "--log-level",
            self.log_level,
            "--ready-file",
            str(self._ready),
            *(["--shards", str(self.shards)] if self.shards != 1 else []),
            *self.extra,
        ]
        self.proc = spawn(
            cmd, stdin=subprocess.DEVNULL, stderr=self.stderr, env=child_env(), cwd=CHILD_CWD
        )
        self._deadline = time.monotonic() + self.startup_timeout

    def poll_ready(self) -> bool:
        """True once the emulator serves (its addresses are then set); raises
        :class:`OSError` if it exited or did not start within ``startup_timeout``."""
        if self.data[1]:
            return True
        if self.proc is None or self._ready is None:
            raise RuntimeError("EmulatorProcess.poll_ready before begin")
        if not self._ready.exists():
            if self.proc.poll() is not None:
                self._remove_dir()
                raise OSError(f"the emulator exited with status {self.proc.returncode} at start")
            if time.monotonic() > self._deadline:
                self.stop()
                raise OSError(f"the emulator did not start within {self.startup_timeout:g} s")
            return False
        info = json.loads(self._ready.read_text())
        self._remove_dir()  # the ready file was all it held
        self.control_addr = (info["control"][0], int(info["control"][1]))
        self.data_ports = [int(p) for p in info.get("data_ports") or [int(info["data"][1])]]
        self.data = (info["data"][0], int(info["data"][1]))
        return True

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._remove_dir()
        return self.proc.returncode

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


#: temporary directories of :class:`EmulatorProcess`: ``swemu-<launcher pid>-<random>``
DIR_PREFIX = "swemu-"
_DIR_RE = re.compile(re.escape(DIR_PREFIX) + r"(\d+)-")


def sweep_stale_dirs(root: str | None = None) -> list[str]:
    """Remove this user's ``swemu-<pid>-*`` directories whose launcher ``pid``
    is no longer alive (it was killed while its emulator was starting);
    return their paths. Directories of live launchers are left alone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        m = _DIR_RE.match(entry.name)
        if not m:
            continue
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _pid_alive(
                int(m.group(1))
            ):
                continue
            shutil.rmtree(entry.path)
            removed.append(entry.path)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process of that number: alive
        return True
    return True


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


def torchrun_envs(workers: int) -> list[dict[str, str]]:
    """What torchrun sets for each rank of a one-machine job, one dict per
    rank: the world, the rank, a rendezvous on a free loopback port (rank 0's
    ``init_process_group`` serves the store there) and one OpenMP thread per
    process unless the user chose otherwise."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "WORLD_SIZE": str(workers),
        "LOCAL_WORLD_SIZE": str(workers),
        "ROLE_WORLD_SIZE": str(workers),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    return [
        {**env, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(workers)
    ]
