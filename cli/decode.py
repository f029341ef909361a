"""``switchml-emu decode``: a capture of SwitchML traffic as a timeline, streamed.

Rows are printed as the capture is decoded, a chunk of the file at a time, so
``decode big.pcap | head`` answers at once and a closed pipe ends the command
quietly (the entry point exits 0). The summary of the whole capture follows the
rows.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

import click

from .terminal import CLIError, terminal

if TYPE_CHECKING:
    from swemu.observe.decode import Event

#: ANSI colours of the kinds, on a terminal only
_ANSI = {
    "contribution": "32",
    "retransmission": "33",
    "result (multicast)": "36",
    "result (unicast)": "35",
    "malformed": "1;31",
}
_HEADER = (
    f"{'port:slot':>13}  {'time ms':>11}  {'frame':>8}  {'dir':<8}  {'worker':<29}  "
    f"{'set':>3}  {'job':>3}  {'tsi':>10}  {'e0/e1':>9}  {'kind':<30}  values / note"
)


def _port(port: int) -> str:
    """SwitchML's ports in hex, as the protocol names them (0xbee0); others in decimal."""
    return f"{port:#x}" if port & 0xFFF0 == 0xBEE0 else str(port)


def _row_maker(color: bool) -> Callable[[Event], str]:
    """The function that turns an event into one line of the table (imports and
    lookups done once, not per row)."""
    from swemu.observe.decode import MALFORMED, MULTICAST, TO_SWITCH, format_addr

    addr = functools.lru_cache(maxsize=4096)(format_addr)
    blank = f"{'':>3}  {'':>3}  {'':>10}  {'':>9}"

    def row(ev: Event) -> str:
        if ev.kind == MALFORMED:
            label, values, fields = "malformed", f"{ev.length} bytes", blank
        else:
            label = f"{_port(ev.switch[1])}:{ev.slot}"
            more = ", …" if len(ev.values) < 32 << (ev.size_code or 0) else ""
            values = "[" + ", ".join(map(str, ev.values)) + more + "]"
            fields = f"{ev.set:>3}  {ev.job_number:>3}  {ev.tsi:>10}  {f'{ev.e0}/{ev.e1}':>9}"
        kind = ev.kind + (f" #{ev.group} x{ev.fanout}" if ev.kind == MULTICAST else "")
        kind = f"{kind:<30}"
        if color:
            kind = f"\x1b[{_ANSI[ev.kind]}m{kind}\x1b[0m"
        note = f"  {ev.note}" if ev.note else ""
        return (
            f"{label:>13}  {ev.time * 1e3:>11.3f}  {ev.frame:>8}  "
            f"{'→ switch' if ev.direction == TO_SWITCH else '← switch':<8}  "
            f"{addr(ev.worker) + (' (child)' if ev.child else ''):<29}  {fields}  {kind}  "
            f"{values}{note}\n"
        )

    return row


@click.command()
@click.argument("pcap", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--port",
    "ports",
    multiple=True,
    type=click.IntRange(1, 65535),
    help="The switch's UDP data port (repeatable) [default: 0xBEE0-0xBEEF and the "
    "ports found in the capture: the port on one side of every SwitchML packet].",
)
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
    help="Print the events shown and the summary (of the whole capture) as JSON.",
)
def decode(
    pcap: str, ports: tuple[int, ...], slot: int | None, limit: int | None, as_json: bool
) -> None:
    """Decode a pcap of SwitchML traffic (from `serve --pcap`, tcpdump, Wireshark).

    Every packet is classified as the switch sees it — contribution,
    retransmission, result (multicast) or result (unicast), malformed — and
    printed in capture order as it is decoded; `--slot N` follows one slot.
    """
    from swemu.observe.decode import Decoder, Summary, decode_batches
    from swemu.observe.pcap import PcapError, read_pcap_batches

    decoder = Decoder(ports=ports or None)
    counts = Summary()
    out: TextIO = sys.stdout
    color = not as_json and out.isatty() and not terminal.out.no_color
    row = _row_maker(color)
    shown = total = 0
    lines: list[str] = []
    if as_json:
        out.write('{\n  "events": [')

    def flush() -> None:
        out.write("".join(lines))
        out.flush()
        lines.clear()

    batches = read_pcap_batches(pcap, chunk_bytes=1 << 20)  # small chunks: rows come at once
    try:
        for ev in decode_batches(batches, decoder):
            counts.add(ev)
            if slot is not None and ev.slot != slot:
                continue
            total += 1
            if limit is not None and shown >= limit:
                continue
            if as_json:
                lines.append(("\n    " if shown == 0 else ",\n    ") + json.dumps(ev.to_dict()))
            else:
                if shown == 0:
                    lines.append(_HEADER + "\n")
                lines.append(row(ev))
            shown += 1
            if len(lines) >= 256:
                flush()
    except PcapError as exc:
        flush()
        raise CLIError(str(exc)) from None
    flush()
    s = counts.result()
    if as_json:
        body = json.dumps(s, indent=2).replace("\n", "\n  ")
        out.write(("\n  " if shown else "") + f'],\n  "summary": {body}\n}}\n')
        return
    if not s["events"]:
        where = (
            f"UDP to or from port {', '.join(map(str, ports))}"
            if ports
            else "no UDP datagram parses as SwitchML; give the switch's port with --port"
        )
        terminal.warning(f"{pcap}: no SwitchML packets ({where})")
        return
    more = f", {total - shown} more not shown (--limit)" if shown < total else ""
    out.write(f"SwitchML timeline: {shown} of {total} events{more}\n")
    res = s["results"]
    out.write(
        f"{s['events']} events in {s['duration'] * 1e3:.3f} ms on {', '.join(s['switches'])}, "
        f"{s['slots']} slots, {res['multicast']} multicasts ({res['multicast_packets']} "
        f"packets), {res['unicast']} unicasts, {s['retransmissions']} retransmissions, "
        f"{s['malformed']} malformed\n"
    )
    out.flush()
    _print_whole(_summary_table(s))


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
    """The per-worker counts of :func:`swemu.observe.decode.summary` as a table."""
    from rich.table import Table

    table = Table()
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
    children = set(s.get("children", ()))
    for worker, counts in s["workers"].items():
        label = f"{worker} (child switch)" if worker in children else worker
        table.add_row(label, *(str(counts[n]) for n in names))
    return table
