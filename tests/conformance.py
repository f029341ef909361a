"""Conformance vectors: docs/protocol.md §1-§2 as data, and a runner for the emulator engine.

Each ``tests/vectors/*.json`` file is one scenario (format in
``tests/vectors/README.md``). This module loads them, turns their packet
descriptions into datagrams and runs them against :class:`swemu.core.engine.SwitchEngine`
in memory. The packet builder is written from §1 directly, without
:mod:`swemu.protocol.wire`, so that the vectors check the codec too; and the functions
are public so that other runners (real UDP sockets, the P4 program under PTF)
replay the very same vectors.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VECTORS_DIR = Path(__file__).resolve().parent / "vectors"

#: Header fields a packet description may give, with their defaults.
PACKET_DEFAULTS: dict[str, int] = {
    "msg_type": 1,
    "unused": 0,
    "job_number": 0,
    "tsi": 0,
    "set": 0,
    "pool_index_unused": 0,
    "slot": 0,
    "e0": 0,
    "e1": 0,
}
PACKET_KEYS = {*PACKET_DEFAULTS, "size_code", "values", "fill", "n_values", "values_at"}
STEP_KEYS = {"from", "packet", "raw_hex", "expect", "note", "register"}
ACTIONS = (
    "DROP_UNKNOWN_SOURCE",
    "DROP_MALFORMED",
    "DROP_WRONG_SIZE",
    "DROP_SLOT_RANGE",
    "AGGREGATED",
    "MULTICAST",
    "RETRANSMIT_PENDING",
    "UNICAST",
)


class VectorError(ValueError):
    """A vector file that does not follow the format of tests/vectors/README.md."""


class VectorMismatch(AssertionError):
    """The switch under test did something other than what a vector expects."""


# ----------------------------------------------------------------------------- loading
def load_vectors(directory: Path | str = VECTORS_DIR) -> list[dict[str, Any]]:
    """All vectors of ``directory``, sorted by file name, each checked for form."""
    vectors = []
    for path in sorted(Path(directory).glob("*.json")):
        with path.open() as f:
            vector = json.load(f)
        vector.setdefault("file", path.name)
        check_vector(vector)
        vectors.append(vector)
    return vectors


def check_vector(vector: dict[str, Any]) -> None:
    """Raise :class:`VectorError` if ``vector`` misses a key or has an unknown one."""
    where = vector.get("file", vector.get("name", "?"))
    for key in ("name", "description", "rule", "switch", "jobs", "steps"):
        if key not in vector:
            raise VectorError(f"{where}: missing {key!r}")
    for i, step in enumerate(vector["steps"]):
        unknown = set(step) - STEP_KEYS
        if unknown:
            raise VectorError(f"{where} step {i}: unknown keys {sorted(unknown)}")
        if "register" in step:
            continue
        if "from" not in step or "expect" not in step:
            raise VectorError(f"{where} step {i}: a packet step needs 'from' and 'expect'")
        if ("packet" in step) == ("raw_hex" in step):
            raise VectorError(f"{where} step {i}: give exactly one of 'packet' and 'raw_hex'")
        if step["expect"].get("action") not in ACTIONS:
            raise VectorError(f"{where} step {i}: unknown action {step['expect'].get('action')}")
        for pkt in [step.get("packet"), *(o["packet"] for o in step["expect"].get("out", []))]:
            if pkt is not None and set(pkt) - PACKET_KEYS:
                raise VectorError(f"{where} step {i}: unknown packet keys {set(pkt) - PACKET_KEYS}")


# ----------------------------------------------------------------------------- packets
def parse_addr(text: str) -> tuple[int, int]:
    """``"10.0.0.1:5000"`` -> ``(0x0A000001, 5000)``."""
    host, _, port = text.rpartition(":")
    octets = [int(x) for x in host.split(".")]
    if len(octets) != 4 or not all(0 <= o <= 255 for o in octets):
        raise VectorError(f"not an ip:port address: {text!r}")
    return (octets[0] << 24 | octets[1] << 16 | octets[2] << 8 | octets[3], int(port))


def format_addr(ip: int, port: int) -> str:
    """``(0x0A000001, 5000)`` -> ``"10.0.0.1:5000"``."""
    return ".".join(str((ip >> s) & 0xFF) for s in (24, 16, 8, 0)) + f":{port}"


def ip_to_int(text: str) -> int:
    """Dotted quad to a 32-bit integer."""
    return parse_addr(text + ":0")[0]


def values_of(packet: dict[str, Any]) -> list[int]:
    """The packet's value list: ``n_values`` (default ``32 << size_code``) entries,
    all ``fill`` (default 0), overwritten from the start by ``values``, then at the
    indices of ``values_at`` (``{"index": value}``, for values far into a packet)."""
    n = packet.get("n_values", 32 << packet["size_code"])
    values = list(packet.get("values", []))
    if len(values) > n:
        raise VectorError(f"{len(values)} values given for a packet of {n}")
    values += [packet.get("fill", 0)] * (n - len(values))
    for index, value in packet.get("values_at", {}).items():
        if not 0 <= int(index) < n:
            raise VectorError(f"values_at index {index} outside a packet of {n} values")
        values[int(index)] = value
    return values


def build_packet(packet: dict[str, Any]) -> bytes:
    """The datagram a packet description stands for (docs/protocol.md §1, bit for bit)."""
    p = {**PACKET_DEFAULTS, **packet}
    byte0 = (p["msg_type"] & 0xF) << 4 | (p["unused"] & 1) << 3 | (p["size_code"] & 7)
    pool_index = (p["set"] & 1) << 15 | (p["pool_index_unused"] & 1) << 14 | (p["slot"] & 0x3FFF)
    header = struct.pack(">BBIHbb", byte0, p["job_number"], p["tsi"], pool_index, p["e0"], p["e1"])
    values = values_of(p)
    return header + struct.pack(f">{len(values)}i", *values)


def step_datagram(step: dict[str, Any]) -> bytes:
    """The bytes a packet step sends."""
    if "raw_hex" in step:
        return bytes.fromhex(step["raw_hex"])
    return build_packet(step["packet"])


def expected_outputs(step: dict[str, Any]) -> list[tuple[str, bytes]]:
    """A step's expected ``(destination, datagram)`` list, sorted (multicast order is free)."""
    return sorted((o["to"], build_packet(o["packet"])) for o in step["expect"].get("out", []))


