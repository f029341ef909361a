"""P4Testgen's PTF tests as data: read a generated ``.py`` file into :class:`TestCase`\\ s.

P4Testgen's Tofino target writes one Python file of PTF classes ``Test<N>`` (its PTF back
end, ``backends/p4tools/modules/testgen/targets/tofino/test_backend/ptf.cpp``). Each class
says, in calls with literal arguments only:

* ``setupCtrlPlane``: ``self.insertTableEntry(table, [gc.KeyTuple(field, value[, mask]
  | low=, high= | prefix_len=)...], action, [gc.DataTuple(param, value)...])``,
  ``self.overrideDefaultEntry(table, action, [...])`` and ``self.setRegisterValue(register,
  value | [(field, value)...], index)``: the control plane and the registers before the
  packet;
* ``sendPacket``: ``ig_port = N`` and ``pkt = b'...'``, the packet and its port;
* ``verifyPackets``: ``eg_port = N``, ``exp_pkt = b'...'`` and
  ``exp_pkt.set_do_not_care(bit_offset, bit_count)``, the packet expected out (nothing:
  a drop), and -- with the project's generator patch
  (p4/model/patches/testgen-register-after-packet.patch) -- ``self.verifyRegisterValue(
  register, value | [(field, value)...], index)``, a register after the packet;
* a docstring with the trace of the path (tables, actions, branches taken) and a comment
  ``# Current statement coverage: X``.

The file is read with :mod:`ast`, never executed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class KeyField:
    """One field of a table key: exact (``mask`` None), ternary (``mask``), range
    (``low``/``high``) or lpm (``prefix_len``)."""

    name: str
    value: int = 0
    mask: int | None = None
    low: int | None = None
    high: int | None = None
    prefix_len: int | None = None


@dataclass
class TableEntry:
    """A table entry the test installs, or (``default`` True) a default action it sets."""

    table: str
    action: str
    params: dict[str, int]
    key: list[KeyField] = field(default_factory=list)
    default: bool = False


@dataclass
class RegisterValue:
    """One register entry: its value before the packet and, where the generator says,
    after it. A struct register's value is a dict of its fields (``set0``, ``first``...),
    a plain one an int."""

    name: str
    index: int
    before: dict[str, int] | int
    after: dict[str, int] | int | None = None


@dataclass
class Expected:
    """The packet expected out of ``port``; ``dont_care`` lists (bit offset, bit count)."""

    port: int
    packet: bytes
    dont_care: list[tuple[int, int]] = field(default_factory=list)

    def care_mask(self) -> bytes:
        """One byte per packet byte: bits that must match set."""
        mask = bytearray(b"\xff" * len(self.packet))
        for offset, count in self.dont_care:
            for bit in range(offset, min(offset + count, 8 * len(mask))):
                mask[bit // 8] &= ~(0x80 >> (bit % 8)) & 0xFF
        return bytes(mask)


@dataclass
class TestCase:
    """One generated test: control plane, registers, the packet in, what comes out."""

    name: str
    port: int
    packet: bytes
    entries: list[TableEntry] = field(default_factory=list)
    registers: list[RegisterValue] = field(default_factory=list)
    expected: Expected | None = None  # None: the packet is dropped
    trace: list[str] = field(default_factory=list)
    coverage: float | None = None

    __test__ = False  # not a pytest class

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly dict (bytes as hex)."""
        d = asdict(self)
        d["packet"] = self.packet.hex()
        if self.expected is not None:
            d["expected"]["packet"] = self.expected.packet.hex()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TestCase:
        exp = d.get("expected")
        return cls(
            name=d["name"],
            port=d["port"],
            packet=bytes.fromhex(d["packet"]),
            entries=[
                TableEntry(
                    e["table"],
                    e["action"],
                    dict(e["params"]),
                    [KeyField(**k) for k in e["key"]],
                    e.get("default", False),
                )
                for e in d["entries"]
            ],
            registers=[RegisterValue(**r) for r in d["registers"]],
            expected=None
            if exp is None
            else Expected(
                exp["port"],
                bytes.fromhex(exp["packet"]),
                [tuple(m) for m in exp["dont_care"]],
            ),
            trace=list(d.get("trace", [])),
            coverage=d.get("coverage"),
        )


class PtfFormatError(ValueError):
    """The file is not the PTF P4Testgen writes (a call or argument this reader does not know)."""


def _name(node: ast.expr) -> str:
    """A table, action or register name without the BF Runtime's ``pipe.`` prefix."""
    return str(_literal(node)).removeprefix("pipe.")


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as e:
        raise PtfFormatError(f"line {node.lineno}: not a literal: {ast.unparse(node)}") from e


