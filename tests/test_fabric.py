"""A fabric of switches (docs/protocol.md §7), in memory: workers -> child
switch engines -> a root engine (tests/fabric.py's TreeFabric), with loss,
duplication and reordering on every link at both levels. The fabric on real
sockets and processes is tests/test_fabric_e2e.py."""

from __future__ import annotations

import itertools

import numpy as np
from fabric import Faults, TreeFabric
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swemu.protocol.worker import quant


def exact(xs):
    return np.sum([x.astype(np.int64) for x in xs], axis=0).astype(np.int32)


@st.composite
def groups(draw):
    """Ranks 0..W-1 spread over 1..4 child switches (each with at least one)."""
    w = draw(st.integers(1, 7))
    children = draw(st.integers(1, min(4, w)))
    order = draw(st.permutations(range(w)))
    cuts = (
        sorted(
            draw(
                st.lists(
                    st.integers(1, w - 1), min_size=children - 1, max_size=children - 1, unique=True
                )
            )
        )
        if children > 1
        else []
    )
    bounds = [0, *cuts, w]
    return [sorted(order[a:b]) for a, b in itertools.pairwise(bounds)]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=groups(),
    n=st.integers(0, 300),
    window=st.integers(1, 5),
    calls=st.integers(1, 3),
    loss_up=st.sampled_from([0.0, 0.05, 0.3]),
    loss_down=st.sampled_from([0.0, 0.05, 0.3]),
    dup=st.sampled_from([0.0, 0.1]),
    reorder=st.sampled_from([0.0, 0.001, 0.01]),
    seed=st.integers(0, 2**32 - 1),
)
def test_exactly_once_through_two_levels(
    tree, n, window, calls, loss_up, loss_down, dup, reorder, seed
):
    """Every allreduce through the tree is the exact (wrapping) int32 sum: lost,
    duplicated and late packets on every link, in both directions, at both
    levels, recovered by the workers' and the children's timers."""
    fab = TreeFabric(
        tree,
        window=window,
        seed=seed,
        faults=Faults(loss_up=loss_up, loss_down=loss_down, dup=dup, reorder=reorder),
    )
    rng = np.random.default_rng(seed)
    w = fab.w
    for _ in range(calls):
        xs = [rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(w)]
        for y in fab.allreduce(xs):
            np.testing.assert_array_equal(y, exact(xs))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=groups(), n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1))
def test_float32_through_two_levels_is_the_one_switch_result(tree, n, seed):
    """Exponents are max-reduced at each level: a float32 allreduce through the
    tree returns bit for bit what one switch gives (quant.simulate_allreduce)."""
    fab = TreeFabric(tree, window=3, seed=seed, faults=Faults(loss_up=0.1, loss_down=0.1))
    rng = np.random.default_rng(seed)
    xs = [
        (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5)).astype(np.float32)
        for _ in range(fab.w)
    ]
    want = quant.simulate_allreduce(xs, 32)
    for y in fab.allreduce(xs):
        np.testing.assert_array_equal(y, want)


def test_children_answer_retransmissions_from_their_shadow_copy():
    """Results lost between the children and their workers only: each child
    answers its workers' retransmissions itself (the lowest level that holds
    the result), so the root sees each partial aggregate exactly once."""
    fab = TreeFabric(
        [[0, 1], [2, 3]], window=4, seed=5, faults=Faults(loss_down=0.2), uplink_faults=Faults()
    )
    xs = [np.full(2000, r + 1, np.int32) for r in range(4)]
    assert all((y == 10).all() for y in fab.allreduce(xs))
    chunks = -(-2000 // 32)
    root = fab.root.job_counters_of(7)
    assert root["aggregated"] == 2 * chunks  # one partial aggregate per child per chunk
    assert root["multicast"] == chunks
    # (a child resends up only while the other child's workers are slow: not lost)
    assert sum(eng.job_counters_of(7)["unicast"] for eng, *_ in fab.children) > 0


def test_a_lost_upward_packet_is_resent_by_the_childs_timer():
    """Loss between the children and the root only: the children's uplink
    timers resend partial aggregates and take the results, exactly once."""
    fab = TreeFabric(
        [[0, 1], [2]],
        window=3,
        seed=9,
        faults=Faults(),
        uplink_faults=Faults(loss_up=0.3, loss_down=0.3),
    )
    xs = [np.arange(1000, dtype=np.int32) * (r + 1) for r in range(3)]
    assert all((y == np.arange(1000) * 6).all() for y in fab.allreduce(xs))
    up = [eng.job_counters_of(7) for eng, *_ in fab.children]
    assert sum(c["up_retransmissions"] for c in up) > 0
    assert all(c["up_results"] == -(-1000 // 32) for c in up)
