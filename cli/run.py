"""``switchml run``: launch N workers against a switch (an embedded emulator by default).

Without a command, each worker allreduces deterministic inputs, checks every
result against the exact sum (float32: within the block floating point bound)
and the launcher prints per-iteration time and goodput. With ``-- CMD ...`` it
starts N copies of the user's program with RANK, WORLD_SIZE, LOCAL_RANK and
SWITCHML_* set, so the program can call ``hostlib.from_env()``.
"""

from __future__ import annotations

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
    help="Slots in flight per worker (the job's pool size) [default: 512 KiB in flight, "
    "at most 512 slots].",
)
@click.option(
    "--shards",
    default=1,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Data-plane processes of the local emulator (switchml-emu serve --shards).",
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
    no_progress,
    json_out,
    command,
) -> None:
    """Launch WORKERS workers; with -- COMMAND, run COMMAND as each worker."""
    import contextlib

    from swemu.launch import EmulatorProcess
    from swemu.netutil import parse_address

    if control and not switch:
        raise CLIError("--control needs --switch (the data plane of the same switch)")
    if switch and shards != 1:
        raise CLIError("--shards sets up the local emulator; a given --switch has its own")
    if switch:
        try:
            host, _ = parse_address(switch, 48864)
            if control:
                parse_address(control, 50099)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        control = control or f"{host}:50099"
    if packet_size is None:
        from swemu.wire import EMULATOR_SIZE_CODE

        packet_size = _switch_packet_size(control) if switch else int(EMULATOR_SIZE_CODE)
    if window is None:
        from hostlib.client import default_window

        window = default_window(packet_size)
    if size % 4:
        raise CLIError(f"--size {size} is not a whole number of 4-byte elements")

    local = not switch
    with contextlib.ExitStack() as stack:
        if local:
            terminal.info("starting a local emulator ...")
            emu = stack.enter_context(EmulatorProcess(shards=shards))
            switch, control = emu.switch, emu.control
            shown = f"{switch} (+{shards - 1} shards on the next ports)" if shards > 1 else switch
            terminal.info(f"emulator: data {shown}, control {control}")
        results, failed = _launch(
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
        )
    if command:
        if failed:
            raise CLIError(f"{len(failed)} of {workers} workers failed: " + ", ".join(failed))
        terminal.success(f"all {workers} workers finished")
        return
    _report(results, failed, workers, size, dtype, packet_size, window, json_out)


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
    workers, switch, control, packet_size, window, no_progress, size, dtype, iters, command, local
):
    """Start the workers, wait for them, collect their JSON reports. With a
    ``local`` emulator (which warns about small socket buffers for this
    machine) the workers do not repeat the warning."""
    import json
    import random
    import subprocess
    import sys
    import time

    from swemu.launch import CHILD_CWD, child_env

    from ._worker import RESULT_PREFIX

    session = random.getrandbits(62) | 1
    procs = []
    for rank in range(workers):
        env = child_env(
            RANK=str(rank),
            WORLD_SIZE=str(workers),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(workers),
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
        cmd = list(command) if command else [sys.executable, "-m", "cli._worker"]
        try:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=None if command else subprocess.PIPE,
                    text=True,
                    cwd=None if command else CHILD_CWD,  # the user's command runs where they are
                )
            )
        except OSError as exc:
            for p in procs:
                p.kill()
            raise CLIError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
    failed: list[str] = []
    results: dict[int, dict] = {}
    grace_until = None
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)
            if grace_until is None and any(p.poll() not in (None, 0) for p in procs):
                # a worker failed: the others notice within no_progress; then stop them
                grace_until = time.monotonic() + no_progress + 5.0
            if grace_until is not None and time.monotonic() > grace_until:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.main.Terminated)
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        raise
    for rank, p in enumerate(procs):
        if not command:
            for line in p.stdout.read().splitlines():
                if line.startswith(RESULT_PREFIX):
                    results[rank] = json.loads(line[len(RESULT_PREFIX) :])
            p.stdout.close()
        if p.returncode != 0:
            why = results.get(rank, {}).get("error")
            failed.append(f"rank {rank} (exit {p.returncode}{': ' + why if why else ''})")
    return results, failed


def _report(results, failed, workers, size, dtype, packet_size, window, json_out) -> None:
    import json
    import statistics

    from rich.table import Table

    iters = min((len(r["iters"]) for r in results.values()), default=0)
    table = Table(
        title=f"switchml run: {workers} workers, {size / 2**20:g} MiB {dtype}, "
        f"size code {packet_size}, window {window}"
    )
    for col in ("iter", "time (ms)", "goodput (Gbit/s)", "retransmissions", "check"):
        table.add_column(col, justify="right")
    rows = []
    for it in range(iters):
        per = [results[r]["iters"][it] for r in sorted(results)]
        t = max(p["time"] for p in per)  # the collective ends when its last worker has its result
        ok = all(p["ok"] for p in per) and len(per) == workers
        retx = sum(p.get("retransmissions", 0) for p in per)
        rows.append(
            {
                "iter": it,
                "time": t,
                "goodput_gbps": size * 8 / t / 1e9,
                "ok": ok,
                "retransmissions": retx,
                "worst_error_ratio": max(p["worst"] for p in per),
            }
        )
        table.add_row(
            str(it),
            f"{t * 1e3:.1f}",
            f"{size * 8 / t / 1e9:.2f}",
            str(retx),
            "[green]ok[/]" if ok else "[red]WRONG[/]",
        )
    if rows:
        terminal.out.print(table)
        med = statistics.median(r["time"] for r in rows)
        terminal.out.print(
            f"median {med * 1e3:.1f} ms per allreduce, "
            f"{size * 8 / med / 1e9:.2f} Gbit/s goodput per worker"
        )
    if json_out:
        with open(json_out, "w") as f:
            json.dump(
                {
                    "workers": workers,
                    "size": size,
                    "dtype": dtype,
                    "packet_size": packet_size,
                    "window": window,
                    "iters": rows,
                    "failed": failed,
                },
                f,
                indent=2,
            )
    if failed:
        raise CLIError(f"{len(failed)} of {workers} workers failed: " + "; ".join(failed))
    if not all(r["ok"] for r in rows):
        raise CLIError("some results were wrong (see the check column)")
    terminal.success(f"all {workers} workers verified {iters} results")
