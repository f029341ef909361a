"""The resource summary of a bf-p4c build of switchml.p4, from the compiler's own logs.

bf-p4c (``-g``) writes ``pipe/logs/resources.json`` (per MAU stage: the SRAM, map RAM
and TCAM blocks, stateful and statistics ALUs, gateways, VLIW instructions and logical
tables it allocated) and ``pipe/logs/phv.json`` (every PHV container it used). This
prints them per stage against Tofino 1's capacity, the table that p4/README.md
records; ``p4/build.sh`` writes it to ``DIR/switchml/resources.txt``. (p4c's
``p4c-build-logs`` prints the same figures as ``mau.resources.log`` when it is there;
build.sh runs it too when it finds it.)

usage: python -m p4.resource_summary DIR/switchml   (or python p4/resource_summary.py ...)
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: Tofino 1 capacity per MAU stage, for the columns below.
STAGE_CAPACITY = {
    "tables": 16,
    "sram": 80,
    "map_ram": 48,
    "tcam": 24,
    "stateful_alu": 4,
    "stats_alu": 4,
    "gateway": 16,
    "vliw": 32,
}
#: Tofino 1 MAU stages per pipe (ingress and egress share them).
STAGES = 12
#: Tofino 1 normal (non-tagalong) PHV containers per width.
PHV_CAPACITY = {8: 64, 16: 96, 32: 64}


@dataclass(frozen=True)
class Summary:
    """What one build used: per stage (stage number -> column -> count), and the PHV."""

    stages: dict[int, dict[str, int]]
    n_stages: int
    phv: dict[int, int]  # width -> normal containers used (ingress and egress)
    compiler_version: str

    def total(self, column: str) -> int:
        """A column summed over all stages."""
        return sum(s[column] for s in self.stages.values())


def load(build_dir: Path) -> Summary:
    """Read ``build_dir/pipe/logs/resources.json`` and ``phv.json``."""
    logs = build_dir / "pipe" / "logs"
    data = json.loads((logs / "resources.json").read_text())
    mau = data["resources"]["mau"]
    stages: dict[int, dict[str, int]] = {}
    for s in mau["mau_stages"]:
        stages[int(s["stage_number"])] = {
            "tables": len(s["logical_tables"]["ids"]),
            "sram": len(s["rams"]["srams"]),
            "map_ram": len(s["map_rams"]["maprams"]),
            "tcam": len(s["tcams"]["tcams"]),
            "stateful_alu": len(s["meter_alus"]["meters"]),
            "stats_alu": len(s["statistic_alus"]["stats"]),
            "gateway": len(s["gateways"]["gateways"]),
            "vliw": len(s["vliw"]["instructions"]),
        }
    phv: Counter[int] = Counter()
    phv_path = logs / "phv.json"
    if phv_path.is_file():
        for c in json.loads(phv_path.read_text())["containers"]:
            if c.get("container_type") == "normal" and c.get("slices"):
                phv[int(c["bit_width"])] += 1
    return Summary(
        stages=stages,
        n_stages=int(mau.get("nStages", len(stages))),
        phv=dict(phv),
        compiler_version=str(data.get("compiler_version", "?")),
    )


def render(summary: Summary) -> str:
    """The summary as a Markdown table (per stage, then the totals against capacity)."""
    cols = list(STAGE_CAPACITY)
    head = "| stage | " + " | ".join(f"{c} (of {STAGE_CAPACITY[c]})" for c in cols) + " |"
    lines = [
        f"bf-p4c {summary.compiler_version}: {summary.n_stages} of {STAGES} MAU stages",
        "",
        head,
        "|" + "---|" * (len(cols) + 1),
    ]
    for n in sorted(summary.stages):
        row = summary.stages[n]
        lines.append(f"| {n} | " + " | ".join(str(row[c]) for c in cols) + " |")
    totals = " | ".join(f"{summary.total(c)} / {STAGE_CAPACITY[c] * STAGES}" for c in cols)
    lines.append(f"| total | {totals} |")
    if summary.phv:
        used = ", ".join(
            f"{summary.phv.get(w, 0)} of {PHV_CAPACITY[w]} {w}-bit" for w in sorted(PHV_CAPACITY)
        )
        lines += ["", f"PHV (normal containers, ingress + egress): {used}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Print the summary of the build directory ``argv[0]``."""
    if len(argv) != 1:
        print("usage: resource_summary.py DIR/switchml", file=sys.stderr)
        return 2
    path = Path(argv[0]) / "pipe" / "logs" / "resources.json"
    if not path.is_file():
        print(f"resource_summary.py: no {path} (did bf-p4c run with -g?)", file=sys.stderr)
        return 1
    print(render(load(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