def describe(data: bytes) -> str:
    """A short human-readable form of a datagram, for failure messages."""
    if len(data) < 10:
        return f"<{len(data)} bytes {data.hex()}>"
    b0, job, tsi, pi, e0, e1 = struct.unpack(">BBIHbb", data[:10])
    n = (len(data) - 10) // 4
    values = struct.unpack(f">{n}i", data[10 : 10 + 4 * n])
    shown = ", ".join(map(str, values[:8])) + (", ..." if n > 8 else "")
    return (
        f"<type {b0 >> 4} unused {(b0 >> 3) & 1} size {b0 & 7} job {job} tsi {tsi} "
        f"set {pi >> 15} bit14 {(pi >> 14) & 1} slot {pi & 0x3FFF} e0 {e0} e1 {e1} "
        f"{n} values [{shown}]>"
    )


# ----------------------------------------------------------------------------- steps
@dataclass
class Registration:
    """One UdpSession call of a vector (docs/protocol.md §5)."""

    session_id: int
    rank: int
    num_workers: int
    ipv4: int
    udp_port: int
    size_code: int
    pool_size: int
    value_formats: int = 0  # ValueFormats (docs/protocol.md §5; 1: the 16-bit format too)


@dataclass
class StepResult:
    """What the switch did at one packet step."""

    index: int
    action: str
    out: list[tuple[str, bytes]] = field(default_factory=list)


