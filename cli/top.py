"""``switchml-emu top``: a live view of a running emulator, refreshed over gRPC."""

from __future__ import annotations

import click

from .stats import control_option, timeout_option
from .terminal import CLIError, terminal


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
    help="Stop after this many snapshots [default: until Ctrl-C].",
)
@timeout_option
def top(control: str, interval: float, max_jobs: int, count: int | None, timeout: float) -> None:
    """Watch a running emulator: rates, goodput, slots in use, drops, the slowest worker."""
    import time

    from rich.live import Live

    from swemu.observe.stats import StatsClient
    from swemu.observe.tui import History, render

    history = History()
    with StatsClient(control, timeout) as client:
        try:
            snap = client.get()
        except OSError as exc:
            raise CLIError(str(exc)) from None
        history.add(snap)
        taken = 1
        # auto_refresh off: the view changes only when a snapshot arrives
        with Live(
            render(snap, history, max_jobs=max_jobs),
            console=terminal.out,
            auto_refresh=False,
            transient=False,
        ) as live:
            try:
                while count is None or taken < count:
                    time.sleep(interval)
                    try:
                        snap = client.get()
                    except OSError as exc:
                        raise CLIError(f"lost the emulator: {exc}") from None
                    history.add(snap)
                    taken += 1
                    live.update(render(snap, history, max_jobs=max_jobs), refresh=True)
            except KeyboardInterrupt:
                pass
