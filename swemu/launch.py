"""Start an emulator in a child process and learn its bound addresses.

Used by ``switchml run`` (its embedded emulator), the pytest plugin, the
end-to-end tests and the benchmarks: one place that knows how to start
``switchml-emu serve`` on free ports, wait until it serves, and stop it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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
        startup_timeout: float = 60.0,
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
        self._dir = tempfile.TemporaryDirectory(prefix="swemu-")

    @property
    def switch(self) -> str:
        return f"{self.data[0]}:{self.data[1]}"

    @property
    def control(self) -> str:
        return f"{self.control_addr[0]}:{self.control_addr[1]}"

    def start(self) -> EmulatorProcess:
        ready = Path(self._dir.name) / "ready.json"
        cmd = [
            sys.executable,
            "-m",
            "cli.main",
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
            str(ready),
            *(["--shards", str(self.shards)] if self.shards != 1 else []),
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stderr=self.stderr, env=child_env(), cwd=CHILD_CWD
        )
        deadline = time.monotonic() + self.startup_timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise OSError(f"the emulator exited with status {self.proc.returncode} at start")
            if time.monotonic() > deadline:
                self.stop()
                raise OSError(f"the emulator did not start within {self.startup_timeout:g} s")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        self.data = (info["data"][0], int(info["data"][1]))
        self.control_addr = (info["control"][0], int(info["control"][1]))
        self.data_ports = [int(p) for p in info.get("data_ports") or [self.data[1]]]
        return self

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
        self._dir.cleanup()
        return self.proc.returncode

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# where child processes of ours start: ``python -m`` puts the working directory
# first on sys.path, and a user's ``random.py`` (or a scratch ``nt.py``, which
# pathlib's import probes for) would shadow the standard library in the child.
# The project root is on the children's path anyway (child_env).
CHILD_CWD = str(Path(__file__).resolve().parent.parent)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: this one, with the project importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
