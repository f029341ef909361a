"""The P4 program (p4/*.p4) against the Python side: headers, constants, decision tables.

bf-p4c cannot run here, so these tests read the P4 source itself: a small
reader strips comments, collects ``#define``/``const``/``typedef``, header
declarations and tables' ``const entries``. They check that

* the ``switchml_h`` and ``switchml_values_h`` headers are docs/protocol.md §1 bit for
  bit, as :mod:`swemu.protocol.wire` encodes it (byte layout of ``HEADER_DTYPE``, the bit
  fields of byte 0 and of pool_index, signedness, values per packet);
* the constants that mirror Python constants agree with them;
* the tables whose const entries encode §1-§2 (packet checks, retransmission,
  write/add/read, next step) choose what the protocol says, for every input.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p4 import source
from swemu.core.engine import EMULATOR_ONLY_ACTIONS, Action
from swemu.protocol import wire


# ----------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class Field:
    """One header field: name, width in bits, and whether it is ``int<>`` (signed)."""

    name: str
    width: int
    signed: bool


class P4Source(source.P4Source):
    """The P4 files of p4/ (the project's one reader, :mod:`p4.source`), with what
    these tests need from them: headers in order and the decision tables."""

    def header(self, name: str) -> list[Field]:
        """The fields of ``header name { ... }``, in order."""
        m = re.search(rf"\bheader\s+{name}\s*\{{(.*?)\}}", self.text, re.S)
        assert m, f"header {name} not found"
        fields = []
        for fm in re.finditer(r"([\w]+(?:<[^>]+>)?)\s+(\w+)\s*;", m.group(1)):
            width, signed = self.width_and_sign(fm.group(1))
            fields.append(Field(fm.group(2), width, signed))
        return fields

    # -- tables
    def expand(self, text: str) -> str:
        """Expand the function-like macros (one level, as the tables use them)."""
        for name, (params, body) in self.macros.items():

            def sub(m: re.Match[str], params: list[str] = params, body: str = body) -> str:
                out = body
                for p, a in zip(params, m.group(1).split(","), strict=True):
                    out = re.sub(rf"\b{p}\b", a.strip(), out)
                return out

            text = re.sub(rf"\b{name}\(([^()]*)\)", sub, text)
        return text

    def table(self, name: str) -> Table:
        """The table ``name``: its key fields, const entries and default action."""
        body = _block(self.text, rf"\btable\s+{name}\b")
        keys = [k.split(":")[0].strip() for k in _block(body, r"\bkey\s*=").split(";") if k.strip()]
        entries, args = [], []
        for entry in _split_top(self.expand(_block(body, r"\bconst\s+entries\s*=")), ";"):
            keyset, action = entry.rsplit(":", 1)
            keyset = keyset.strip()
            if keyset.startswith("(") and keyset.endswith(")"):
                keyset = keyset[1:-1]
            entries.append(([self.keyset(k) for k in _split_top(keyset, ",")], _name(action)))
            inside = action.split("(", 1)[1].rsplit(")", 1)[0]
            args.append([self.value(a) for a in _split_top(inside, ",")])
        default = re.search(r"default_action\s*=\s*(\w+)", body)
        return Table(name, keys, entries, default.group(1) if default else "NoAction", args)

    def keyset(self, text: str) -> tuple[int, int] | None:
        """``(value, mask)`` of one key of an entry; None for ``_`` (match anything)."""
        text = text.strip()
        if text in ("_", "default"):
            return None
        if "&&&" in text:
            value, mask = text.split("&&&")
            return self.value(value), self.value(mask)
        return self.value(text), -1

    def action_body(self, name: str) -> str:
        """The body of ``action name(...)``."""
        return _block(self.text, rf"\baction\s+{name}\s*\(")


@dataclass
class Table:
    """A table's keys and const entries, applied as the switch does: first match wins."""

    name: str
    keys: list[str]
    entries: list[tuple[list[tuple[int, int] | None], str]]
    default: str
    args: list[list[int]]  # the action arguments of each entry

    def apply(self, **key_values: int) -> str:
        """The action chosen for key values given by the key's last name component."""
        return self.call(**key_values)[0]

    def call(self, **key_values: int) -> tuple[str, list[int]]:
        """The action chosen, with the arguments its entry gives it."""
        values = [key_values[k.split(".")[-1].replace("()", "")] for k in self.keys]
        for (keyset, action), args in zip(self.entries, self.args, strict=True):
            assert len(keyset) == len(values), f"{self.name}: entry arity"
            if all(
                k is None or (v & k[1]) == (k[0] & k[1])
                for k, v in zip(keyset, values, strict=True)
            ):
                return action, args
        return self.default, []


def _block(text: str, start: str) -> str:
    """The text inside the first ``{...}`` that follows the regex ``start``."""
    return source.block(text, start)


def _split_top(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside parentheses; drop empty parts."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _name(action_call: str) -> str:
    return action_call.strip().split("(")[0].strip()


P4 = P4Source()


# ----------------------------------------------------------------------------- headers
#: §1 in P4 terms: which P4 fields make up each field of wire.HEADER_DTYPE.
DTYPE_GROUPS = {
    "type_size": ["msg_type", "unused", "size"],
    "job_number": ["job_number"],
    "tsi": ["tsi"],
    "pool_index": ["set", "pool_index_unused", "slot"],
    "e0": ["e0"],
    "e1": ["e1"],
}


def _offsets(fields: list[Field]) -> dict[str, tuple[int, int]]:
    """name -> (first bit, width), bit 0 being the most significant bit of byte 0."""
    out, pos = {}, 0
    for f in fields:
        out[f.name] = (pos, f.width)
        pos += f.width
    return out


def p4_unpack(fields: list[Field], data: bytes) -> dict[str, int]:
    """Read the fields of a P4 header from ``data`` as a Tofino parser would."""
    total = sum(f.width for f in fields)
    word = int.from_bytes(data[: total // 8], "big")
    out, pos = {}, 0
    for f in fields:
        v = (word >> (total - pos - f.width)) & ((1 << f.width) - 1)
        if f.signed and v >> (f.width - 1):
            v -= 1 << f.width
        out[f.name] = v
        pos += f.width
    return out


def p4_pack(fields: list[Field], values: dict[str, int]) -> bytes:
    """Write the fields of a P4 header as a Tofino deparser would."""
    word = 0
    for f in fields:
        word = (word << f.width) | (values[f.name] & ((1 << f.width) - 1))
    return word.to_bytes(sum(f.width for f in fields) // 8, "big")


SWITCHML = P4.header("switchml_h")
HALF = P4.header("value_half_h")  # values_first / values_second: 32 values each


def test_switchml_header_is_protocol_section_1() -> None:
    """Field names, order and widths of switchml_h: the bit layout of §1."""
    assert [(f.name, f.width) for f in SWITCHML] == [
        ("msg_type", 4),
        ("unused", 1),
        ("size", 3),
        ("job_number", 8),
        ("tsi", 32),
        ("set", 1),
        ("pool_index_unused", 1),
        ("slot", 14),
        ("e0", 8),
        ("e1", 8),
    ]
    assert sum(f.width for f in SWITCHML) == 8 * wire.HEADER_LEN


def test_switchml_header_matches_header_dtype() -> None:
    """Each HEADER_DTYPE field is exactly a run of P4 fields at the same bytes, with the
    same signedness: the numpy batch view and the P4 parser read the same bytes."""
    offsets = _offsets(SWITCHML)
    by_name = {f.name: f for f in SWITCHML}
    covered = []
    for name, (dtype, offset) in wire.HEADER_DTYPE.fields.items():
        group = DTYPE_GROUPS[name]
        covered += group
        start = offsets[group[0]][0]
        assert start == 8 * offset, name
        pos = start
        for member in group:  # contiguous, in order
            assert offsets[member][0] == pos, (name, member)
            pos += offsets[member][1]
        assert pos - start == 8 * dtype.itemsize, name
        if len(group) == 1:
            assert by_name[group[0]].signed == (dtype.kind == "i"), name
    assert covered == [f.name for f in SWITCHML]


def test_byte0_and_pool_index_bits() -> None:
    """msg_type is the high nibble, unused bit 3, size bits 2..0; pool_index is
    set (bit 15) | bit 14 | slot (bits 13..0) -- the masks swemu.protocol.wire uses."""
    offsets = _offsets(SWITCHML)
    assert offsets["msg_type"] == (0, 4)
    assert offsets["unused"] == (4, 1)
    assert offsets["size"] == (5, 3)
    pi = 8 * wire.HEADER_DTYPE.fields["pool_index"][1]
    assert offsets["set"] == (pi, 1)
    assert 1 << (15 - (offsets["set"][0] - pi)) == wire.SET_BIT
    assert offsets["pool_index_unused"] == (pi + 1, 1)
    assert offsets["slot"] == (pi + 2, 14)
    assert (1 << offsets["slot"][1]) - 1 == wire.SLOT_MASK


header_values = st.fixed_dictionaries(
    {
        "size_code": st.integers(0, 7),
        "job_number": st.integers(0, 255),
        "tsi": st.integers(0, 2**32 - 1),
        "set": st.integers(0, 1),
        "slot": st.integers(0, wire.MAX_SLOTS - 1),
        "e0": st.integers(-128, 127),
        "e1": st.integers(-128, 127),
    }
)


@given(h=header_values)
def test_p4_parser_reads_what_wire_encodes(h: dict[str, int]) -> None:
    """wire.encode -> the P4 header's bit layout gives back every field."""
    data = wire.encode(values=np.zeros(wire.values_per_packet(h["size_code"]), np.int32), **h)
    got = p4_unpack(SWITCHML, data)
    assert got == {
        "msg_type": wire.MSG_TYPE,
        "unused": 0,
        "size": h["size_code"],
        "job_number": h["job_number"],
        "tsi": h["tsi"],
        "set": h["set"],
        "pool_index_unused": 0,
        "slot": h["slot"],
        "e0": h["e0"],
        "e1": h["e1"],
    }


@given(h=header_values, unused=st.integers(0, 1), bit14=st.integers(0, 1))
def test_wire_decodes_what_p4_deparser_writes(h: dict[str, int], unused: int, bit14: int) -> None:
    """The P4 header written out -> wire.decode reads the same fields, ignoring the
    unused bit and bit 14 of pool_index as §1 says."""
    fields = {
        **h,
        "msg_type": wire.MSG_TYPE,
        "size": h["size_code"],
        "unused": unused,
        "pool_index_unused": bit14,
    }
    n = wire.values_per_packet(h["size_code"])
    data = p4_pack(SWITCHML, fields) + bytes(4 * n)
    pkt = wire.decode(data)
    assert (pkt.size_code, pkt.job_number, pkt.tsi, pkt.set, pkt.slot, pkt.e0, pkt.e1) == (
        h["size_code"],
        h["job_number"],
        h["tsi"],
        h["set"],
        h["slot"],
        h["e0"],
        h["e1"],
    )
    assert wire.split_pool_index(int.from_bytes(data[6:8], "big")) == (h["set"], h["slot"])


def test_values_header_holds_one_size_code_1_payload() -> None:
    """Two value_half_h of VALUES_PER_HALF int32 fields v00..v31 are one pass's
    values_per_packet(1) values, so header plus values are exactly packet_len(1)
    bytes; a size-code-3 packet is QUARTERS passes of them."""
    n = wire.values_per_packet(P4.value("SIZE_CODE_ONE_PASS"))
    assert n == wire.values_per_packet(1) == P4.value("VALUES_PER_PASS")
    half = P4.value("VALUES_PER_HALF")
    assert 2 * half == n
    assert [f.name for f in HALF] == [f"v{i:02d}" for i in range(half)]
    assert all(f.width == 32 for f in HALF)
    total_bits = sum(f.width for f in SWITCHML) + 2 * sum(f.width for f in HALF)
    assert total_bits == 8 * wire.packet_len(1)
    four = P4.value("SIZE_CODE_FOUR_PASSES")
    assert wire.values_per_packet(four) == P4.value("QUARTERS") * n == 256
    header = P4.text[P4.text.index("struct header_t") :]
    assert re.search(r"value_half_h\s+values_first;\s*value_half_h\s+values_second;", header)


def test_every_value_is_aggregated_once() -> None:
    """Aggregate hands each value of a pass to exactly one register pair, pair i
    holding values i and i + 32 (values_first.v<i> and values_second.v<i>)."""
    calls = re.findall(r"pair(\d+)\.apply\(first\.(v\d+), second\.(v\d+), ig_md\)", P4.text)
    assert len(calls) == len(HALF)
    assert sorted(first for _, first, _ in calls) == [f.name for f in HALF]
    for pair, first, second in calls:
        assert int(first[1:]) == int(second[1:]) == int(pair)
    assert "aggregate.apply(hdr.values_first, hdr.values_second, ig_md)" in P4.text


# ----------------------------------------------------------------------------- constants
def test_constants_mirror_swemu_wire() -> None:
    """The constants of configuration.p4 that the Python side also has agree with it."""
    assert P4.value("MSG_TYPE_SWITCHML") == wire.MSG_TYPE
    assert P4.value("MAX_WORKERS") == wire.MAX_WORKERS
    assert 1 << P4.value("SLOT_INDEX_BITS") == wire.MAX_SLOTS
    assert P4.value("SWITCHML_UDP_PORT_BASE") == wire.UDP_PORT_BASE == 0xBEE0
    assert P4.value("SWITCHML_UDP_PORT_MASK") == wire.UDP_PORT_MASK == 0xFFF0
    assert P4.value("SWITCHML_HEADER_BYTES") == wire.HEADER_LEN
    for code in range(8):
        assert P4.value(f"UDP_LENGTH_CODE{code}") == 8 + wire.packet_len(code), code
    supported = {P4.value("SIZE_CODE_ONE_PASS"), P4.value("SIZE_CODE_FOUR_PASSES")}
    assert supported == set(wire.HARDWARE_SIZE_CODES) == {1, 3}


def test_value_formats_mirror_swemu_wire() -> None:
    """VALUE_FORMATS_* are swemu.protocol.wire.ValueFormats, and set_worker carries the
    job's (the control plane writes UdpSession's value_formats there)."""
    assert P4.value("VALUE_FORMATS_INT32") == wire.ValueFormats.INT32
    assert P4.value("VALUE_FORMATS_INT32_AND_BLOCK16") == wire.ValueFormats.INT32_AND_BLOCK16
    assert P4.width_and_sign("value_formats_t") == (1, False)
    assert "ig_md.value_formats = value_formats;" in P4.action_body("set_worker")


@pytest.mark.parametrize("formats", [0, 1])
@pytest.mark.parametrize("bit", [0, 1])
def test_result_format_bit_is_the_engines(formats: int, bit: int) -> None:
    """The result's format bit (the header's ``unused``), as NextStep leaves it: the
    triggering packet's for a job of the 16-bit format, 0 otherwise, as the engine
    writes it (docs/protocol.md §4.2). recirculate keeps the packet's bit; NextStep's
    apply block clears it for VALUE_FORMATS_INT32 jobs after the table."""
    from swemu.core.engine import EngineConfig, SwitchEngine

    assert "hdr.switchml.unused" not in P4.action_body("recirculate")
    apply = _block(_block(P4.text, r"\bcontrol\s+NextStep\b"), r"\bapply\s*")
    clear = re.search(
        r"if\s*\(ig_md\.value_formats == (\w+)\)\s*\{\s*hdr\.switchml\.unused = 0;", apply
    )
    assert clear and apply.index("next_step.apply()") < clear.start()
    p4_bit = 0 if formats == P4.value(clear.group(1)) else bit

    eng = SwitchEngine(EngineConfig(pool_size=4))
    eng.register(
        session_id=1, rank=0, num_workers=1, ipv4=1, udp_port=2, pool_size=4, value_formats=formats
    )
    data = bytearray(wire.encode(size_code=1, job_number=0, tsi=0, set=0, slot=0, values=[0] * 64))
    data[0] |= bit << 3
    action, out = eng.receive_datagram(bytes(data), (1, 2))
    assert action == Action.MULTICAST
    assert (out[0][0][0] >> 3) & 1 == p4_bit == (bit & formats)


def test_types_fit_the_constants() -> None:
    """Bitmaps have a bit per worker, ids address every worker, indices every entry."""
    assert P4.width_and_sign("worker_bitmap_t") == (P4.value("MAX_WORKERS"), False)
    assert 1 << P4.width_and_sign("worker_id_t")[0] == P4.value("MAX_WORKERS")
    assert P4.width_and_sign("slot_t") == (P4.value("SLOT_INDEX_BITS"), False)
    assert P4.width_and_sign("exponent_t") == (8, True)
    assert 1 << P4.value("POOL_SLOT_BITS") == P4.value("NUM_POOL_SLOTS") <= wire.MAX_SLOTS
    assert P4.value("POOL_INDEX_BITS") == P4.value("POOL_SLOT_BITS") + 1
    assert P4.value("COUNTER_INDEX_BITS") == P4.value("JOB_ID_BITS") + 3
    assert P4.value("COUNTER_SIZE") == 1 << P4.value("COUNTER_INDEX_BITS")
    assert 2 ** P4.width_and_sign("count_t")[0] > P4.value("MAX_WORKERS")
    assert sum(f.width for f in P4.header("switchml_md_h")) % 8 == 0


def test_action_codes_are_the_engines() -> None:
    """ACTION_* of configuration.p4 number the outcomes as swemu.core.engine.Action does."""
    for action in (a for a in Action if a not in EMULATOR_ONLY_ACTIONS):
        assert P4.value(f"ACTION_{action.name}") == action.value, action.name


# ----------------------------------------------------------------------------- tables
NEXT_STEP_ACTIONS = {
    "aggregated": Action.AGGREGATED,
    "multicast_result": Action.MULTICAST,
    "retransmit_pending": Action.RETRANSMIT_PENDING,
    "unicast_result": Action.UNICAST,
    # size code 3: the same outcomes, with the other three quarters still to aggregate
    "consume_aggregated": Action.AGGREGATED,
    "consume_multicast": Action.MULTICAST,
    "consume_unicast": Action.UNICAST,
}
CODE3_ACTIONS = {"consume_aggregated", "consume_multicast", "consume_unicast"}
PASS = {name[5:]: P4.value(name) for name in P4.consts if name.startswith("PASS_")}
OP = {name[9:]: P4.value(name) for name in P4.consts if name.startswith("VALUE_OP_")}


def section2_next_step(retransmission: bool, count_after: int) -> Action:
    """§2 step 5 (count_after: workers still missing after the packet)."""
    if not retransmission:
        return Action.MULTICAST if count_after == 0 else Action.AGGREGATED
    return Action.UNICAST if count_after == 0 else Action.RETRANSMIT_PENDING


@given(
    before=st.one_of(st.just(0), st.integers(0, 2**32 - 1)),
    w=st.integers(0, 31),
    count=st.integers(0, 31),
    code=st.sampled_from([1, 3]),
)
def test_next_step_table_is_section_2(before: int, w: int, count: int, code: int) -> None:
    """next_step's const entries give the §2 step-5 decision for every input, for both
    size codes; a size-code-3 packet that changes the values carries the step-4
    decision (write after release, else add; read for an answered retransmission)."""
    map_result = before & (1 << w)
    chosen, args = P4.table("next_step").call(
        size_code=code, map_result=map_result, count=count, worker_bitmap_before=before
    )
    assert NEXT_STEP_ACTIONS[chosen] == section2_next_step(map_result != 0, count)
    assert (chosen in CODE3_ACTIONS) == (code == 3 and chosen != "retransmit_pending")
    if chosen in ("consume_aggregated", "consume_multicast"):
        assert args == [OP["WRITE"] if before == 0 else OP["ADD"]]
    if chosen == "consume_unicast":
        assert "consume(VALUE_OP_READ, 1, 0);" in P4.action_body("consume_unicast")


def test_next_step_actions_count_their_outcome() -> None:
    """Each next_step action records the Action of the same name in action_code."""
    for name, action in NEXT_STEP_ACTIONS.items():
        assert f"ig_md.action_code = ACTION_{action.name};" in P4.action_body(name), name
    # a result is sent at the end (result = 1), by multicast or to the sender
    assert "consume(op, 1, 1);" in P4.action_body("consume_multicast")
    assert "consume(op, 0, 0);" in P4.action_body("consume_aggregated")
    for entry in P4.table("next_step").entries:
        assert entry[1] in NEXT_STEP_ACTIONS


bitmaps = st.one_of(st.just(0), st.integers(0, 2**32 - 1), st.integers(0, 31).map(lambda b: 1 << b))


@pytest.mark.parametrize(
    ("table", "first", "new", "retransmission", "harvest"),
    [
        ("aggregate", "write", "add", "read", "harvest"),
        ("exponents_max", "write", "max_reduce", "read", "harvest"),
        ("count_workers", "new_contribution", "new_contribution", "retransmission", "NoAction"),
    ],
)
@given(before=bitmaps, w=st.integers(0, 31))
def test_section_2_step_4_tables(
    table: str,
    first: str,
    new: str,
    retransmission: str,
    harvest: str,
    before: int,
    w: int,
) -> None:
    """Write after release (bitmap before == 0), add / max / count a new contribution,
    leave everything alone on a retransmission ((before & b) != 0); the harvest pass
    only reads. Count and exponents see the bitmap, aggregate sees map_result too."""
    t = P4.table(table)
    keys = {
        "worker_id": w,
        "worker_bitmap_before": before,
        "map_result": before & (1 << w),
        "value_op": 0,
    }
    if before == 0:
        want = first
    elif before & (1 << w):
        want = retransmission
    else:
        want = new
    assert t.apply(pass_type=PASS["FIRST"], **keys) == want
    assert t.apply(pass_type=PASS["HARVEST"], **keys) == harvest


@pytest.mark.parametrize("quarter", [1, 2, 3])
@pytest.mark.parametrize("op", ["WRITE", "ADD", "READ"])
def test_consume_passes_do_what_the_first_pass_decided(quarter: int, op: str) -> None:
    """Size code 3: a consume pass writes, adds or reads its quarter as the first
    pass decided (value_op), whatever the metadata of the bitmap says; bitmap, count
    and exponents are left alone (they were updated once, by the first pass)."""
    want = {"WRITE": "write", "ADD": "add", "READ": "read"}[op]
    for before in (0, 1, 0xFFFFFFFF):
        keys = {"worker_id": 0, "worker_bitmap_before": before, "map_result": before & 1}
        pass_type = PASS[f"CONSUME{quarter}"]
        assert P4.table("aggregate").apply(pass_type=pass_type, value_op=OP[op], **keys) == want
        for table in ("count_workers", "exponents_max"):
            assert P4.table(table).apply(pass_type=pass_type, value_op=OP[op], **keys) == (
                "NoAction"
            )


def test_collect_passes_read_each_half_once() -> None:
    """The eight collect passes of a size-code-3 result read each half of each
    quarter exactly once, into the half header they open; e1 is read on the last."""
    aggregate, half = P4.table("aggregate"), P4.table("collect_half")
    expo = P4.table("exponents_max")
    seen = []
    for q in range(4):
        for which, action in (("FIRST", "read"), ("SECOND", "harvest")):
            pass_type = PASS[f"COLLECT_{q}_{which}"]
            keys = {"value_op": 0, "worker_bitmap_before": 0, "map_result": 0, "worker_id": 0}
            assert aggregate.apply(pass_type=pass_type, **keys) == action
            assert half.apply(pass_type=pass_type) == f"open_{which.lower()}"
            want_e1 = "harvest" if (q, which) == (0, "FIRST") else "NoAction"
            assert expo.apply(pass_type=pass_type, **keys) == want_e1
            seen.append(pass_type)
    assert len(set(seen)) == 8
    for pass_type in (PASS["FIRST"], PASS["HARVEST"], PASS["CONSUME1"]):
        assert half.apply(pass_type=pass_type) == "NoAction"
    # read() returns the first half into `first`, harvest() the second into `second`
    assert "first = read_first.execute" in P4.action_body("read")
    assert "second = read_second.execute" in P4.action_body("harvest")


@functools.cache
def table(name: str) -> Table:
    """P4.table(name), read once (the simulation below applies tables per pass)."""
    return P4.table(name)


# The pool index each pass action leaves for the next pass, from the action bodies.
STEP = {"consume_next": 2, "consume_then_collect": 0, "collect_same_quarter": 0}


def test_pass_actions_move_to_the_right_entry() -> None:
    """Consume passes move one entry on (pool_index + 2: one entry, both sets), the
    last one stays for the first collect pass, collect passes stay or go one back."""
    assert "recirculate(PASS_CONSUME1, ig_md.pool_index + 2," in P4.action_body("consume")
    assert "go_round(next, 2);" in P4.action_body("consume_next")
    assert "go_round(next, 0);" in P4.action_body("consume_then_collect")
    assert "go_round(next, 0);" in P4.action_body("collect_same_quarter")
    before = P4.action_body("collect_quarter_before")
    assert "hdr.switchml_md.pool_index = ig_md.pool_index - 2;" in before
    go_round = P4.action_body("go_round")
    assert "hdr.switchml_md.pool_index = ig_md.pool_index + step;" in go_round
    for body in (before, go_round):
        assert "ig_tm_md.ucast_egress_port = ig_intr_md.ingress_port[8:7] ++" in body
    for name in ("consume_next", "consume_then_collect", "consume"):
        assert "hdr.values_first.setInvalid();" in P4.action_body(name)
        assert "hdr.values_second.setInvalid();" in P4.action_body(name)
    assert "setInvalid" not in P4.action_body("collect_same_quarter") + before


def simulate_size_code_3(
    registers: dict[int, list[list[int]]],
    values: list[int],
    *,
    before: int,
    w: int,
    count: int,
    pool_index: int,
) -> tuple[str, list[int] | None, int]:
    """One size-code-3 packet through every pass, as the P4 tables chain them.

    ``registers[entry]`` is the 32 pairs [first, second] of one register entry. The
    packet's payload is a list; a consume pass removes the 64 values at its front, a
    collect pass puts 32 in front. Returns (the first pass's action, the payload of the
    result or None when nothing is sent, the number of passes)."""
    aggregate, half = table("aggregate"), table("collect_half")
    payload = list(values)
    map_result = before & (1 << w)
    chosen, args = table("next_step").call(
        size_code=3, map_result=map_result, count=count, worker_bitmap_before=before
    )
    if chosen not in CODE3_ACTIONS:
        return chosen, None, 1
    op = args[0] if args else OP["READ"]
    result = 0 if chosen == "consume_aggregated" else 1
    multicast = 1 if chosen == "consume_multicast" else 0
    pass_type, index, passes = PASS["FIRST"], pool_index, 0
    while True:
        passes += 1
        keys = {
            "pass_type": pass_type,
            "value_op": op if pass_type != PASS["FIRST"] else 0,
            "worker_bitmap_before": before,
            "map_result": map_result,
        }
        action = aggregate.apply(**keys)
        opened = half.apply(pass_type=pass_type)
        pairs = registers.setdefault(index, [[0, 0] for _ in range(32)])
        if opened == "NoAction":  # a pass that carries 64 values
            pass_values, payload = payload[:64], payload[64:]
        for i, pair in enumerate(pairs):
            if action == "write":
                pair[:] = [pass_values[i], pass_values[i + 32]]
            elif action == "add":
                pair[:] = [wrap(pair[0] + pass_values[i]), wrap(pair[1] + pass_values[i + 32])]
        if opened == "open_first":
            payload = [p[0] for p in pairs] + payload
        elif opened == "open_second":
            payload = [p[1] for p in pairs] + payload
        if pass_type == PASS["FIRST"]:
            pass_type, index = PASS["CONSUME1"], index + 2
            continue
        step, args = table("next_pass").call(
            pass_type=pass_type, result=result, multicast=multicast
        )
        if step in ("to_all_workers", "to_sender"):
            assert step == ("to_all_workers" if multicast else "to_sender")
            return chosen, payload, passes
        if step == "consumed":
            assert not payload
            return chosen, None, passes
        index += STEP.get(step, -2)
        (pass_type,) = args


def wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


@settings(deadline=None, max_examples=25)
@given(
    w=st.integers(2, 8),
    data=st.data(),
)
def test_size_code_3_end_to_end(w: int, data: st.DataObject) -> None:
    """W workers' 256-value packets into one slot, through the tables pass by pass:
    every packet takes 4 passes, the last one's result 12, and it carries the
    int32 sums of all 256 values in order; a retransmission afterwards gets the
    same sums back (unicast) and changes nothing. The register entries are the
    slot's four quarters."""
    vectors = [
        data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=256, max_size=256))
        for _ in range(w)
    ]
    registers: dict[int, list[list[int]]] = {}
    base = 2 * 4 * data.draw(st.integers(0, 100))  # (pool_base + 4 slot) ++ set 0
    bitmap = 0
    for rank, vec in enumerate(vectors):
        count_after = w - 1 - rank
        chosen, out, passes = simulate_size_code_3(
            registers, vec, before=bitmap, w=rank, count=count_after, pool_index=base
        )
        bitmap |= 1 << rank
        if rank < w - 1:
            assert (chosen, out, passes) == ("consume_aggregated", None, 4)
        else:
            assert chosen == "consume_multicast" and passes == 12
            sums = [wrap(sum(col)) for col in zip(*vectors, strict=True)]
            assert out == sums
    assert sorted(registers) == [base, base + 2, base + 4, base + 6]
    chosen, again, passes = simulate_size_code_3(
        registers, vectors[0], before=bitmap, w=0, count=0, pool_index=base
    )
    assert (chosen, passes) == ("consume_unicast", 12) and again == out
    chosen, _, passes = simulate_size_code_3(
        registers, vectors[0], before=bitmap, w=0, count=1, pool_index=base
    )
    assert (chosen, passes) == ("retransmit_pending", 1)


def test_size_code_3_single_worker_writes() -> None:
    """W = 1: every packet is first and last: written (not added) and multicast."""
    registers: dict[int, list[list[int]]] = {0: [[7, 7] for _ in range(32)]}
    vec = list(range(256))
    chosen, out, passes = simulate_size_code_3(registers, vec, before=0, w=0, count=0, pool_index=0)
    assert (chosen, out, passes) == ("consume_multicast", vec, 12)


def test_bitmap_update_sets_own_set_and_clears_other() -> None:
    """§2 step 1: a packet for set s sets the worker's bit in s and clears it in 1 - s."""
    t = P4.table("update_bitmap")
    assert t.apply(set=0) == "contribute_to_set0" and t.apply(set=1) == "contribute_to_set1"
    for s in (0, 1):
        body = _block(P4.text, rf"\)\s*update_set{s}\s*=")
        o = 1 - s
        assert f"before = value.set{s};" in body
        assert f"value.set{s} = value.set{s} | ig_md.worker_bit;" in body
        assert f"value.set{o} = value.set{o} & ~ig_md.worker_bit;" in body


def section1_check(msg_type: int, size: int, udp_len: int, job_code: int) -> str:
    """§1 checks as swemu's kernel orders them: malformed, then wrong size code."""
    if msg_type != wire.MSG_TYPE or udp_len - 8 != wire.packet_len(size):
        return "malformed"
    return "wrong_size" if size != job_code else "well_formed"


LENGTHS = sorted({8 + wire.packet_len(c) for c in range(8)} | {8, 17, 18, 19, 8 + 262, 8 + 270})


@pytest.mark.parametrize("udp_len", LENGTHS)
def test_check_packet_table_is_section_1(udp_len: int) -> None:
    """check_packet accepts exactly the well-formed packets of the job's size code 1 or
    3, and tells wrong-size from malformed as the emulator does; a job of another size
    code (emulator only) can never have a packet accepted here."""
    t = P4.table("check_packet")
    for msg_type in range(16):
        for size in range(8):
            args = {"msg_type": msg_type, "size": size, "len": udp_len}
            for job_code in (1, 3):
                got = t.apply(size_code=job_code, **args)
                assert got == section1_check(msg_type, size, udp_len, job_code)
            for job_code in (0, 2, 4, 5, 6, 7):
                assert t.apply(size_code=job_code, **args) != "well_formed"


# ----------------------------------------------------------------------------- structure
def test_files_have_include_guards() -> None:
    """Every included file guards itself (STYLE.md §6)."""
    for name, text in P4.files.items():
        if name == "switchml.p4":
            continue
        m = re.search(r"#ifndef\s+(\w+)\s*\n\s*#define\s+(\w+)", text)
        assert m and m.group(1) == m.group(2), name
        assert text.rstrip().endswith(f"#endif /* {m.group(1)} */"), name


def test_top_level_includes_every_file() -> None:
    """switchml.p4 includes TNA and every other file, and instantiates the Switch."""
    top = P4.files["switchml.p4"]
    included = set(re.findall(r'#include\s+"([\w.]+)"', top))
    assert included == set(P4.files) - {"switchml.p4"}
    assert "#include <tna.p4>" in top and "#include <core.p4>" in top
    assert re.search(r"\bSwitch\(pipe\)\s+main;", top)


def test_brackets_balance() -> None:
    """A cheap syntax guard in lieu of a compiler: (), {} and <> of types balance."""
    for name, text in P4.files.items():
        code = source.strip_comments(text)
        assert code.count("{") == code.count("}"), name
        assert code.count("(") == code.count(")"), name
        assert len(re.findall(r"\b(?:bit|int)<", code)) <= code.count(">"), name


def test_resource_estimate() -> None:
    """32 value pairs + bitmap + count + exponents fit the 48 stateful ALUs of a pipe."""
    registers = len(re.findall(r"\bRegister<", P4.text))
    pairs = P4.text.count("ValuePair() pair")
    assert pairs == 32
    assert registers == 4  # bitmap, count, exponents, one value pair (instantiated 32 times)
    assert pairs + (registers - 1) <= 48
    assert math.log2(P4.value("NUM_POOL_SLOTS")) == P4.value("POOL_SLOT_BITS")
