"""Replay P4Testgen's tests of switchml.p4 against the emulator's switch engine.

Each :class:`~p4.testgen.ptf.TestCase` says what the P4 program does with one packet
given a control plane and starting registers. :func:`replay` puts the same control
plane and registers into a fresh :class:`swemu.core.engine.SwitchEngine` (jobs and
workers from ``set_worker`` entries, pools from the registers, through
:mod:`p4.testgen.layout`), hands it the packet's UDP datagram from the packet's source
address, and compares:

* **drops, by reason**: the program's reason is the action its trace ran
  (``unknown_source``, ``malformed``, ``wrong_size``, ``slot_out_of_range``,
  ``aggregated``, ``retransmit_pending``); the emulator's is its
  :class:`~swemu.core.engine.Action`;
* **the packet out, under the test's masks**: a worker's packet that the program sends
  round (a result, or a size-code-3 packet's next quarter) leaves on the recirculation
  port with ``switchml_md`` in front. The emulator does all passes at once; the replay
  builds what the program's first pass must send from the emulator's decision and its
  state after the packet (the first 32 result values and e0 at size code 1, the
  decision for the next passes, the values not yet consumed) and compares bytes;
* **registers after the packet**, where the generator gives them (the project's patch):
  bitmap pair, count, exponents and value pairs against the engine's pool.

Tests that start on the recirculation port (a later pass on its own: P4Testgen does not
chain passes) are checked by :func:`replay_later_pass`. Packets that are not SwitchML
for the program (ARP, ICMP, other traffic) have no emulator counterpart (the emulator's
host answers ARP and ping) and are counted apart, as are control planes the
controller never writes (``set_worker`` entries that disagree with each other or with
the limits), and frames a host would drop (:func:`truncated`). Faults of P4Testgen's own
model are set apart by the test's trace, not compared: a sender or a multicast replica
on its drop port 511 (no Tofino port), and an egress that parsed a ``switchml_md`` other
than the one its ingress sent (after a unicast hand-off). :func:`replay_all` sums it up
as a :class:`Report`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from p4.testgen import layout as L
from p4.testgen.ptf import KeyField, RegisterValue, TableEntry, TestCase
from swemu.core.engine import Action, EngineConfig, Job, SwitchEngine
from swemu.protocol import wire
from swemu.protocol.wire import HEADER_LEN, MAX_SLOTS, MAX_WORKERS, UDP_PORT_BASE, UDP_PORT_MASK

#: What a test is, for the replay.
FIRST_PASS = "first pass"  # a worker's packet: replayed
LATER_PASS = "later pass"  # starts on the recirculation port: replay_later_pass
NOT_SWITCHML = "not SwitchML"  # ARP, ICMP, other traffic: no emulator counterpart
UNWRITTEN = "control plane the controller never writes"
TRUNCATED = "truncated frame"  # shorter than its UDP length, past what the program parses
KINDS = (FIRST_PASS, LATER_PASS, NOT_SWITCHML, UNWRITTEN, TRUNCATED)

ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8
SWITCHML_AT = ETH_LEN + IPV4_LEN + UDP_LEN  # the SwitchML header in a worker's frame
ETHERTYPE_IPV4, IP_PROTOCOL_UDP = 0x0800, 17

#: The program's actions that end a worker's packet, and the emulator's Action for each.
P4_DROP_ACTIONS = {
    "unknown_source": Action.DROP_UNKNOWN_SOURCE,
    "malformed": Action.DROP_MALFORMED,
    "wrong_size": Action.DROP_WRONG_SIZE,
    "slot_out_of_range": Action.DROP_SLOT_RANGE,
    "aggregated": Action.AGGREGATED,
    "retransmit_pending": Action.RETRANSMIT_PENDING,
}
RESULTS = (Action.MULTICAST, Action.UNICAST)


@dataclass
class Outcome:
    """What the replay of one test found."""

    name: str
    kind: str
    mismatches: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def replayed(self) -> bool:
        """Compared with the engine: a pass the replay ran, not set apart by a note."""
        return self.kind in (FIRST_PASS, LATER_PASS) and not self.note


@dataclass
class Report:
    """The replay of a corpus: outcomes by kind, and every mismatch."""

    outcomes: list[Outcome]

    @property
    def by_kind(self) -> Counter[str]:
        return Counter(o.kind for o in self.outcomes)

    @property
    def mismatched(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.mismatches]

    def summary(self) -> str:
        kinds = ", ".join(f"{self.by_kind[k]} {k}" for k in KINDS if self.by_kind[k])
        compared = Counter(o.kind for o in self.outcomes if o.replayed)
        lines = [
            f"{len(self.outcomes)} tests: {kinds}; compared with the engine: "
            f"{compared[FIRST_PASS]} first and {compared[LATER_PASS]} later passes; "
            f"{len(self.mismatched)} mismatched"
        ]
        for o in self.mismatched:
            lines += [f"  {o.name} ({o.kind}): {m}" for m in o.mismatches]
        notes = Counter((o.kind, o.note) for o in self.outcomes if not o.replayed and o.note)
        lines += [f"  not compared, {n} ({k}): {why}" for (k, why), n in sorted(notes.items())]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the packet
@dataclass(frozen=True)
class WorkerFrame:
    """A frame the program parses as a worker's SwitchML packet."""

    src_ip: int
    src_port: int
    udp_len: int
    datagram: bytes  # the UDP payload, as the emulator's socket would receive it


