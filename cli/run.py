"""``switchml run``: launch N workers against a switch (an embedded emulator by default).

Without a command, each worker allreduces deterministic inputs, checks every
result against the exact sum (float32: within the block floating point bound)
and the launcher prints per-iteration time and goodput, a table row as each
iteration finishes. With ``-- CMD ...`` it starts N copies of the user's program
with what torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, MASTER_ADDR and a free MASTER_PORT, OMP_NUM_THREADS=1
unless set) and SWITCHML_* naming the switch, so the program can call
``hostlib.from_env()`` or ``dist.init_process_group("switchml")``.
``--racks R`` runs the job through a local two-level fabric (docs/protocol.md
§7): a root emulator and R emulators under it, the ranks in R blocks, each block
registered at its own rack's emulator.

Start-up: the local emulator and one warm-up process (``cli.worker
--warm-up``) start side by side; each compiles its kernels, or loads them from
Numba's cache, once. The workers start after both, so they load the kernels
rather than compile them N times at once (a first run printed "compiling
kernels (first run only)").

Lifetime: every child (emulator, warm-up, workers, user commands) is started
by :func:`swemu.launch.spawn` and so is sent SIGTERM by the kernel if this
process dies, even by SIGKILL. SIGHUP (the terminal closed) unwinds like
SIGTERM and Ctrl-C: the workers are killed, the emulator stopped in order. A
rank that dies or fails is said at once, in one line, and the other ranks are
stopped (as torchrun does); a user command's output comes line by line,
prefixed with its rank.
"""

from __future__ import annotations

import re

import click

from .terminal import SIZE, CLIError, terminal


@click.command(context_settings={"ignore_unknown_options": False})
@click.option(
    "--workers",
    "-n",
    required=True,
    type=click.IntRange(1, 32),
    help="Number of worker processes (world size).",
)
@click.option(
    "--switch",
    default=None,
    metavar="HOST:PORT",
    help="Data plane of a running switch [default: start a local emulator].",
)
@click.option(
    "--control",
    default=None,
    metavar="HOST:PORT",
    help="Control plane of that switch [default: the switch's host, port 50099].",
)
@click.option(
    "--size",
    default="16Mi",
    show_default=True,
    type=SIZE,
    help="Tensor size in bytes per worker (suffixes Ki, Mi, Gi).",
)
@click.option(
    "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "int32"])
)
@click.option(
    "--iters", default=5, show_default=True, type=click.IntRange(1), help="Timed allreduce calls."
)
@click.option(
    "--packet-size",
    default=None,
    type=click.IntRange(0, 7),
    help="Size code (values = 32 << code) [default: the emulator's fastest (6) when the "
    "switch is an emulator, 3 (Tofino-compatible) on hardware].",
)
@click.option(
    "--window",
    default=None,
    type=click.IntRange(1, 16384),
    help="Slots in flight per worker (the job's pool size) [default: about 3 MiB in flight "
    "for the whole job, 256 KiB to 1 MiB per worker, at most 512 slots].",
)
@click.option(
    "--shards",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Data-plane processes of the local emulator (switchml-emu serve --shards).",
)
@click.option(
    "--racks",
    default=1,
    show_default=True,
    type=click.IntRange(1, 32),
    help="Run through a local two-level fabric: a root emulator and this many rack "
    "emulators under it (serve --parent), the workers split between them rank by rank.",
)
@click.option(
    "--no-progress",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds without any result before a worker gives up.",
)
@click.option(
    "--json",
    "json_out",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the per-iteration results to this JSON file.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    workers,
    switch,
    control,
    size,
    dtype,
    iters,
    packet_size,
    window,
    shards,
    racks,
    no_progress,
    json_out,
    command,
) -> None:
    """Launch WORKERS workers; with -- COMMAND, run COMMAND as each worker."""
    import contextlib

    from swemu.launch import EmulatorProcess

    if control and not switch:
        raise CLIError("--control needs --switch (the data plane of the same switch)")
    if switch and shards != 1:
        raise CLIError("--shards sets up the local emulator; a given --switch has its own")
    if racks > 1 and (switch or shards != 1 or racks > workers):
        raise CLIError(
            "--racks builds a local fabric of single-process emulators: not with --switch "
            "or --shards, and at most one rack per worker"
        )
    if switch:
        host = _resolved("--switch", switch, 48864, ipv4=True)
        if control:
            _resolved("--control", control, 50099, ipv4=False)
        control = control or f"{host}:50099"
    if packet_size is None:
        from swemu.protocol.wire import EMULATOR_SIZE_CODE

        packet_size = _switch_packet_size(control) if switch else int(EMULATOR_SIZE_CODE)
    if window is None:
        from hostlib.client import default_window

        window = default_window(packet_size, workers)
    if size % 4:
        raise CLIError(f"--size {size} is not a whole number of 4-byte elements")

    if json_out:
        _check_writable(json_out)

    local = not switch
    with _hangup_as_sigterm(), contextlib.ExitStack() as stack:
        emu = None
        if local:
            emu = EmulatorProcess(shards=shards)
            stack.callback(emu.stop)
        _start_up(emu, None if command else dtype)
        if emu is not None:
            switch, control = emu.switch, emu.control
            shown = f"{switch} (+{shards - 1} shards on the next ports)" if shards > 1 else switch
            terminal.info(f"emulator: data {shown}, control {control}")
        children = _start_racks(emu, racks, stack) if racks > 1 else []
        title = (
            f"switchml run: {workers} workers, {size / 2**20:g} MiB {dtype}, "
            f"size code {packet_size}, window {window}"
            + (f", through {racks} rack switches under a root" if children else "")
        )
        view = stack.enter_context(_RowView(title, size, workers)) if not command else None
        failure = _launch(
            workers,
            switch,
            control,
            packet_size,
            window,
            no_progress,
            size,
            dtype,
            iters,
            command,
            local,
            view,
            children,
        )
    if command:
        if failure:
            raise click.exceptions.Exit(1)  # said as it happened (_launch)
        terminal.success(f"all {workers} workers finished")
        return
    _report(view, failure, workers, size, dtype, packet_size, window, json_out)


