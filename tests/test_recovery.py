"""Restart recovery (docs/protocol.md §5, "Surviving a switch restart").

In memory first (tests/fabric.py's RestartFabric: the switch engine replaced by
a fresh one at seeded points, loss and duplication on the links, the workers'
own recovery rules), then the planner's refusals; the real thing -- an emulator
killed with SIGKILL and started again -- is in tests/test_restart.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from fabric import Faults, RestartFabric
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swemu.protocol.worker import quant
from swemu.protocol.worker.recovery import Progress, RecoveryError, SlotResult, plan_repairs


def exact(xs):
    return np.sum([x.astype(np.int64) for x in xs], axis=0).astype(np.int32)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 5),
    n=st.integers(1, 400),
    window=st.integers(1, 6),
    calls=st.integers(1, 4),
    restarts=st.lists(st.integers(0, 400), min_size=1, max_size=3),
    loss=st.sampled_from([0.0, 0.05, 0.2]),
    dup=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**32 - 1),
)
def test_int32_sums_stay_exact_across_restarts(w, n, window, calls, restarts, loss, dup, seed):
    """The switch restarts at seeded points (before the first packet, in the
    middle of a round, between calls, during retransmissions): every result of
    every call is the exact sum, nothing lost and nothing counted twice."""
    fab = RestartFabric(
        w,
        size_code=0,
        window=window,
        seed=seed,
        faults=Faults(loss_up=loss, loss_down=loss, dup=dup),
    )
    rng = np.random.default_rng(seed)
    inputs = [
        [rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(w)]
        for _ in range(calls)
    ]
    got = fab.run([[inputs[c][r] for c in range(calls)] for r in range(w)], restarts)
    for r in range(w):
        for c in range(calls):
            np.testing.assert_array_equal(got[r][c], exact(inputs[c]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 4),
    n=st.integers(1, 300),
    window=st.integers(1, 5),
    restarts=st.lists(st.integers(0, 300), min_size=1, max_size=2),
    seed=st.integers(0, 2**32 - 1),
)
def test_float32_results_are_those_of_an_uninterrupted_job(w, n, window, restarts, seed):
    """float32 through block floating point: with restarts the results are bit
    for bit what the same inputs give without any (quant.simulate_allreduce),
    and so within §4's bound."""
    fab = RestartFabric(
        w, size_code=0, window=window, seed=seed, faults=Faults(loss_up=0.1, loss_down=0.1)
    )
    rng = np.random.default_rng(seed)
    calls = 2
    inputs = [
        [
            (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
            for _ in range(w)
        ]
        for _ in range(calls)
    ]
    got = fab.run([[inputs[c][r] for c in range(calls)] for r in range(w)], restarts)
    for c in range(calls):
        want = quant.simulate_allreduce(inputs[c], 32)
        for r in range(w):
            np.testing.assert_array_equal(got[r][c], want)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 4),
    n=st.integers(1, 300),
    window=st.integers(1, 5),
    restarts=st.lists(st.integers(0, 300), min_size=1, max_size=2),
    wire16=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_float16_results_are_those_of_an_uninterrupted_job(w, n, window, restarts, wire16, seed):
    """float16 tensors, on the 16-bit wire (§4.2) or the 32-bit one: with
    restarts, every rank's results are bit for bit those of the same calls
    without any (results handed from rank to rank are 16-bit bit patterns)."""
    rng = np.random.default_rng(seed)
    calls = 2
    inputs = [
        [(rng.standard_normal(n) * 4).astype(np.float16) for _ in range(w)] for _ in range(calls)
    ]
    per_rank = [[inputs[c][r] for c in range(calls)] for r in range(w)]
    faults = Faults(loss_up=0.1, loss_down=0.1)
    calm = RestartFabric(w, size_code=0, window=window, seed=seed, values16=wire16)
    want = calm.run(per_rank, [])
    fab = RestartFabric(w, size_code=0, window=window, seed=seed, faults=faults, values16=wire16)
    got = fab.run(per_rank, restarts)
    for r in range(w):
        for c in range(calls):
            assert got[r][c].dtype == np.float16
            np.testing.assert_array_equal(got[r][c].view(np.uint16), want[0][c].view(np.uint16))


def test_a_lost_result_is_handed_on_by_a_rank_that_holds_it():
    """Results lost on their way down, then a restart: the recovery hands
    results from rank to rank (the case the shadow copy answered before the
    restart), and the sums stay exact. Seeds where it happens are common: at
    least one of these twenty runs must repair something."""
    repaired = 0
    for seed in range(20):
        fab = RestartFabric(3, window=2, seed=seed, faults=Faults(loss_down=0.3))
        rng = np.random.default_rng(seed)
        xs = [[rng.integers(-1000, 1000, 200).astype(np.int32) for _ in range(3)] for _ in range(3)]
        got = fab.run([[xs[c][r] for c in range(3)] for r in range(3)], [40 + 7 * seed])
        for r in range(3):
            for c in range(3):
                np.testing.assert_array_equal(got[r][c], exact(xs[c]))
        repaired += fab.repaired
    assert repaired > 0


def _result(slot, rnd):
    return SlotResult(slot, rnd, tsi=rnd, set=rnd % 2, job_number=0, e0=0, values=b"x")


def test_plan_repairs_hands_the_furthest_result_to_the_ranks_behind():
    progress = {
        0: Progress((3, 5), {0: _result(0, 3), 1: _result(1, 5)}),
        1: Progress((2, 5), {0: _result(0, 2), 1: _result(1, 5)}),
        2: Progress((3, 4), {0: _result(0, 3), 1: _result(1, 4)}),
    }
    assert plan_repairs(progress) == {0: [], 1: [_result(0, 3)], 2: [_result(1, 5)]}


@pytest.mark.parametrize(
    "progress, why",
    [
        ({0: Progress((3,)), 1: Progress((3, 3))}, "windows"),
        ({0: Progress((5,), {0: _result(0, 5)}), 1: Progress((3,))}, "cannot be resumed"),
        ({0: Progress((5,), {}), 1: Progress((4,))}, "none of those holds"),
    ],
)
def test_plan_repairs_refuses_reports_of_no_single_job(progress, why):
    with pytest.raises(RecoveryError, match=why):
        plan_repairs(progress)
