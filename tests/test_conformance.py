"""Run the conformance vectors (tests/vectors/*.json) against the emulator engine.

The vectors are docs/protocol.md §1-§2 written down as data, with hand-computed
expectations; the same files are replayed against the P4 program
(p4/ptf/test_switchml_vectors.py). Here each one runs in memory on a fresh
:class:`swemu.core.engine.SwitchEngine` and every step's action, output bytes and
destinations must match exactly.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from conformance import (
    ACTIONS,
    VectorError,
    VectorMismatch,
    build_packet,
    check_vector,
    expected_outputs,
    load_vectors,
    run_vector_on_engine,
    values_of,
)
from hypothesis import given
from hypothesis import strategies as st

from swemu.core.engine import EMULATOR_ONLY_ACTIONS, Action
from swemu.protocol import wire

VECTORS = load_vectors()

#: Every rule of docs/protocol.md §1-§2 that a vector must demonstrate, by file name.
REQUIRED = {
    "write_add_multicast",  # first write, add, last multicasts to all
    "multicast_ip_only_worker",  # udp_port 0 worker: triggering packet's source port
    "retransmission_pending",  # incomplete slot: counted once, nothing sent
    "retransmission_complete_unicast",  # complete slot: unicast to that worker only
    "shadow_set_slow_worker",  # old result after the others moved to the other set
    "released_set_overwritten",  # released set is written, not added to
    "int32_wrap",
    "exponents_signed_max",
    "single_worker",  # W = 1
    "two_jobs_isolated",  # same job_number and slots, separate state
    "register_again_moves",
    "drop_unknown_source",
    "drop_short_datagram",
    "drop_wrong_length",
    "drop_msg_type",
    "drop_wrong_size_code",
    "drop_slot_range",
    "unused_bits_ignored",
    "format_bit_block16",  # 16-bit format (§4.2): words added, format bit echoed
    # size code 3, the other size the Tofino program aggregates (four passes there)
    "size_code_3_write_add_multicast",  # write, add, multicast, unicast over 256 values
    "size_code_3_released_set_and_checks",  # released set written; checks at code 3
    "size_codes_1_and_3_jobs",  # jobs of both sizes side by side
}


def test_vectors_cover_both_hardware_size_codes() -> None:
    """Every size code the Tofino program aggregates has vectors (p4/ptf replays them)."""
    codes = {job["size_code"] for v in VECTORS for job in v["jobs"]}
    assert codes >= set(wire.HARDWARE_SIZE_CODES)


def test_values_at_convention() -> None:
    """``values_at`` sets single values anywhere in a packet, after ``values``/``fill``."""
    got = values_of({"size_code": 3, "fill": 1, "values": [5], "values_at": {"255": 9, "0": 7}})
    assert len(got) == 256 and got[0] == 7 and got[255] == 9 and set(got[1:255]) == {1}
    with pytest.raises(VectorError, match="values_at index 256"):
        values_of({"size_code": 3, "values_at": {"256": 1}})


def test_every_rule_has_a_vector() -> None:
    """The vector set covers each §1-§2 rule listed in REQUIRED."""
    assert {v["name"] for v in VECTORS} >= REQUIRED


def test_vector_names_match_files() -> None:
    """A vector's name is its file name, so a failure message points at the file."""
    for v in VECTORS:
        assert v["file"] == f"{v['name']}.json"
        assert "§" in v["rule"], f"{v['file']}: 'rule' should cite the docs/protocol.md section"


def test_vector_actions_are_the_engines() -> None:
    """The action names of the vector format are exactly swemu.core.engine.Action's
    (but for the emulator-only ones: fault injection, wrong data-plane shard)."""
    assert set(ACTIONS) == {a.name for a in Action} - {a.name for a in EMULATOR_ONLY_ACTIONS}


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_on_engine(vector: dict[str, Any]) -> None:
    """Every step of the vector: same action, same datagrams to the same addresses."""
    results = run_vector_on_engine(vector)
    assert len(results) == sum(1 for s in vector["steps"] if "register" not in s)


