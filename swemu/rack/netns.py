"""Network namespaces of the rack: names, permission check, the leftovers of
killed runs and their removal, signals as exceptions while a rack exists.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

PREFIX_RE = re.compile(r"^swml(\d+)-")
ETH_HEADER = 14  # tc counts L2 bytes
METHODS = ("switchml", "ring", "ps", "link", "flat")
SWITCH_UDP_PORT = 48864
SWITCH_CONTROL_PORT = 50099
GLOO_PORT = 29500


class ClusterError(RuntimeError):
    """The rack could not be built or a run failed (one line, says what to do)."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP during a run: unwinds like Ctrl-C so the rack is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def default_prefix() -> str:
    """``swml<pid>-``: unique per live process, and the pid tells cleanup whose it was."""
    return f"swml{os.getpid()}-"


# ---------------------------------------------------------------- commands
def _cmd(argv: Sequence[str], *, check: bool = True) -> str:
    """Run ``ip``/``tc``; a failure becomes a :class:`ClusterError` with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def namespaces_permitted() -> str | None:
    """None if this process may create network namespaces, else the reason why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"{default_prefix()}probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"`ip netns add` failed: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def list_namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    out = _cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> list[str]:
    out = _cmd(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            names.append(parts[1].strip().split("@")[0])
    return names


def leftovers(prefix: str) -> list[str]:
    """Namespaces and root-namespace links whose name starts with ``prefix``."""
    return [n for n in list_namespaces() + _root_links() if n.startswith(prefix)]


def netns_pids(ns: str) -> list[int]:
    out = _cmd(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_pids(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGTERM the given processes (ours: started inside our namespaces), then SIGKILL."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove_namespace(ns: str) -> None:
    _kill_pids(netns_pids(ns))
    _cmd(["ip", "netns", "del", ns], check=False)


def cleanup_leftovers(*, everything: bool = False) -> list[str]:
    """Remove namespaces (and their processes), root links and log directories of
    dead runs.

    A name ``swml<pid>-...`` belongs to a dead run when no process ``pid`` exists;
    ``everything`` also removes those of live runs. Returns what was removed.
    """
    removed = []
    for name in list_namespaces():
        m = PREFIX_RE.match(name)
        if m and (everything or not Path(f"/proc/{m.group(1)}").exists()):
            _remove_namespace(name)
            removed.append(name)
    for name in _root_links():
        m = PREFIX_RE.match(name)
        if m and (everything or not Path(f"/proc/{m.group(1)}").exists()):
            _cmd(["ip", "link", "del", name], check=False)
            removed.append(name)
    for path in Path(tempfile.gettempdir()).glob("swml-cluster-*-*"):  # run_benchmark's logs
        pid = path.name.split("-")[2]
        if pid.isdigit() and (everything or not Path(f"/proc/{pid}").exists()):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


@contextlib.contextmanager
def signals_as_exceptions() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`Interrupted` (SIGINT already raises
    KeyboardInterrupt), so ``finally`` blocks remove the rack on every exit."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Teardown must finish: hold SIGINT/SIGTERM/SIGHUP until it has."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
