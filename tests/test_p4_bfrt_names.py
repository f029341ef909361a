"""The BF Runtime names the controller and the PTF replay write, against the program.

* Now, without a compiler: every ``pipe.Ingress...`` / ``Ingress...`` / ``Egress...``
  name in ``p4/controller/*.py`` and ``p4/ptf/*.py`` is a table, action or field of
  the schema :mod:`p4.controller.p4_schema` derives from ``p4/*.p4`` with bf-p4c's
  naming rules (``pipe.<control>.<instance path>.<table>`` for tables,
  ``<control>.<path>.<action>`` for actions, ``<register path>.<field>`` for a
  register's data, ``.$valid`` for an ``isValid()`` key).
* With bf-p4c's output (``$SWITCHML_BFRT_JSON``, else ``p4/build/switchml/bfrt.json``
  from ``p4/build.sh``): the compiled ``bfrt.json`` has every table, key, action and
  register field of that schema with the same match kinds and widths, and every name
  the controller writes. Skipped, saying so, when no compiled schema is there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from p4.controller import bfrt_target as bt
from p4.controller.p4_schema import TableSchema, compare, load_bfrt_json, load_schema, main

REPO = Path(__file__).resolve().parent.parent
SCHEMA = load_schema()
SOURCES = sorted((REPO / "p4" / "controller").glob("*.py")) + sorted(
    (REPO / "p4" / "ptf").glob("*.py")
)
#: A BF Runtime name as a string literal: a table, an action or a data field.
NAME = re.compile(r"""["']((?:pipe\.)?(?:Ingress|Egress)\.[\w.$]+)["']""")


def names_written() -> dict[str, set[str]]:
    """Every quoted BF Runtime name in the controller and PTF sources, by file."""
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        hits = set(NAME.findall(path.read_text()))
        if hits:
            found[path.name] = hits
    return found


def known_names(schema: dict[str, TableSchema]) -> set[str]:
    """Tables, actions and data fields of a schema."""
    names = set(schema)
    for t in schema.values():
        names |= set(t.actions) | set(t.data_fields)
    return names


def test_controller_and_ptf_names_are_in_the_p4_source() -> None:
    """No name the controller or the PTF replay writes is missing from p4/*.p4."""
    written = names_written()
    assert "bfrt_target.py" in written and "test_switchml_vectors.py" in written
    known = known_names(SCHEMA)
    missing = {f: sorted(n - known) for f, n in written.items() if n - known}
    assert not missing


def test_ptf_short_table_names_are_unique_in_the_p4_source() -> None:
    """The PTF replay finds tables by their last name component: each must name one."""
    text = (REPO / "p4" / "ptf" / "test_switchml_vectors.py").read_text()
    short = set(re.findall(r"""self\.table\(\s*["']([\w$.]+)["']""", text))
    short |= set(re.findall(r"""^\s*["']([\w$.]+)["'],\s*$""", text, re.M)) & {
        n.rsplit(".", 1)[-1] for n in SCHEMA
    }
    assert {"worker_by_address", "worker_by_ip", "worker_address", "arp_icmp"} <= short
    for name in short:
        matches = [t for t in SCHEMA if t == name or t.endswith("." + name)]
        assert len(matches) == 1, (name, matches)


def test_controller_tables_and_keys_are_writable() -> None:
    """The tables the Tofino target writes exist, are writable, and its keys are theirs."""
    for name in (bt.WORKER_BY_ADDRESS, bt.WORKER_BY_IP, bt.WORKER_ADDRESS, bt.ARP_ICMP):
        assert SCHEMA[name].writable, name
    assert set(SCHEMA[bt.WORKER_BY_ADDRESS].keys) == {"hdr.ipv4.src_addr", "hdr.udp.src_port"}
    assert set(SCHEMA[bt.WORKER_BY_IP].keys) == {"hdr.ipv4.src_addr"}
    assert set(SCHEMA[bt.WORKER_ADDRESS].keys) == {"eg_intr_md.egress_rid"}
    assert set(SCHEMA[bt.WORKER_BY_ADDRESS].actions[bt.SET_WORKER]) == {
        "job_id",
        "worker_id",
        "worker_bit",
        "num_workers",
        "size_code",
        "pool_base",
        "pool_size",
        "mgid",
        "value_formats",
    }
    for register in (bt.WORKER_BITMAP, bt.COUNT):
        assert SCHEMA[register].kind == "register"
    # the fixed decision tables are const: nothing for a controller to write
    for name, table in SCHEMA.items():
        if name.endswith((".next_step", ".next_pass", ".aggregate", ".check_packet")):
            assert not table.writable, name


# ----------------------------------------------------------------------------- bfrt.json
def to_bfrt_json(schema: dict[str, TableSchema]) -> dict[str, Any]:
    """A bfrt.json document (the layout bf-p4c's control-plane/bfruntime.cpp writes:
    ``tables`` with ``name``, ``table_type``, ``size``, ``key``, ``action_specs``,
    ``data``) holding ``schema``: the test double of a compiler's output."""
    types = {"match": "MatchAction_Direct", "register": "Register", "counter": "Counter"}
    tables = []
    for t in schema.values():
        if t.kind == "pre":
            continue
        entry: dict[str, Any] = {
            "name": t.name,
            "table_type": types[t.kind],
            "size": t.size,
            "key": [
                {
                    "name": k,
                    "match_type": m.capitalize(),
                    # bf-p4c types a register's or counter's index as a width-less uint32
                    "type": {"type": "uint32"}
                    if k in ("$REGISTER_INDEX", "$COUNTER_INDEX")
                    else {"type": "bytes", "width": t.key_widths.get(k, 32)},
                }
                for k, m in t.keys.items()
            ],
            "action_specs": [
                {
                    "name": a,
                    "data": [
                        {"name": p, "type": {"type": "bytes", "width": w}} for p, w in ps.items()
                    ],
                }
                for a, ps in t.actions.items()
            ],
            "data": [
                {"singleton": {"name": d, "type": {"type": "bytes", "width": w}}}
                for d, w in t.data_fields.items()
            ],
        }
        if any(m == "ternary" for m in t.keys.values()):
            entry["key"].append(
                {"name": "$MATCH_PRIORITY", "match_type": "Exact", "type": {"type": "uint32"}}
            )
        tables.append(entry)
    return {"schema_version": "1.0.0", "tables": tables}


def test_compare_finds_drift(tmp_path: Path) -> None:
    """The bfrt.json reader and comparison have teeth: a faithful document compares
    clean, and a renamed table, a narrower key, a missing action parameter and a wrong
    register field are each reported."""
    doc = to_bfrt_json(SCHEMA)
    path = tmp_path / "bfrt.json"
    path.write_text(json.dumps(doc))
    assert compare(SCHEMA, load_bfrt_json(path)) == []
    assert main([str(path)]) == 0

    by_name = {t["name"]: t for t in doc["tables"]}
    by_name[bt.WORKER_BY_IP]["name"] = "pipe.Ingress.worker_lookup.workers_by_ip"
    by_name[bt.WORKER_BY_ADDRESS]["key"][1]["type"]["width"] = 8
    (spec,) = [a for a in by_name[bt.WORKER_ADDRESS]["action_specs"] if a["name"] == bt.TO_WORKER]
    spec["data"] = [d for d in spec["data"] if d["name"] != "udp_port"]
    by_name[bt.COUNT]["data"][0]["singleton"]["name"] = "Ingress.count_workers.count.f2"
    path.write_text(json.dumps(doc))
    problems = compare(SCHEMA, load_bfrt_json(path))
    assert f"{bt.WORKER_BY_IP}: not in bfrt.json" in problems
    assert any("hdr.udp.src_port is 8 bits, the source says 16" in p for p in problems)
    assert any(f"{bt.TO_WORKER}(udp_port) is None bits" in p for p in problems)
    assert any(
        p.startswith(f"{bt.COUNT}: data field Ingress.count_workers.count.f1") for p in problems
    )
    assert len(problems) == 4
    assert main([str(path)]) == 1
    assert main([str(tmp_path / "absent.json")]) == 1


def compiled_bfrt_json() -> Path | None:
    """bf-p4c's bfrt.json: ``$SWITCHML_BFRT_JSON``, else p4/build.sh's default output."""
    env = os.environ.get("SWITCHML_BFRT_JSON")
    path = Path(env) if env else REPO / "p4" / "build" / "switchml" / "bfrt.json"
    return path if path.is_file() else None


def test_compiled_bfrt_json_has_the_controllers_names() -> None:
    """Against bf-p4c's own output: every table, key, action and register field of
    p4/*.p4 as the controller sees them, and every name it and the PTF replay write."""
    path = compiled_bfrt_json()
    if path is None:
        pytest.skip("no compiled bfrt.json: run p4/build.sh with bf-p4c, or set SWITCHML_BFRT_JSON")
    compiled = load_bfrt_json(path)
    assert compare(SCHEMA, compiled) == []
    known = known_names(compiled)
    missing = {f: sorted(n - known) for f, n in names_written().items() if n - known}
    assert not missing


def test_ptf_pool_layout_is_the_controllers() -> None:
    """The PTF replay lays jobs out in the pool as the controller does (it cannot import
    the controller: it runs with the SDE's Python)."""
    text = (REPO / "p4" / "ptf" / "test_switchml_vectors.py").read_text()
    m = re.search(r"^ENTRIES_PER_SLOT = (\{[^}]*\})$", text, re.M)
    assert m and eval(m.group(1), {"__builtins__": {}}) == bt.ENTRIES_PER_SLOT
