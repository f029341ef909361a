"""The P4 program (p4/*.p4) against the Python side: headers, constants, decision tables.

bf-p4c cannot run here, so these tests read the P4 source itself: a small
reader strips comments, collects ``#define``/``const``/``typedef``, header
declarations and tables' ``const entries``. They check that

* the ``switchml_h`` and ``switchml_values_h`` headers are PROTOCOL.md §1 bit for
  bit, as :mod:`swemu.wire` encodes it (byte layout of ``HEADER_DTYPE``, the bit
  fields of byte 0 and of pool_index, signedness, values per packet);
* the constants that mirror Python constants agree with them;
* the tables whose const entries encode §1-§2 (packet checks, retransmission,
  write/add/read, next step) choose what the protocol says, for every input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from swemu import wire
from swemu.engine import EMULATOR_ONLY_ACTIONS, Action

P4_DIR = Path(__file__).resolve().parent.parent / "p4"


# ----------------------------------------------------------------------------- reader
@dataclass(frozen=True)
class Field:
    """One header field: name, width in bits, and whether it is ``int<>`` (signed)."""

    name: str
    width: int
    signed: bool


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


class P4Source:
    """The P4 files of p4/, comment-free, with what these tests need from them."""

    def __init__(self, directory: Path = P4_DIR) -> None:
        self.files = {p.name: p.read_text() for p in sorted(directory.glob("*.p4"))}
        self.text = "\n".join(_strip_comments(t) for t in self.files.values())
        self.defines: dict[str, str] = {}
        self.macros: dict[str, tuple[list[str], str]] = {}
        for m in re.finditer(r"^\s*#define\s+(\w+)(\(([^)]*)\))?[ \t]*(.*)$", self.text, re.M):
            name, has_args, args, body = m.groups()
            if has_args:
                self.macros[name] = ([a.strip() for a in args.split(",")], body.strip())
            else:
                self.defines[name] = body.strip()
        self.consts = {
            m.group(2): m.group(3).strip()
            for m in re.finditer(
                r"\bconst\s+(bit|int)<\s*\d+\s*>\s+(\w+)\s*=\s*([^;]+);", self.text
            )
        }
        self.typedefs = {
            m.group(3): (m.group(1), m.group(2))
            for m in re.finditer(r"\btypedef\s+(bit|int)<([^>]+)>\s+(\w+)\s*;", self.text)
        }

    # -- values
    def value(self, expr: str) -> int:
        """Evaluate a constant expression: literals (``32w1``, ``0xBEE0``), named
        constants and macros, and + - * << >> & | ~ with parentheses."""
        expr = re.sub(r"\b\d+w(0x[0-9a-fA-F]+|\d+)\b", r"\1", expr)
        for _ in range(10):  # names may refer to names
            expr = re.sub(
                r"\b[A-Za-z_]\w*\b",
                lambda m: f"({self.defines.get(m.group(), self.consts.get(m.group(), m.group()))})",
                expr,
            )
            if not re.search(r"[A-Za-z_]", re.sub(r"0x[0-9a-fA-F]+", "", expr)):
                break
        if not re.fullmatch(r"[\s0-9a-fA-Fx()+\-*<>&|~]*", expr):
            raise ValueError(f"not a constant expression: {expr!r}")
        return int(eval(expr, {"__builtins__": {}}))

    def width(self, type_name: str) -> tuple[int, bool]:
        """Bit width and signedness of ``bit<N>``, ``int<N>``, a typedef or a TNA type."""
        m = re.fullmatch(r"(bit|int)<(.+)>", type_name)
        if m:
            return self.value(m.group(2)), m.group(1) == "int"
        if type_name in self.typedefs:
            kind, width = self.typedefs[type_name]
            return self.value(width), kind == "int"
        tna = {"PortId_t": 9, "MulticastGroupId_t": 16}
        return tna[type_name], False

    def header(self, name: str) -> list[Field]:
        """The fields of ``header name { ... }``, in order."""
        m = re.search(rf"\bheader\s+{name}\s*\{{(.*?)\}}", self.text, re.S)
        assert m, f"header {name} not found"
        fields = []
        for fm in re.finditer(r"([\w]+(?:<[^>]+>)?)\s+(\w+)\s*;", m.group(1)):
            width, signed = self.width(fm.group(1))
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
        entries = []
        for entry in _split_top(self.expand(_block(body, r"\bconst\s+entries\s*=")), ";"):
            keyset, action = entry.rsplit(":", 1)
            keyset = keyset.strip()
            if keyset.startswith("(") and keyset.endswith(")"):
                keyset = keyset[1:-1]
            entries.append(([self.keyset(k) for k in _split_top(keyset, ",")], _name(action)))
        default = re.search(r"default_action\s*=\s*(\w+)", body)
        return Table(name, keys, entries, default.group(1) if default else "NoAction")

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

    def apply(self, **key_values: int) -> str:
        """The action chosen for key values given by the key's last name component."""
        values = [key_values[k.split(".")[-1].replace("()", "")] for k in self.keys]
        for keyset, action in self.entries:
            assert len(keyset) == len(values), f"{self.name}: entry arity"
            if all(
                k is None or (v & k[1]) == (k[0] & k[1])
                for k, v in zip(keyset, values, strict=True)
            ):
                return action
        return self.default