def worker_frame(frame: bytes) -> WorkerFrame | None:
    """The frame as the program's ingress parser sees it (p4/parsers.p4): Ethernet,
    IPv4 without options and not a fragment, UDP to 0xBEE0..0xBEEF, then the SwitchML
    header; None for anything else."""
    if len(frame) < SWITCHML_AT + HEADER_LEN:
        return None
    if int.from_bytes(frame[12:14], "big") != ETHERTYPE_IPV4:
        return None
    ip = frame[ETH_LEN:]
    ihl, flags_frag, proto = ip[0] & 0xF, int.from_bytes(ip[6:8], "big"), ip[9]
    if ihl != 5 or flags_frag & 0x3FFF or proto != IP_PROTOCOL_UDP:  # MF and the offset
        return None
    udp = frame[ETH_LEN + IPV4_LEN :]
    if int.from_bytes(udp[2:4], "big") & UDP_PORT_MASK != UDP_PORT_BASE:
        return None
    udp_len = int.from_bytes(udp[4:6], "big")
    # The datagram the UDP length says, as far as the frame holds it (a shorter frame:
    # a short datagram, which the program counts malformed by its parser error).
    datagram = frame[SWITCHML_AT : SWITCHML_AT + max(udp_len - UDP_LEN, 0)]
    return WorkerFrame(
        int.from_bytes(ip[12:16], "big"), int.from_bytes(udp[0:2], "big"), udp_len, datagram
    )


# ----------------------------------------------------------------------------- control plane
@dataclass(frozen=True)
class JobEntry:
    """``set_worker``'s parameters: one worker of one job, as the program holds it."""

    job_id: int
    worker_id: int
    worker_bit: int
    num_workers: int
    size_code: int
    pool_base: int
    pool_size: int
    mgid: int
    value_formats: int = 0  # 1: VALUE_FORMATS_INT32_AND_BLOCK16, results echo the format bit

    @property
    def job(self) -> tuple[int, int, int, int, int, int]:
        return (
            self.num_workers,
            self.size_code,
            self.pool_base,
            self.pool_size,
            self.mgid,
            self.value_formats,
        )

    @property
    def entries(self) -> int:
        return L.ENTRIES_PER_SLOT.get(self.size_code, 1) * self.pool_size


@dataclass
class Setup:
    """The engine a test runs on, and where each program job went in it."""

    engine: SwitchEngine
    jobs: dict[int, tuple[JobEntry, Job]]  # job_id -> (its entry, the engine's job)
    before: dict[tuple[int, int], int]  # (job_id, pool position) -> bitmap before

    def job_of_entry(self, entry: int) -> tuple[JobEntry, Job, L.Place] | None:
        """The job whose pool holds register entry ``entry`` (a slot_index)."""
        for params, job in self.jobs.values():
            where = L.place(params.pool_base, params.pool_size, params.size_code, entry)
            if where is not None:
                return params, job, where
        return None


def _worker_entries(test: TestCase) -> list[tuple[TableEntry, JobEntry]]:
    fields = JobEntry.__dataclass_fields__
    out = []
    for e in test.entries:
        if e.table in (L.WORKER_BY_ADDRESS, L.WORKER_BY_IP) and e.action == L.SET_WORKER:
            out.append((e, JobEntry(**{k: int(v) for k, v in e.params.items() if k in fields})))
    return out


