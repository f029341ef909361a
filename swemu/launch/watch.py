"""Waiting on a child process: every wait ends as soon as the child exits, and says how.

A test (or a launcher) that waits for its child to print a line, to write a
file or to reach some state must not go on waiting once the child is gone: a
wait on a dead child used to last its whole timeout and then fail with a bare
``queue.Empty``, never showing why the child had died. :class:`Watched` fails
such a wait at once with :class:`ChildFailed`, whose message holds the child's
exit status and the end of its stderr; a wait that times out says the same of
a child still running.

The child is started by :func:`.process.spawn` (it dies with its parent), with
every signal at its default action (``default_signals``: a child must not
inherit SIGINT ignored from a test run as a background job), and its stderr
goes to a temporary file, never to a pipe that fills while nobody reads it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from .process import spawn

#: how often a wait looks at the child (and at what it waits for)
POLL_S = 0.05
#: how long a child whose stdout ended may take to exit before a report
#: says it still runs
EXIT_AFTER_EOF_S = 2.0
#: the end of the child's stderr that a failure message quotes
TAIL_CHARS = 6000


class ChildFailed(AssertionError):
    """A watched child exited (or overran its time) while something waited on
    it; the message says what was awaited, the exit status and the end of the
    child's stderr."""


class Watched:
    """A child process whose waits end when it exits (see the module docstring).

    ``cmd`` and the keyword arguments go to :func:`.process.spawn` (``stdin``
    defaults to ``DEVNULL``, ``stdout`` to ``DEVNULL``; with ``stdout=PIPE`` a
    thread reads it, :meth:`readline` gives it line by line and :meth:`stdout`
    all of it; with ``stdout=STDOUT`` it goes where stderr goes, into the
    reports). ``name`` names the child in messages (default: the command). Use
    as a context manager: on leaving, a child still running is killed and reaped.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        name: str | None = None,
        stdout: Any = subprocess.DEVNULL,
        stdin: Any = subprocess.DEVNULL,
        **kwargs: Any,
    ) -> None:
        argv = [str(a) for a in cmd]
        self.name = name or _short(argv)
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._out: list[str] = []
        if stdout == subprocess.PIPE:
            kwargs.setdefault("text", True)
        elif stdout == subprocess.STDOUT:
            stdout = self._err
        try:
            self.proc = spawn(
                argv, default_signals=True, stdin=stdin, stdout=stdout, stderr=self._err, **kwargs
            )
        except BaseException:
            self._err.close()
            raise
        if self.proc.stdout is not None:  # read at once: a full pipe would stop the child
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    # ----------------------------------------------------------- the state
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def poll(self) -> int | None:
        """The exit status, or None while the child runs."""
        return self.proc.poll()

    def stderr(self) -> str:
        """Everything the child wrote to stderr so far."""
        with contextlib.suppress(ValueError):  # closed: nothing more to read
            return os.pread(self._err.fileno(), 1 << 30, 0).decode(errors="replace")
        return ""

    def stdout(self) -> str:
        """Every line of stdout read so far (``stdout=PIPE``); all of it once
        the child has exited and its pipe is closed."""
        reader = self._stdout_reader()
        if self.proc.poll() is not None:
            reader.join(5)
        return "".join(self._out)

    def report(self) -> str:
        """How the child is: its exit status (or that it still runs), then the
        end of its stderr."""
        code = self.proc.poll()
        if code is None:
            state = f"{self.name} (pid {self.pid}) is still running"
        elif code < 0:
            state = f"{self.name} (pid {self.pid}) was killed by {_signame(-code)}"
        else:
            state = f"{self.name} (pid {self.pid}) exited with status {code}"
        err = self.stderr()
        if not err.strip():
            return f"{state}; its stderr is empty"
        cut = "..." if len(err) > TAIL_CHARS else ""
        return f"{state}; its stderr{' ends' if cut else ''}:\n{cut}{err[-TAIL_CHARS:]}"

    # ------------------------------------------------------------- waiting
    def wait_until(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Wait until ``predicate()`` is true and return its value; raise
        :class:`ChildFailed` as soon as the child exits before that (the
        predicate is asked once more after the exit: a file written just
        before it counts), or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                value = predicate()
                if value:
                    return value
                raise ChildFailed(f"waiting for {what}: {self.report()}")
            if time.monotonic() > deadline:
                raise ChildFailed(f"waiting for {what}: not within {timeout:g} s; {self.report()}")
            time.sleep(POLL_S)

    def readline(self, timeout: float, what: str = "a line on its stdout") -> str:
        """The next line of stdout (``stdout=PIPE``); :class:`ChildFailed` if the
        child exits without writing one, or after ``timeout`` seconds."""
        reader = self._stdout_reader()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=POLL_S)
            except queue.Empty:
                if self.proc.poll() is not None:
                    reader.join(POLL_S)  # what it wrote before it exited
                    if self._lines.empty():
                        raise ChildFailed(f"waiting for {what}: {self.report()}") from None
                elif time.monotonic() > deadline:
                    raise ChildFailed(
                        f"waiting for {what}: not within {timeout:g} s; {self.report()}"
                    ) from None
                continue
            if line is None:  # end of stdout: the child is gone (or closed it)
                self._lines.put(None)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(EXIT_AFTER_EOF_S)  # its status, for the report
                raise ChildFailed(f"waiting for {what}: stdout ended; {self.report()}")
            return line

    def wait(self, timeout: float, what: str = "it to exit") -> int:
        """The exit status once the child exits; after ``timeout`` seconds it is
        killed and :class:`ChildFailed` says so."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChildFailed(
                f"waiting for {what}: not within {timeout:g} s (killed); {self.report()}"
            ) from None

    def expect(self, status: int = 0, timeout: float = 60.0, what: str = "it to exit") -> str:
        """Wait for the exit (:meth:`wait`) and check its status; return stderr.
        :class:`ChildFailed` with the report when the status is another."""
        code = self.wait(timeout, what)
        if code != status:
            raise ChildFailed(f"waiting for {what} with status {status}: {self.report()}")
        return self.stderr()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the child has exited already."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit (SIGKILL after ``timeout``); the status."""
        self.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL if still running, and reap."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        self.proc.wait()

    @staticmethod
    def wait_all(children: Sequence[Watched], timeout: float, what: str = "them to exit") -> None:
        """Wait until every child has exited with status 0; :class:`ChildFailed`
        as soon as one exits with another status (the others, which would wait
        for it, are killed), or after ``timeout`` seconds (all killed)."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                failed = [c for c in children if c.poll() not in (None, 0)]
                if failed:
                    raise ChildFailed(f"waiting for {what}: {failed[0].report()}")
                running = [c for c in children if c.poll() is None]
                if not running:
                    return
                if time.monotonic() > deadline:
                    raise ChildFailed(
                        f"waiting for {what}: not within {timeout:g} s; {running[0].report()}"
                    )
                time.sleep(POLL_S)
        finally:
            for c in children:
                c.kill()

    # ----------------------------------------------------------- lifetime
    def close(self) -> None:
        """Kill the child if it still runs, reap it, close its files."""
        self.kill()
        if self._reader is not None:
            self._reader.join(5)
        for f in (self.proc.stdout, self.proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._err.close()

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stdout_reader(self) -> threading.Thread:
        if self._reader is None:
            raise RuntimeError(f"{self.name}: reading its stdout needs stdout=PIPE")
        return self._reader

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed under the thread
            for line in self.proc.stdout:
                self._out.append(line)
                self._lines.put(line)
        self._lines.put(None)


def _short(argv: list[str]) -> str:
    """The command as messages name it: the program and its first arguments."""
    shown = " ".join(argv[:4]).replace("\n", " ")
    return shown if len(shown) <= 100 else shown[:97] + "..."


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def run(
    cmd: Sequence[str],
    *,
    status: int | None = 0,
    timeout: float = 300.0,
    name: str | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[str]:
    """:func:`subprocess.run` for a child that must end with ``status`` (None:
    any): stdout and stderr captured as text, the child started as
    :class:`Watched` starts it. :class:`ChildFailed` with the exit status and
    the end of stderr when it ends with another status, or overruns
    ``timeout`` (then it is killed)."""
    with Watched(cmd, name=name, stdout=subprocess.PIPE, **kwargs) as child:
        code = child.wait(timeout)
        if status is not None and code != status:
            raise ChildFailed(f"expected exit status {status}: {child.report()}")
        return subprocess.CompletedProcess(list(cmd), code, child.stdout(), child.stderr())
