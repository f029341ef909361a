"""Where switchml.p4 keeps what the emulator keeps: names, register layout, headers.

Everything here is read from the P4 source (:class:`p4.source.P4Source`) or from the
controller's names (:mod:`p4.controller.bfrt_target`), so the replay follows the program
when it changes:

* the worker tables and ``set_worker``'s parameters (the job as the controller writes it);
* the registers and how a job's (slot, set) maps onto their entries: a slot is
  ``ENTRIES_PER_SLOT[code]`` consecutive entries from the job's ``pool_base``
  (``slot_index``); the per-(slot, set) registers are indexed by ``pool_index =
  slot_index << 1 | set``; bitmap, count and exponents live in a slot's first entry,
  and value pair i of entry q holds values ``64 q + i`` (first) and ``64 q + 32 + i``
  (second);
* header layouts as (field, bit width) lists, for packing ``switchml_md_h``;
* the pass types and value operations of the later passes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from p4.controller import bfrt_target
from p4.source import P4Source

#: Control-plane names as P4Testgen writes them (no ``pipe.`` prefix).
WORKER_BY_ADDRESS = bfrt_target.WORKER_BY_ADDRESS.removeprefix("pipe.")
WORKER_BY_IP = bfrt_target.WORKER_BY_IP.removeprefix("pipe.")
SET_WORKER = bfrt_target.SET_WORKER
WORKER_ADDRESS = bfrt_target.WORKER_ADDRESS.removeprefix("pipe.")
TO_WORKER = bfrt_target.TO_WORKER
TO_WORKER_BY_IP = bfrt_target.TO_WORKER_BY_IP
WORKER_BITMAP = bfrt_target.WORKER_BITMAP.removeprefix("pipe.")
COUNT = bfrt_target.COUNT.removeprefix("pipe.")
EXPONENTS = "Ingress.exponents.exponents"
VALUE_PAIR = re.compile(r"Ingress\.aggregate\.pair(\d+)\.values")
ENTRIES_PER_SLOT = bfrt_target.ENTRIES_PER_SLOT
NUM_POOL_SLOTS = bfrt_target.NUM_POOL_SLOTS


@functools.cache
def program() -> P4Source:
    """The P4 sources of p4/ (read once)."""
    return P4Source()


def const(name: str) -> int:
    """A constant or ``#define`` of the program."""
    return program().value(name)


def header_fields(name: str) -> list[tuple[str, int]]:
    """The fields of header ``name`` in wire order, with their bit widths."""
    src = program()
    return [(member, src.width(kind)) for kind, member in src.structs[name]]


def header_bytes(name: str) -> int:
    """The length of header ``name`` in bytes."""
    return sum(w for _, w in header_fields(name)) // 8


def pack(name: str, values: dict[str, int]) -> bytes:
    """Header ``name`` with its fields from ``values`` (missing ones 0), big-endian."""
    bits, total = 0, 0
    for field, width in header_fields(name):
        bits = (bits << width) | (values.get(field, 0) & ((1 << width) - 1))
        total += width
    return bits.to_bytes(total // 8, "big")


def unpack(name: str, data: bytes) -> dict[str, int]:
    """The fields of header ``name`` at the start of ``data``."""
    fields = header_fields(name)
    total = sum(w for _, w in fields)
    bits = int.from_bytes(data[: total // 8], "big")
    out = {}
    for field, width in reversed(fields):
        out[field] = bits & ((1 << width) - 1)
        bits >>= width
    return out


def recirculation_port(ingress_port: int) -> int:
    """The recirculation port of the pipe of ``ingress_port`` (its pipe bits ++ 68)."""
    return (ingress_port & ~0x7F) | const("RECIRCULATION_PORT_IN_PIPE")


def is_recirculation_port(port: int) -> bool:
    return port & 0x7F == const("RECIRCULATION_PORT_IN_PIPE")


@dataclass(frozen=True)
class Place:
    """Where a register entry belongs in a job's pool: its slot, set (None for the
    per-slot bitmap pair) and quarter (the entry within the slot)."""

    slot: int
    set: int | None
    quarter: int


def place(pool_base: int, pool_size: int, size_code: int, entry: int) -> Place | None:
    """Entry ``entry`` (a ``slot_index``) in the pool of a job, or None outside it."""
    k = ENTRIES_PER_SLOT[size_code]
    offset = entry - pool_base
    if not 0 <= offset < k * pool_size:
        return None
    return Place(offset // k, None, offset % k)


def pool_index(pool_base: int, size_code: int, slot: int, set_: int, quarter: int = 0) -> int:
    """The ``pool_index`` of (slot, set) of a job, entry ``quarter`` of the slot."""
    k = ENTRIES_PER_SLOT[size_code]
    slot_index = (pool_base + k * slot + quarter) & ((1 << const("POOL_SLOT_BITS")) - 1)
    return slot_index << 1 | set_