def test_mismatch_is_reported() -> None:
    """A wrong expectation fails with a message naming the file and step."""
    vector = next(v for v in VECTORS if v["name"] == "write_add_multicast")
    broken = {**vector, "steps": [dict(s) for s in vector["steps"]]}
    broken["steps"][0] = {**broken["steps"][0], "expect": {"action": "MULTICAST", "out": []}}
    with pytest.raises(VectorMismatch, match=r"write_add_multicast\.json step 0"):
        run_vector_on_engine(broken)


def test_malformed_vector_is_refused() -> None:
    """A step with both a packet and raw bytes is a format error, not a silent pass."""
    bad = {
        "name": "x",
        "description": "",
        "rule": "§2",
        "switch": {"pool_size": 1},
        "jobs": [],
        "steps": [
            {
                "from": "1.2.3.4:5",
                "packet": {"size_code": 1},
                "raw_hex": "",
                "expect": {"action": "AGGREGATED"},
            }
        ],
    }
    with pytest.raises(VectorError):
        check_vector(bad)


# ------------------------------------------------------------------ the packet builder
def test_values_padding_convention() -> None:
    """``values`` overwrite the start of a list of ``fill`` (default 0) of length N."""
    assert values_of({"size_code": 0, "values": [1, 2]}) == [1, 2] + [0] * 30
    assert values_of({"size_code": 0, "fill": 7, "values": [1]}) == [1] + [7] * 31
    assert values_of({"size_code": 1, "n_values": 3}) == [0, 0, 0]


@given(
    size_code=st.integers(0, 3),
    job_number=st.integers(0, 255),
    tsi=st.integers(0, 2**32 - 1),
    set_=st.integers(0, 1),
    slot=st.integers(0, wire.MAX_SLOTS - 1),
    e0=st.integers(-128, 127),
    e1=st.integers(-128, 127),
    seed=st.integers(0, 2**32 - 1),
)
def test_build_packet_equals_wire_encode(
    size_code: int,
    job_number: int,
    tsi: int,
    set_: int,
    slot: int,
    e0: int,
    e1: int,
    seed: int,
) -> None:
    """The vectors' independent builder and swemu.protocol.wire agree byte for byte."""
    n = wire.values_per_packet(size_code)
    values = np.random.default_rng(seed).integers(-(2**31), 2**31, n, dtype=np.int64)
    desc = {
        "size_code": size_code,
        "job_number": job_number,
        "tsi": tsi,
        "set": set_,
        "slot": slot,
        "e0": e0,
        "e1": e1,
        "values": values.tolist(),
    }
    data = build_packet(desc)
    assert data == wire.encode(
        size_code=size_code,
        job_number=job_number,
        tsi=tsi,
        set=set_,
        slot=slot,
        values=values.astype(np.int32),
        e0=e0,
        e1=e1,
    )
    pkt = wire.decode(data)
    assert (pkt.size_code, pkt.job_number, pkt.tsi, pkt.set, pkt.slot, pkt.e0, pkt.e1) == (
        size_code,
        job_number,
        tsi,
        set_,
        slot,
        e0,
        e1,
    )


def test_build_packet_unused_bits() -> None:
    """The builder can set the bits §1 says are ignored; wire.decode ignores them."""
    data = build_packet({"size_code": 0, "unused": 1, "pool_index_unused": 1, "slot": 5})
    assert data[0] == 0x18  # msg_type 1, unused 1, size 0
    assert struct.unpack(">H", data[6:8])[0] == 0x4005
    assert wire.decode(data).slot == 5


def test_expected_outputs_are_well_formed() -> None:
    """Every expected result is a valid packet of the job's size code, with bit 14 of
    pool_index clear and the format bit clear unless a job of the vector registered
    the 16-bit format (§4.2): the vectors cannot expect something §1 forbids the
    switch to send."""
    for v in VECTORS:
        codes = {j["size_code"] for j in v["jobs"]}
        block16 = any(j.get("value_formats", 0) for j in v["jobs"])
        for step in v["steps"]:
            for to, data in expected_outputs(step) if "expect" in step else []:
                pkt = wire.decode(data)
                assert pkt.size_code in codes, (v["file"], to)
                assert data[6] & 0x40 == 0, (v["file"], to)
                assert block16 or data[0] & wire.FORMAT_BIT == 0, (v["file"], to)
