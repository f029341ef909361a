"""The Numba engine against the plain-Python reference of §2, plus registration rules."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from conftest import LOCALHOST, packet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swemu.core import kernels as K
from swemu.core.engine import (
    Action,
    Batch,
    EngineConfig,
    RegistrationError,
    SwitchEngine,
    pool_bytes,
)
from swemu.core.reference import ReferenceSwitch
from swemu.protocol import wire

# two jobs with overlapping job numbers and slots, one IP-only worker
JOBS = [
    # session, W, size code, pool, workers [(ip, port)]
    (11, 3, 0, 4, [(LOCALHOST, 1000), (LOCALHOST, 1001), (0x7F000002, 0)]),
    (22, 1, 0, 2, [(LOCALHOST, 2000)]),
    (33, 2, 1, 3, [(0x0A000001, 3000), (0x0A000001, 3001)]),
    (44, 2, 0, 3, [(0x0A000002, 4000), (0x0A000002, 4001)]),
]
# the jobs registered for the 16-bit format beside the 32-bit one (docs/protocol.md
# §4.2): their results echo the triggering packet's format bit
VALUE_FORMATS = {44: 1}
SOURCES = [addr for *_, ws in JOBS for addr in ws] + [
    (0x7F000002, 4444),  # matches the IP-only worker
    (LOCALHOST, 9999),  # unknown
]


def build_pair() -> tuple[SwitchEngine, ReferenceSwitch]:
    eng, ref = SwitchEngine(EngineConfig(pool_size=8, max_jobs=5)), ReferenceSwitch()
    for sid, w, code, pool, workers in JOBS:
        formats = VALUE_FORMATS.get(sid, 0)
        ref.add_job(sid, w, code, pool, formats)
        for rank, (ip, port) in enumerate(workers):
            eng.register(
                session_id=sid,
                rank=rank,
                num_workers=w,
                ipv4=ip,
                udp_port=port,
                packet_size=code,
                pool_size=pool,
                value_formats=formats,
            )
            ref.add_worker(sid, rank, ip, port)
    return eng, ref


@st.composite
def datagrams(draw: st.DrawFn) -> tuple[bytes, tuple[int, int]]:
    src = draw(st.sampled_from(SOURCES))
    kind = draw(st.sampled_from(["valid"] * 8 + ["random", "short", "badtype", "truncated"]))
    if kind == "random":
        return draw(st.binary(max_size=300)), src
    if kind == "short":
        return draw(st.binary(max_size=9)), src
    code = draw(st.sampled_from([0, 0, 0, 1]))
    vals = draw(
        st.lists(st.sampled_from([0, 1, -1, 7, 2**31 - 1, -(2**31), 12345]), min_size=1, max_size=4)
    )
    data = bytearray(
        packet(
            slot=draw(st.integers(0, 4)),
            set=draw(st.integers(0, 1)),
            values=vals,
            code=code,
            tsi=draw(st.integers(0, 3)),
            job=draw(st.integers(0, 2)),
            e0=draw(st.integers(-128, 127)),
            e1=draw(st.integers(-128, 127)),
        )
    )
    if draw(st.booleans()):
        data[0] |= 0x08  # the format bit: ignored on input, echoed by a 16-bit job
    if draw(st.booleans()):
        data[6] |= 0x40  # and so is bit 14 of pool_index
    if kind == "badtype":
        data[0] = (data[0] & 0x0F) | (draw(st.sampled_from([0, 2, 15])) << 4)
    if kind == "truncated":
        data = data[: draw(st.integers(10, len(data) - 1))]
    return bytes(data), src


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(datagrams(), min_size=1, max_size=120), batch=st.integers(1, 16))
def test_engine_matches_reference(stream, batch):
    """Every action and every byte sent equals the reference, whatever the stream."""
    eng, ref = build_pair()
    b = Batch(batch)
    for start in range(0, len(stream), batch):
        chunk = stream[start : start + batch]
        b.n = 0
        for data, src in chunk:
            b.add(data, *src)
        eng.process(b)
        got = b.results()
        expected = []
        for r, (data, src) in enumerate(chunk):
            action, out = ref.receive(data, src)
            assert Action(int(b.action[r])) == action, (r, data.hex())
            expected += out
        assert got == expected


def test_kernel_body_in_python(monkeypatch):
    """The kernel's Python body (what NUMBA_DISABLE_JIT runs) agrees with the JIT."""
    rng = np.random.default_rng(5)
    stream = []
    for _ in range(200):
        src = SOURCES[rng.integers(len(SOURCES))]
        stream.append(
            (
                packet(
                    slot=int(rng.integers(0, 4)),
                    set=int(rng.integers(0, 2)),
                    values=rng.integers(-(2**31), 2**31, 4),
                    tsi=int(rng.integers(4)),
                    e0=int(rng.integers(-128, 128)),
                ),
                src,
            )
        )
    jit_eng, _ = build_pair()
    jit_out = [jit_eng.receive_datagram(d, s) for d, s in stream]
    monkeypatch.setattr(K, "process_batch", K.process_batch.py_func)
    py_eng, _ = build_pair()
    with np.errstate(over="ignore"):  # numpy scalars warn where the kernel wraps silently
        py_out = [py_eng.receive_datagram(d, s) for d, s in stream]
    assert py_out == jit_out


