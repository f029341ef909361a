"""The BF Runtime names of p4/switchml.p4, read from the P4 source itself, and
compared with the ``bfrt.json`` bf-p4c writes.

bf-p4c writes the program's BF Runtime schema (``bfrt.json``, p4/build.sh) when
it compiles; so that a controller can be checked without it, this module derives
the part a controller needs from the ``.p4`` files with a few regular expressions:
every table the control plane can write (full name, key fields and match kinds,
actions and their data fields with widths, size), every register (index range, data fields) and
counter, plus the fixed ``$pre.*`` tables of the packet replication engine. It
follows bf-p4c's naming: ``pipe.<Ingress|Egress>.<instance path>.<name>`` for
tables, ``<Ingress|Egress>.<instance path>.<action>`` for actions, ``$valid``
for an ``isValid()`` key, ``<register path>.<field>`` for a struct register's
fields and ``<register path>.f1`` for a plain one (the rules of p4c's
backends/tofino/bf-p4c/control-plane/bfruntime.cpp and bfruntime_arch_handler.h).

:class:`p4.controller.recording_bfrt.RecordingBfrt` checks every write against
it, so that the Tofino target cannot name a table, field or action the program
does not have, or write a value wider than its field. :func:`load_bfrt_json` reads
the same view from a compiled ``bfrt.json`` and :func:`compare` lists where the
two differ (``python -m p4.controller.p4_schema p4/build/switchml/bfrt.json``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from p4.source import P4_DIR, P4Source, block

TNA_FIELD_WIDTHS = {"eg_intr_md.egress_rid": 16, "ig_intr_md.ingress_port": 9}
#: Control parameters that are the program's own structs.
ROOT_TYPES = {"hdr": "header_t", "ig_md": "ingress_metadata_t", "eg_md": "egress_metadata_t"}
#: Pipeline controls of switchml.p4 and the gress name BF Runtime gives each.
PIPELINE_CONTROLS = {"Ingress": "Ingress", "Egress": "Egress"}


@dataclass
class TableSchema:
    """One BF Runtime table: a match table, a register, a counter or a PRE table."""

    name: str
    kind: str  # "match", "register", "counter", "pre"
    size: int
    keys: dict[str, str] = field(default_factory=dict)  # key field -> match kind
    key_widths: dict[str, int] = field(default_factory=dict)
    actions: dict[str, dict[str, int]] = field(default_factory=dict)  # action -> {param: width}
    data_fields: dict[str, int] = field(default_factory=dict)  # registers, counters, PRE
    const_entries: bool = False  # the program fixes the entries: not writable

    @property
    def writable(self) -> bool:
        return self.kind != "counter" and not self.const_entries


class P4Program(P4Source):
    """The P4 sources of a directory (:class:`p4.source.P4Source`), read for the
    tables, registers and counters BF Runtime exposes."""

    def field_width(self, path: str) -> int | None:
        """Bits of a key field (``hdr.ipv4.src_addr``, ``hdr.arp.$valid``), or None
        for a field of an intrinsic metadata type this reader does not know."""
        if path.endswith(".$valid"):
            return 1
        root, *members = path.split(".")
        type_name = ROOT_TYPES.get(root)
        if type_name is None:
            return TNA_FIELD_WIDTHS.get(path)
        for member in members:
            types = dict((n, t) for t, n in self.structs.get(type_name, []))
            if member not in types:
                return None
            type_name = types[member]
        return self.width(type_name)

    # ------------------------------------------------------------------ schema
    def schema(self) -> dict[str, TableSchema]:
        """Every table BF Runtime would expose for this program, by full name."""
        tables: dict[str, TableSchema] = {}
        for control, gress in PIPELINE_CONTROLS.items():
            self._collect(control, gress, gress, tables)
        tables["$pre.mgid"] = TableSchema(
            "$pre.mgid",
            "pre",
            size=1 << 16,
            keys={"$MGID": "exact"},
            key_widths={"$MGID": 16},
            data_fields={
                "$MULTICAST_NODE_ID": 32,
                "$MULTICAST_NODE_L1_XID_VALID": 1,
                "$MULTICAST_NODE_L1_XID": 16,
            },
        )
        tables["$pre.node"] = TableSchema(
            "$pre.node",
            "pre",
            size=1 << 24,
            keys={"$MULTICAST_NODE_ID": "exact"},
            key_widths={"$MULTICAST_NODE_ID": 32},
            data_fields={"$MULTICAST_RID": 16, "$MULTICAST_LAG_ID": 8, "$DEV_PORT": 9},
        )
        return tables

    def _collect(self, control: str, gress: str, path: str, out: dict[str, TableSchema]) -> None:
        body = self.controls[control]
        # sub-control instances: `WorkerLookup() worker_lookup;`
        for m in re.finditer(r"^\s*(\w+)\s*\(\s*\)\s*(\w+)\s*;", body, re.M):
            if m.group(1) in self.controls:
                self._collect(m.group(1), gress, f"{path}.{m.group(2)}", out)
        actions = self._actions(body)
        for m in re.finditer(r"\btable\s+(\w+)\s*\{", body):
            tbody = block(body, m.start())
            key_text = re.search(r"\bkey\s*=\s*\{([^}]*)\}", tbody)
            keys = {}
            for km in re.finditer(
                r"([\w.()]+?)\s*:\s*(\w+)\s*;", key_text.group(1) if key_text else ""
            ):
                keys[re.sub(r"\.isValid\(\)$", ".$valid", km.group(1))] = km.group(2)
            action_list = re.search(r"\bactions\s*=\s*\{([^}]*)\}", tbody)
            names = re.findall(
                r"(?:@\w+\s+)?(\w+)\s*;", action_list.group(1) if action_list else ""
            )
            size = re.search(r"\bsize\s*=\s*([^;]+);", tbody)
            out[f"pipe.{path}.{m.group(1)}"] = TableSchema(
                f"pipe.{path}.{m.group(1)}",
                "match",
                size=self.value(size.group(1)) if size else 1024,
                keys=keys,
                key_widths={k: w for k in keys if (w := self.field_width(k)) is not None},
                actions={
                    ("NoAction" if a == "NoAction" else f"{path}.{a}"): actions.get(a, {})
                    for a in names
                },
                const_entries=bool(re.search(r"\bconst\s+entries\b", tbody)),
            )
        for m in re.finditer(r"\bRegister<\s*(\w+)\s*,\s*\w+\s*>\s*\(([^)]*)\)\s*(\w+)\s*;", body):
            value_type, size, name = m.groups()
            reg = f"{path}.{name}"
            if value_type in self.structs:
                fields = {f"{reg}.{f}": self.width(t) for t, f in self.structs[value_type]}
            else:
                fields = {f"{reg}.f1": self.width(value_type)}
            out[f"pipe.{reg}"] = TableSchema(
                f"pipe.{reg}",
                "register",
                size=self.value(size),
                keys={"$REGISTER_INDEX": "exact"},
                key_widths={"$REGISTER_INDEX": 32},
                data_fields=fields,
            )
        for m in re.finditer(r"\bCounter<.*?>\s*\(([^,]+),[^)]*\)\s*(\w+)\s*;", body):
            out[f"pipe.{path}.{m.group(2)}"] = TableSchema(
                f"pipe.{path}.{m.group(2)}",
                "counter",
                size=self.value(m.group(1)),
                keys={"$COUNTER_INDEX": "exact"},
                data_fields={"$COUNTER_SPEC_PKTS": 64, "$COUNTER_SPEC_BYTES": 64},
            )

    def _actions(self, body: str) -> dict[str, dict[str, int]]:
        """Actions of a control body with their control-plane parameters (directionless
        ones: ``in``/``out`` parameters are arguments of internal calls)."""
        found = {}
        for m in re.finditer(r"\baction\s+(\w+)\s*\(([^)]*)\)", body):
            params = {}
            for p in filter(None, (x.strip() for x in m.group(2).split(","))):
                words = p.split()
                if words[0] in ("in", "out", "inout"):
                    continue
                params[words[-1]] = self.width(" ".join(words[:-1]))
            found[m.group(1)] = params
        return found


def load_schema(directory: Path | str = P4_DIR) -> dict[str, TableSchema]:
    """The BF Runtime tables of the program in ``directory`` (default: this repository's)."""
    return P4Program(directory).schema()


# ------------------------------------------------------------------ bfrt.json
#: bfrt.json table types and the kinds above (other types are not compared).
BFRT_KINDS = {
    "MatchAction_Direct": "match",
    "MatchAction_Indirect": "match",
    "Register": "register",
    "Counter": "counter",
    "PreMgid": "pre",
    "PreNode": "pre",
}


def _width(field_spec: dict) -> int:
    """Bits of a bfrt.json key or data field: ``type.width`` for ``bytes``, 1 for
    ``bool``, and the width in the name of a fixed-size integer type (bf-p4c writes
    ``{"type": "uint32"}`` without a width for ``$REGISTER_INDEX`` / ``$COUNTER_INDEX``
    and ``uint64`` for counter data)."""
    ftype = field_spec.get("type", {})
    kind = str(ftype.get("type", ""))
    if kind == "bool":
        return 1
    if "width" not in ftype and kind.startswith("uint") and kind[4:].isdigit():
        return int(kind[4:])
    return int(ftype.get("width", 0))


def load_bfrt_json(path: Path | str) -> dict[str, TableSchema]:
    """The tables of a bf-p4c ``bfrt.json`` (its ``tables`` list), in this module's terms:
    key fields with match kinds and widths, actions with their data fields, the data
    fields of registers, counters and PRE tables. Internal fields (``$MATCH_PRIORITY``)
    are left out of the keys, as a controller gives them apart."""
    with open(path) as f:
        doc = json.load(f)
    tables: dict[str, TableSchema] = {}
    for t in doc.get("tables", []):
        kind = BFRT_KINDS.get(t.get("table_type", ""))
        if kind is None:
            continue
        keys = {
            k["name"]: k.get("match_type", "Exact").lower()
            for k in t.get("key", [])
            if k["name"] != "$MATCH_PRIORITY"
        }
        widths = {k["name"]: _width(k) for k in t.get("key", []) if k["name"] in keys}
        actions = {
            a["name"]: {d["name"]: _width(d) for d in a.get("data", [])}
            for a in t.get("action_specs", [])
        }
        data = {}
        for d in t.get("data", []):
            spec = d.get("singleton", d)
            if "name" in spec:
                data[spec["name"]] = _width(spec)
        tables[t["name"]] = TableSchema(
            t["name"],
            kind,
            size=int(t.get("size", 0)),
            keys=keys,
            key_widths=widths,
            actions=actions,
            data_fields=data,
        )
    return tables


def compare(
    source: dict[str, TableSchema],
    compiled: dict[str, TableSchema],
    names: set[str] | None = None,
) -> list[str]:
    """Where the compiled schema does not have what the source schema says, one line
    each: tables (``names``: only these; default all but the PRE's, which the SDE
    defines), their keys with match kinds and widths, actions with data fields and
    widths, register data fields. Sizes are not compared (the compiler may round)."""
    problems = []
    wanted = names if names is not None else {n for n, t in source.items() if t.kind != "pre"}
    for name in sorted(wanted):
        want = source[name]
        got = compiled.get(name)
        if got is None:
            problems.append(f"{name}: not in bfrt.json")
            continue
        for key, match in want.keys.items():
            if key not in got.keys:
                problems.append(f"{name}: no key field {key}")
            elif got.keys[key] != match:
                problems.append(f"{name}: key {key} is {got.keys[key]}, the source says {match}")
            elif key in want.key_widths and got.key_widths.get(key) != want.key_widths[key]:
                problems.append(
                    f"{name}: key {key} is {got.key_widths.get(key)} bits, "
                    f"the source says {want.key_widths[key]}"
                )
        for action, params in want.actions.items():
            if want.const_entries:
                break  # entries fixed by the program: the controller writes none
            if action not in got.actions:
                problems.append(f"{name}: no action {action}")
                continue
            for param, width in params.items():
                got_width = got.actions[action].get(param)
                if got_width != width:
                    problems.append(
                        f"{name}: {action}({param}) is {got_width} bits, the source says {width}"
                    )
        for data, width in want.data_fields.items():
            if want.kind != "register":
                continue
            if got.data_fields.get(data) != width:
                problems.append(
                    f"{name}: data field {data} is {got.data_fields.get(data)} bits, "
                    f"the source says {width}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m p4.controller.p4_schema BFRT_JSON``: compare it with p4/*.p4."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m p4.controller.p4_schema path/to/bfrt.json", file=sys.stderr)
        return 2
    try:
        compiled = load_bfrt_json(args[0])
    except (OSError, ValueError) as exc:
        print(f"error: cannot read {args[0]}: {exc}", file=sys.stderr)
        return 1
    problems = compare(load_schema(), compiled)
    for line in problems:
        print(line)
    print(f"{len(problems)} differences" if problems else "bfrt.json has every name of p4/*.p4")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