def _resolved(option: str, text: str, default_port: int, *, ipv4: bool) -> str:
    """The host of ``--switch``/``--control`` ``HOST:PORT``, once it is known to
    resolve (the data plane needs IPv4; gRPC takes either family): checked
    before anything starts, one line if not, instead of every worker failing
    with a traceback of its own."""
    import socket

    from swemu.protocol.netutil import parse_address, resolve_ipv4

    try:
        host, port = parse_address(text, default_port)
        if ipv4:
            resolve_ipv4(host)
        else:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise OSError(f"cannot resolve {host!r}: {exc.strerror}") from None
    except (ValueError, OSError) as exc:
        raise CLIError(f"{option} {text}: {exc}") from None
    return host


def _check_writable(path: str) -> None:
    """Fail before the run, not after it, when ``--json`` cannot be written."""
    import os

    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise CLIError(f"cannot write --json {path}: {exc.strerror or exc}") from None
    if not existed:
        os.unlink(path)


class _hangup_as_sigterm:
    """While inside: SIGHUP (the terminal closed) raises what SIGTERM raises
    (:class:`cli.main.Terminated`), so the run unwinds and stops its children
    instead of dying with them running."""

    def __enter__(self) -> None:
        import signal
        import threading

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGHUP, _on_hangup)

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGHUP, self.previous)


def _on_hangup(signum: int, frame: object) -> None:
    from .main import Terminated

    raise Terminated


