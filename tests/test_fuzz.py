"""The packet parser and the engine under a bounded fuzzing run (bench/fuzz.py)."""

from __future__ import annotations

import os

from bench.fuzz import fuzz


def test_fuzz_engine_against_reference_for_a_bounded_time():
    """Random, truncated, bit-flipped and misaddressed datagrams: the compiled
    engine agrees with the reference on every one and keeps its invariants.
    SWEMU_FUZZ_SECONDS lengthens the run (CI: 15 s)."""
    seconds = float(os.environ.get("SWEMU_FUZZ_SECONDS", "15"))
    res = fuzz(seconds, seed=int(os.environ.get("SWEMU_FUZZ_SEED", "20261202")))
    assert res["datagrams"] > 1000
