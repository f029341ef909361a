"""``switchml simulate``: the scale model of SwitchML, ring all-reduce and a parameter server.

Subcommands: ``allreduce`` (one setting, the three methods), ``what-if`` (tables
over link rates and worker counts, with the pool size that fills the link and
the emulator shards it would take), ``reproduce`` (the paper's settings: tables
and the speedup plot), ``check`` (predict a real ``switchml run`` on this
machine and run it). ``--calibrate`` re-measures our per-packet costs and writes
the JSON the other subcommands load. The model itself is :mod:`swemu.model`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .terminal import SIZE, CLIError, terminal

if TYPE_CHECKING:  # heavy modules load inside the commands, so --help stays instant
    from swemu.model import ModelProfile
    from swemu.model.calibrate import Calibration

#: ``--params`` accepts these names for the reproduction's models: the keys of
#: :data:`swemu.model.MODELS` (named here too, so that ``--help`` loads no model)
MODEL_NAMES = ("resnet50", "bert", "vgg19", "lstm")


def _model(name: str) -> ModelProfile:
    from swemu import model as sim

    return sim.MODELS[name]()


def parse_params(text: str) -> int:
    """``25.6M``, ``1.2G``, ``800k``, ``143667240`` or a model name -> parameters."""
    t = text.strip().lower()
    if t in MODEL_NAMES:
        return _model(t).params
    units = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
    num = t.rstrip("kmgb")
    unit = t[len(num) :]
    try:
        value = float(num) * units[unit]
    except (KeyError, ValueError):
        raise click.BadParameter(
            f"{text!r} is not a parameter count (examples: 25.6M, 1.2G, "
            f"or one of {', '.join(MODEL_NAMES)})"
        ) from None
    if value < 1:
        raise click.BadParameter("the model needs at least one parameter")
    return round(value)


class ParamsType(click.ParamType):
    """A click parameter for ``--params``: a count with a suffix or a model name."""

    name = "params"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_params(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _float_list(ctx: click.Context, param: click.Parameter, value: str) -> list[float]:
    try:
        out = [float(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    if not out or any(x <= 0 for x in out):
        raise click.BadParameter("needs positive numbers")
    return out


def _int_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        out = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not out or any(x < 1 for x in out):
        raise click.BadParameter("needs integers of at least 1")
    return out


def _print_wide(renderable: object) -> None:
    """Print a wide table whole: pipes and files get 120 columns, terminals their width."""
    out = terminal.out
    if out.is_terminal:
        out.print(renderable)
        return
    width = out.width
    out.width = max(width, 120)
    try:
        out.print(renderable)
    finally:
        out.width = width


def _write_json(path: str | None, data: object) -> None:
    if path:
        import json

        with open(path, "w") as f:
            json.dump(data, f, indent=2)
        terminal.info(f"wrote {path}")


def _calibration(path: str | None) -> Calibration:
    from swemu.model import calibrate

    try:
        return calibrate.load(path)
    except (OSError, ValueError, TypeError) as exc:
        where = path or calibrate.DEFAULT_PATH
        raise CLIError(f"cannot read the calibration {where}: {exc}") from None


@click.group(invoke_without_command=True)
@click.option(
    "--calibrate",
    "do_calibrate",
    is_flag=True,
    help="Measure this machine's per-packet costs of the emulator and the host library "
    "and write them to the calibration file.",
)
@click.option(
    "--calibration",
    default=None,
    type=click.Path(dir_okay=False),
    help="Calibration JSON to write (--calibrate) or read [default: "
    "bench/results/calibration.json, or $SWITCHML_CALIBRATION; built-in values if absent].",
)
@click.pass_context
def simulate(ctx: click.Context, do_calibrate: bool, calibration: str | None) -> None:
    """Discrete-event model of SwitchML vs ring all-reduce vs a parameter server."""
    ctx.obj = {"calibration": calibration}
    if do_calibrate:
        from swemu.model import calibrate

        terminal.info("measuring per-packet costs, then a real run (about 30 s) ...")
        cal = calibrate.calibrate()
        path = calibrate.save(cal, calibration)
        _print_calibration(cal)
        terminal.success(f"calibration written to {path}")
    elif ctx.invoked_subcommand is None:
        terminal.out.print(ctx.get_help())


def _print_calibration(cal: Calibration) -> None:
    from rich.table import Table

    big = 4 * (32 << cal.size_code)
    t = Table(title=f"per-packet costs at {big} B payloads ({cal.machine}, {cal.measured_at})")
    t.add_column("cost")
    t.add_column("µs", justify="right")
    small = 4 * (32 << cal.small_code)
    for name in ("switch_kernel", "switch_call", "host_kernel", "host_call", "send", "recv"):
        t.add_row(name, f"{getattr(cal, name) * 1e6:.2f}")
    t.add_row(f"switch_kernel at {small} B", f"{cal.switch_kernel_small * 1e6:.2f}")
    t.add_row(f"host_kernel at {small} B", f"{cal.host_kernel_small * 1e6:.2f}")
    t.add_row("wakeup", f"{cal.wakeup * 1e6:.2f}")
    t.add_row("emulator per packet (batches of 64)", f"{cal.switch_packet * 1e6:.2f}")
    t.add_row("worker per packet (batches of 64)", f"{cal.host_packet * 1e6:.2f}")
    terminal.out.print(t)
    terminal.out.print(
        f"in situ (real multi-process run / model): emulator {cal.switch_in_situ:.2f}x, "
        f"worker {cal.host_in_situ:.2f}x"
    )
    terminal.out.print(
        f"one emulator shard: {cal.shard_pps / 1e3:.0f} kpps with socket I/O, "
        f"{cal.shard_pps_kernel_only / 1e3:.0f} kpps kernel only"
    )


# ------------------------------------------------------------------ options
def network_options(f: Callable[..., None]) -> Callable[..., None]:
    """The network and method options shared by ``allreduce`` and ``what-if``."""
    for opt in reversed(
        [
            click.option(
                "--rtt-us",
                default=10.0,
                show_default=True,
                type=float,
                help="Worker-switch round trip without serialization (µs).",
            ),
            click.option(
                "--rack-size",
                default=None,
                type=click.IntRange(1),
                help="Workers per rack switch under a spine [default: one switch].",
            ),
            click.option(
                "--values",
                "values_per_packet",
                default=64,
                show_default=True,
                type=click.IntRange(1, 4096),
                help="int32 values per SwitchML packet (64: 256 B, Tofino one pass).",
            ),
            click.option(
                "--loss",
                default=0.0,
                show_default=True,
                type=click.FloatRange(0, 1, max_open=True),
                help="Packet loss probability per link (SwitchML).",
            ),
            click.option(
                "--ps-servers",
                default=None,
                type=click.IntRange(1),
                help="Parameter servers (dedicated machines) [default: one per worker].",
            ),
        ]
    ):
        f = opt(f)
    return f


# --------------------------------------------------------------- allreduce
@simulate.command()
@click.option(
    "--params",
    required=True,
    type=ParamsType(),
    help="Gradient size: parameters (25.6M) or a model (resnet50, bert, vgg19, lstm).",
)
@click.option(
    "--gbps", default=100.0, show_default=True, type=click.FloatRange(min=0, min_open=True)
)
@click.option("--workers", default=8, show_default=True, type=click.IntRange(1))
@network_options
@click.option(
    "--window",
    default=None,
    type=click.IntRange(1, 16384),
    help="SwitchML pool size [default: what fills the link].",
)
@click.option(
    "--timeout-ms",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="SwitchML's fixed retransmission timeout.",
)
@click.option(
    "--switch-pps",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="Switch pipeline rate, packets/s over all ports [default: line rate].",
)
@click.option(
    "--host-cost-us",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Worker CPU per SwitchML packet (µs; 0: keeps up with the link).",
)
@click.option(
    "--alpha-us",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Ring / PS per-message latency (µs).",
)
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
def allreduce(
    params,
    gbps,
    workers,
    rtt_us,
    rack_size,
    values_per_packet,
    loss,
    ps_servers,
    window,
    timeout_ms,
    switch_pps,
    host_cost_us,
    alpha_us,
    json_out,
) -> None:
    """One allreduce of PARAMS float32 gradients: the three methods side by side."""
    from rich.table import Table

    from swemu import model as sim

    net, res = sim.compare(
        params=params,
        workers=workers,
        gbps=gbps,
        rtt_us=rtt_us,
        rack_size=rack_size,
        values_per_packet=values_per_packet,
        loss=loss,
        ps_servers=ps_servers,
        window=window,
        timeout_ms=timeout_ms,
        switch_pps=switch_pps,
        host_cost_us=host_cost_us,
        alpha_us=alpha_us,
    )
    nbytes = params * sim.PARAM_BYTES
    t = Table(
        title=f"allreduce of {params / 1e6:g} M float32 ({nbytes / 2**20:.1f} MiB), "
        f"{workers} workers, {gbps:g} Gbps, {net.racks(workers)} rack(s)"
    )
    for col in ("method", "time (ms)", "goodput (Gbit/s)", "vs ring"):
        t.add_column(col, justify="right")
    ring = res["ring"].time
    for name, r in res.items():
        t.add_row(name, f"{r.time * 1e3:.3f}", f"{r.goodput_gbps:.2f}", f"{ring / r.time:.2f}x")
    terminal.out.print(t)
    for name, r in res.items():
        detail = ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.detail.items()
        )
        terminal.out.print(f"{name}: {detail}")
    _write_json(json_out, {k: {"time": r.time, **r.detail} for k, r in res.items()})


# ------------------------------------------------------------------ what-if
@simulate.command("what-if")
@click.option(
    "--params",
    required=True,
    type=ParamsType(),
    help="Gradient size: parameters (25.6M) or a model (resnet50, bert, vgg19, lstm).",
)
@click.option(
    "--gbps",
    default="100",
    show_default=True,
    callback=_float_list,
    help="Link rates, comma-separated (10,25,100,400).",
)
@click.option(
    "--workers",
    default="8",
    show_default=True,
    callback=_int_list,
    help="Worker counts, comma-separated (8,64,1024).",
)
@network_options
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
@click.pass_context
def what_if(
    ctx, params, gbps, workers, rtt_us, rack_size, values_per_packet, loss, ps_servers, json_out
) -> None:
    """Predicted allreduce times, the pool that fills the link and the emulator it takes."""
    from rich.table import Table

    from swemu import model as sim

    cal = _calibration(ctx.obj.get("calibration"))
    nbytes = params * sim.PARAM_BYTES
    rows = sim.what_if_grid(
        params=params,
        gbps=gbps,
        workers=workers,
        rtt_us=rtt_us,
        values_per_packet=values_per_packet,
        rack_size=rack_size,
        cal=cal,
        loss=loss,
        ps_servers=ps_servers,
    )
    t = Table(
        title=f"what if: {params / 1e6:g} M parameters ({nbytes / 2**20:.1f} MiB), "
        f"{4 * values_per_packet} B SwitchML payloads, RTT {rtt_us:g} µs",
        caption="pool: SwitchML slots that fill the link; switch Mpps: packets/s the switch "
        "takes in at line rate; shards: emulator processes (one core each) for that rate, "
        "with today's socket I/O or kernel only; worker cores: hostlib cores per worker "
        "for its link's packet rate",
    )
    cols = (
        "Gbps",
        "workers",
        "SwitchML ms",
        "ring ms",
        "PS ms",
        "vs ring",
        "pool",
        "switch Mpps",
        "shards",
        "shards (kernel only)",
        "worker cores",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        tm = r["times_ms"]
        t.add_row(
            f"{r['gbps']:g}",
            str(r["workers"]),
            f"{tm['switchml']:.3g}",
            f"{tm['ring']:.3g}",
            f"{tm['ps']:.3g}",
            f"{r['speedup_vs_ring']:.2f}x",
            str(r["pool_to_fill"]),
            f"{r['switch_pps'] / 1e6:.1f}",
            str(r["shards"]),
            str(r["shards_kernel_only"]),
            str(r["worker_cores"]),
        )
    _print_wide(t)
    r0 = rows[0]
    terminal.out.print(
        f"emulator at {4 * values_per_packet} B payloads: one shard takes "
        f"{r0['shard_pps'] / 1e3:.0f} kpps with today's socket I/O "
        f"({r0['shard_pps_kernel_only'] / 1e3:.0f} kpps kernel only); a worker spends "
        f"{r0['host_packet'] * 1e6:.1f} µs per packet (calibration: {cal.measured_at})"
    )
    _write_json(json_out, rows)


# ---------------------------------------------------------------- reproduce
@simulate.command()
@click.option(
    "--figure",
    default="bench/figures/simulate_speedup.png",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Where to write the speedup plot.",
)
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
@click.option(
    "--markdown",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the tables as markdown.",
)
def reproduce(figure, json_out, markdown) -> None:
    """The paper's settings: 8 workers, 10 and 100 Gbps, ResNet-50, BERT-base, VGG-19, LSTM."""
    import os

    from swemu import model as sim

    rows = sim.reproduction()
    scale = sim.scaling()
    md = sim.reproduction_markdown(rows, scale)
    terminal.out.print(md, markup=False, highlight=False, soft_wrap=True)
    if markdown:
        with open(markdown, "w") as f:
            f.write(md)
        terminal.info(f"wrote {markdown}")
    _write_json(json_out, {"reproduction": rows, "scaling": scale})
    if figure:  # last: the results above never depend on the plotting library
        os.makedirs(os.path.dirname(figure) or ".", exist_ok=True)
        try:
            sim.plot_speedup(rows, figure, scale)
            terminal.info(f"wrote {figure}")
        except ImportError as exc:
            from .extras import explain

            terminal.warning(f"no plot: {explain(exc, 'plotting')}")


