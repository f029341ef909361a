"""Worker protocol engines against the switch engine, in memory (tests/fabric.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fabric import Fabric, Faults
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostlib.errors import NoProgressError
from swemu.protocol import wire
from swemu.protocol.worker import kernels as K
from swemu.protocol.worker import quant
from swemu.protocol.worker.protocol import Timing, WorkerProtocol


def int_inputs(rng, w, n):
    return [rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(w)]


def exact(xs):
    return np.sum([x.astype(np.int64) for x in xs], axis=0).astype(np.int32)  # wraps as int32


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 5),
    n=st.integers(0, 300),
    window=st.integers(1, 6),
    calls=st.integers(1, 3),
    loss_up=st.sampled_from([0.0, 0.05, 0.3]),
    loss_down=st.sampled_from([0.0, 0.05, 0.3]),
    dup=st.sampled_from([0.0, 0.1]),
    reorder=st.sampled_from([0.0, 0.001, 0.01]),
    seed=st.integers(0, 2**32 - 1),
)
def test_exactly_once_under_loss_duplication_and_reordering(
    w, n, window, calls, loss_up, loss_down, dup, reorder, seed
):
    """Every allreduce equals the exact (wrapping) int32 sum, every time."""
    fab = Fabric(
        w,
        size_code=0,
        window=window,
        seed=seed,
        faults=Faults(loss_up=loss_up, loss_down=loss_down, dup=dup, reorder=reorder),
    )
    rng = np.random.default_rng(seed)
    for _ in range(calls):  # consecutive calls: the set parity continues
        xs = int_inputs(rng, w, n)
        for y in fab.allreduce(xs):
            np.testing.assert_array_equal(y, exact(xs))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 4),
    n=st.integers(1, 200),
    seed=st.integers(0, 2**32 - 1),
    loss=st.sampled_from([0.0, 0.1]),
)
def test_float32_equals_block_floating_point_model(w, n, seed, loss):
    """float32 results equal the numpy model of §4 bit for bit, under loss too."""
    rng = np.random.default_rng(seed)
    scales = 2.0 ** rng.integers(-30, 30, size=(w, 1))
    xs = [(rng.standard_normal(n) * s).astype(np.float32) for s in scales[:, 0]]
    if n > 40:
        for x in xs:
            x[:32] = 0  # an all-zero chunk
    fab = Fabric(w, size_code=0, window=3, seed=seed, faults=Faults(loss_up=loss, loss_down=loss))
    ys = fab.allreduce(xs)
    model = quant.simulate_allreduce(xs, 32)
    for y in ys:
        np.testing.assert_array_equal(y, model)
    # and the model is within the documented bound of the exact sum
    ex = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for c in range(0, n, 32):
        m = max(np.abs(x[c : c + 32]).max() for x in xs)
        assert np.all(np.abs(model[c : c + 32] - ex[c : c + 32]) <= quant.error_bound(m, w))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_large_outputs_take_streaming_stores_at_any_alignment(dtype):
    """Outputs of 4 MiB and more are written with streaming stores (swemu.protocol.worker.stream)
    in their 64-byte-aligned middle and word by word around it: every output
    alignment (including an output that is not even 4-byte aligned) gets the
    same values as the model, up to the last element."""
    from swemu.protocol.worker import stream

    n = stream.MIN_BYTES // 4 + 4096 + 37  # a partial last chunk too
    w = 2
    rng = np.random.default_rng(7)
    if dtype == np.float32:
        xs = [rng.standard_normal(n).astype(np.float32) * 100 for _ in range(w)]
        expect = quant.simulate_allreduce(xs, 4096)
    else:
        xs = int_inputs(rng, w, n)
        expect = exact(xs)
    fab = Fabric(w, size_code=7, window=8, seed=1)
    for offset in (0, 4, 20, 60, 1):  # byte offsets from a 64-byte-aligned buffer
        raw = np.zeros(4 * n + 128, np.uint8)
        start = (-raw.ctypes.data) % 64 + offset
        outs = [np.frombuffer(raw, dtype, n, start)]
        outs.append(np.empty(n, dtype))
        assert outs[0].ctypes.data % 64 == offset
        for y in fab.allreduce(xs, outs=outs):
            np.testing.assert_array_equal(y, expect)
        np.testing.assert_array_equal(outs[0], expect)  # written in place


def _answer(op, pkt, now):
    """Feed the switch's result for ``pkt`` (one worker: the sum is the packet)."""
    data = wire.encode(
        size_code=0,
        job_number=pkt.job_number,
        tsi=pkt.tsi,
        set=pkt.set,
        slot=pkt.slot,
        values=pkt.values,
    )
    buf = np.frombuffer(data, np.uint8)[None, :].copy()
    return op.receive(buf, np.array([len(data)], np.int32), np.ones(1, np.uint8), 1, now)


def test_set_parity_continues_across_calls():
    """A call's first packet on a slot uses the set opposite to the last one used."""
    proto = WorkerProtocol(num_workers=1, size_code=0, window=2)
    sets = []
    for n in (96, 32, 64):  # 3 chunks (slots 0,1,0), then 1 chunk, then 2
        op = proto.allreduce(np.zeros(n, np.int32), None, 0.0)
        pkts = [bytes(p) for p in op.packets(op.initial(0.0))]
        while pkts:
            p = wire.decode(pkts.pop(0))
            sets.append((p.slot, p.set))
            pkts += [bytes(q) for q in op.packets(_answer(op, p, 0.0))]
        assert op.done
    assert sets == [(0, 0), (1, 0), (0, 1), (0, 0), (0, 1), (1, 1)]


