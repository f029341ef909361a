"""``switchml cluster``: the SwitchML-vs-ring experiment on emulated racks.

``switchml cluster run`` builds network namespaces joined by a bridge over
rate-limited veth links (``swemu/rack/``), runs the emulator in the switch's
namespace and one worker per worker namespace, measures SwitchML, gloo ring
allreduce and a parameter server interleaved, and writes a markdown table, a
JSON file and a speedup plot. With ``--racks R`` it builds R such racks under a
root switch, joined by shaped (``--oversubscription``) uplinks, runs a child
emulator per rack (``serve --parent``: a two-level fabric) and one more switch
serving every worker directly, and measures the fabric against gloo's ring
and that one switch, with the bytes on each rack uplink and the scale model's
prediction beside the measurement. ``switchml cluster --cleanup`` removes what
runs that were killed (SIGKILL, power loss) left behind. Needs root.
"""

from __future__ import annotations

import click

from .extras import MissingExtra, explain, require
from .terminal import CLIError, parse_size, terminal


def _floats(ctx, param, value: str) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    if not out or min(out) <= 0:
        raise click.BadParameter("give one or more positive numbers, e.g. 0.5,1,2.5")
    return out


def _ints(ctx, param, value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 2 or max(out) > 32:
        raise click.BadParameter("worker counts must be in 2..32, e.g. 2,4,8")
    return tuple(sorted(set(out)))


def _sizes(ctx, param, value: str) -> tuple[int, ...]:
    out = tuple(parse_size(v) for v in value.split(",") if v.strip())
    if not out or any(s <= 0 or s % 4 for s in out):
        raise click.BadParameter("sizes must be positive multiples of 4 bytes, e.g. 16Mi,64Mi")
    return out


def _methods(ctx, param, value: str | None) -> tuple[str, ...] | None:
    from swemu.rack import METHODS

    if value is None:
        return None
    out = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [m for m in out if m not in METHODS]
    if bad or not out:
        raise click.BadParameter(f"choose from {','.join(METHODS)}")
    return out


@click.group(invoke_without_command=True)
@click.option(
    "--cleanup",
    is_flag=True,
    help="Remove namespaces, links and processes left by killed runs (swml<pid>-*).",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="With --cleanup: also remove those of runs that are still alive.",
)
@click.pass_context
def cluster(ctx: click.Context, cleanup: bool, everything: bool) -> None:
    """Emulated rack: SwitchML vs gloo ring vs parameter server over shaped links."""
    if cleanup:
        from swemu.rack import cleanup_leftovers

        _need_root()
        removed = cleanup_leftovers(everything=everything)
        if removed:
            terminal.success(f"removed {len(removed)}: {' '.join(removed)}")
        else:
            terminal.info("nothing to clean up")
        return
    if ctx.invoked_subcommand is None:
        terminal.out.print(ctx.get_help())


def _need_root() -> None:
    from swemu.rack import namespaces_permitted

    why = namespaces_permitted()
    if why:
        raise CLIError(f"cannot build an emulated rack: {why}")


@cluster.command()
@click.option(
    "--rates",
    default="0.5,1,2.5",
    show_default=True,
    callback=_floats,
    help="Link rates in Gbit/s (each direction of each link).",
)
@click.option(
    "--workers", "-n", default="2,4,8", show_default=True, callback=_ints, help="Worker counts W."
)
@click.option(
    "--sizes",
    default="16Mi,64Mi",
    show_default=True,
    callback=_sizes,
    help="float32 tensor sizes per worker (suffixes Ki, Mi, Gi).",
)
@click.option(
    "--reps",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    help="Repetitions of every point (medians are reported).",
)
@click.option(
    "--methods",
    default=None,
    callback=_methods,
    help="switchml (emulator; with --racks the fabric: each rack's switch under the "
    "root), ring (gloo all_reduce), ps (parameter server at rank 0 over gloo "
    "send/recv), link (one shaped link, calibration), flat (with --racks: one switch "
    "serving every worker over a second link each) [default: switchml,ring,ps,link; "
    "with --racks: switchml,ring,flat].",
)
@click.option(
    "--racks",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Racks: the largest W split rack by rack, a child switch per rack under a root.",
)
@click.option(
    "--oversubscription",
    "oversubscriptions",
    default="1",
    show_default=True,
    callback=_floats,
    help="With --racks: rack uplink oversubscriptions (uplink rate = rate × workers per "
    "rack / this), e.g. 1,4.",
)
@click.option(
    "--packet-size",
    default=6,
    show_default=True,
    type=click.IntRange(0, 7),
    help="SwitchML size code (6: 8 KiB payloads, needs --mtu 9000; 3 fits 1500).",
)
@click.option(
    "--window",
    default=None,
    type=click.IntRange(1, 16384),
    help="SwitchML slots in flight per worker [default: hostlib's for the packet size].",
)
@click.option(
    "--mtu",
    default=9000,
    show_default=True,
    type=click.IntRange(1280, 65535),
    help="MTU of the veth links and the bridge.",
)
@click.option(
    "--delay",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0),
    help="netem delay per direction, ms (needs sch_netem).",
)
@click.option(
    "--loss",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 100),
    help="netem loss per direction, percent (needs sch_netem).",
)
@click.option(
    "--queue",
    default="4Mi",
    show_default=True,
    help="tbf queue limit per direction (bytes, suffixes allowed).",
)
@click.option(
    "--emulator-nice",
    default=-10,
    show_default=True,
    type=click.IntRange(-20, 19),
    help="Scheduling niceness of the emulator. The default -10 runs it before the "
    "workers, as a switch that does not share their CPU would; 0 makes it compete.",
)
@click.option(
    "--subnet",
    default="10.201.0",
    show_default=True,
    help="First three octets of the rack's private /24 (exists only in its namespaces).",
)
@click.option(
    "--json",
    "json_out",
    default="cluster.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Write every measurement and the summary here.",
)
@click.option(
    "--plot",
    "plot_out",
    default="cluster_speedup.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Speedup-vs-W plot (PNG); '' for none.",
)
@click.option(
    "--markdown",
    "md_out",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the results table (markdown) to this file.",
)
def run(
    rates,
    workers,
    sizes,
    reps,
    methods,
    racks,
    oversubscriptions,
    packet_size,
    window,
    mtu,
    delay,
    loss,
    queue,
    emulator_nice,
    subnet,
    json_out,
    plot_out,
    md_out,
) -> None:
    """Build the rack(s), measure every point interleaved, remove them."""
    from swemu import rack as bc

    if methods is None:
        methods = ("switchml", "ring", "flat") if racks > 1 else ("switchml", "ring", "ps", "link")
    config = bc.BenchConfig(
        rates_gbps=rates,
        workers=workers,
        racks=racks,
        oversubscriptions=oversubscriptions,
        sizes=sizes,
        reps=reps,
        methods=methods,
        packet_size=packet_size,
        window=window,
        mtu=mtu,
        delay_ms=delay,
        loss_pct=loss,
        queue_bytes=parse_size(queue),
        emulator_nice=emulator_nice,
        subnet=subnet,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    # before minutes of measuring, not at the end: what the run cannot do without
    require("torch", "switchml cluster run (its workers use torch.distributed)")
    if plot_out:
        try:
            require("matplotlib", "the speedup plot")
        except MissingExtra as exc:
            raise MissingExtra(f"{exc.format_message()} (or --plot '' for none)") from None
    _need_root()

    def on_record(r: bc.Record) -> None:
        c = r.counters
        uplinks = ""
        if racks > 1:
            up = [c.get(f"rackup{k}_bytes", 0) / r.nbytes for k in range(racks)]
            down = [c.get(f"rackdown{k}_bytes", 0) / r.nbytes for k in range(racks)]
            uplinks = (
                f"uplinks {r.oversubscription:g}:1 up "
                + "/".join(f"{v:.2f}" for v in up)
                + " down "
                + "/".join(f"{v:.2f}" for v in down)
                + " S  "
            )
        terminal.info(
            f"rep {r.rep}  {r.rate_gbps:g} Gb/s  W={r.workers}  {r.nbytes / 2**20:g} MiB  "
            f"{uplinks}"
            f"{r.method:8s} {r.time * 1e3:8.1f} ms (ideal {r.ideal * 1e3:7.1f}, "
            f"busiest link {c.get('busiest_link_bytes', 0) * 8 / r.rate_gbps / 1e6:7.1f})  "
            f"{'ok' if r.ok else 'WRONG'}  retx {r.retransmissions} "
            f"(spurious {c.get('spurious', 0):.0f})  "
            f"drops tbf {c.get('drops', 0):.0f} udp {c.get('udp_errors_switch', 0):.0f}/"
            f"{c.get('udp_errors_workers', 0):.0f}  "
            f"CPU {c.get('machine_busy', 0) * 100:3.0f}%, ours {c.get('ours_cores', 0):.2f} "
            f"cores, emulator {c.get('emulator_cores', 0):.2f}"
        )

    done: list[bc.Record] = []

    def save_partial() -> str:
        if not done:
            return ""
        bc.write_json(json_out, config, done, bc.summarize(done), complete=False, code=code)
        return f" ({len(done)} measurements saved to {json_out})"

    code = bc.code_state()
    try:
        records = bc.run_benchmark(
            config, on_record=lambda r: (done.append(r), on_record(r)), on_status=terminal.info
        )
    except bc.ClusterError as exc:
        raise CLIError(f"{exc}{save_partial()}") from None
    except (bc.Interrupted, KeyboardInterrupt) as exc:
        code = 128 + exc.signum if isinstance(exc, bc.Interrupted) else 130
        why = str(exc) or "interrupted"
        raise CLIError(f"{why}; the rack was removed{save_partial()}", code=code) from None
    rows = bc.summarize(records)
    if racks > 1:
        hosts = max(workers) // racks
        _predict(rows, hosts, packet_size, window, mtu)
        table = bc.fabric_table(rows, hosts)
    else:
        table = bc.markdown_table(rows)
    terminal.out.print(table, markup=False, highlight=False, soft_wrap=True)
    faithful = bc.faithful_up_to(rows)
    for method, rate in faithful.items():
        terminal.out.print(
            f"{method}: link-bound (within 1.25x of ideal) up to "
            + (f"{rate:g} Gb/s" if rate else "none of the measured rates"),
            markup=False,
        )
    # the results first: a plot that fails must not take them with it
    bc.write_json(json_out, config, records, rows, code=code)
    written = [json_out]
    if md_out:
        with open(md_out, "w") as f:
            f.write(table)
        written.append(md_out)
    if plot_out:
        try:
            bc.plot_speedup(rows, plot_out)
            written.append(plot_out)
        except ImportError as exc:
            terminal.warning(f"no plot: {explain(exc, 'plotting')}")
    terminal.success("wrote " + ", ".join(written))
    if not all(r.ok for r in records):
        raise CLIError("some results were wrong (see the table)")


def _predict(
    rows: list[dict], hosts: int, packet_size: int, window: int | None, mtu: int
) -> dict[tuple, float]:
    """The scale model's two-level prediction of every fabric point with a flat
    switch beside it (:func:`swemu.model.racks.predict_rows`), written into the
    rows and returned for the table."""
    from hostlib.client import default_window
    from swemu.model.racks import predict_rows

    return predict_rows(
        rows,
        hosts=hosts,
        values_per_packet=32 << packet_size,
        window_of=lambda w: window or default_window(packet_size, w),
        mtu=mtu,
    )