def _start_up(emu, dtype: str | None = None) -> None:
    """Start the local emulator (if any) and the kernel warm-up side by side
    and wait for both. On a first run (the warm-up's Numba cache missed) say so,
    with the time it took; in a terminal, a line counts the seconds. ``dtype``:
    the built-in workers' element type (only its kernels are warmed up); None
    for a user's command (both)."""
    import subprocess
    import sys
    import time

    from swemu.launch import CHILD_CWD, child_env, spawn

    from .worker import COMPILING, WARM_PREFIX

    t0 = time.monotonic()
    warm = spawn(
        [sys.executable, "-m", "cli.worker", "--warm-up", *([dtype] if dtype else [])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=CHILD_CWD,
    )
    out, err = _Lines(warm.stdout), _Lines(warm.stderr)
    if emu is not None:
        terminal.info("starting a local emulator ...")
        emu.begin()
    compiling = warm_done = False
    ready = emu is None
    try:
        with _Ticker() as ticker:
            while not (warm_done and ready):
                for line in out.read():
                    if line == COMPILING and not compiling:
                        compiling = True
                        terminal.info("compiling kernels (first run only) ...")
                    warm_done = warm_done or line.startswith(WARM_PREFIX)
                err.read()
                if not warm_done and warm.poll() is not None:
                    out.read(final=True)
                    last = (err.read(final=True) or err.seen or ["no output"])[-1]
                    terminal.warning(
                        f"the kernel warm-up failed (exit {warm.returncode}: {last}); "
                        "each worker compiles its own"
                    )
                    warm_done = True
                ready = ready or emu.poll_ready()
                what = "compiling kernels (first run only)" if compiling else "starting"
                ticker.show(f"{what} ... {time.monotonic() - t0:.0f} s")
                time.sleep(0.05)
    finally:
        if warm.poll() is None:
            warm.kill()
        warm.wait()
        warm.stdout.close()
        warm.stderr.close()
    if compiling:
        terminal.info(
            f"compiled the kernels in {time.monotonic() - t0:.1f} s; later runs load them "
            "from the cache"
        )


class _Ticker:
    """A transient status line on stderr when it is a terminal (no thread:
    redrawn by :meth:`show`); nothing otherwise."""

    def __enter__(self) -> _Ticker:
        self.live = None
        if terminal.err.is_terminal:
            from rich.live import Live

            self.live = Live("", console=terminal.err, transient=True, auto_refresh=False)
            self.live.start()
        return self

    def show(self, text: str) -> None:
        if self.live is not None:
            self.live.update(text, refresh=True)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()


class _Lines:
    """Complete lines from a child's pipe without blocking (the launcher
    watches several children from one thread)."""

    def __init__(self, pipe) -> None:
        import os

        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.eof = False
        self.seen: list[str] = []

    def read(self, final: bool = False) -> list[str]:
        """The lines that arrived since the last call; ``final``: the child
        has exited, so read to the end and keep an unterminated last line."""
        import os
        import select
        import time

        until = time.monotonic() + 2.0  # a grandchild may hold the pipe open: not forever
        while not self.eof:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                if not final or time.monotonic() > until:
                    break
                select.select([self.fd], [], [], 0.1)
                continue
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        if self.eof and self.buf:
            lines.append(self.buf)
            self.buf = b""
        text = [line.decode(errors="replace").rstrip("\r") for line in lines]
        self.seen = (self.seen + [t for t in text if t.strip()])[-20:]
        return text


def _start_racks(root, racks: int, stack) -> list:
    """``racks`` emulators under ``root`` (``serve --parent``: a two-level fabric,
    docs/protocol.md §7), started side by side; stopped on exit, before the root."""
    import time

    from swemu.launch import EmulatorProcess

    children = [EmulatorProcess("--parent", root.control) for _ in range(racks)]
    for child in children:
        stack.callback(child.stop)
        child.begin()
    while not all([c.poll_ready() for c in children]):
        time.sleep(0.05)
    for k, child in enumerate(children):
        terminal.info(f"rack {k} emulator: data {child.switch}, control {child.control}")
    return children


def _switch_packet_size(control: str) -> int:
    """The default size code for a given switch: its controller's answer
    (an emulator names its fastest; hardware, or a controller without the
    question, gets 3), so that every worker uses the same one."""
    import asyncio

    from hostlib.control import ControlClient
    from hostlib.errors import ControlPlaneError

    async def ask() -> int:
        ctl = ControlClient(control)
        try:
            await ctl.connect()
            return await ctl.default_packet_size()
        finally:
            await ctl.close()

    try:
        return asyncio.run(ask())
    except ControlPlaneError as exc:
        raise CLIError(str(exc)) from None


def _launch(
    workers,
    switch,
    control,
    packet_size,
    window,
    no_progress,
    size,
    dtype,
    iters,
    command,
    local,
    view,
    children=(),
) -> str | None:
    """Start the workers, wait for them, feed their per-iteration reports to
    ``view`` as they come; with a ``command``, pass each rank's output on line
    by line, prefixed with its rank. Return what went wrong first (None: nothing).

    A rank that dies or fails (a signal, an exit status, a worker's error;
    not a built-in worker that finished and found a wrong result, which the
    table shows) is said at once, in one line, and the other ranks are
    stopped at once (SIGTERM, SIGKILL after :data:`STOP_GRACE` seconds), as
    torchrun does, rather than left to give up on the switch one by one.
    With a ``local`` emulator (which warns about small socket buffers for
    this machine) the workers do not repeat the warning. With rack switches
    (``children``, :func:`_start_racks`) rank r uses rack ``r * racks // workers``'s."""
    import json
    import random
    import signal
    import subprocess
    import sys
    import time

    from swemu.launch import CHILD_CWD, child_env, spawn, torchrun_envs

    from .worker import ITER_PREFIX, RESULT_PREFIX

    session = random.getrandbits(62) | 1
    launcher = torchrun_envs(workers)
    procs = []
    for rank in range(workers):
        if children:
            rack = children[rank * len(children) // workers]
            switch, control = rack.switch, rack.control
        env = child_env(
            **launcher[rank],
            SWITCHML_SWITCH=switch,
            SWITCHML_CONTROL=control,
            SWITCHML_SESSION_ID=str(session),
            SWITCHML_PACKET_SIZE=str(packet_size),
            SWITCHML_WINDOW=str(window),
            SWITCHML_NO_PROGRESS=str(no_progress),
            **({"SWITCHML_BUFFER_WARNING": "0"} if local else {}),
            SWITCHML_RUN_SIZE=str(size),
            SWITCHML_RUN_DTYPE=dtype,
            SWITCHML_RUN_ITERS=str(iters),
        )
        if command:  # its output goes through a pipe: line by line, not at exit
            env.setdefault("PYTHONUNBUFFERED", "1")
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines: off
        cmd = list(command) if command else [sys.executable, "-m", "cli.worker"]
        try:
            procs.append(
                spawn(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE if command else None,
                    cwd=None if command else CHILD_CWD,  # the user's command runs where they are
                )
            )
        except OSError as exc:
            for p in procs:
                p.kill()
            raise CLIError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
    out = [_Lines(p.stdout) for p in procs]
    err = [_Lines(p.stderr) for p in procs] if command else []
    reports: dict[int, dict] = {}
    quiet = _tensorflow_quiet(env.get("TF_CPP_MIN_LOG_LEVEL"))

    def take(rank: int, final: bool = False) -> None:
        if command:
            _forward(sys.stdout, rank, out[rank].read(final))
            _forward(sys.stderr, rank, [x for x in err[rank].read(final) if not quiet(x)])
            return
        for line in out[rank].read(final):
            if line.startswith(ITER_PREFIX):
                view.add(json.loads(line[len(ITER_PREFIX) :]))
            elif line.startswith(RESULT_PREFIX):
                reports[rank] = json.loads(line[len(RESULT_PREFIX) :])

    first: str | None = None  # what went wrong first
    kill_at = None  # when the ranks still running after a failure get SIGKILL
    try:
        while any(p.poll() is None for p in procs):
            for rank in range(workers):
                take(rank)
            if first is None:
                first = _first_failure(procs, reports, take, builtin=not command)
                if first is not None:
                    running = [p for p in procs if p.poll() is None]
                    terminal.error(first + ("; stopping the other ranks" if running else ""))
                    for p in running:
                        p.send_signal(signal.SIGTERM)
                    kill_at = time.monotonic() + STOP_GRACE
            if kill_at is not None and time.monotonic() > kill_at:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
        for rank in range(workers):
            take(rank, final=True)
        if first is None:  # the last ones to exit
            first = _first_failure(procs, reports, take, builtin=not command)
            if first is not None:
                terminal.error(first)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (cli.main.Terminated)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        raise
    finally:
        for p in procs:
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
    return first


#: Seconds the other ranks get to end on SIGTERM once one failed, before SIGKILL.
STOP_GRACE = 5.0


def _first_failure(procs, reports: dict[int, dict], take, *, builtin: bool) -> str | None:
    """The first rank (lowest number) that has exited and failed, in words, or
    None. A built-in worker that reported its results without an error
    finished its run (a wrong result is the table's to show); any other
    non-zero exit is a failure."""
    import signal

    for rank, p in enumerate(procs):
        rc = p.poll()
        if rc in (None, 0):
            continue
        take(rank, final=True)  # its last lines: the report says why
        report = reports.get(rank)
        if builtin and report is not None and "error" not in report:
            continue
        if rc < 0:
            try:
                name = f" ({signal.Signals(-rc).name})"
            except ValueError:
                name = ""
            return f"rank {rank} was killed by signal {-rc}{name}"
        if report is not None and report.get("error"):
            return f"rank {rank} failed: {report['error']}"
        return f"rank {rank} exited with status {rc}"
    return None


#: absl's lines from before TensorFlow sets up its logging, which its
#: TF_CPP_MIN_LOG_LEVEL does not reach (TensorFlow 2.16 and later print them at
#: every start, oneDNN's notice among them): INFO lines, and the notice that
#: they go to stderr.
ABSL_EARLY_INFO = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR$|I\d{4} \d\d:\d\d:\d+(?:\.\d+)? +\d+ \S+:\d+\] "
)