def _address(e: TableEntry) -> tuple[int, int]:
    """A worker entry's (IPv4, UDP port) key; port 0 for ``worker_by_ip``."""
    by_name = {k.name.rsplit(".", 1)[-1]: k.value for k in e.key}
    ip = by_name.get("src_addr", e.key[0].value)
    if e.table != L.WORKER_BY_ADDRESS:
        return ip, 0
    return ip, by_name.get("src_port", e.key[1].value if len(e.key) > 1 else 0)


def unwritten(test: TestCase) -> str | None:
    """Why the test's control plane is not one the controller writes (p4/controller),
    or None: every ``set_worker`` entry must be a rank < W <= 32 with its bit, of a job
    of size code 1 or 3 whose pool fits the registers, jobs agreeing on their parameters
    and keeping apart, addresses once each, (IP, port) entries with a port."""
    jobs: dict[int, JobEntry] = {}
    addresses = set()
    for e, w in _worker_entries(test):
        if e.default:
            return "set_worker as a default action"
        if w.size_code not in L.ENTRIES_PER_SLOT:
            return f"size code {w.size_code}"
        if not 1 <= w.num_workers <= MAX_WORKERS or w.worker_id >= w.num_workers:
            return f"worker {w.worker_id} of {w.num_workers}"
        if w.worker_bit != 1 << w.worker_id:
            return f"worker_bit {w.worker_bit:#x} of worker {w.worker_id}"
        if not 1 <= w.pool_size <= MAX_SLOTS or w.pool_base + w.entries > L.NUM_POOL_SLOTS:
            return f"pool {w.pool_base}+{w.entries} entries"
        if w.job_id == 0:
            return "job id 0 (the unknown sources' counters)"
        key = (e.table == L.WORKER_BY_IP, *_address(e))
        if e.table == L.WORKER_BY_ADDRESS and key[2] == 0:
            return "a worker_by_address entry with port 0"
        if key in addresses:
            return "an address twice"
        addresses.add(key)
        other = jobs.setdefault(w.job_id, w)
        if other.job != w.job:
            return f"job {w.job_id} with two sets of parameters"
    ranges = sorted((j.pool_base, j.pool_base + j.entries) for j in jobs.values())
    if any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(ranges)):
        return "pools that overlap"
    return None


#: A register entry's place in the engine: its fields ("" for a plain register) and the
#: engine array and position that hold each.
Cells = dict[str, tuple[np.ndarray, int]]


def _cells(setup: Setup, reg: RegisterValue) -> Cells | None:
    """Where the engine keeps register entry ``reg``, or None: not in a job's pool, or
    not where the job keeps that register (bitmap, count and exponents live in a slot's
    first entry)."""
    per_set = reg.name != L.WORKER_BITMAP
    found = setup.job_of_entry(reg.index >> 1 if per_set else reg.index)
    if found is None:
        return None
    params, job, where = found
    values, exps, bitmap, count = setup.engine.pool_arrays(job.index)
    p, n = params.pool_size, 32 << params.size_code
    k = (reg.index & 1) * p + where.slot
    pair = L.VALUE_PAIR.fullmatch(reg.name)
    if pair:
        i = k * n + 64 * where.quarter + int(pair.group(1))
        return {"first": (values, i), "second": (values, i + 32)}
    if where.quarter != 0:
        return None
    if reg.name == L.WORKER_BITMAP:
        return {"set0": (bitmap, where.slot), "set1": (bitmap, p + where.slot)}
    if reg.name == L.EXPONENTS:
        return {"e0": (exps, 2 * k), "e1": (exps, 2 * k + 1)}
    if reg.name == L.COUNT:
        return {"": (count, k)}
    return None


def _set_register(setup: Setup, reg: RegisterValue, value: dict[str, int] | int) -> None:
    """Write one register entry into the engine's pools (nothing if they do not hold it)."""
    cells = _cells(setup, reg)
    for name, (array, at) in (cells or {}).items():
        v = value[name] if name else value
        array[at] = np.array(v & 0xFFFFFFFF, np.uint32).astype(array.dtype)


def _read_register(setup: Setup, reg: RegisterValue) -> dict[str, int] | int | None:
    """A register entry's value in the engine, as the program's register holds it
    (unsigned, count 8 bits wide), or None if the engine does not hold it."""
    cells = _cells(setup, reg)
    if cells is None:
        return None
    width = {"": 8, "e0": 8, "e1": 8}
    got = {
        name: int(array[at]) & ((1 << width.get(name, 32)) - 1)
        for name, (array, at) in cells.items()
    }
    return got.get("", got)