def test_results_with_wrong_set_tsi_job_or_source_are_ignored():
    proto = WorkerProtocol(num_workers=1, size_code=0, window=1)
    op = proto.allreduce(np.arange(32, dtype=np.int32), None, 0.0)
    op.initial(0.0)
    good = dict(size_code=0, job_number=0, tsi=0, set=0, slot=0, values=np.full(32, 9, np.int32))
    bad = [dict(good, set=1), dict(good, tsi=1), dict(good, job_number=1), dict(good, slot=0)]
    oks = [1, 1, 1, 0]  # the last one has the right header but not the switch's address
    for b, ok in zip(bad, oks):
        data = wire.encode(**b)
        buf = np.frombuffer(data, np.uint8)[None, :].copy()
        op.receive(buf, np.array([len(data)], np.int32), np.array([ok], np.uint8), 1, 0.0)
        assert not op.done
    assert op.counters[1] == 4  # ignored


def test_duplicate_result_marks_the_timeout_spurious_and_raises_the_floor():
    """A resend answered after the original result came (the switch's unicast to
    a retransmission) shows the timeout fired for nothing: the floor doubles,
    once per timeout, carries over to the next call and decays with samples."""
    proto = WorkerProtocol(num_workers=1, size_code=0, window=1, timing=Timing(timeout=0.02))
    op = proto.allreduce(np.arange(96, dtype=np.int32), None, 0.0)
    first = wire.decode(bytes(op.packets(op.initial(0.0))[0]))
    assert op.handle_timer(0.021) == 1  # the timer resends chunk 0 ...
    assert _answer(op, first, 0.030) == 1  # ... but the original result was only late
    assert op.counters[K.Counter.SPURIOUS] == 0 and proto.rtt[K.Rtt.FLOOR] == 0
    assert _answer(op, first, 0.031) == 0  # the switch's answer to the resend
    assert op.counters[K.Counter.SPURIOUS] == 1 and op.counters[K.Counter.IGNORED] == 1
    assert proto.rtt[K.Rtt.FLOOR] == pytest.approx(0.04)
    assert _answer(op, first, 0.032) == 0  # same timer event: no second raise
    assert op.counters[K.Counter.SPURIOUS] == 2 and proto.rtt[K.Rtt.FLOOR] == pytest.approx(0.04)
    # the new packet (chunk 1) already waits for the raised floor
    assert op.get_timer() == pytest.approx(0.030 + 0.02)  # it was built before the duplicate
    second = wire.decode(bytes(op.packets(1)[0]))
    assert _answer(op, second, 0.035) == 1  # a sample of 5 ms: the floor decays a little
    floor = proto.rtt[K.Rtt.FLOOR]
    assert 0.04 * (1 - 1 / 4096) < floor < 0.04
    assert op.get_timer() == pytest.approx(0.035 + floor)  # chunk 2 uses the raised floor
    # the next call's first window starts from what was learned, not from `timeout`
    op2 = proto.allreduce(np.arange(32, dtype=np.int32), None, 1.0)
    op2.initial(1.0)
    assert op2.get_timer() == pytest.approx(1.0 + floor)


def test_dead_peer_raises_no_progress_naming_the_chunk():
    proto = WorkerProtocol(
        num_workers=2, size_code=0, window=2, timing=Timing(timeout=0.01, no_progress=1.0)
    )
    op = proto.allreduce(np.zeros(100, np.int32), None, 0.0)
    op.initial(0.0)
    now = 0.0
    with pytest.raises(NoProgressError, match=r"chunk 0 on slot 0") as info:
        while True:
            now = op.get_timer()
            op.check(now)
            op.handle_timer(now)
    assert info.value.chunk == 0 and now >= 1.0
    # backoff: timeouts doubled after every 3 consecutive timeouts, capped
    assert op.rto[0] <= proto.timing.max_timeout and op.rto[0] > proto.timing.timeout


def test_input_validation():
    proto = WorkerProtocol(num_workers=2)
    with pytest.raises(TypeError, match="int32, float32, float16 and bfloat16"):
        proto.allreduce(np.zeros(4, np.float64), None, 0.0)
    with pytest.raises(ValueError, match="C-contiguous"):
        proto.allreduce(np.zeros((4, 4), np.int32)[:, 1], None, 0.0)
    with pytest.raises(ValueError, match="same dtype and shape"):
        proto.allreduce(np.zeros(4, np.int32), np.zeros(5, np.int32), 0.0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        proto.allreduce(np.array([1, np.nan], np.float32), None, 0.0)
    with pytest.raises(ValueError, match="NaN or Inf"):
        proto.allreduce(np.array([np.inf], np.float32), None, 0.0)
    with pytest.raises(ValueError, match="2\\^127"):
        proto.allreduce(np.array([3e38], np.float32), None, 0.0)
    assert proto.calls == 0  # nothing was sent, the job number did not move
