"""``python -m bench WHAT``: the benchmarks, each against its baseline side by side in one run.

Results go to ``--out`` (default ``bench/results/``, git-ignored) as JSON, a
markdown table and a PNG plot.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class BenchError(Exception):
    """An expected failure (no rack, bad options): one line on stderr, exit status 1."""


def _list(kind):
    def parse(text: str) -> list:
        from swemu.options import parse_size

        try:
            return [kind(x) if kind in (int, str) else parse_size(x) for x in text.split(",") if x]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _save(out: Path, name: str, data: object, markdown: str, newline: bool = False) -> None:
    """Write ``out/name.json`` and ``out/name.md``, then print the markdown."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2))
    (out / f"{name}.md").write_text(markdown + ("\n" if newline else ""))
    print(markdown)


def _tree_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """``--rounds``, ``--tree`` (repeatable: other source trees measured in the
    same invocation, bench/trees.py) and ``--out``."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument(
        "--tree", type=Path, action="append", default=[], help="another source tree to compare"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("allreduce", help="SwitchML vs gloo ring vs parameter server")
    a.add_argument("--workers", type=_list(int), default=[2, 4, 8])
    a.add_argument("--sizes", type=_list(None), default=[1 << 20, 16 << 20, 64 << 20])
    a.add_argument("--codes", type=_list(int), default=[1, 3, 6, 7])
    a.add_argument(
        "--forms",
        type=_list(str),
        default=["out", "new"],
        help="SwitchML's result: out (into out=, allocated once), new (y = ctx.allreduce(x))",
    )
    a.add_argument(
        "--windows",
        type=_list(int),
        default=[0],
        help="slots per worker of each code's jobs (0: the library's default), each compared",
    )
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--shards", type=int, default=1, help="data-plane processes of the emulator")
    a.add_argument(
        "--dtype",
        choices=["float32", "int32", "float16"],
        default="float32",
        help="int32: exact sums, no quantization (the transport's own cost); float16: "
        "SwitchML's 16-bit values against gloo's ring on float16 tensors",
    )
    a.add_argument(
        "--neighbour",
        choices=["off", "on", "both"],
        default="off",
        help="a CPU-bound neighbour process during every method's calls "
        "(both: every repetition quiet and loaded)",
    )
    a.add_argument("--out", type=Path, default=Path("bench/results"))
    g = sub.add_parser(
        "gloo-baseline", help="gloo alone under the old harness's conditions and without each"
    )
    g.add_argument("--workers", type=int, default=4)
    g.add_argument("--size", type=_list(None), default=[64 << 20])
    g.add_argument("--code", type=int, default=6, help="SwitchML's size code between gloo's calls")
    g.add_argument("--rounds", type=int, default=9)
    g.add_argument(
        "--no-matrix",
        action="store_true",
        help="leave out the old harness's whole matrix (sizes 1/16 MiB, codes 1, 3, 6, 7)",
    )
    g.add_argument("--out", type=Path, default=Path("bench/results"))
    lo = sub.add_parser("loss", help="goodput under injected loss vs lossless")
    lo.add_argument(
        "--levels",
        type=lambda t: [float(x) for x in t.split(",")],
        default=[0.0, 0.001, 0.01, 0.05],
    )
    lo.add_argument("--workers", type=int, default=4)
    lo.add_argument("--size", type=_list(None), default=[16 << 20])
    lo.add_argument("--size-code", type=int, default=6)
    lo.add_argument("--reps", type=int, default=5)
    lo.add_argument("--out", type=Path, default=Path("bench/results"))
    s = sub.add_parser("switch", help="switch-only packets/s: aggregation vs echo")
    s.add_argument("--workers", type=int, default=4)
    s.add_argument("--size-codes", type=_list(int), default=[3, 6])
    s.add_argument("--window", type=int, default=32)
    s.add_argument("--reps", type=int, default=5)
    s.add_argument("--seconds", type=float, default=1.0)
    s.add_argument("--shards", type=int, default=1, help="data-plane processes (serve --shards)")
    s.add_argument(
        "--formats",
        type=_list(int),
        default=[32],
        help="value formats: 32, and/or 16 (docs/protocol.md §4.2), interleaved",
    )
    s.add_argument(
        "--engine",
        action="store_true",
        help="the switch kernel alone, in memory (no sockets): bytes/s per value format",
    )
    s.add_argument("--rounds", type=int, default=200, help="--engine: windows per repetition")
    s.add_argument("--out", type=Path, default=Path("bench/results"))
    pr = sub.add_parser(
        "precision", help="16-bit SwitchML vs float16/bfloat16 rings: errors of the sums"
    )
    pr.add_argument("--workers", type=_list(int), default=[4, 32])
    pr.add_argument("--values", type=int, default=1 << 16, help="values per worker")
    pr.add_argument("--size-code", type=int, default=6)
    pr.add_argument("--out", type=Path, default=Path("bench/results"))
    sub.add_parser("decode", help="switchml-emu decode on a big synthetic capture (MB/s)")
    if (sys.argv[1:] if argv is None else argv)[:1] == ["decode"]:  # options of its own
        from .decode import main as decode_main

        return decode_main((sys.argv[1:] if argv is None else argv)[1:])
    f = sub.add_parser("firstrun", help="switchml run with an empty Numba cache vs a warm one")
    f.add_argument("--workers", type=int, default=4)
    f.add_argument("--size", default="1Mi")
    f.add_argument("--iters", type=int, default=3)
    _tree_options(f, rounds=1)
    rs = sub.add_parser("restart", help="what a switch restart costs a running job")
    rs.add_argument("--workers", type=int, default=4)
    rs.add_argument("--size", type=_list(None), default=[16 << 20])
    rs.add_argument("--rounds", type=int, default=5)
    rs.add_argument("--seed", type=int, default=1)
    rs.add_argument("--out", type=Path, default=Path("bench/results"))
    c = sub.add_parser("compile", help="what a first run compiles, per kernel (CPU seconds)")
    c.add_argument("--dtype", choices=["float32", "int32"], default="float32")
    _tree_options(c, rounds=1)
    ca = sub.add_parser("calls", help="the cost of one call of the compiled loops, per tree")
    ca.add_argument("--calls", type=int, default=2000, help="calls per timed run")
    _tree_options(ca, rounds=3)
    so = sub.add_parser("soak", help="consecutive jobs against one emulator: memory stays flat")
    so.add_argument("--jobs", type=int, default=1000)
    so.add_argument("--workers", type=int, default=2)
    so.add_argument("--size", type=_list(None), default=[64 << 10], help="bytes per worker")
    so.add_argument("--every", type=int, default=100, help="sample the RSS every N jobs")
    so.add_argument("--shards", type=int, default=1, help="data-plane processes (serve --shards)")
    so.add_argument("--out", type=Path, default=Path("bench/results"))
    i = sub.add_parser("identity", help="workers known by IP alone vs by (IP, port)")
    i.add_argument("--workers", type=int, default=3)
    i.add_argument("--size", type=_list(None), default=[4 << 20])
    i.add_argument("--size-code", type=int, default=3)
    i.add_argument("--reps", type=int, default=10)
    i.add_argument(
        "--per-worker-ports",
        action="store_true",
        help="also measure IP identity with a port per worker (the slow path)",
    )
    i.add_argument("--out", type=Path, default=Path("bench/results"))
    ov = sub.add_parser("overlap", help="DDP step time, switchml backend: overlap on vs off")
    ov.add_argument("--workers", type=int, default=2)
    ov.add_argument("--hidden", type=int, default=768, help="width of the MLP's square layers")
    ov.add_argument("--layers", type=int, default=8)
    ov.add_argument("--batch", type=int, default=384)
    ov.add_argument("--steps", type=int, default=4, help="steps per mode per round")
    ov.add_argument("--rounds", type=int, default=6, help="interleaved rounds of every mode")
    ov.add_argument("--bucket-mb", type=float, default=2.0, help="DDP's bucket_cap_mb")
    ov.add_argument(
        "--link-gbps", type=float, default=1.0, help="switch-to-worker link rate (0: unlimited)"
    )
    ov.add_argument("--out", type=Path, default=Path("bench/results"))
    tr = sub.add_parser(
        "training", help="DDP training on the emulated rack: switchml vs gloo (needs root)"
    )
    tr.add_argument("--workers", type=_list(int), default=[2, 4, 8])
    tr.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",") if x], default=[1.0])
    tr.add_argument("--steps", type=int, default=40, help="training steps per run")
    tr.add_argument("--hidden", type=int, default=2048, help="width of the MLP")
    tr.add_argument("--layers", type=int, default=3, help="linear layers of the MLP")
    tr.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    tr.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    tr.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    tr.add_argument("--reps", type=int, default=3, help="runs per backend and point")
    tr.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="loss for the time-to-loss column (default: per W, one every run reached)",
    )
    tr.add_argument(
        "--emulator-nice", type=int, default=-10, help="niceness of the emulator (0: as workers)"
    )
    tr.add_argument(
        "--window", type=int, default=None, help="SwitchML slots in flight (default: hostlib's)"
    )
    tr.add_argument("--no-plot", action="store_true", help="no PNG (matplotlib not needed)")
    tr.add_argument("--out", type=Path, default=Path("bench/results"))
    cp = sub.add_parser(
        "compression",
        help="DDP: switchml vs gloo vs fp16 / PowerSGD / top-k / QSGD compression (rack: root)",
    )
    cp.add_argument("--workers", type=int, default=4)
    cp.add_argument(
        "--rates",
        type=lambda t: [x if x == "lo" else float(x) for x in t.split(",") if x],
        default=[1.0, 0.5],
        help="link rates in Gbit/s on the emulated rack, and/or lo (loopback, no shaping)",
    )
    cp.add_argument(
        "--models",
        default=None,
        help="HIDDENxLAYERS@BATCH,... (default 2048x3@16,512x4@512: comm- and compute-heavy)",
    )
    cp.add_argument(
        "--methods",
        default=None,
        help="a comma list of switchml,switchml16,switchml-fp16,gloo,fp16,bf16,powersgd,topk,qsgd",
    )
    cp.add_argument("--steps", type=int, default=30, help="training steps per run")
    cp.add_argument("--reps", type=int, default=1, help="runs per method and point")
    cp.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    cp.add_argument(
        "--emulator-nice",
        type=int,
        default=-10,
        help="niceness of the emulator (keep it 10 below the workers' when running the "
        "benchmark under nice)",
    )
    cp.add_argument(
        "--vary-seed",
        action="store_true",
        help="repetition r starts from seed r (weights, data order): the spread of a "
        "method's final loss is its run-to-run noise",
    )
    cp.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: loopback, 2 workers, a 256x2@8 MLP, 8 steps (timed from 3)",
    )
    cp.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="no run: merge these JSON files (one per site) into one table and plot",
    )
    cp.add_argument("--name", default="compression", help="file names: NAME.json/.md/.png")
    cp.add_argument("--no-plot", action="store_true", help="no PNG (matplotlib not needed)")
    cp.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)

    if args.what == "allreduce":
        from swemu.options import available, missing_message, require

        require("torch", "python -m bench allreduce (gloo and the parameter server)")
        if not available("matplotlib"):  # the results do not need it: said now, not at the end
            print(f"warning: no plot: {missing_message('matplotlib', 'plotting')}", file=sys.stderr)
        from .allreduce import markdown, run, write_outputs

        data = run(
            args.workers,
            args.sizes,
            args.codes,
            args.reps,
            log=lambda m: print(m, file=sys.stderr),
            shards=args.shards,
            dtype=args.dtype,
            neighbour=args.neighbour,
            forms=args.forms,
            windows=args.windows,
        )
        paths = write_outputs(data, args.out)
        print(markdown(data))
        print("written: " + ", ".join(map(str, paths)), file=sys.stderr)
        return 0
    import json

    if args.what == "gloo-baseline":
        from swemu.options import require

        require("torch", "python -m bench gloo-baseline")
        from . import gloo_baseline

        data = gloo_baseline.run(
            args.workers,
            args.size[0],
            args.code,
            args.rounds,
            log=lambda m: print(m, file=sys.stderr),
            matrix=not args.no_matrix,
        )
        _save(args.out, "gloo_baseline", data, gloo_baseline.markdown(data))
        return 0
    if args.what == "firstrun":
        from . import firstrun

        data = firstrun.run(
            args.workers,
            args.size,
            args.iters,
            args.rounds,
            [t.resolve() for t in args.tree],
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "firstrun", data, firstrun.markdown(data))
        return 0
    if args.what == "restart":
        from . import restart

        data = restart.run(args.workers, args.size[0], args.rounds, args.seed)
        _save(args.out, "restart", data, restart.markdown(data), newline=True)
        return 0 if data["wrong"] == 0 else 1
    if args.what == "compile":
        from . import compile as compile_bench

        data = compile_bench.run(
            args.rounds,
            [t.resolve() for t in args.tree],
            args.dtype,
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "compile", data, compile_bench.markdown(data))
        return 0
    if args.what == "calls":
        from . import calls

        data = calls.run(
            args.rounds,
            [t.resolve() for t in args.tree],
            args.calls,
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "calls", data, calls.markdown(data))
        return 0
    if args.what == "soak":
        from . import soak

        data = soak.run(
            args.jobs,
            args.workers,
            args.size[0],
            args.every,
            args.shards,
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "soak", data, soak.markdown(data), newline=True)
        return 0 if data["live_jobs_at_end"] == 0 else 1
    if args.what == "loss":
        from . import loss

        data = loss.run(
            args.levels,
            args.workers,
            args.size[0],
            args.size_code,
            args.reps,
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "loss", data, loss.markdown(data))
        return 0
    if args.what == "overlap":
        from swemu.options import require

        require("torch", "python -m bench overlap")
        from . import overlap

        data = overlap.run(
            args.workers,
            args.hidden,
            args.layers,
            args.batch,
            args.steps,
            args.rounds,
            args.bucket_mb,
            args.link_gbps,
            log=lambda m: print(m, file=sys.stderr),
        )
        paths = overlap.write_outputs(data, args.out)
        print(overlap.markdown(data))
        print("written: " + ", ".join(map(str, paths)), file=sys.stderr)
        return 0
    if args.what == "training":
        from swemu.options import require

        require("torch", "python -m bench training")
        if not args.no_plot:  # checked now, not after a long run
            require("matplotlib", "python -m bench training's plot (or --no-plot)")
        from swemu.rack import namespaces_permitted

        why = namespaces_permitted()
        if why:
            raise BenchError(f"python -m bench training needs the emulated rack: {why}")
        from swemu.rack import ClusterError

        from . import training

        try:
            data = training.run(
                args.workers,
                args.rates,
                steps=args.steps,
                hidden=args.hidden,
                layers=args.layers,
                batch=args.batch,
                reps=args.reps,
                lr=args.lr,
                bucket_mb=args.bucket_mb,
                target_loss=args.target_loss,
                emulator_nice=args.emulator_nice,
                window=args.window,
                partial=args.out / "training.partial.json",
                log=lambda m: print(m, file=sys.stderr),
            )
        except (ClusterError, ValueError) as exc:  # no rack, a rank failed, bad options
            raise BenchError(str(exc)) from None
        paths = training.write_outputs(data, args.out, plot=not args.no_plot)
        print(training.markdown(data))
        print("written: " + ", ".join(map(str, paths)), file=sys.stderr)
        return 0
    if args.what == "compression":
        return _compression(args)
    if args.what == "precision":
        from . import precision

        data = precision.measure(args.workers, args.values, args.size_code)
        _save(args.out, "precision", data, precision.markdown(data), newline=True)
        return 0
    if args.what == "identity":
        from . import identity

        data = identity.run(
            args.workers,
            args.size[0],
            args.size_code,
            args.reps,
            per_worker_ports=args.per_worker_ports,
            log=lambda m: print(m, file=sys.stderr),
        )
        _save(args.out, "identity", data, identity.markdown(data))
        return 0
    from .switch import run as run_switch

    if set(args.formats) - {16, 32} or not args.formats:
        raise BenchError("--formats is a list of 32 and 16")
    if args.engine:
        from .switch import engine_rates

        rows = []
        for code in args.size_codes:
            r = engine_rates(
                args.workers, code, args.window, args.rounds, args.reps, tuple(args.formats)
            )
            rows.append(r)
            rates = ", ".join(f"{b}-bit {v / 1e9:.2f} GB/s" for b, v in r["bytes_per_s"].items())
            ratio = r.get("b16_over_b32_paired")
            print(
                f"{r['packet_bytes']:>6} B, switch kernel in memory: {rates}"
                + (f"; 16-bit / 32-bit per byte {ratio:.3f} (paired)" if ratio else "")
            )
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "switch_engine.json").write_text(json.dumps(rows, indent=2))
        return 0
    rows = []
    for code in args.size_codes:
        r = run_switch(
            args.workers,
            code,
            args.window,
            args.reps,
            args.seconds,
            args.shards,
            tuple(args.formats),
        )
        rows.append(r)
        for bits, f in r["formats"].items():
            print(
                f"{r['packet_bytes']:>6} B, {bits}-bit values: aggregation "
                f"{f['agg_pps'] / 1e3:7.0f} kpkt/s, echo {f['echo_pps'] / 1e3:7.0f} kpkt/s, "
                f"ratio {f['ratio']:.2f}"
            )
        if "agg16_over_agg32" in r:
            print(
                f"{r['packet_bytes']:>6} B: 16-bit / 32-bit aggregation per byte "
                f"{r['agg16_over_agg32']:.3f} (paired {r['agg16_over_agg32_paired']:.3f}), "
                "per value twice that"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "switch.json").write_text(json.dumps(rows, indent=2))
    return 0


def _compression(args: argparse.Namespace) -> int:
    """``python -m bench compression``: run (or ``--merge``), write, print the table."""
    import json

    from swemu.options import require

    if args.merge:
        from . import compression

        data = compression.merge([json.loads(f.read_text()) for f in args.merge])
    else:
        require("torch", "python -m bench compression")
        if not args.no_plot:  # checked now, not after a long run
            require("matplotlib", "python -m bench compression's plot (or --no-plot)")
        from . import compression

        try:
            models = [compression.Model.parse(m) for m in (args.models or "").split(",") if m]
            sites, workers, steps = args.rates, args.workers, args.steps
            timing: dict = {}
            if args.quick:
                sites, workers, steps = ["lo"], 2, 8
                models = models or [compression.Model(256, 2, 8)]
                timing = {"timed_from": 3, "powersgd_start": 3}
            models = models or [compression.Model.parse(m) for m in compression.DEFAULT_MODELS]
            if any(s != "lo" for s in sites):
                why = compression.rack_lib.namespaces_permitted()
                if why:
                    raise BenchError(f"the emulated rack is unavailable ({why}); use --rates lo")
            methods = args.methods.split(",") if args.methods else compression.METHODS
            data = compression.run(
                sites,
                models,
                workers=workers,
                methods=methods,
                steps=steps,
                reps=args.reps,
                lr=args.lr,
                partial=args.out / f"{args.name}.partial.json",
                log=lambda m: print(m, file=sys.stderr),
                vary_seed=args.vary_seed,
                emulator_nice=args.emulator_nice,
                **timing,
            )
        except (compression.rack_lib.ClusterError, ValueError) as exc:
            raise BenchError(str(exc)) from None
    paths = compression.write_outputs(data, args.out, name=args.name, plot=not args.no_plot)
    print(compression.markdown(data))
    print("written: " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    from swemu.options import MissingExtra

    try:
        sys.exit(main())
    except (BenchError, MissingExtra) as exc:  # an expected failure: one line
        sys.exit(f"error: {exc}")
