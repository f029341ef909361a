"""An in-memory stand-in for the BF Runtime client, for where no Tofino exists.

:class:`RecordingBfrt` offers the three objects :class:`~p4.controller.bfrt_target.TofinoTarget`
uses from ``bfrt_grpc.client`` -- the module (``KeyTuple``, ``DataTuple``,
``Target``), ``bfrt_info`` (``table_get``) and the device target -- with the
table calls of the real client (``make_key``, ``make_data``, ``entry_add``,
``entry_mod``, ``entry_del``, ``entry_get``, ``info``). It keeps entries in
dictionaries and records every write, and it is strict where the switch is:

* every table, key field, action and data field must exist in the P4 program
  (:mod:`p4.controller.p4_schema`, read from ``p4/*.p4``), with no field
  missing or extra, and every value must fit its field's width;
* adding an entry that exists, or modifying/deleting one that does not, fails,
  as does writing a table the program fixes with ``const entries``, a counter,
  or a table beyond its size.

It replaces only the client (what cannot exist here); the Tofino target's logic
runs unchanged against it. ``switchml_ctl.py --target emulator`` prints its
writes as the dry run.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .p4_schema import TableSchema, load_schema


class BfrtError(RuntimeError):
    """What the real client raises as ``BfruntimeRpcException``."""


class KeyTuple:
    """``bfrt_grpc.client.KeyTuple``: one key field (with a mask for ternary)."""

    def __init__(
        self,
        name: str,
        value: Any = None,
        mask: Any = None,
        prefix_len: int | None = None,
        low: Any = None,
        high: Any = None,
    ) -> None:
        self.name, self.value, self.mask = name, value, mask


class DataTuple:
    """``bfrt_grpc.client.DataTuple``: one data field (scalar or array)."""

    def __init__(
        self,
        name: str,
        val: Any = None,
        float_val: float | None = None,
        str_val: str | None = None,
        int_arr_val: list[int] | None = None,
        bool_arr_val: list[bool] | None = None,
        bool_val: bool | None = None,
    ) -> None:
        self.name = name
        if int_arr_val is not None:
            self.val: Any = list(int_arr_val)
        elif bool_arr_val is not None:
            self.val = [bool(b) for b in bool_arr_val]
        elif bool_val is not None:
            self.val = bool(bool_val)
        else:
            self.val = val


class DeviceTarget:
    """``bfrt_grpc.client.Target``."""

    def __init__(self, device_id: int = 0, pipe_id: int = 0xFFFF) -> None:
        self.device_id, self.pipe_id = device_id, pipe_id


class Key:
    """A made key: field -> (value, mask)."""

    def __init__(self, fields: dict[str, tuple[Any, Any]]) -> None:
        self.fields = fields
        self.id = tuple(sorted((n, v, m) for n, (v, m) in fields.items()))

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {
            n: {"value": v} if m is None else {"value": v, "mask": m}
            for n, (v, m) in self.fields.items()
        }


class Data:
    """Made data: action (None for registers and PRE tables) and field values."""

    def __init__(self, action: str | None, fields: dict[str, Any]) -> None:
        self.action, self.fields = action, fields

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.fields)
        if self.action is not None:
            out["action_name"] = self.action
        out["is_default_entry"] = False
        return out


@dataclass
class Write:
    """One table call: ``op`` of ``entries`` (key dict, data dict or None) on ``table``."""

    op: str
    table: str
    entries: list[tuple[dict[str, Any], dict[str, Any] | None]]


def _fits(value: Any, width: int, where: str) -> None:
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool):
            continue
        if not isinstance(v, int) or not 0 <= v < (1 << width):
            raise BfrtError(f"{where}: {v!r} does not fit {width} bits")


class _Info:
    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema

    def name_get(self) -> str:
        return self.schema.name

    def size_get(self) -> int:
        return self.schema.size

    def key_field_name_list_get(self) -> list[str]:
        return list(self.schema.keys)

    def data_field_name_list_get(self, action_name: str | None = None) -> list[str]:
        if action_name is not None:
            return list(self.schema.actions[action_name])
        return list(self.schema.data_fields)


class RecordingTable:
    """One table of :class:`RecordingBfrt`."""

    def __init__(self, owner: RecordingBfrt, schema: TableSchema) -> None:
        self.owner = owner
        self.schema = schema
        self.info = _Info(schema)
        self.entries: dict[tuple, tuple[Key, Data]] = {}

    # -- making keys and data
    def make_key(self, key_tuples: list[KeyTuple]) -> Key:
        s = self.schema
        names = [k.name for k in key_tuples]
        if sorted(names) != sorted(s.keys):
            raise BfrtError(f"{s.name}: key fields {names}, the program has {list(s.keys)}")
        fields = {}
        for k in key_tuples:
            width = s.key_widths.get(k.name)
            value = int(k.value) if isinstance(k.value, bool) else k.value
            if s.keys[k.name] == "ternary":
                if k.mask is None:
                    raise BfrtError(f"{s.name}: ternary key {k.name} needs a mask")
                if width is not None:
                    _fits(k.mask, width, f"{s.name} mask {k.name}")
            elif k.mask is not None:
                raise BfrtError(f"{s.name}: {s.keys[k.name]} key {k.name} takes no mask")
            if width is not None:
                _fits(value, width, f"{s.name} key {k.name}")
            fields[k.name] = (value, k.mask)
        if s.kind == "register" and not 0 <= fields["$REGISTER_INDEX"][0] < s.size:
            raise BfrtError(f"{s.name}: index {fields['$REGISTER_INDEX'][0]} out of range")
        return Key(fields)

    def make_data(self, data_tuples: list[DataTuple], action_name: str | None = None) -> Data:
        s = self.schema
        names = [d.name for d in data_tuples]
        if s.kind == "match":
            if action_name not in s.actions:
                raise BfrtError(f"{s.name}: no action {action_name!r} (has {list(s.actions)})")
            wanted = s.actions[action_name]
            if sorted(names) != sorted(wanted):
                raise BfrtError(f"{s.name} {action_name}: data {names}, the action has {wanted}")
        else:
            if action_name is not None:
                raise BfrtError(f"{s.name}: a {s.kind} table has no actions")
            wanted = s.data_fields
            unknown = set(names) - set(wanted)
            if unknown:
                raise BfrtError(f"{s.name}: unknown data fields {sorted(unknown)}")
        for d in data_tuples:
            _fits(d.val, wanted[d.name], f"{s.name} data {d.name}")
        return Data(action_name, {d.name: d.val for d in data_tuples})

    # -- entries
    def _writable(self) -> None:
        if not self.schema.writable:
            raise BfrtError(f"{self.schema.name} is not writable by the control plane")

    def _record(self, op: str, pairs: list[tuple[Key, Data | None]]) -> None:
        self.owner._record(
            Write(op, self.schema.name, [(k.to_dict(), d and d.to_dict()) for k, d in pairs])
        )

    def entry_add(self, target: DeviceTarget, key_list: list[Key], data_list: list[Data]) -> None:
        self._writable()
        if self.schema.kind == "register":
            raise BfrtError(f"{self.schema.name}: register entries always exist; use entry_mod")
        for key, data in zip(key_list, data_list, strict=True):
            if key.id in self.entries:
                raise BfrtError(f"{self.schema.name}: entry {key.to_dict()} already exists")
            if len(self.entries) >= self.schema.size:
                raise BfrtError(f"{self.schema.name}: table full ({self.schema.size} entries)")
            self.entries[key.id] = (key, data)
        self._record("entry_add", list(zip(key_list, data_list)))

    def entry_mod(self, target: DeviceTarget, key_list: list[Key], data_list: list[Data]) -> None:
        self._writable()
        for key, data in zip(key_list, data_list, strict=True):
            if self.schema.kind != "register" and key.id not in self.entries:
                raise BfrtError(f"{self.schema.name}: no entry {key.to_dict()} to modify")
            self.entries[key.id] = (key, data)
        self._record("entry_mod", list(zip(key_list, data_list)))

    def entry_del(self, target: DeviceTarget, key_list: list[Key] | None = None) -> None:
        self._writable()
        if key_list is None:  # the real client: delete every entry
            key_list = [k for k, _ in self.entries.values()]
        for key in key_list:
            if key.id not in self.entries:
                raise BfrtError(f"{self.schema.name}: no entry {key.to_dict()} to delete")
            del self.entries[key.id]
        self._record("entry_del", [(k, None) for k in key_list])

    def entry_get(
        self,
        target: DeviceTarget,
        key_list: list[Key] | None = None,
        flags: dict[str, Any] | None = None,
        required_data: Any = None,
    ) -> Iterator[tuple[Data, Key]]:
        if key_list is None:
            yield from ((d, k) for k, d in self.entries.values())
            return
        for key in key_list:
            if key.id in self.entries:
                k, d = self.entries[key.id]
                yield d, k
            elif self.schema.kind == "register":
                yield Data(None, dict.fromkeys(self.schema.data_fields, 0)), key
            else:
                raise BfrtError(f"{self.schema.name}: no entry {key.to_dict()}")


class _BfrtInfo:
    def __init__(self, owner: RecordingBfrt) -> None:
        self.owner = owner

    def table_get(self, name: str) -> RecordingTable:
        table = self.owner.tables.get(name)
        if table is None:
            raise BfrtError(f"table {name!r} is not in the P4 program")
        return table


class RecordingBfrt:
    """The BF Runtime client objects, in memory: ``.gc``, ``.bfrt_info``, ``.device``."""

    def __init__(
        self,
        schema: dict[str, TableSchema] | None = None,
        on_write: Callable[[Write], None] | None = None,
    ) -> None:
        self.schema = schema if schema is not None else load_schema()
        self.tables = {name: RecordingTable(self, s) for name, s in self.schema.items()}
        self.gc = types.SimpleNamespace(
            KeyTuple=KeyTuple,
            DataTuple=DataTuple,
            Target=DeviceTarget,
            BfruntimeRpcException=BfrtError,
        )
        self.bfrt_info = _BfrtInfo(self)
        self.device = DeviceTarget()
        self.writes: list[Write] = []
        self.on_write = on_write

    def _record(self, write: Write) -> None:
        self.writes.append(write)
        if self.on_write is not None:
            self.on_write(write)

    def entries(self, table: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """``(key dict, data dict)`` of every entry of ``table`` (registers: written ones)."""
        return [(k.to_dict(), d.to_dict()) for k, d in self.tables[table].entries.values()]


#: Fields shown as dotted quads / colon-separated MACs in :func:`format_write`.
IPV4_FIELDS = ("ip", "hdr.ipv4.src_addr", "hdr.ipv4.dst_addr", "hdr.arp.target_proto_addr")
MAC_FIELDS = ("mac", "switch_mac")


def _show(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        if name in IPV4_FIELDS:
            return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
        if name in MAC_FIELDS:
            return ":".join(f"{(value >> s) & 0xFF:02x}" for s in range(40, -8, -8))
    return str(value)


def format_write(write: Write, limit: int = 4) -> str:
    """One line per entry (``limit`` at most, then a count) for the dry run's output."""

    def fields(d: dict[str, Any]) -> str:
        parts = []
        for n, v in d.items():
            if n in ("action_name", "is_default_entry"):
                continue
            if isinstance(v, dict):
                shown = _show(n, v["value"])
                v = shown if "mask" not in v else f"{shown}&{v['mask']:#x}"
            else:
                v = _show(n, v)
            parts.append(f"{n}={v}")
        return ", ".join(parts)

    lines = []
    for key, data in write.entries[:limit]:
        line = f"{write.op} {write.table} [{fields(key)}]"
        if data is not None:
            action = data.get("action_name")
            line += f" -> {action}({fields(data)})" if action else f" = ({fields(data)})"
        lines.append(line)
    if len(write.entries) > limit:
        lines.append(f"{write.op} {write.table} ... {len(write.entries) - limit} more entries")
    return "\n".join(lines)