def setup_engine(test: TestCase) -> Setup:
    """A fresh engine with the test's jobs, workers and registers."""
    engine = SwitchEngine(EngineConfig(max_jobs=16, max_pool_memory=1 << 34))
    setup = Setup(engine, {}, {})
    for e, w in _worker_entries(test):
        if w.job_id not in setup.jobs:
            job = engine.create_job(
                w.job_id, w.num_workers, w.size_code, w.pool_size, 0.0, w.value_formats
            )
            for array in engine.pool_arrays(job.index):
                array[:] = 0  # registers the test does not set start at 0 in the engine
            setup.jobs[w.job_id] = (w, job)
        ip, port = _address(e)
        engine.set_worker(setup.jobs[w.job_id][1], w.worker_id, ip, port)
    for reg in test.registers:
        _set_register(setup, reg, reg.before)
    return setup


# ----------------------------------------------------------------------------- the program's side
def p4_action(test: TestCase) -> Action | None:
    """The action among :data:`P4_DROP_ACTIONS` the test's trace ran last, if any."""
    found = None
    for line in test.trace:
        for name, action in P4_DROP_ACTIONS.items():
            if re.search(rf"\b{name}\b", line):
                found = action
    return found


def _compare(what: str, expected: bytes, got: bytes, care: bytes) -> list[str]:
    """Byte differences under the care mask, as ranges."""
    if len(expected) != len(got):
        return [f"{what}: {len(got)} bytes out, the emulator implies {len(expected)}"]
    bad = [i for i in range(len(got)) if (expected[i] ^ got[i]) & care[i]]
    if not bad:
        return []
    first, last = bad[0], bad[-1]
    return [
        f"{what}: {len(bad)} bytes differ in {first}..{last} (program "
        f"{got[first : last + 1][:16].hex()} emulator {expected[first : last + 1][:16].hex()})"
    ]


def first_pass_out(
    test: TestCase,
    frame: WorkerFrame,
    params: JobEntry,
    setup: Setup,
    action: Action,
    before: int,
    result: bytes | None = None,
) -> bytes:
    """What the program's first pass must send round (p4/next_step.p4), given what the
    emulator did: ``switchml_md`` with the decision for the later passes, the frame with
    the SwitchML header's unused bits cleared (the format bit: as the emulator's
    ``result`` has it, or without one cleared unless the job registered 16-bit values,
    docs/protocol.md section 4.2) and e0 the slot's, and the values: size
    code 1, the first 32 of the result and the packet's other 32; size code 3, the values
    from 64 on (the first 64 are aggregated and dropped)."""
    pkt = test.packet
    code = params.size_code
    hdr = bytearray(pkt[SWITCHML_AT : SWITCHML_AT + HEADER_LEN])
    s, slot = hdr[6] >> 7, int.from_bytes(hdr[6:8], "big") & (MAX_SLOTS - 1)
    values, exps, _, _ = setup.engine.pool_arrays(setup.jobs[params.job_id][1].index)
    k = s * params.pool_size + slot
    if result is not None:  # the format bit as the emulator's result carries it
        hdr[0] = (hdr[0] & 0xF7) | (result[0] & 0x08)
    elif not params.value_formats:
        hdr[0] &= 0xF7
    hdr[6] &= 0xBF  # pool_index bit 14
    hdr[8] = int(exps[2 * k]) & 0xFF
    retransmission = action in (Action.UNICAST, Action.RETRANSMIT_PENDING)
    if code == 1:
        op, pass_type = "VALUE_OP_READ", "PASS_HARVEST"
    else:
        op = (
            "VALUE_OP_READ"
            if retransmission
            else "VALUE_OP_WRITE"
            if before == 0
            else "VALUE_OP_ADD"
        )
        pass_type = "PASS_CONSUME1"
    md = L.pack(
        "switchml_md_h",
        {
            "pass_type": L.const(pass_type),
            "value_op": L.const(op),
            "result": int(action in RESULTS),
            "multicast": int(action == Action.MULTICAST),
            "ingress_port": test.port,
            "mgid": params.mgid,
            "pool_index": L.pool_index(params.pool_base, code, slot, s, 0 if code == 1 else 1),
        },
    )
    at = SWITCHML_AT + HEADER_LEN
    n = 32 << code
    if code == 1:
        first = values[k * n : k * n + 32].astype(">u4").tobytes()
        rest = first + pkt[at + 128 :]
    else:
        rest = pkt[at + 256 :]
    return md + pkt[:SWITCHML_AT] + bytes(hdr) + rest