def _call_name(node: ast.expr) -> str:
    """``self.insertTableEntry`` -> ``insertTableEntry``; ``gc.KeyTuple`` -> ``KeyTuple``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _key_field(node: ast.expr) -> KeyField:
    if not (isinstance(node, ast.Call) and _call_name(node.func) == "KeyTuple"):
        raise PtfFormatError(f"line {node.lineno}: expected gc.KeyTuple(...)")
    args = [_literal(a) for a in node.args]
    kw = {k.arg: _literal(k.value) for k in node.keywords}
    key = KeyField(args[0])
    if "low" in kw:
        key.low, key.high = kw["low"], kw["high"]
    elif "prefix_len" in kw:
        key.value, key.prefix_len = args[1], kw["prefix_len"]
    else:
        key.value = args[1]
        key.mask = args[2] if len(args) > 2 else None
    return key


def _data_fields(node: ast.expr) -> dict[str, int]:
    if not isinstance(node, ast.List):
        raise PtfFormatError(f"line {node.lineno}: expected a list of gc.DataTuple")
    out = {}
    for item in node.elts:
        if not (isinstance(item, ast.Call) and _call_name(item.func) == "DataTuple"):
            raise PtfFormatError(f"line {item.lineno}: expected gc.DataTuple(...)")
        name, value = (_literal(a) for a in item.args)
        out[name] = value
    return out


def _register_value(value: Any) -> dict[str, int] | int:
    """``[('Ingress.r.r.first', 1), ...]`` -> ``{'first': 1, ...}``; an int stays."""
    if isinstance(value, list):
        return {name.rsplit(".", 1)[-1]: int(v) for name, v in value}
    return int(value)


def _method(cls: ast.ClassDef, name: str) -> list[ast.stmt]:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node.body
    return []


def _calls(body: list[ast.stmt]) -> list[ast.Call]:
    return [s.value for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]


def _assignments(body: list[ast.stmt]) -> dict[str, Any]:
    out = {}
    for s in body:
        if (
            isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name)
            and not isinstance(s.value, ast.Call)
        ):
            out[s.targets[0].id] = _literal(s.value)
    return out


def parse_test(cls: ast.ClassDef, source: str | list[str]) -> TestCase:
    """One ``Test<N>`` class (``source``: the file, or its lines as
    :func:`parse_file` passes them, split once for every class)."""
    send = _assignments(_method(cls, "sendPacket"))
    if "pkt" not in send:
        raise PtfFormatError(f"{cls.name}: no packet is sent")
    test = TestCase(name=cls.name, port=int(send["ig_port"]), packet=bytes(send["pkt"]))
    doc = ast.get_docstring(cls, clean=True) or ""
    test.trace = [line for line in doc.splitlines() if line.strip()]
    lines = source.splitlines(keepends=True) if isinstance(source, str) else source
    segment = "".join(lines[cls.lineno - 1 : cls.end_lineno or cls.lineno])
    m = re.search(r"#\s*Current statement coverage:\s*([0-9.eE+-]+)", segment)
    if m:
        test.coverage = float(m.group(1))

    for call in _calls(_method(cls, "setupCtrlPlane")):
        what = _call_name(call.func)
        if what == "insertTableEntry":
            table = _name(call.args[0])
            keys = call.args[1]
            if not isinstance(keys, ast.List):
                raise PtfFormatError(f"line {call.lineno}: expected a list of keys")
            if _literal(call.args[2]) is None:
                raise PtfFormatError(f"line {call.lineno}: action profiles are not read")
            action = _name(call.args[2])
            test.entries.append(
                TableEntry(
                    table, action, _data_fields(call.args[3]), [_key_field(k) for k in keys.elts]
                )
            )
        elif what == "overrideDefaultEntry":
            table, action = _name(call.args[0]), _name(call.args[1])
            params = _data_fields(call.args[2]) if len(call.args) > 2 else {}
            test.entries.append(TableEntry(table, action, params, default=True))
        elif what == "setRegisterValue":
            name = _name(call.args[0])
            value = _register_value(_literal(call.args[1]))
            test.registers.append(RegisterValue(name, int(_literal(call.args[2])), value))
        else:
            raise PtfFormatError(f"line {call.lineno}: unknown control-plane call {what}")

    verify = _method(cls, "verifyPackets")
    out = _assignments(verify)
    if "exp_pkt" in out:
        test.expected = Expected(int(out["eg_port"]), bytes(out["exp_pkt"]))
    for call in _calls(verify):
        what = _call_name(call.func)
        if what == "set_do_not_care" and test.expected is not None:
            offset, count = (int(_literal(a)) for a in call.args)
            test.expected.dont_care.append((offset, count))
        elif what == "verifyRegisterValue":
            name = _name(call.args[0])
            index = int(_literal(call.args[2]))
            after = _register_value(_literal(call.args[1]))
            for reg in test.registers:
                if reg.name == name and reg.index == index:
                    reg.after = after
                    break
            else:
                raise PtfFormatError(f"line {call.lineno}: {name}[{index}] has no value before")
        elif what not in ("verify_packet", "Mask"):
            raise PtfFormatError(f"line {call.lineno}: unknown verification call {what}")
    return test


def parse_file(source: str) -> list[TestCase]:
    """Every ``Test<N>`` class of a generated PTF file, in file order."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)  # once: a 17 MB file has 300 classes
    return [
        parse_test(node, lines)
        for node in tree.body
        if isinstance(node, ast.ClassDef) and re.fullmatch(r"Test\d+", node.name)
    ]
