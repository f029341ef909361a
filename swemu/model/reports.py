"""The reproduction: the paper's claims, the comparison of the three methods,
the what-if grid, scaling, and the report (Markdown, plot).

Part of the scale model (:mod:`swemu.model`, its theory of operation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .iteration import iteration_time
from .network import PARAM_BYTES, Network, Result, switchml_wire_bytes
from .ps import PSConfig, ps_allreduce
from .ring import RingConfig, ring_allreduce
from .switchml import SwitchMLConfig, pool_to_fill, switchml_allreduce
from .zoo import ModelProfile, paper_models, resnet50

#: The paper's (Sapio et al., NSDI 2021) headline claims the reproduction is held against.
PAPER_CLAIMS = {
    "allreduce_10g": "up to 80% faster than ring all-reduce at 10 Gbps (network-bound models)",
    "allreduce_100g": "up to 67% faster than ring all-reduce at 100 Gbps",
    "training": "up to 5.5x training throughput end to end",
    "scaling": "constant allreduce time as workers are added (p4app-switchML)",
}


def three_methods(
    nbytes: int,
    workers: int,
    net: Network,
    sml: SwitchMLConfig | None = None,
    ring: RingConfig | None = None,
    ps: PSConfig | None = None,
) -> dict[str, Result]:
    """The allreduce time of each method for one setting."""
    return {
        "switchml": switchml_allreduce(nbytes, workers, net, sml or SwitchMLConfig()),
        "ring": ring_allreduce(nbytes, workers, net, ring or RingConfig()),
        "ps": ps_allreduce(nbytes, workers, net, ps or PSConfig(servers=workers)),
    }


def compare(
    *,
    params: int,
    workers: int,
    gbps: float,
    rtt_us: float = 10.0,
    rack_size: int | None = None,
    values_per_packet: int = 64,
    loss: float = 0.0,
    ps_servers: int | None = None,
    window: int | None = None,
    timeout_ms: float = 10.0,
    switch_pps: float | None = None,
    host_cost_us: float = 0.0,
    alpha_us: float = 20.0,
) -> tuple[Network, dict[str, Result]]:
    """One allreduce of ``params`` float32 gradients by the three methods, from
    the units a user types (µs, ms, Gbit/s; ``window`` None: the pool that fills
    the link, ``switch_pps`` None: line rate, ``ps_servers`` None: one server per
    worker): ``switchml simulate allreduce``."""
    net = Network(gbps=gbps, rtt=rtt_us * 1e-6, rack_size=rack_size)
    cfg = SwitchMLConfig(
        values_per_packet=values_per_packet,
        window=window,
        loss=loss,
        timeout=timeout_ms * 1e-3,
        switch_pps=switch_pps or math.inf,
        host_cost=host_cost_us * 1e-6,
    )
    res = three_methods(
        params * PARAM_BYTES,
        workers,
        net,
        cfg,
        RingConfig(alpha=alpha_us * 1e-6),
        PSConfig(servers=ps_servers or workers, chunk=512 << 10, alpha=alpha_us * 1e-6),
    )
    return net, res


def what_if_grid(
    *,
    params: int,
    gbps: Sequence[float],
    workers: Sequence[int],
    rtt_us: float = 10.0,
    values_per_packet: int = 64,
    rack_size: int | None = None,
    cal: Any = None,
    loss: float = 0.0,
    ps_servers: int | None = None,
) -> list[dict]:
    """:func:`what_if` for every link rate × worker count (``switchml simulate
    what-if``), rates outermost."""
    return [
        what_if(
            nbytes=params * PARAM_BYTES,
            gbps=g,
            workers=n,
            rtt=rtt_us * 1e-6,
            values_per_packet=values_per_packet,
            rack_size=rack_size,
            cal=cal,
            loss=loss,
            ps_servers=ps_servers,
        )
        for g in gbps
        for n in workers
    ]


def reproduction(
    *,
    gbps: Sequence[float] = (10.0, 100.0),
    workers: int = 8,
    models: Sequence[ModelProfile] | None = None,
    values_per_packet: Sequence[int] = (64, 256),
    rtt: float = 10e-6,
) -> list[dict]:
    """Rows of the reproduction table: per link rate and model, the allreduce time
    of the whole gradient and the iteration time of each method, and SwitchML's
    speedup over the ring. PS is sharded over ``workers`` dedicated servers."""
    rows = []
    for g in gbps:
        net = Network(gbps=g, rtt=rtt)
        for model in models or paper_models():
            ring_cfg = RingConfig()
            ps_cfg = PSConfig(servers=workers, chunk=512 << 10)

            def ring_t(nb: int, _net: Network = net, _c: RingConfig = ring_cfg) -> float:
                return ring_allreduce(nb, workers, _net, _c).time

            def ps_t(nb: int, _net: Network = net, _c: PSConfig = ps_cfg) -> float:
                return ps_allreduce(nb, workers, _net, _c).time

            row: dict[str, Any] = {
                "gbps": g,
                "workers": workers,
                "model": model.name,
                "params_m": model.params / 1e6,
                "compute_ms": model.compute * 1e3,
                "ring_ms": ring_t(model.nbytes) * 1e3,
                "ps_ms": ps_t(model.nbytes) * 1e3,
            }
            it_ring = iteration_time(model, ring_t)
            it_ps = iteration_time(model, ps_t)
            row["ring_iter_ms"] = it_ring.time * 1e3
            row["ps_iter_ms"] = it_ps.time * 1e3
            for v in values_per_packet:
                cfg = SwitchMLConfig(values_per_packet=v)

                def sml_t(nb: int, _net: Network = net, _c: SwitchMLConfig = cfg) -> float:
                    return switchml_allreduce(nb, workers, _net, _c).time

                t = sml_t(model.nbytes)
                it = iteration_time(model, sml_t)
                row[f"sml{v}_ms"] = t * 1e3
                row[f"sml{v}_iter_ms"] = it.time * 1e3
                row[f"sml{v}_speedup"] = row["ring_ms"] / (t * 1e3)
                row[f"sml{v}_train_speedup"] = it_ring.time / it.time
            rows.append(row)
    return rows


def scaling(
    *,
    model: ModelProfile | None = None,
    gbps: float = 100.0,
    workers: Sequence[int] = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    rack_size: int = 32,
    values_per_packet: int = 256,
) -> list[dict]:
    """Allreduce time of one model's gradient as workers are added: one switch up
    to ``rack_size`` workers, then a two-level tree of racks of ``rack_size``."""
    model = model or resnet50()
    rows = []
    for n in workers:
        net = Network(gbps=gbps, rack_size=rack_size if n > rack_size else None)
        res = three_methods(
            model.nbytes,
            n,
            net,
            SwitchMLConfig(values_per_packet=values_per_packet),
            ps=PSConfig(servers=max(1, n // 8), chunk=512 << 10),
        )
        rows.append(
            {
                "workers": n,
                "racks": net.racks(n),
                **{f"{k}_ms": r.time * 1e3 for k, r in res.items()},
            }
        )
    return rows


def reproduction_markdown(rows: list[dict], scale: list[dict] | None = None) -> str:
    """The reproduction (and scaling) tables as markdown."""
    lines = [
        "| Gbps | model | params (M) | compute (ms) | ring (ms) | PS (ms) "
        "| SwitchML 256 B (ms) | SwitchML 1 KB (ms) | allreduce speedup 256 B / 1 KB "
        "| training speedup 256 B / 1 KB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gbps']:g} | {r['model']} | {r['params_m']:.1f} | {r['compute_ms']:.0f} "
            f"| {r['ring_ms']:.1f} | {r['ps_ms']:.1f} | {r['sml64_ms']:.1f} | {r['sml256_ms']:.1f} "
            f"| {r['sml64_speedup']:.2f}x / {r['sml256_speedup']:.2f}x "
            f"| {r['sml64_train_speedup']:.2f}x / {r['sml256_train_speedup']:.2f}x |"
        )
    if scale:
        lines += [
            "",
            "| workers | racks | SwitchML (ms) | ring (ms) | PS (ms) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in scale:
            lines.append(
                f"| {r['workers']} | {r['racks']} | {r['switchml_ms']:.2f} "
                f"| {r['ring_ms']:.2f} | {r['ps_ms']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def plot_speedup(
    rows: list[dict], path: str, scale: list[dict] | None = None, values_per_packet: int = 256
) -> None:
    """Bars of SwitchML's speedup over the ring (allreduce and training) per model
    at each link rate, the paper's claims as dashed lines; with ``scale``, a last
    panel of allreduce time against the number of workers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["gbps"] for r in rows})
    panels = len(rates) + (1 if scale else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))
    axes = np.atleast_1d(axes)
    claims = {10.0: 1.80, 100.0: 1.67}
    big = 4 * values_per_packet
    keys = [
        ("sml64_speedup", "allreduce, 256 B packets"),
        (f"sml{values_per_packet}_speedup", f"allreduce, {big} B packets"),
        ("sml64_train_speedup", "training iteration, 256 B packets"),
        (f"sml{values_per_packet}_train_speedup", f"training iteration, {big} B packets"),
    ]
    for ax, g in zip(axes, rates):
        sub = [r for r in rows if r["gbps"] == g]
        x = np.arange(len(sub))
        w = 0.2
        for k, (key, label) in enumerate(keys):
            ax.bar(x + (k - 1.5) * w, [r[key] for r in sub], w, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if g in claims:
            ax.axhline(
                claims[g],
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"paper: allreduce up to {claims[g]:.2f}x (+{claims[g] - 1:.0%})",
            )
        ax.set_ylim(0, 2.1)
        ax.set_xticks(x, [r["model"] for r in sub])
        ax.set_title(f"{g:g} Gbps, {sub[0].get('workers', 8)} workers")
        ax.set_ylabel("speedup over ring all-reduce")
        ax.legend(fontsize=7, loc="lower center", ncol=2, framealpha=0.9)
    if scale:
        ax = axes[-1]
        n = [r["workers"] for r in scale]
        for key, label in (
            ("switchml_ms", "SwitchML"),
            ("ring_ms", "ring"),
            ("ps_ms", "PS (n/8 servers)"),
        ):
            ax.plot(n, [r[key] for r in scale], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers (racks of 32 above 32)")
        ax.set_ylabel("allreduce time (ms)")
        ax.set_title("ResNet-50 gradient, 100 Gbps")
        ax.legend(fontsize=8)
    fig.suptitle("SwitchML vs ring all-reduce vs parameter server (swemu.model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ what-if
def what_if(
    *,
    nbytes: int,
    gbps: float,
    workers: int,
    rtt: float = 10e-6,
    values_per_packet: int = 64,
    rack_size: int | None = None,
    cal: Any = None,
    loss: float = 0.0,
    ps_servers: int | None = None,
) -> dict:
    """Predicted allreduce time of the three methods for one setting, the pool
    size that fills the link, and what it would take to emulate it with our code:
    emulator shards (the switch's packet rate over all ports ÷ one shard's
    measured packet rate) and worker cores (each worker's packet rate × its
    measured per-packet cost)."""
    net = Network(gbps=gbps, rtt=rtt, rack_size=rack_size)
    cfg = SwitchMLConfig(values_per_packet=values_per_packet, loss=loss)
    res = three_methods(
        nbytes,
        workers,
        net,
        cfg,
        ps=PSConfig(servers=ps_servers or workers, chunk=512 << 10),
    )
    pool = pool_to_fill(workers, net, cfg)
    link_pps = net.bytes_per_s / switchml_wire_bytes(values_per_packet)
    out = {
        "nbytes": nbytes,
        "gbps": gbps,
        "workers": workers,
        "values_per_packet": values_per_packet,
        "rtt_us": rtt * 1e6,
        "times_ms": {k: r.time * 1e3 for k, r in res.items()},
        "speedup_vs_ring": res["ring"].time / res["switchml"].time,
        "pool_to_fill": pool,
        "link_pps": link_pps,
        "switch_pps": link_pps * workers,
    }
    if cal is not None:
        # isolated per-packet costs at this packet size, times the in-situ factors
        # measured in a real multi-process run (kernel only: no socket I/O at all)
        v = values_per_packet
        out["shard_pps"] = cal.shard_pps_at(v) / cal.switch_in_situ
        out["shard_pps_kernel_only"] = cal.shard_pps_kernel_only_at(v)
        out["host_packet"] = cal.host_packet_at(v) * cal.host_in_situ
        out["shards"] = math.ceil(link_pps * workers / out["shard_pps"])
        out["shards_kernel_only"] = math.ceil(link_pps * workers / out["shard_pps_kernel_only"])
        out["worker_cores"] = math.ceil(link_pps * out["host_packet"])
    return out
