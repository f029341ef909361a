"""``switchml-emu top``: a live view of a running emulator, refreshed over gRPC.

In a terminal the view is redrawn in place; ``q`` (or Ctrl-C) quits, and the
screen says so. Into a pipe or a file every snapshot is printed, one frame
after the other (``top --count 3 > frames.txt``), each line as wide as it needs.
"""

from __future__ import annotations

import click

from .stats import control_option, timeout_option
from .terminal import CLIError, terminal

#: The last line of the view in a terminal whose keys ``top`` reads.
QUIT_HINT = "q to quit (or Ctrl-C)"


@click.command()
@control_option
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between snapshots.",
)
@click.option(
    "--jobs",
    "max_jobs",
    default=8,
    show_default=True,
    type=click.IntRange(min=1),
    help="Most job panels shown.",
)
@click.option(
    "--count",
    default=None,
    type=click.IntRange(min=1),
    help="Stop after this many snapshots [default: until q or Ctrl-C].",
)
@timeout_option
def top(control: str, interval: float, max_jobs: int, count: int | None, timeout: float) -> None:
    """Watch a running emulator: rates, goodput, slots in use, drops, the slowest worker."""
    from swemu.observe.stats import StatsClient
    from swemu.observe.tui import History

    history = History()
    with StatsClient(control, timeout) as client, _Keys() as keys:

        def frames():
            """Snapshots, one per ``interval``, until ``count`` or ``q``."""
            taken = 0
            while True:
                try:
                    snap = client.get()
                except OSError as exc:
                    raise CLIError(f"lost the emulator: {exc}" if taken else str(exc)) from None
                history.add(snap)
                taken += 1
                yield snap
                if (count is not None and taken >= count) or keys.quit_within(interval):
                    return

        try:
            if terminal.out.is_terminal:
                _live(frames(), history, max_jobs, keys.active)
            else:
                from swemu.observe.tui import render

                for snap in frames():
                    terminal.show(render(snap, history, max_jobs=max_jobs))
        except KeyboardInterrupt:
            pass


def _live(frames, history, max_jobs: int, keys: bool) -> None:
    """Redraw the view in place for each snapshot, with how to quit below it."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from swemu.observe.tui import render

    hint = Text(QUIT_HINT if keys else "Ctrl-C to quit", style="dim")
    live = None
    try:
        for snap in frames:
            view = Group(render(snap, history, max_jobs=max_jobs), hint)
            if live is None:
                # auto_refresh off: the view changes only when a snapshot arrives
                live = Live(view, console=terminal.out, auto_refresh=False, transient=False)
                live.start()
            else:
                live.update(view, refresh=True)
    finally:
        if live is not None:
            live.stop()


class _Keys:
    """Keys typed while ``top`` runs, when stdin is a terminal: it is put in
    cbreak mode (keys come one by one, unechoed; Ctrl-C still interrupts) and
    restored on exit. Elsewhere, :meth:`quit_within` just sleeps."""

    def __enter__(self) -> _Keys:
        import sys

        self.active = False
        self.saved = None
        try:
            self.fd = sys.stdin.fileno()
            if sys.stdin.isatty():
                import termios
                import tty

                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
                self.active = True
        except (OSError, ValueError, AttributeError, ImportError):
            self.active = False
        return self

    def quit_within(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as ``q`` is typed."""
        import os
        import select
        import time

        if not self.active:
            time.sleep(seconds)
            return False
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            typed = os.read(self.fd, 64)
            if b"q" in typed.lower():
                return True
            if not typed:  # the terminal went away: no more keys
                self.active = False
                time.sleep(max(0.0, deadline - time.monotonic()))
        return False

    def __exit__(self, *exc: object) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
