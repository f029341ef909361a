"""``switchml-emu serve``: run the emulator until SIGINT/SIGTERM (docs/protocol.md §6).

With ``--shards S`` (S > 1) the data plane runs in S processes on ports
``--port`` .. ``--port + S - 1`` behind this process's control plane
(:mod:`swemu.serving.shards`); with the default 1 everything runs in this process.
"""

from __future__ import annotations

import click

from .terminal import SIZE, CLIError, terminal


def _probability(ctx, param, value):
    if value is not None and not 0.0 <= value <= 1.0:
        raise click.BadParameter("must be a probability in [0, 1]")
    return value


class Seconds(click.ParamType):
    """A number of seconds, or ``never`` (None)."""

    name = "seconds"

    def __init__(self, *, positive: bool) -> None:
        self.positive = positive

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        if str(value).lower() == "never":
            return None
        try:
            seconds = float(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number of seconds nor 'never'", param, ctx)
        if seconds < 0 or (self.positive and seconds == 0) or seconds != seconds:
            self.fail(
                f"{value} must be {'>' if self.positive else '>='} 0 (or 'never')", param, ctx
            )
        return seconds


def _mac(ctx, param, value):
    if value is None:
        return None
    from swemu.protocol.netutil import parse_mac

    try:
        return parse_mac(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _pcap_size(ctx, param, value):
    if value < 24:
        raise click.BadParameter("must leave room for the 24-byte pcap file header")
    return value


@click.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="Address of the data plane.")
@click.option(
    "--port",
    default=48864,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="UDP port of the data plane (0xBEE0; 0 = any free port).",
)
@click.option(
    "--shards",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Data-plane processes, shard i on UDP port --port + i (1 = all in this process).",
)
@click.option(
    "--control-port",
    default=50099,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="gRPC port of the control plane (0 = any free port).",
)
@click.option(
    "--control-host", default=None, help="Address of the control plane [default: --host]."
)
@click.option(
    "--pool-size",
    default=16384,
    show_default=True,
    type=click.IntRange(1, 16384),
    help="The most slots one job may take (also the default for jobs that do not ask).",
)
@click.option(
    "--max-workers",
    default=32,
    show_default=True,
    type=click.IntRange(1, 32),
    help="The most workers one job may have.",
)
@click.option(
    "--max-jobs",
    default=256,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="The most jobs served at once.",
)
@click.option(
    "--max-pool-memory",
    default="1GiB",
    show_default=True,
    type=SIZE,
    help="Memory budget for all jobs' pools; registrations beyond it are refused.",
)
@click.option(
    "--idle-timeout",
    default="600",
    show_default=True,
    type=Seconds(positive=True),
    help="Free a job after this many seconds without packets or registrations, for "
    "jobs whose workers vanished without releasing it ('never' keeps them).",
)
@click.option(
    "--evict-after",
    default="1",
    show_default=True,
    type=Seconds(positive=False),
    help="When the switch is full (--max-jobs, --max-pool-memory), a new job may evict "
    "the jobs idle longest, if idle this many seconds ('never': refuse the new job).",
)
@click.option(
    "--advertise-ip",
    default=None,
    help="IPv4 address given to workers as the switch's [default: --host, or 127.0.0.1].",
)
@click.option(
    "--advertise-mac",
    default=None,
    callback=_mac,
    help="MAC address given to workers as the switch's (clients that write their own "
    "Ethernet headers send to it) [default: that of the interface holding --host, "
    "else 02:00:5e:be:e0:00].",
)
@click.option(
    "--identify-by",
    default="ip-port",
    show_default=True,
    type=click.Choice(["ip-port", "ip"]),
    help="How workers are told apart: by (IP, udp_port), or by IP alone with results "
    "sent to the triggering packet's source port, as p4app-switchML's switch does.",
)
@click.option(
    "--parent",
    default=None,
    metavar="HOST:PORT",
    help="Be a child of the switch whose control plane is there (a fabric, "
    "docs/protocol.md §7): jobs whose workers are spread over several switches send "
    "their partial aggregates up. Workers use this switch as any other.",
)
@click.option(
    "--always-up",
    is_flag=True,
    help="With --parent: send every job up, even one whose workers are all here "
    "(to study multi-level aggregation; by default such a job is served here alone).",
)
@click.option(
    "--gso/--no-gso",
    default=True,
    show_default=True,
    help="Send results to one worker as UDP segmentation offload messages. --no-gso "
    "sends each datagram on its own: needed when workers read raw frames (DPDK "
    "af_packet) behind virtual links (veth) that pass such messages on uncut.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 = any free port).",
)
@click.option(
    "--metrics-host",
    default=None,
    help="Address of the metrics endpoint [default: --control-host].",
)
@click.option("--tui", is_flag=True, help="Show a live view of the switch in this terminal (2 Hz).")
@click.option(
    "--pcap",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="Record every packet the switch receives and sends to this pcap file.",
)
@click.option(
    "--pcap-max-packets",
    default=100_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Stop recording after this many packets.",
)
@click.option(
    "--pcap-max-bytes",
    default="256MiB",
    show_default=True,
    type=SIZE,
    callback=_pcap_size,
    help="Stop recording before the file grows past this size.",
)
@click.option(
    "--loss-in",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Fault injection: probability a packet to the switch is lost.",
)
@click.option(
    "--loss-out",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Fault injection: probability a packet from the switch is lost.",
)
@click.option(
    "--duplicate",
    default=0.0,
    type=click.FloatRange(0, 1),
    show_default=True,
    help="Fault injection: probability a packet to the switch arrives twice.",
)
@click.option(
    "--reorder-ms",
    default=0.0,
    type=click.FloatRange(0),
    show_default=True,
    help="Fault injection: packets from the switch are held back up to this long.",
)
@click.option(
    "--delay-ms",
    default=0.0,
    type=click.FloatRange(0),
    show_default=True,
    help="Fault injection: fixed extra delay of packets from the switch.",
)
@click.option(
    "--link-gbps",
    default=0.0,
    type=click.FloatRange(0),
    show_default=True,
    help="Rate of each switch-to-worker link (a token bucket; 0 = unlimited).",
)
@click.option(
    "--seed",
    default=None,
    type=click.IntRange(0),
    help="Seed of the fault injection's random generator (reproducible runs).",
)
@click.option(
    "--ready-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Once serving, write the bound addresses as JSON to this file (launchers wait "
    "for it; the ports are bound only once the kernels are compiled).",
)
def serve(
    host,
    port,
    shards,
    control_port,
    control_host,
    pool_size,
    max_workers,
    max_jobs,
    max_pool_memory,
    idle_timeout,
    evict_after,
    advertise_ip,
    advertise_mac,
    identify_by,
    parent,
    always_up,
    gso,
    log_level,
    metrics_port,
    metrics_host,
    tui,
    pcap,
    pcap_max_packets,
    pcap_max_bytes,
    loss_in,
    loss_out,
    duplicate,
    reorder_ms,
    delay_ms,
    link_gbps,
    seed,
    ready_file,
) -> None:
    """Serve the SwitchML data plane (UDP) and control plane (gRPC)."""
    import asyncio
    import json
    import logging
    import os
    import signal

    if shards > 1:  # checked before the heavy imports: a bad option costs nothing
        from swemu.serving.shard_process import check_shards

        try:
            check_shards(port, shards)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--shards'") from None
        if pcap is not None:
            raise click.BadParameter("needs --shards 1 (one data plane)", param_hint="'--pcap'")
        if parent is not None:
            raise click.BadParameter("needs --shards 1 (one data plane)", param_hint="'--parent'")
    if parent is not None:
        from swemu.protocol.netutil import parse_address

        try:
            parent_host, parent_port = parse_address(parent, 0)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--parent'") from None
        if not parent_host or not 0 < parent_port <= 0xFFFF:
            raise click.BadParameter(
                f"{parent!r} is not HOST:PORT of the parent's control plane",
                param_hint="'--parent'",
            )
    elif always_up:
        raise click.BadParameter("needs --parent (a child switch)", param_hint="'--always-up'")

    from swemu.core.engine import EngineConfig
    from swemu.core.faults import FaultConfig
    from swemu.protocol.netutil import format_mac
    from swemu.serving.fault_control import configure
    from swemu.serving.server import Emulator

    if tui:
        # log lines go through the live view's console, above the view, not across it
        from rich.logging import RichHandler

        logging.basicConfig(
            level=log_level.upper(),
            format="%(name)s %(message)s",
            handlers=[RichHandler(console=terminal.out, show_path=False)],
        )
    else:
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
    config = EngineConfig(
        pool_size=pool_size,
        max_workers=max_workers,
        max_jobs=max_jobs,
        max_pool_memory=max_pool_memory,
        idle_timeout=idle_timeout,
        evict_after=evict_after,
    )

    faults = FaultConfig(
        loss_in=loss_in,
        loss_out=loss_out,
        duplicate=duplicate,
        reorder_ms=reorder_ms,
        delay_ms=delay_ms,
        link_gbps=link_gbps,
    )
    inject = faults != FaultConfig() or seed is not None

    async def main() -> None:
        common = {
            "host": host,
            "port": port,
            "control_host": control_host,
            "control_port": control_port,
            "config": config,
            "advertise_ip": advertise_ip,
            "switch_mac": advertise_mac,
            "identify_by": identify_by,
            "metrics_port": metrics_port,
            "metrics_host": metrics_host,
        }
        if shards > 1:
            from swemu.serving.shards import ShardedEmulator

            if not gso:  # read by each shard's data plane (spawned with this environment)
                os.environ["SWEMU_GSO"] = "0"

            emu = ShardedEmulator(
                shards=shards,
                faults=faults if inject else None,
                seed=seed,
                log_level=log_level,
                **common,
            )
        else:
            emu = Emulator(
                **common,
                parent=parent,
                always_up=always_up,
                gso=None if gso else False,  # None: on unless SWEMU_GSO=0
                pcap=pcap,
                pcap_max_packets=pcap_max_packets,
                pcap_max_bytes=pcap_max_bytes,
            )
        await emu.start()
        data_ports = emu.ports if shards > 1 else None
        if inject:
            if shards == 1:
                configure(emu.engine, emu.data_plane, faults, seed=seed)
            per_shard = " + shard index" if shards > 1 else ""
            logging.getLogger("swemu.faults").info(
                "fault injection: %s (seed %s%s)", faults, seed, per_shard
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready_file:
            tmp = ready_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(
                    {
                        "data": list(emu.data_address),
                        "control": list(emu.control_address),
                        "metrics": list(emu.metrics_address) if emu.metrics_address else None,
                        "data_ports": data_ports,
                        "mac": format_mac(emu.switch_mac),
                        "pid": os.getpid(),
                    },
                    f,
                )
            os.replace(tmp, ready_file)
        if log_level.lower() in ("debug", "info"):
            metrics = ""
            if emu.metrics_address:
                metrics = ", metrics http://%s:%d/metrics" % emu.metrics_address
            data = f"{emu.host}:{emu.port}"
            if shards > 1:
                data += f"-{emu.port + shards - 1} ({shards} shards)"
            terminal.info(
                f"switchml-emu serving: data udp {data} (MAC {format_mac(emu.switch_mac)}), "
                f"control grpc {emu.control_host}:{emu.control_port}{metrics} "
                "(Ctrl-C to stop)"
            )
        view = asyncio.ensure_future(_live_view(emu)) if tui else None
        # a sharded emulator also stops when a shard dies (it logged why)
        failed = getattr(emu, "failed", None)
        waits = [asyncio.ensure_future(stop.wait())] + ([failed] if failed is not None else [])
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waits[0].cancel()
            if view is not None:
                view.cancel()
                await asyncio.gather(view, return_exceptions=True)
            await emu.stop()
        if failed is not None and failed.done():
            raise click.exceptions.Exit(1)

    try:
        _run(main())
    except OSError as exc:
        raise CLIError(str(exc)) from None


#: Refreshes per second of ``serve --tui``: each takes one snapshot of the engine.
TUI_HZ = 2.0


async def _live_view(emu) -> None:
    """Redraw the live view from a snapshot every 1/TUI_HZ s until cancelled.

    Runs in the emulator's event loop; a snapshot reads the counter arrays
    (never per packet), so the data plane loses one short pause per refresh.
    """
    import asyncio

    from rich.live import Live

    from swemu.observe.stats import take_snapshot
    from swemu.observe.tui import History, render

    history = History()
    snap = await take_snapshot(emu.snapshot)  # a sharded emulator asks its shards
    history.add(snap)
    # no refresh thread: the view is redrawn here, when a snapshot is taken
    with Live(render(snap, history), console=terminal.out, auto_refresh=False) as live:
        while True:
            await asyncio.sleep(1.0 / TUI_HZ)
            snap = await take_snapshot(emu.snapshot)
            history.add(snap)
            live.update(render(snap, history), refresh=True)


def _run(coro) -> None:
    """Run on uvloop when it is installed, else on asyncio's default loop."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
