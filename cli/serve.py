"""``switchml-emu serve``: run the emulator until SIGINT/SIGTERM (PROTOCOL.md §6)."""

from __future__ import annotations

import click

from .terminal import SIZE, CLIError, terminal


def _probability(ctx, param, value):
    if value is not None and not 0.0 <= value <= 1.0:
        raise click.BadParameter("must be a probability in [0, 1]")
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
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Free a job's pool after this many seconds without packets [default: never].",
)
@click.option(
    "--advertise-ip",
    default=None,
    help="IPv4 address given to workers as the switch's [default: --host, or 127.0.0.1].",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--ready-file",
    default=None,
    type=click.Path(dir_okay=False),
    hidden=True,
    help="Write the bound addresses as JSON here once serving (for launchers).",
)
def serve(
    host,
    port,
    control_port,
    control_host,
    pool_size,
    max_workers,
    max_jobs,
    max_pool_memory,
    idle_timeout,
    advertise_ip,
    log_level,
    ready_file,
) -> None:
    """Serve the SwitchML data plane (UDP) and control plane (gRPC)."""
    import asyncio
    import json
    import logging
    import os
    import signal

    from swemu.engine import EngineConfig
    from swemu.server import Emulator

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    config = EngineConfig(
        pool_size=pool_size,
        max_workers=max_workers,
        max_jobs=max_jobs,
        max_pool_memory=max_pool_memory,
        idle_timeout=idle_timeout,
    )

    async def main() -> None:
        emu = Emulator(
            host=host,
            port=port,
            control_host=control_host,
            control_port=control_port,
            config=config,
            advertise_ip=advertise_ip,
        )
        await emu.start()
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
                        "pid": os.getpid(),
                    },
                    f,
                )
            os.replace(tmp, ready_file)
        if log_level.lower() in ("debug", "info"):
            terminal.info(
                f"switchml-emu serving: data udp {emu.host}:{emu.port}, "
                f"control grpc {emu.control_host}:{emu.control_port} "
                "(Ctrl-C to stop)"
            )
        try:
            await stop.wait()
        finally:
            await emu.stop()

    try:
        _run(main())
    except OSError as exc:
        raise CLIError(str(exc)) from None


def _run(coro) -> None:
    """Run on uvloop when it is installed, else on asyncio's default loop."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
