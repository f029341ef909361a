"""The speedup plot (matplotlib, the ``bench`` extra).

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis import _mib, speedups


def plot_speedup(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Speedup of SwitchML over ring (and over PS) vs W, one line per rate and
    size, with the link-bound theory 2(W-1)/W (and W-1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp = speedups(rows)
    has_ps = any("vs_ps" in s for s in sp)
    fig, axes = plt.subplots(
        1, 2 if has_ps else 1, figsize=(11 if has_ps else 6, 4.2), squeeze=False
    )
    ws = sorted({s["workers"] for s in sp})
    for ax, other, theory, title in (
        (axes[0][0], "ring", lambda w: 2 * (w - 1) / w, "SwitchML vs gloo ring"),
        *(((axes[0][1], "ps", lambda w: w - 1, "SwitchML vs parameter server"),) if has_ps else ()),
    ):
        grid = [w / 10 for w in range(10, 10 * max(ws, default=8) + 1)]  # from W = 1
        ax.plot(grid, [theory(w) for w in grid], "k--", label="link-bound theory")
        overs = sorted({s["oversubscription"] for s in sp})
        for rate in sorted({s["rate_gbps"] for s in sp}):
            for over in overs:
                for nbytes in sorted({s["nbytes"] for s in sp}):
                    pts = [
                        s
                        for s in sp
                        if (s["rate_gbps"], s["oversubscription"], s["nbytes"])
                        == (rate, over, nbytes)
                        and f"vs_{other}" in s
                    ]
                    if pts:
                        uplinks = f", uplinks {over:g}:1" if overs != [1.0] else ""
                        ax.plot(
                            [p["workers"] for p in pts],
                            [p[f"vs_{other}"] for p in pts],
                            marker="o",
                            label=f"{rate:g} Gb/s, {_mib(nbytes)}{uplinks}",
                        )
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("workers W")
        ax.set_ylabel(f"time({other}) / time(SwitchML)")
        ax.set_title(title)
        ax.set_xticks(sorted({1, *ws}))
        ax.legend(fontsize=7)
    fig.suptitle("Emulated rack on one machine (rate-limited veth links, medians)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
