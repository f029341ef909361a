"""A ``switchml-emu serve`` child process on free loopback ports.

One place that knows how to start the emulator, wait until it serves and stop it.
It is started by a command line (``python -m swemu.launch.child DIR cli.main serve ...``),
never imported: nothing here imports the switch or the CLI.

The emulator's temporary directory (``swemu-<pid>-*``, only its ready file)
is removed as soon as the ready file is read, by the emulator's own process if
it stops before that, and any left by a launcher that was killed during the
emulator's start-up (``<pid>`` no longer alive) is swept at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .process import CHILD_CWD, child_env, spawn

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


class EmulatorProcess:
    """A ``switchml-emu serve`` child process on free loopback ports.

    ``switch`` and ``control`` are ``HOST:PORT`` strings ready for
    :func:`hostlib.connect`. Use as a context manager, or call :meth:`start`
    and :meth:`stop`. ``shards`` > 1 runs the data plane in that many
    processes (``serve --shards``): ``switch`` is shard 0's address and
    ``data_ports`` lists every shard's port (workers learn them at registration).
    ``port`` and ``control_port`` choose the ports (0: free ones), e.g. to start
    an emulator again where one was killed (:meth:`kill`).
    """

    def __init__(
        self,
        *args: str,
        host: str = "127.0.0.1",
        shards: int = 1,
        startup_timeout: float = 300.0,
        log_level: str = "warning",
        stderr=None,
        port: int = 0,
        control_port: int = 0,
    ) -> None:
        self.extra = list(args)
        self.port = port
        self.control_port = control_port
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
            "swemu.launch.child",  # run the command, then remove self._dir
            self._dir,
            "cli.main",  # switchml-emu
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--control-port",
            str(self.control_port),
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

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is shut down in order."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._remove_dir()

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