def replay_first_pass(test: TestCase, frame: WorkerFrame) -> Outcome:
    """A worker's packet: the engine against the program (see the module docstring)."""
    out = Outcome(test.name, FIRST_PASS)
    setup = setup_engine(test)
    action, results = setup.engine.receive_datagram(frame.datagram, (frame.src_ip, frame.src_port))
    job = _hit_job(setup, frame)
    before = 0
    if job is not None:
        before = _bitmap_before(test, job, frame)
    exp = test.expected
    if exp is None:
        reason = p4_action(test)
        if action in RESULTS or (
            action == Action.AGGREGATED and job is not None and job.size_code == 3
        ):
            out.mismatches.append(
                f"the program drops it ({reason and reason.name}), the emulator: {action.name}"
            )
        elif reason is None:
            out.note = "dropped without a reason in the trace"
        elif reason != action:
            out.mismatches.append(
                f"drop reason: the program {reason.name}, the emulator {action.name}"
            )
    elif not L.is_recirculation_port(exp.port) or job is None:
        out.mismatches.append(
            f"the program sends it to port {exp.port}, the emulator: {action.name}"
        )
    elif action not in RESULTS and not (action == Action.AGGREGATED and job.size_code == 3):
        out.mismatches.append(f"the program sends it round, the emulator: {action.name}")
    else:
        if exp.port != L.recirculation_port(test.port):
            out.mismatches.append(
                f"recirculated on port {exp.port}, not {L.recirculation_port(test.port)}"
            )
        result = results[0][0] if results else None
        want = first_pass_out(test, frame, job, setup, action, before, result)
        out.mismatches += _compare("packet sent round", want, exp.packet, exp.care_mask())
    out.mismatches += compare_registers(test, setup)
    return out


def _unsigned(value: dict[str, int] | int) -> dict[str, int] | int:
    """A register value as the replay compares it: each field unsigned, 8 bits wide for
    count and the exponents (``int<8>``: the generator may write them negative)."""
    if isinstance(value, dict):
        return {k: v & (0xFF if k in ("e0", "e1") else 0xFFFFFFFF) for k, v in value.items()}
    return value & 0xFF


def compare_registers(test: TestCase, setup: Setup) -> list[str]:
    """The registers after the packet, where the generator gives them, against the engine."""
    bad = []
    for reg in test.registers:
        if reg.after is None:
            continue
        got = _read_register(setup, reg)
        if got is not None and got != _unsigned(reg.after):
            bad.append(f"{reg.name}[{reg.index}] after: program {reg.after}, emulator {got}")
    return bad


def _hit_job(setup: Setup, frame: WorkerFrame) -> JobEntry | None:
    """The job entry of the worker that sent ``frame``: (IP, port) first, then (IP, 0)."""
    for port in (frame.src_port, 0):
        for params, job in setup.jobs.values():
            if (frame.src_ip, port) in job.workers.values():
                return params
    return None


def _bitmap_before(test: TestCase, params: JobEntry, frame: WorkerFrame) -> int:
    """The bitmap of the packet's (slot, set) before the packet, from the test's registers."""
    hdr = frame.datagram[:HEADER_LEN]
    if len(hdr) < HEADER_LEN:
        return 0
    s, slot = hdr[6] >> 7, int.from_bytes(hdr[6:8], "big") & (MAX_SLOTS - 1)
    entry = L.pool_index(params.pool_base, params.size_code, slot, 0) >> 1
    for reg in test.registers:
        if reg.name == L.WORKER_BITMAP and reg.index == entry:
            return int(reg.before[f"set{s}"])
    return 0


# ----------------------------------------------------------------------------- later passes
#: The later passes, by pass type: the quarter of the slot each reads or writes, and
#: which half of its value pairs a collect pass reads ("first"/"second"; None: consume).
LATER_PASSES = {
    "PASS_HARVEST": (0, "second"),
    "PASS_CONSUME1": (1, None),
    "PASS_CONSUME2": (2, None),
    "PASS_CONSUME3": (3, None),
    **{f"PASS_COLLECT_{q}_{h.upper()}": (q, h) for q in range(4) for h in ("first", "second")},
}