def initial_registrations(vector: dict[str, Any]) -> list[Registration]:
    """The vector's jobs as UdpSession calls, rank 0 of each job first."""
    regs = []
    for job in vector["jobs"]:
        for worker in sorted(job["workers"], key=lambda w: w["rank"]):
            regs.append(
                Registration(
                    job["session_id"],
                    worker["rank"],
                    job["num_workers"],
                    ip_to_int(worker["ip"]),
                    worker["udp_port"],
                    job["size_code"],
                    job["pool_size"],
                    job.get("value_formats", 0),
                )
            )
    return regs


def step_registration(step: dict[str, Any]) -> Registration:
    """The UdpSession call of a ``register`` step."""
    r = step["register"]
    return Registration(
        r["session_id"],
        r["rank"],
        r["num_workers"],
        ip_to_int(r["ip"]),
        r["udp_port"],
        r["size_code"],
        r["pool_size"],
        r.get("value_formats", 0),
    )


def packet_steps(vector: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, step)`` of the steps that send a packet."""
    for i, step in enumerate(vector["steps"]):
        if "register" not in step:
            yield i, step


def check_step(vector: dict[str, Any], index: int, got: StepResult) -> None:
    """Raise :class:`VectorMismatch` unless ``got`` is what step ``index`` expects."""
    step = vector["steps"][index]
    want_action = step["expect"]["action"]
    want_out = expected_outputs(step)
    if got.action == want_action and sorted(got.out) == want_out:
        return
    note = f" ({step['note']})" if "note" in step else ""
    lines = [
        f"{vector['file']} step {index}{note}: from {step['from']}",
        f"  action: expected {want_action}, got {got.action}",
        "  expected out:",
        *(f"    {to} {describe(data)}" for to, data in want_out),
        "  got out:",
        *(f"    {to} {describe(data)}" for to, data in sorted(got.out)),
    ]
    raise VectorMismatch("\n".join(lines))


# ----------------------------------------------------------------------------- engine
def make_engine(vector: dict[str, Any]) -> Any:
    """A fresh :class:`swemu.core.engine.SwitchEngine` with the vector's jobs registered."""
    from swemu.core.engine import EngineConfig, SwitchEngine

    engine = SwitchEngine(EngineConfig(pool_size=vector["switch"]["pool_size"]))
    for reg in initial_registrations(vector):
        register_on_engine(engine, reg)
    return engine


def register_on_engine(engine: Any, reg: Registration) -> None:
    """Apply one UdpSession call to an engine."""
    engine.register(
        session_id=reg.session_id,
        rank=reg.rank,
        num_workers=reg.num_workers,
        ipv4=reg.ipv4,
        udp_port=reg.udp_port,
        packet_size=reg.size_code,
        pool_size=reg.pool_size,
        value_formats=reg.value_formats,
    )


def run_vector_on_engine(vector: dict[str, Any]) -> list[StepResult]:
    """Run every step of ``vector`` on a fresh engine; raise :class:`VectorMismatch`
    at the first step (or counter) that differs from the expectation."""
    engine = make_engine(vector)
    results = []
    for i, step in enumerate(vector["steps"]):
        if "register" in step:
            register_on_engine(engine, step_registration(step))
            continue
        action, out = engine.receive_datagram(step_datagram(step), parse_addr(step["from"]))
        got = StepResult(i, action.name, [(format_addr(*addr), data) for data, addr in out])
        check_step(vector, i, got)
        results.append(got)
    check_counters(vector, engine)
    return results


def check_counters(vector: dict[str, Any], engine: Any) -> None:
    """Compare the vector's optional ``counters`` with the engine's (a subset check)."""
    want = vector.get("counters")
    if not want:
        return
    snapshot = engine.snapshot()
    problems = []
    for name, value in want.get("global", {}).items():
        if snapshot["counters"][name] != value:
            problems.append(f"global {name}: expected {value}, got {snapshot['counters'][name]}")
    for session, counters in want.get("jobs", {}).items():
        got = engine.job_counters_of(int(session))
        for name, value in counters.items():
            if got[name] != value:
                problems.append(f"job {session} {name}: expected {value}, got {got[name]}")
    if problems:
        raise VectorMismatch(f"{vector['file']} counters:\n  " + "\n  ".join(problems))
