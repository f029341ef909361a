"""Regenerate the committed corpus: run P4Testgen on p4/switchml.p4, keep its tests as data.

    python -m p4.testgen.generate                      # p4testgen from p4/model/build-p4testgen.sh
    python -m p4.testgen.generate --p4testgen PATH --max-tests 300 --seed 1
    python -m p4.testgen.generate --from-ptf switchml.py --log p4testgen.log   # generated elsewhere

Runs ``p4testgen --target tofino --arch tna --test-backend PTF`` (statement coverage as
the goal, greedy path selection, a fixed seed, ports 0..511 so that every port a pass
may leave on -- the recirculation ports ``pipe << 7 | 68`` among them -- is allowed,
``-DP4TESTGEN``: the program's ``testgen_assume`` contract and its identity hashes
written out, p4/README.md "P4Testgen"), reads the PTF file it writes
(:mod:`p4.testgen.ptf`) and writes ``p4/testgen/corpus/switchml.json``: the command, the
generator's version and its final statement coverage, then every test as data. It then
replays the new corpus (:mod:`p4.testgen.replay`) and prints the summary; the exit
status is 1 if any test mismatches. ``tests/test_p4testgen_replay.py`` replays the
committed file in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p4.testgen import ptf, replay

P4_DIR = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "corpus" / "switchml.json"
DEFAULT_BUILD = Path.home() / ".cache" / "switchml-emu" / "p4testgen"


def command(p4testgen: Path, p4c_src: Path, out_dir: Path, max_tests: int, seed: int) -> list[str]:
    """The p4testgen command line (the TNA headers come from the p4c sources)."""
    return [
        str(p4testgen),
        "--target", "tofino",
        "--arch", "tna",
        "--std", "p4-16",
        "-D__TARGET_TOFINO__=1",  # tna.p4 picks Tofino 1's specs by it (bf-p4c's driver sets it)
        "-DP4TESTGEN=1",  # set_worker's testgen_assume: only entries the controller writes
        "-I", str(p4c_src / "backends" / "tofino" / "bf-p4c" / "p4include"),
        "-I", str(p4c_src / "p4include"),
        "--test-backend", "PTF",
        "--port-ranges", "0:511",
        "--path-selection", "GREEDY_STATEMENT_SEARCH",
        "--track-coverage", "STATEMENTS",
        "--stop-metric", "MAX_NODE_COVERAGE",
        "--max-tests", str(max_tests),
        "--seed", str(seed),
        "--print-traces",
        "--print-coverage",
        "--out-dir", str(out_dir),
        str(P4_DIR / "switchml.p4"),
    ]  # fmt: skip


def coverage_of(log: str) -> dict:
    """The statement coverage p4testgen reported last ("Nodes covered: 0.9 (90/100)") and
    the statements it had not covered then (``--print-coverage``)."""
    found = re.findall(r"Nodes covered:\s*([0-9.]+)\s*\((\d+)/(\d+)\)", log)
    if not found:
        return {"fraction": None, "covered": None, "statements": None, "uncovered": []}
    fraction, covered, total = found[-1]
    blocks = log.split("Not covered program nodes:")
    uncovered = []
    if len(blocks) > 1:
        for line in blocks[-1].splitlines()[1:]:
            if not line.startswith("\t"):
                break
            entry = re.sub(r"^.*/p4/", "p4/", line.strip()).replace("\\", ":", 1)
            if entry not in uncovered:
                uncovered.append(entry)
    return {
        "fraction": float(fraction),
        "covered": int(covered),
        "statements": int(total),
        "uncovered": uncovered,
    }


#: Trace lines the corpus leaves out: assignments, extractions, emits and packet dumps
#: (the packets are in the test itself), and the lines of value pairs 1..31 (pair 0's
#: say what all 32 did). Tables, actions, branches, drops stay, and the extractions of
#: ``switchml_md`` (the replay checks that egress read what ingress sent).
NOISE = re.compile(
    r"^\[(P4Testgen )?(AssignmentStatement|ExtractSuccess(?!\] hdr\.switchml_md@)|Emit|Packet "
    r"|PrependToProgramHeader|AppendToProgramHeader|Prepending the emit buffer|Invalid emit)"
    r"|aggregate[._]pair(0[1-9]|[12][0-9]|3[01])[._]"
)


def brief_trace(trace: list[str], width: int = 240) -> list[str]:
    """The trace without :data:`NOISE`, each line cut to ``width`` characters (the
    extractions of ``switchml_md`` whole)."""
    return [
        line if line.startswith("[ExtractSuccess]") else line[:width]
        for line in (raw.strip() for raw in trace)
        if not NOISE.search(line)
    ]


def generate(p4testgen: Path, p4c_src: Path, max_tests: int, seed: int, corpus: Path) -> dict:
    """Run p4testgen and write ``corpus``; return what was written."""
    with tempfile.TemporaryDirectory(prefix="p4testgen-") as tmp:
        cmd = command(p4testgen, p4c_src, Path(tmp), max_tests, seed)
        started = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        seconds = time.monotonic() - started
        log = run.stdout + run.stderr
        (Path(tmp) / "p4testgen.log").write_text(log)
        files = sorted(Path(tmp).glob("*.py"))
        if not files:
            raise SystemExit(f"p4testgen wrote no PTF file (exit {run.returncode}):\n{log[-3000:]}")
        tests = [t for f in files for t in ptf.parse_file(f.read_text())]
        for t in tests:
            t.trace = brief_trace(t.trace)
        version = subprocess.run(
            [str(p4testgen), "--target", "tofino", "--arch", "tna", "--version"],
            capture_output=True,
            text=True,
        )
    data = {
        "generator": {
            "command": ["p4testgen", *cmd[1:-1], "p4/switchml.p4"],
            "version": (version.stdout or version.stderr).strip(),
            "exit_status": run.returncode,
            "seconds": round(seconds, 1),
            "statement_coverage": coverage_of(log),
            "tests": len(tests),
        },
        "tests": [t.to_json() for t in tests],
    }
    write(corpus, data)
    return data


def write(corpus: Path, data: dict) -> None:
    """The corpus as JSON: the generator's record indented, one test a line (a diff of
    two corpora then shows tests, and the file stays small)."""
    tests = ",\n".join(json.dumps(t, separators=(",", ":")) for t in data["tests"])
    record = json.dumps(data["generator"], indent=1)
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text(f'{{"generator": {record},\n"tests": [\n{tests}\n]}}\n')


def convert(ptf_file: Path, log_file: Path | None, corpus: Path) -> dict:
    """Write ``corpus`` from a PTF file p4testgen wrote elsewhere (and its log, for the
    coverage), as :func:`generate` would."""
    tests = ptf.parse_file(ptf_file.read_text())
    for t in tests:
        t.trace = brief_trace(t.trace)
    log = log_file.read_text() if log_file is not None else ""
    data = {
        "generator": {
            "command": f"converted from {ptf_file.name}",
            "statement_coverage": coverage_of(log),
            "tests": len(tests),
        },
        "tests": [t.to_json() for t in tests],
    }
    write(corpus, data)
    return data


def load(corpus: Path = CORPUS) -> tuple[dict, list[ptf.TestCase]]:
    """The generator's record and the tests of a corpus file."""
    data = json.loads(corpus.read_text())
    return data["generator"], [ptf.TestCase.from_json(t) for t in data["tests"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    build = Path(os.environ.get("P4TESTGEN_BUILD_DIR", DEFAULT_BUILD))
    ap.add_argument("--p4testgen", type=Path, default=build / "build" / "p4testgen")
    ap.add_argument("--p4c-src", type=Path, default=build / "src" / "p4c")
    ap.add_argument("--max-tests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--replay-only", action="store_true", help="replay the corpus, no generation")
    ap.add_argument("--from-ptf", type=Path, help="a PTF file p4testgen wrote elsewhere")
    ap.add_argument("--log", type=Path, help="with --from-ptf: p4testgen's output (coverage)")
    args = ap.parse_args(argv)
    if args.from_ptf is not None:
        record = convert(args.from_ptf, args.log, args.corpus)
        print(json.dumps(record["generator"], indent=1))
    elif not args.replay_only:
        if not args.p4testgen.exists():
            print(
                f"generate: no p4testgen at {args.p4testgen} "
                "(p4/model/build-p4testgen.sh builds it)",
                file=sys.stderr,
            )
            return 127
        record = generate(args.p4testgen, args.p4c_src, args.max_tests, args.seed, args.corpus)
        print(json.dumps(record["generator"], indent=1))
    _, tests = load(args.corpus)
    report = replay.replay_all(tests)
    print(report.summary())
    return 1 if report.mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