def _ipv4_checksum(header: bytes) -> int:
    words = sum(int.from_bytes(header[i : i + 2], "big") for i in range(0, 20, 2) if i != 10)
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    return ~words & 0xFFFF


def from_switch_to(frame: bytes, mac: int, ip: int, port: int) -> bytes:
    """A result as egress sends it (p4/result.p4): from the switch's MAC, IPv4 address
    and UDP port (the triggering packet's destination) to ``mac``, ``ip``, ``port``, the
    IPv4 checksum recomputed, no UDP checksum; the rest of ``frame`` as it is."""
    eth = frame[:ETH_LEN]
    ip_hdr = bytearray(frame[ETH_LEN : ETH_LEN + IPV4_LEN])
    udp = bytearray(frame[ETH_LEN + IPV4_LEN : SWITCHML_AT])
    ip_hdr[12:16], ip_hdr[16:20] = ip_hdr[16:20], ip.to_bytes(4, "big")
    ip_hdr[10:12] = _ipv4_checksum(bytes(ip_hdr)).to_bytes(2, "big")
    udp[0:2], udp[2:4], udp[6:8] = udp[2:4], port.to_bytes(2, "big"), b"\0\0"
    return (
        mac.to_bytes(6, "big")
        + eth[0:6]
        + eth[12:14]
        + bytes(ip_hdr)
        + bytes(udp)
        + frame[SWITCHML_AT:]
    )


def to_sender(frame: bytes) -> bytes:
    """A result back to the worker that triggered it (``to_sender``: addresses swapped)."""
    mac = int.from_bytes(frame[6:12], "big")
    ip = int.from_bytes(frame[ETH_LEN + 12 : ETH_LEN + 16], "big")
    port = int.from_bytes(frame[ETH_LEN + IPV4_LEN : ETH_LEN + IPV4_LEN + 2], "big")
    return from_switch_to(frame, mac, ip, port)


def _replica_destination(test: TestCase) -> tuple[int, int, int | None] | None:
    """The ``worker_address`` entry a multicast replica took: (MAC, IPv4, UDP port or None
    for a worker registered by IP alone)."""
    for e in test.entries:
        if e.table == L.WORKER_ADDRESS and e.action in (L.TO_WORKER, L.TO_WORKER_BY_IP):
            return e.params["mac"], e.params["ip"], e.params.get("udp_port")
    return None