def _served(python: bool, stream: list, monkeypatch: pytest.MonkeyPatch) -> list:
    """The data plane's served path (:func:`swemu.serving.loops.switch_batch`)
    with every fault stage on, over ``stream`` in batches of 16, from a seeded
    generator: per batch what left now, what waits in the delay queue and the
    actions; then every counter. ``python`` runs the Python bodies of the
    switch kernel and of the fault stages (the generator: NumPy's, the same
    Mersenne Twister as Numba's), else the compiled ones."""
    from swemu.core import faults
    from swemu.core.faults import DelayQueue, FaultConfig
    from swemu.protocol.fastio import Sends
    from swemu.serving import loops

    eng, _ = build_pair()
    params = FaultConfig(
        loss_in=0.1, duplicate=0.2, loss_out=0.1, delay_ms=1, reorder_ms=2, link_gbps=0.002
    ).params()
    eng.faults[:] = params
    eng.refresh_fault_flags()
    batch, queue = Batch(32), DelayQueue(48)  # 16 rows and room for their duplicates
    sends = Sends(
        np.zeros(1024, np.int64),
        np.zeros(1024, np.int64),
        np.zeros(1024, np.uint32),
        np.zeros(1024, np.int32),
    )
    no_up = np.full(4, -1, np.int32)  # no uplinks: a switch alone
    io = loops.BatchIO(batch.packets, sends, queue.arrays, np.zeros((4, 32)), sends, no_up)
    if python:
        for name in ("duplicate_rows", "egress", "leave_now"):
            monkeypatch.setattr(faults, name, getattr(faults, name).py_func)
        monkeypatch.setattr(loops, "process_batch", K.process_batch.py_func)
        np.random.seed(7)

        def run(now, n):
            return loops.switch_batch.py_func(
                now, n, io, eng.state, K.NO_ADDRESSES, eng.fault_flags, None
            )
    else:
        K.seed(7)

        def run(now, n):
            return loops.step(now, n, io, eng.state, eng.fault_flags, None)

    out = []
    for start in range(0, len(stream), 16):
        batch.n = 0
        for data, src in stream[start : start + 16]:
            batch.add(data, *src)
        with np.errstate(over="ignore"):  # numpy scalars warn where the kernel wraps silently
            m, rows, dests = run(0.001 * start, batch.n)
        sent = [
            (
                ctypes.string_at(int(sends.ptr[i]), int(sends.len[i])),
                int(sends.ip[i]),
                int(sends.port[i]),
            )
            for i in range(m)
        ]
        queued = sorted(
            (queue.buf[i, : queue.len[i]].tobytes(), float(queue.due[i]), int(queue.ip[i]))
            for i in np.flatnonzero(queue.len)
        )
        out.append((m, int(rows), int(dests), batch.action[:rows].tolist(), sent, queued))
    out.append(
        [eng.fault_counters.tolist(), eng.job_counters.tolist(), eng.worker_counters.tolist()]
    )
    return out