# -------------------------------------------------------------------- check
@simulate.command()
@click.option("--workers", "-n", default=2, show_default=True, type=click.IntRange(1, 32))
@click.option("--size", default="16Mi", show_default=True, type=SIZE)
@click.option("--iters", default=3, show_default=True, type=click.IntRange(1))
@click.option(
    "--from-json",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Use this `switchml run --json` report instead of running it.",
)
@click.option(
    "--background",
    default=None,
    type=click.FloatRange(min=0),
    help="Other runnable processes during the run [default: sampled before and after it; "
    "0 with --from-json].",
)
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
@click.pass_context
def check(ctx, workers, size, iters, from_json, background, json_out) -> None:
    """Predict `switchml run --workers N --size S` on this machine, run it, compare."""
    import json

    from swemu.model import calibrate

    cal = _calibration(ctx.obj.get("calibration"))
    measured = None
    if from_json:
        with open(from_json) as f:
            measured = json.load(f)
        workers, size = measured["workers"], measured["size"]
        if background is None:
            background = 0.0
    else:
        terminal.info(f"running switchml run --workers {workers} --size {size} --iters {iters} ...")
    try:
        r = calibrate.check(
            cal,
            workers=workers,
            nbytes=size,
            iters=iters,
            measured=measured,
            background=background,
        )
    except RuntimeError as exc:
        raise CLIError(str(exc)) from None
    out = terminal.out
    out.print(
        f"measured  : {r['measured'] * 1e3:.1f} ms median of "
        f"{[round(t * 1e3, 1) for t in r['iters']]} (retransmissions {r['retransmissions']})"
    )
    out.print(
        f"predicted : {r['predicted_idle'] * 1e3:.1f} ms on an idle machine "
        f"({r['cores']} cores): error {r['error_idle']:+.0%}"
    )
    out.print(
        f"predicted : {r['predicted_loaded'] * 1e3:.1f} ms with the background load "
        f"({r['background']:.2f} other runnable processes; "
        f"{r['retransmissions_predicted']} retransmissions): error {r['error_loaded']:+.0%}"
    )
    _write_json(json_out, r)