def replay_later_pass(test: TestCase) -> Outcome:
    """A later pass on its own (P4Testgen does not chain passes: the test starts on the
    recirculation port with ``switchml_md`` in front and registers as the solver chose
    them). The pass's register entry becomes slot 0 of a one-slot job in the engine (the
    entry ``pool_index >> 1`` the pass's quarter of it); then

    * a consume pass writes, adds or only reads (``value_op``) its quarter: the engine
      gets worker 0's packet with that quarter's values into a slot released (write),
      holding worker 1's contribution (add) or worker 0's (read), and the value pairs
      after it must be the program's;
    * a harvest or collect pass reads one half of the quarter's 32 value pairs (the last
      one also e1): the half the program puts into the packet must be the result's. The
      engine's result is its unicast to worker 0 retransmitting into the complete slot,
      and a result the program sends back to the sender must leave as that unicast does
      (:func:`to_sender`); for a result the program hands to the multicast group
      (P4Testgen with the project's patch: one replica, to the ``worker_address`` entry
      of its replication id), the engine's job has one worker at that entry's address,
      whose packet of the registers' values completes the slot, and the replica must
      leave as the engine's multicast copy to it does (:func:`from_switch_to`).
    """
    out = Outcome(test.name, LATER_PASS)
    md_len = L.header_bytes("switchml_md_h")
    md = L.unpack("switchml_md_h", test.packet)
    names = {L.const(name): name for name in LATER_PASSES}
    pass_name = names.get(md["pass_type"])
    frame = test.packet[md_len:]
    if pass_name is None or len(frame) < SWITCHML_AT + HEADER_LEN:
        out.note = "a pass no first pass sends"
        return out
    quarter, half = LATER_PASSES[pass_name]
    entry, s = md["pool_index"] >> 1, md["pool_index"] & 1
    sent = (md["result"], md["multicast"])
    exp = test.expected
    final = pass_name in ("PASS_HARVEST", "PASS_COLLECT_0_FIRST")
    op = {L.const(f"VALUE_OP_{o}"): o for o in ("WRITE", "ADD", "READ")}.get(md["value_op"])
    if half is not None:
        valid = sent in ((1, 0), (1, 1))
    else:
        valid = op is not None and sent in ((0, 0), (1, 0), (1, 1))
    if not valid:
        out.note = "a pass no first pass sends"
        return out
    if final and sent == (1, 0) and md["ingress_port"] == DROP_PORT:
        out.note = "a sender on port 511 (P4Testgen's drop port, no Tofino port)"
        return out
    if final and _egress_misread(test, md):
        out.note = "egress read a switchml_md ingress did not send (P4Testgen's unicast hand-off)"
        return out
    if entry < quarter:  # the same pass on entry + 4: quarter `quarter` of a slot
        test = _shifted(test, QUARTERS)
        entry += QUARTERS
    code = 1 if pass_name == "PASS_HARVEST" else 3
    src_ip = int.from_bytes(frame[ETH_LEN + 12 : ETH_LEN + 16], "big")
    src_port = int.from_bytes(frame[ETH_LEN + IPV4_LEN : ETH_LEN + IPV4_LEN + 2], "big")
    replica = None
    if final and sent == (1, 1):  # one multicast replica, to the worker_address entry taken
        replica = _replica_destination(test)
        if replica is None:
            if exp is not None:
                out.mismatches.append(f"a replica left on port {exp.port} without a worker")
            else:
                out.note = "a replica for a replication id nobody registered"
            return out
        if exp is None and not _egress_drops(test):
            # egress took the worker's entry and did not drop: the port the solver chose
            # for the replica (not in the test) can only have been P4Testgen's drop port
            out.note = "a replica on port 511 (P4Testgen's drop port, no Tofino port)"
            return out
        _, src_ip, port = replica
        src_port = port if port is not None else src_port
        workers = 1
    else:
        workers = 2
    params = JobEntry(1, 0, 1, workers, code, entry - quarter, 1, md["mgid"])
    by_ip = replica is not None and replica[2] is None
    key = [KeyField("hdr.ipv4.src_addr", src_ip), KeyField("hdr.udp.src_port", src_port)]
    table = L.WORKER_BY_IP if by_ip else L.WORKER_BY_ADDRESS
    worker = TableEntry(table, L.SET_WORKER, vars(params).copy(), key[:1] if by_ip else key)
    synthetic = TestCase(test.name, test.port, test.packet, [worker], test.registers)
    setup = setup_engine(synthetic)
    loaded_values, exps, bitmap, count = setup.engine.pool_arrays(setup.jobs[1][1].index)
    n = 32 << code
    values, e0, e1 = np.zeros(n, np.int32), 0, 0
    if replica is not None:  # worker 0 writes the registers' values: the slot completes
        values = loaded_values[s * n : s * n + n].view(np.int32).copy()
        e0, e1 = int(exps[2 * s]), int(exps[2 * s + 1])
    elif half is not None:  # a read: the slot is complete, worker 0 retransmits
        bitmap[s], count[s] = 0b11, 0
    else:
        bitmap[s], count[s] = {"WRITE": (0, 0), "ADD": (0b10, 1), "READ": (0b01, 1)}[op]
        pass_values = frame[SWITCHML_AT + HEADER_LEN : SWITCHML_AT + HEADER_LEN + 256]
        values[64 * quarter : 64 * quarter + 64] = np.frombuffer(pass_values, ">i4")
    request = wire.encode(
        size_code=code, job_number=0, tsi=0, set=s, slot=0, values=values, e0=e0, e1=e1
    )
    action, results = setup.engine.receive_datagram(request, (src_ip, src_port))
    out.mismatches += compare_registers(test, setup)
    if half is None:
        return out  # consume passes: the registers are what the emulator has to say
    expected_action = Action.MULTICAST if replica is not None else Action.UNICAST
    if action != expected_action or not results or exp is None:
        out.mismatches.append(
            f"the program {'drops' if exp is None else 'sends'}; emulator {action.name}"
        )
        return out
    result, (dest_ip, dest_port) = results[0]
    at = HEADER_LEN + 4 * (64 * quarter + (32 if half == "second" else 0))
    read = result[at : at + 128]  # the half of the quarter this pass reads
    hdr = bytearray(frame[SWITCHML_AT : SWITCHML_AT + HEADER_LEN])
    payload = frame[SWITCHML_AT + HEADER_LEN :]
    if pass_name == "PASS_HARVEST":  # values 32..63 replace the packet's second half
        payload = payload[:128] + read + payload[256:]
    else:  # a collect pass puts its half in front of the values collected so far
        payload = read + payload
    if not final:  # collected, on to the next collect pass
        got = exp.packet[md_len + SWITCHML_AT + HEADER_LEN :][: len(read)]
        care = exp.care_mask()[md_len + SWITCHML_AT + HEADER_LEN :][: len(read)]
        out.mismatches += _compare("half collected", read, got, care)
        return out
    hdr[9] = result[9]  # the last pass fetches e1
    whole = frame[:SWITCHML_AT] + bytes(hdr) + payload
    if replica is None:
        want = to_sender(whole)
        if exp.port != md["ingress_port"]:
            out.mismatches.append(
                f"result on port {exp.port}, not the sender's {md['ingress_port']}"
            )
    else:
        want = from_switch_to(whole, replica[0], dest_ip, dest_port)
    out.mismatches += _compare("result", want, exp.packet, exp.care_mask())
    return out