def test_served_path_body_in_python_with_every_fault_stage(monkeypatch):
    """The served path's Python bodies (the switch kernel and the fault stages:
    loss and duplication on the way in, loss, delay, reordering, link rate and
    a full delay queue on the way out) agree with the compiled ones, batch for
    batch and counter for counter."""
    rng = np.random.default_rng(9)
    stream = []
    for _ in range(400):
        src = SOURCES[rng.integers(len(SOURCES))]
        stream.append(
            (packet(slot=int(rng.integers(0, 2)), set=int(rng.integers(0, 2)), values=7), src)
        )
    jit_out = _served(False, stream, monkeypatch)
    py_out = _served(True, stream, monkeypatch)
    assert py_out == jit_out
    counters = jit_out[-1][0]
    assert all(sum(row[c] for row in counters) > 0 for c in range(5))  # every fault acted


def make(w: int, code: int = 0, pool: int = 4, **cfg) -> SwitchEngine:
    eng = SwitchEngine(EngineConfig(**{"pool_size": 16, **cfg}))
    for r in range(w):
        eng.register(
            session_id=1,
            rank=r,
            num_workers=w,
            ipv4=LOCALHOST,
            udp_port=1000 + r,
            packet_size=code,
            pool_size=pool,
        )
    return eng


def test_int32_addition_wraps_and_exponents_are_signed_maxima():
    eng = make(2)
    eng.receive_datagram(packet(values=2**31 - 1, e0=-5, e1=3), (LOCALHOST, 1000))
    act, out = eng.receive_datagram(packet(values=2, e0=-7, e1=-100), (LOCALHOST, 1001))
    assert act == Action.MULTICAST and len(out) == 2
    res = wire.decode(out[0][0])
    assert (res.values == -(2**31) + 1).all() and (res.e0, res.e1) == (-5, 3)


def test_single_worker_every_packet_first_and_last():
    eng = make(1)
    for i in range(3):
        act, out = eng.receive_datagram(packet(set=i % 2, values=i), (LOCALHOST, 1000))
        assert act == Action.MULTICAST and wire.decode(out[0][0]).values[0] == i
    assert eng.job_counters_of(1)["multicast"] == 3


def test_released_set_is_overwritten_and_slow_worker_gets_old_result():
    eng = make(2)
    a, b = (LOCALHOST, 1000), (LOCALHOST, 1001)
    eng.receive_datagram(packet(set=0, values=1, tsi=0), a)
    _, out = eng.receive_datagram(packet(set=0, values=2, tsi=0), b)
    assert wire.decode(out[0][0]).values[0] == 3
    # a moves on to set 1 (its result arrived); b lost its result and retransmits on set 0
    assert eng.receive_datagram(packet(set=1, values=10, tsi=1), a)[0] == Action.AGGREGATED
    act, out = eng.receive_datagram(packet(set=0, values=2, tsi=0), b)
    assert act == Action.UNICAST and out == [(out[0][0], b)]
    assert wire.decode(out[0][0]).values[0] == 3
    _, out = eng.receive_datagram(packet(set=1, values=20, tsi=1), b)
    assert wire.decode(out[0][0]).values[0] == 30
    # both back on set 0: released, so written, not added to the old 3
    eng.receive_datagram(packet(set=0, values=100, tsi=2), a)
    _, out = eng.receive_datagram(packet(set=0, values=200, tsi=2), b)
    assert wire.decode(out[0][0]).values[0] == 300


def test_retransmission_of_incomplete_slot_counts_once():
    eng = make(3)
    eng.receive_datagram(packet(values=1), (LOCALHOST, 1000))
    act, out = eng.receive_datagram(packet(values=1), (LOCALHOST, 1000))
    assert act == Action.RETRANSMIT_PENDING and out == []
    eng.receive_datagram(packet(values=1), (LOCALHOST, 1001))
    act, out = eng.receive_datagram(packet(values=1), (LOCALHOST, 1002))
    assert act == Action.MULTICAST and wire.decode(out[0][0]).values[0] == 3


