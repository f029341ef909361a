"""Hosts for tests of a fabric across machines: network namespaces on one bridge.

:class:`Hosts` makes a namespace ``net`` that holds a bridge (``SUBNET.1``,
where a root switch can live: a third machine) and one namespace per host, each
with a veth ``eth0`` into the bridge (``SUBNET.10``, ``SUBNET.11``, ...). Every
process started in them (:meth:`Hosts.spawn`, :meth:`Hosts.serve`) dies with
the test process, and leaving the context kills whatever still runs in the
namespaces and deletes them (their veths and the bridge go with them). Names
start with ``swml<pid>-hosts-``, so ``switchml cluster --cleanup`` also finds
what a killed test run left (swemu/rack/netns.py).

Nothing is added to the test machine's own namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from swemu import rack
from swemu.launch import CHILD_CWD, child_env, spawn

SUBNET = "10.89.0"


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(argv)}` failed: {proc.stderr.strip()}")


def skip_without_namespaces() -> None:
    """Skip the test, with the reason, where this process may not make namespaces."""
    why = rack.namespaces_permitted()
    if why:
        pytest.skip(f"hosts as network namespaces: {why}")


class Hosts:
    """``n`` hosts and a ``net`` namespace on one bridge (see the module)."""

    def __init__(self, n: int, subnet: str = SUBNET) -> None:
        self.prefix = f"{rack.default_prefix()}hosts-"  # apart from a rack's of this process
        self.subnet = subnet
        self.net = f"{self.prefix}net"
        self.names = [f"{self.prefix}h{i}" for i in range(n)]
        self.made: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self._dir = Path(tempfile.mkdtemp(prefix=self.prefix))

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.1"

    def ip(self, host: int) -> str:
        return f"{self.subnet}.{10 + host}"

    def __enter__(self) -> Hosts:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        for ns in [self.net, *self.names]:
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.net, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.net, "addr", "add", f"{self.bridge_ip}/24", "dev", "br0")
        _ip("-n", self.net, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("-n", self.net, "link", "add", f"v{i}", "type", "veth", "peer", "eth0", "netns", ns)
            _ip("-n", self.net, "link", "set", f"v{i}", "master", "br0")
            _ip("-n", self.net, "link", "set", f"v{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def spawn(self, ns: str, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` in namespace ``ns`` (it dies with this process)."""
        kwargs.setdefault("env", child_env())
        kwargs.setdefault("cwd", CHILD_CWD)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = spawn(["ip", "netns", "exec", ns, *cmd], **kwargs)
        self.procs.append(proc)
        return proc

    def serve(
        self, ns: str, host: str, *args: str, timeout: float = 300.0, log: Path | None = None
    ) -> subprocess.Popen:
        """``switchml-emu serve --host HOST ARGS`` in ``ns`` on the default ports
        (48864, 50099), once it serves (its ready file exists)."""
        ready = self._dir / f"ready-{len(self.procs)}.json"
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the child's)
        cmd = [sys.executable, "-m", "cli.main", "serve", "--host", host]
        cmd += ["--log-level", "info", "--ready-file", str(ready), *args]
        proc = self.spawn(ns, cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"the emulator in {ns} exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the emulator in {ns} did not serve within {timeout:g} s")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["control"][1] == 50099, info
        return proc

    def run(self, ns: str, cmd: Sequence[str], timeout: float = 60.0) -> str:
        """Run ``cmd`` in ``ns`` to its end; its stdout (a failure raises with its stderr)."""
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(),
            cwd=CHILD_CWD,
        )
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} in {ns}: {proc.stderr[-3000:]}")
        return proc.stdout

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for ns in reversed(self.made):
            for pid in rack.netns_pids(ns):  # started in it by ours (torchrun's ranks)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()
        shutil.rmtree(self._dir, ignore_errors=True)