def _tensorflow_quiet(level: str | None):
    """Which lines of a rank's stderr to drop: TF_CPP_MIN_LOG_LEVEL (the
    user's, else the launcher's 1) applied to absl's early INFO lines, which
    TensorFlow does not filter itself; 0 keeps them."""
    try:
        quiet = int(level or 0) >= 1
    except ValueError:
        quiet = False
    return (lambda line: ABSL_EARLY_INFO.match(line) is not None) if quiet else (lambda line: False)


def _forward(stream, rank: int, lines: list[str]) -> None:
    """Pass a rank's lines on, each prefixed with its rank (as torchrun's
    ``[rank0]:``), one write per line so that ranks never interleave within one."""
    for line in lines:
        stream.write(f"[rank{rank}]: {line}\n")
    if lines:
        stream.flush()


def _row(it: int, per: list[dict], size: int, workers: int) -> dict:
    """One iteration of the table from every rank's report of it: the
    collective ends when its last worker has its result."""
    t = max(p["time"] for p in per)
    return {
        "iter": it,
        "time": t,
        "goodput_gbps": size * 8 / t / 1e9,
        "ok": all(p["ok"] for p in per) and len(per) == workers,
        "retransmissions": sum(p.get("retransmissions", 0) for p in per),
        "worst_error_ratio": max(p["worst"] for p in per),
    }