def test_registration_errors():
    eng = SwitchEngine(EngineConfig(pool_size=64, max_workers=8, max_pool_memory=10**6))
    ok = {
        "session_id": 5,
        "rank": 0,
        "num_workers": 2,
        "ipv4": LOCALHOST,
        "udp_port": 1,
        "packet_size": 1,
        "pool_size": 8,
    }
    cases = [
        ({"session_id": 0}, "INVALID_ARGUMENT", "session_id"),
        ({"packet_size": 8}, "INVALID_ARGUMENT", "packet_size"),
        ({"num_workers": 0}, "INVALID_ARGUMENT", "num_workers"),
        ({"num_workers": 9}, "INVALID_ARGUMENT", "num_workers"),
        ({"rank": 2}, "INVALID_ARGUMENT", "rank"),
        ({"udp_port": 70000}, "INVALID_ARGUMENT", "udp_port"),
        ({"pool_size": 65}, "INVALID_ARGUMENT", "pool_size"),
        ({"rank": 1}, "INVALID_ARGUMENT", "rank 0"),
        ({"pool_size": 64, "packet_size": 7}, "RESOURCE_EXHAUSTED", str(pool_bytes(64, 7))),
    ]
    for change, code, words in cases:
        with pytest.raises(RegistrationError) as info:
            eng.register(**{**ok, **change})
        assert info.value.code == code and words in info.value.message, change
    eng.register(**ok)
    with pytest.raises(RegistrationError, match="rank 0 registered"):
        eng.register(**{**ok, "rank": 1, "num_workers": 3})
    assert eng.jobs[5].num_workers == 2


def test_rank0_replaces_session_and_address_moves_between_jobs():
    eng = make(2)
    eng.receive_datagram(packet(values=5), (LOCALHOST, 1000))  # slot 0 half full
    eng.register(
        session_id=1,
        rank=0,
        num_workers=2,
        ipv4=LOCALHOST,
        udp_port=1000,
        packet_size=0,
        pool_size=4,
    )
    assert 1001 not in [p for _, p in eng.jobs[1].workers.values()]  # rank 1 must re-register
    assert eng.released["replaced"] == 1
    eng.register(
        session_id=1,
        rank=1,
        num_workers=2,
        ipv4=LOCALHOST,
        udp_port=1001,
        packet_size=0,
        pool_size=4,
    )
    eng.receive_datagram(packet(values=1), (LOCALHOST, 1000))
    _, out = eng.receive_datagram(packet(values=1), (LOCALHOST, 1001))
    assert wire.decode(out[0][0]).values[0] == 2  # the old half-full slot was dropped
    # the address of rank 1 joins another job: it leaves job 1
    eng.register(
        session_id=2,
        rank=0,
        num_workers=1,
        ipv4=LOCALHOST,
        udp_port=1001,
        packet_size=0,
        pool_size=4,
    )
    assert 1 not in eng.jobs[1].workers
    act, out = eng.receive_datagram(packet(values=7), (LOCALHOST, 1001))
    assert act == Action.MULTICAST and out[0][1] == (LOCALHOST, 1001)
    assert eng.job_counters_of(1)["pkts_in"] == 2


def test_idle_jobs_are_released_by_the_timer():
    eng = SwitchEngine(EngineConfig(pool_size=4, idle_timeout=5.0))
    eng.register(
        session_id=3, rank=0, num_workers=1, ipv4=LOCALHOST, udp_port=1, packet_size=0, now=100.0
    )
    assert eng.get_timer() == 105.0
    eng.receive_datagram(packet(), (LOCALHOST, 1), now=103.0)
    assert eng.handle_timer(106.0) == [] and eng.get_timer() == 108.0
    assert eng.handle_timer(108.0) == [3] and not eng.jobs and eng.memory_in_use == 0
    assert eng.receive_datagram(packet(), (LOCALHOST, 1))[0] == Action.DROP_UNKNOWN_SOURCE


def test_memory_is_proportional_to_pools_not_traffic():
    eng = make(2, code=1, pool=8)
    before = eng.memory_in_use
    for i in range(2000):
        eng.receive_datagram(
            packet(slot=i % 8, set=(i // 16) % 2, values=i, code=1), (LOCALHOST, 1000 + i % 2)
        )
        eng.receive_datagram(b"\x00" * (i % 50), (0x01020304, i))
    assert eng.memory_in_use == before == pool_bytes(8, 1)
    assert eng.snapshot()["counters"]["drop_unknown_source"] == 2000


def test_batch_rejects_oversize_datagram():
    eng = make(1)
    b = Batch(2, max_len=64)
    b.add(b"\x10" + b"\x00" * 200, LOCALHOST, 1000)
    eng.process(b)
    assert Action(int(b.action[0])) == Action.DROP_MALFORMED