def _block(text: str, start: str) -> str:
    """The text inside the first ``{...}`` that follows the regex ``start``."""
    m = re.search(start, text)
    assert m, f"{start!r} not found"
    i = text.index("{", m.end())
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    raise AssertionError(f"unbalanced braces after {start!r}")


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
VALUES = P4.header("switchml_values_h")


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
    set (bit 15) | bit 14 | slot (bits 13..0) -- the masks swemu.wire uses."""
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
    """switchml_values_h: values_per_packet(1) int32 fields v00..v63, so header plus
    values are exactly packet_len(1) bytes."""
    n = wire.values_per_packet(P4.value("SIZE_CODE_SUPPORTED"))
    assert n == wire.values_per_packet(1) == P4.value("VALUES_PER_PACKET")
    assert [f.name for f in VALUES] == [f"v{i:02d}" for i in range(n)]
    assert all(f.width == 32 for f in VALUES)
    total_bits = sum(f.width for f in SWITCHML) + sum(f.width for f in VALUES)
    assert total_bits == 8 * wire.packet_len(1)


def test_every_value_is_aggregated_once() -> None:
    """Aggregate hands each value field to exactly one register pair, as (i, i + 32)."""
    calls = re.findall(r"pair(\d+)\.apply\(v\.(v\d+), v\.(v\d+), ig_md\)", P4.text)
    assert len(calls) == len(VALUES) // 2
    used = [name for _, first, second in calls for name in (first, second)]
    assert sorted(used) == [f.name for f in VALUES]
    for pair, first, second in calls:
        assert (int(first[1:]), int(second[1:])) == (int(pair), int(pair) + len(VALUES) // 2)


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
    assert P4.value("SIZE_CODE_SUPPORTED") in wire.HARDWARE_SIZE_CODES


def test_types_fit_the_constants() -> None:
    """Bitmaps have a bit per worker, ids address every worker, indices every entry."""
    assert P4.width("worker_bitmap_t") == (P4.value("MAX_WORKERS"), False)
    assert 1 << P4.width("worker_id_t")[0] == P4.value("MAX_WORKERS")
    assert P4.width("slot_t") == (P4.value("SLOT_INDEX_BITS"), False)
    assert P4.width("exponent_t") == (8, True)
    assert 1 << P4.value("POOL_SLOT_BITS") == P4.value("NUM_POOL_SLOTS") <= wire.MAX_SLOTS
    assert P4.value("POOL_INDEX_BITS") == P4.value("POOL_SLOT_BITS") + 1
    assert P4.value("COUNTER_INDEX_BITS") == P4.value("JOB_ID_BITS") + 3
    assert P4.value("COUNTER_SIZE") == 1 << P4.value("COUNTER_INDEX_BITS")
    assert 2 ** P4.width("count_t")[0] > P4.value("MAX_WORKERS")
    assert sum(f.width for f in P4.header("switchml_md_h")) % 8 == 0


def test_action_codes_are_the_engines() -> None:
    """ACTION_* of configuration.p4 number the outcomes as swemu.engine.Action does."""
    for action in (a for a in Action if a not in EMULATOR_ONLY_ACTIONS):
        assert P4.value(f"ACTION_{action.name}") == action.value, action.name


# ----------------------------------------------------------------------------- tables
NEXT_STEP_ACTIONS = {
    "aggregated": Action.AGGREGATED,
    "multicast_result": Action.MULTICAST,
    "retransmit_pending": Action.RETRANSMIT_PENDING,
    "unicast_result": Action.UNICAST,
}


def section2_next_step(retransmission: bool, count_after: int) -> Action:
    """§2 step 5 (count_after: workers still missing after the packet)."""
    if not retransmission:
        return Action.MULTICAST if count_after == 0 else Action.AGGREGATED
    return Action.UNICAST if count_after == 0 else Action.RETRANSMIT_PENDING


@given(before=st.integers(0, 2**32 - 1), w=st.integers(0, 31), count=st.integers(0, 31))
def test_next_step_table_is_section_2(before: int, w: int, count: int) -> None:
    """next_step's const entries give the §2 step-5 decision for every input."""
    map_result = before & (1 << w)
    chosen = P4.table("next_step").apply(map_result=map_result, count=count)
    assert NEXT_STEP_ACTIONS[chosen] == section2_next_step(map_result != 0, count)


def test_next_step_actions_count_their_outcome() -> None:
    """Each next_step action records the Action of the same name in action_code."""
    for name, action in NEXT_STEP_ACTIONS.items():
        assert f"ig_md.action_code = ACTION_{action.name};" in P4.action_body(name), name
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
    keys = {"worker_id": w, "worker_bitmap_before": before, "map_result": before & (1 << w)}
    if before == 0:
        want = first
    elif before & (1 << w):
        want = retransmission
    else:
        want = new
    assert t.apply(harvest=0, **keys) == want
    assert t.apply(harvest=1, **keys) == harvest


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
    """check_packet accepts exactly the well-formed packets of the job's size code 1, and
    tells wrong-size from malformed as the emulator does; a job of another size code
    (emulator only) can never have a packet accepted here."""
    t = P4.table("check_packet")
    for msg_type in range(16):
        for size in range(8):
            args = {"msg_type": msg_type, "size": size, "len": udp_len}
            assert t.apply(size_code=1, **args) == section1_check(msg_type, size, udp_len, 1)
            for job_code in (0, 2, 3):
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
        code = _strip_comments(text)
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
