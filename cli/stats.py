"""``switchml-emu stats``: one snapshot of a running emulator's counters."""

from __future__ import annotations

import click

from .terminal import CLIError, terminal

DEFAULT_CONTROL = "127.0.0.1:50099"


def _control_address(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``HOST[:PORT]`` (port 50099 by default) as the ``HOST:PORT`` gRPC wants."""
    from swemu.protocol.netutil import parse_address

    try:
        host, port = parse_address(value, 50099)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not HOST:PORT ({exc})") from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


control_option = click.option(
    "--control",
    default=DEFAULT_CONTROL,
    show_default=True,
    callback=_control_address,
    help="Control plane (gRPC) of the emulator.",
)
timeout_option = click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for the emulator's answer.",
)


@click.command()
@control_option
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@timeout_option
def stats(control: str, as_json: bool, timeout: float) -> None:
    """Print every counter of a running emulator: switch-wide, per job, per worker."""
    import json

    from swemu.observe.stats import fetch_stats

    try:
        snap = fetch_stats(control, timeout)
    except OSError as exc:
        raise CLIError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(snap, indent=2, sort_keys=True))
        return
    from swemu.observe.tui import render_stats

    terminal.show(render_stats(snap))