def render(title: str, rows: list[dict]):
    """The results table for ``rows`` (:func:`_row`), as a rich renderable."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("iter", "time (ms)", "goodput (Gbit/s)", "retransmissions", "check"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["iter"]),
            f"{r['time'] * 1e3:.1f}",
            f"{r['goodput_gbps']:.2f}",
            str(r["retransmissions"]),
            "[green]ok[/]" if r["ok"] else "[red]WRONG[/]",
        )
    return table


class _RowView:
    """Collects the workers' per-iteration reports; a row is complete when
    every rank reported that iteration. In a terminal the table grows as rows
    complete (rich Live, redrawn per row, no thread); otherwise it is printed
    once at the end."""

    def __init__(self, title: str, size: int, workers: int) -> None:
        self.title, self.size, self.workers = title, size, workers
        self.pending: dict[int, dict[int, dict]] = {}
        self.rows: list[dict] = []
        self.live = None

    def __enter__(self) -> _RowView:
        if terminal.out.is_terminal:
            from rich.live import Live

            self.live = Live(
                render(self.title, []), console=terminal.out, auto_refresh=False, transient=False
            )
            self.live.start()
        return self

    def add(self, report: dict) -> None:
        per = self.pending.setdefault(int(report["iter"]), {})
        per[int(report["rank"])] = report
        # rows in order: iteration i is shown once every rank has finished it
        while len(self.pending.get(len(self.rows), {})) == self.workers:
            it = len(self.rows)
            done = self.pending.pop(it)
            self.rows.append(_row(it, [done[r] for r in sorted(done)], self.size, self.workers))
            if self.live is not None:
                self.live.update(render(self.title, self.rows), refresh=True)

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            if not self.rows:
                self.live.update("", refresh=True)
            self.live.stop()

    @property
    def shown(self) -> bool:
        """Whether the table is already on the screen."""
        return self.live is not None


def _report(view, failure, workers, size, dtype, packet_size, window, json_out) -> None:
    import json
    import statistics

    rows = view.rows
    if rows:
        if not view.shown:
            terminal.out.print(render(view.title, rows))
        med = statistics.median(r["time"] for r in rows)
        terminal.out.print(
            f"median {med * 1e3:.1f} ms per allreduce, "
            f"{size * 8 / med / 1e9:.2f} Gbit/s goodput per worker"
        )
    if json_out:
        try:
            with open(json_out, "w") as f:
                json.dump(
                    {
                        "workers": workers,
                        "size": size,
                        "dtype": dtype,
                        "packet_size": packet_size,
                        "window": window,
                        "iters": rows,
                        "failed": [failure] if failure else [],
                    },
                    f,
                    indent=2,
                )
        except OSError as exc:
            raise CLIError(f"cannot write --json {json_out}: {exc.strerror or exc}") from None
    if failure:
        raise click.exceptions.Exit(1)  # said as it happened (_launch)
    if not all(r["ok"] for r in rows):
        raise CLIError("some results were wrong (see the check column)")
    terminal.success(f"all {workers} workers verified {len(rows)} results")
