"""``switchml-emu decode``: a capture of SwitchML traffic as a per-slot timeline."""

from __future__ import annotations

import click

from .terminal import CLIError, terminal


@click.command()
@click.argument("pcap", type=click.Path(exists=True, dir_okay=False))
@click.option("--slot", default=None, type=click.IntRange(0, 16383), help="Show one slot only.")
@click.option(
    "--limit",
    default=None,
    type=click.IntRange(min=0),
    help="Show the first N events (after --slot) [default: all].",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary (of the whole capture) and the events shown, as JSON.",
)
def decode(pcap: str, slot: int | None, limit: int | None, as_json: bool) -> None:
    """Decode a pcap of SwitchML traffic (from `serve --pcap`, tcpdump, Wireshark).

    Every packet is classified as the switch sees it — contribution,
    retransmission, result (multicast) or result (unicast), malformed — and
    shown per (switch port, slot), in capture order.
    """
    from swemu.decode import render_timeline, summary, timeline
    from swemu.pcap import PcapError, read_pcap

    try:
        events = timeline(read_pcap(pcap))
    except PcapError as exc:
        raise CLIError(str(exc)) from None
    if as_json:
        import json

        shown = [e for e in events if slot is None or e.slot == slot]
        if limit is not None:
            shown = shown[:limit]
        doc = {"summary": summary(events), "events": [e.to_dict() for e in shown]}
        click.echo(json.dumps(doc, indent=2))
        return
    if not events:
        terminal.warning(f"{pcap}: no SwitchML packets (UDP to or from ports 0xBEE0-0xBEEF)")
        return
    _print_whole(render_timeline(events, slot=slot, limit=limit))
    _print_whole(_summary_table(summary(events)))


def _print_whole(table) -> None:
    """Print a table; into a pipe or file at its natural width, not cut to 80 columns."""
    from rich.measure import Measurement

    out = terminal.out
    if out.is_terminal:
        out.print(table)
        return
    wide = out.options.update_width(100_000)
    natural = Measurement.get(out, wide, table).maximum
    saved = out.width
    out.width = max(saved, natural)  # Console.print never goes past the console's width
    try:
        out.print(table)
    finally:
        out.width = saved


def _summary_table(s: dict):
    """The per-worker counts of :func:`swemu.decode.summary` as a table."""
    from rich.table import Table

    res = s["results"]
    table = Table(
        title=(
            f"{s['events']} events in {s['duration'] * 1e3:.3f} ms, {s['slots']} slots, "
            f"{res['multicast']} multicasts ({res['multicast_packets']} packets), "
            f"{res['unicast']} unicasts, {s['retransmissions']} retransmissions, "
            f"{s['malformed']} malformed"
        ),
        title_justify="left",
    )
    names = (
        "packets",
        "contributions",
        "retransmissions",
        "results_multicast",
        "results_unicast",
        "malformed",
    )
    table.add_column("worker")
    for n in names:
        table.add_column(n.replace("_", " "), justify="right")
    for worker, counts in s["workers"].items():
        table.add_row(worker, *(str(counts[n]) for n in names))
    return table