#: P4Testgen's Tofino drop port (``SharedTofinoConstants::DROP_CONSTANT``): a packet
#: leaving on it is dropped. No Tofino 1 port has that number (a pipe has 72 ports).
DROP_PORT = 511
QUARTERS = 4  # register entries of a size-code-3 slot


def _egress_misread(test: TestCase, md: dict[str, int]) -> bool:
    """Whether egress's parser read a ``switchml_md`` other than ``md`` (the one the
    final pass's ingress sends on unchanged), by the trace's second extraction of it
    (ingress's is the first); a tainted field counts as other. False when the trace
    does not show it."""
    found = [line for line in test.trace if line.startswith("[ExtractSuccess] hdr.switchml_md@")]
    if len(found) < 2:
        return False
    fields = re.findall(r"hdr\.switchml_md\.(\w+) = (0x[0-9A-Fa-f_]+|\w+)", found[1])
    for name, value in fields:
        if not value.startswith("0x") or md.get(name) != int(value.replace("_", ""), 16):
            return True
    return False


def _egress_drops(test: TestCase) -> bool:
    """Egress's own reason to drop in the trace: the default ``no_worker``."""
    return any(re.search(r"\bno_worker\b", line) for line in test.trace)


def _shifted(test: TestCase, entries: int) -> TestCase:
    """The test with every register entry ``entries`` further on. The program reads and
    writes each register at ``pool_index`` alone, the same at every index, so a pass on
    entry e is the pass on entry e + 4; the replay needs it where the solver put a
    later pass of quarter q on an entry e < q, which the quarter's slot cannot start
    before."""
    moved = [
        dataclasses.replace(
            r, index=r.index + (entries if r.name == L.WORKER_BITMAP else 2 * entries)
        )
        for r in test.registers
    ]
    return dataclasses.replace(test, registers=moved)


# ----------------------------------------------------------------------------- all
def replay(test: TestCase) -> Outcome:
    """Replay one test (see the module docstring)."""
    if L.is_recirculation_port(test.port):
        return replay_later_pass(test)
    frame = worker_frame(test.packet)
    if frame is None:
        return Outcome(test.name, NOT_SWITCHML, note="not a SwitchML packet for the program")
    why = unwritten(test)
    if why is not None:
        return Outcome(test.name, UNWRITTEN, note=why)
    if truncated(frame):
        return Outcome(test.name, TRUNCATED, note="frame shorter than its UDP length says")
    return replay_first_pass(test, frame)


def truncated(frame: WorkerFrame) -> bool:
    """A frame cut short past what the program's parser reads (shorter than its UDP
    length says): the header, and 64 values at size codes 1 and 3 (the first quarter
    of a size-code-3 packet; the other codes are dropped on the header alone). The
    program cannot tell: Tofino 1's ingress has no packet length, and the frame's end
    shows only to a later pass or in egress; it checks the UDP length against the size
    code. A host's IP stack drops such a packet before the emulator sees it. Frames cut
    inside what the parser reads end in a parser error, which the program counts as
    malformed, as the emulator does a short datagram: those replay."""
    header = frame.datagram[:HEADER_LEN]
    if len(header) < HEADER_LEN or len(frame.datagram) >= frame.udp_len - UDP_LEN:
        return False
    parsed = HEADER_LEN + (256 if header[0] & 7 in L.ENTRIES_PER_SLOT else 0)
    return len(frame.datagram) >= parsed


def replay_all(tests: list[TestCase]) -> Report:
    return Report([replay(t) for t in tests])