@simulate.command()
@click.argument("cluster_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False))
def racks(cluster_json, json_out) -> None:
    """The two-level tree's prediction beside a `switchml cluster run --racks` JSON.

    The model is calibrated on the run's own flat switch (one switch serving every
    worker over the same links): the host cost that makes the one-switch model
    take its measured time; the fabric's prediction is the two-level tree with
    that cost (bench/SIMULATION.md)."""
    import json

    from hostlib.client import default_window
    from swemu.model.racks import predict_rows
    from swemu.rack import fabric_table

    try:
        with open(cluster_json) as f:
            doc = json.load(f)
        cfg, rows = doc["config"], doc["summary"]
        hosts = max(cfg["workers"]) // cfg["racks"]
        code, window = cfg["packet_size"], cfg["window"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CLIError(
            f"{cluster_json} is not a `switchml cluster run --racks` JSON: {exc}"
        ) from None
    if cfg["racks"] < 2:
        raise CLIError(f"{cluster_json} measured one rack: there is no two-level tree to predict")
    predicted = predict_rows(
        rows,
        hosts=hosts,
        values_per_packet=32 << code,
        window_of=lambda w: window or default_window(code, w),
        mtu=cfg["mtu"],
    )
    if not predicted:
        raise CLIError(f"{cluster_json} has no fabric point with a flat switch beside it")
    table = fabric_table(rows, hosts)
    terminal.out.print(table, markup=False, highlight=False, soft_wrap=True)
    _write_json(json_out, rows)
