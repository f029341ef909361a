"""P4Testgen's tests of p4/switchml.p4, replayed against the emulator's switch engine.

The corpus (p4/testgen/corpus/switchml.json) is what p4c's P4Testgen, with its Tofino
semantics of TNA, generated for the program (``python -m p4.testgen.generate``, where
p4/model/build-p4testgen.sh built it); this module replays every test against a fresh
:class:`swemu.core.engine.SwitchEngine` (:mod:`p4.testgen.replay`) without p4testgen.
The other tests check the reader of the generator's PTF files and that the replay fails
when the program and the emulator disagree.
"""

from __future__ import annotations

import copy
import struct

import numpy as np
import pytest

from p4.testgen import generate, ptf, replay
from p4.testgen import layout as L
from swemu.core.engine import Action
from swemu.protocol import wire

WORKER_IP, SWITCH_IP = 0x0A000001, 0x0A0000FE
WORKER_PORT = 40000


def frame(datagram: bytes, src_ip: int = WORKER_IP, src_port: int = WORKER_PORT) -> bytes:
    """Ethernet / IPv4 / UDP to the switch's port 0xBEE0 around ``datagram``."""
    udp_len = 8 + len(datagram)
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, 20 + udp_len, 0, 0, 64, 17, 0, src_ip, SWITCH_IP)
    udp = struct.pack("!HHHH", src_port, wire.UDP_PORT_BASE, udp_len, 0)
    eth = bytes.fromhex("0200000000010200000000020800")
    return eth + ip + udp + datagram


def set_worker(
    job_id: int = 3, worker_id: int = 0, num_workers: int = 2, **kw: int
) -> ptf.TableEntry:
    params = dict(
        job_id=job_id,
        worker_id=worker_id,
        worker_bit=1 << worker_id,
        num_workers=num_workers,
        size_code=1,
        pool_base=16,
        pool_size=8,
        mgid=5,
    )
    params.update(kw)
    key = [
        ptf.KeyField("hdr.ipv4.src_addr", WORKER_IP),
        ptf.KeyField("hdr.udp.src_port", WORKER_PORT),
    ]
    return ptf.TableEntry(L.WORKER_BY_ADDRESS, L.SET_WORKER, params, key)


def packet(slot: int = 2, set_: int = 0, values: int = 7, code: int = 1, e0: int = 3) -> bytes:
    n = wire.values_per_packet(code)
    return wire.encode(
        size_code=code, job_number=9, tsi=77, set=set_, slot=slot,
        values=np.full(n, values, np.int32), e0=e0,
    )  # fmt: skip


def first_packet_test(trace: str = "Ingress.next_step.aggregated", **after: object) -> ptf.TestCase:
    """Worker 0 of two sends the first packet to slot 2, set 0 (size code 1): the program
    drops it after aggregating; registers after as the program leaves them, unless
    overridden through ``after``."""
    pool_index = L.pool_index(16, 1, 2, 0)
    t = ptf.TestCase("Test1", port=4, packet=frame(packet()), entries=[set_worker()])
    t.trace = [f"[Table] {trace}"]
    t.registers = [
        ptf.RegisterValue(
            L.WORKER_BITMAP,
            pool_index >> 1,
            {"set0": 0, "set1": 0},
            after.get("bitmap", {"set0": 1, "set1": 0}),
        ),
        ptf.RegisterValue(L.COUNT, pool_index, 0, after.get("count", 1)),
        ptf.RegisterValue(L.EXPONENTS, pool_index, {"e0": 0, "e1": 0}, {"e0": 3, "e1": 0}),
        ptf.RegisterValue(
            "Ingress.aggregate.pair05.values",
            pool_index,
            {"first": 1, "second": 2},
            after.get("pair", {"first": 7, "second": 7}),
        ),
    ]
    return t


# ----------------------------------------------------------------------------- the reader
BITMAP = "'Ingress.worker_bitmap.worker_bitmap"
BITMAP_LINE = (
    f"        self.setRegisterValue({BITMAP}', [({BITMAP}.set0', 0x1), ({BITMAP}.set1', 0x0)], 21)"
)
PTF_SAMPLE = '''
class Test7(AbstractTest):
    # Date generated: 2026-01-01-00:00:00.000
    # Current statement coverage: 0.42
    """
    [Parser] IngressParser
    [Table Branch] Ingress.worker_lookup.worker_by_address
    """

    def setupCtrlPlane(self):
        # Table Ingress.worker_lookup.worker_by_address
        self.insertTableEntry(
            'Ingress.worker_lookup.worker_by_address',
            [
                gc.KeyTuple('hdr.ipv4.src_addr', 0x0a000001),
                gc.KeyTuple('hdr.udp.src_port', 0x9c40),
            ],
            'Ingress.worker_lookup.set_worker',
            [
                gc.DataTuple('job_id', 0x03),
                gc.DataTuple('worker_id', 0x00),
            ]
        )
        self.insertTableEntry(
            'Ingress.arp_icmp.arp_icmp',
            [
                gc.KeyTuple('hdr.arp.opcode', 0x0001, 0xffff),
                gc.KeyTuple('hdr.ipv4.dst_addr', low=0x01, high=0x02),
            ],
            'Ingress.arp_icmp.reply_arp',
            [
                gc.DataTuple('switch_mac', 0x020000000001),
            ]
        )
        self.setRegisterValue('Ingress.count_workers.count', 0x05, 42)
{bitmap_line}

    def sendPacket(self):
        ig_port = 4
        pkt = b'\\x00\\x01\\x02'
        send_packet(self, ig_port, pkt)

    def verifyPackets(self):
        eg_port = 68
        exp_pkt = b'\\x0a\\x0b'
        exp_pkt = Mask(exp_pkt)
        exp_pkt.set_do_not_care(4, 8)
        verify_packet(self, exp_pkt, eg_port)
        self.verifyRegisterValue('Ingress.count_workers.count', 0x04, 42)

    def runTest(self):
        self.runTestImpl()
'''.replace("{bitmap_line}", BITMAP_LINE)


def test_the_reader_takes_entries_registers_packets_masks_and_trace() -> None:
    (t,) = ptf.parse_file(PTF_SAMPLE)
    assert (t.name, t.port, t.packet, t.coverage) == ("Test7", 4, b"\x00\x01\x02", 0.42)
    worker, arp = t.entries
    assert worker.table == L.WORKER_BY_ADDRESS and worker.action == L.SET_WORKER
    assert [(k.name, k.value, k.mask) for k in worker.key] == [
        ("hdr.ipv4.src_addr", WORKER_IP, None),
        ("hdr.udp.src_port", WORKER_PORT, None),
    ]
    assert worker.params == {"job_id": 3, "worker_id": 0}
    assert (arp.key[0].mask, arp.key[1].low, arp.key[1].high) == (0xFFFF, 1, 2)
    count, bitmap = t.registers
    assert (count.name, count.index, count.before, count.after) == (L.COUNT, 42, 5, 4)
    assert (bitmap.before, bitmap.after) == ({"set0": 1, "set1": 0}, None)
    assert t.expected == ptf.Expected(68, b"\x0a\x0b", [(4, 8)])
    assert t.expected.care_mask() == b"\xf0\x0f"
    assert t.trace[-1].endswith("worker_by_address")
    assert ptf.TestCase.from_json(t.to_json()) == t


def test_the_reader_refuses_calls_it_does_not_know() -> None:
    bad = PTF_SAMPLE.replace("self.setRegisterValue('Ingress.count", "self.setMeter('Ingress.count")
    with pytest.raises(ptf.PtfFormatError, match="setMeter"):
        ptf.parse_file(bad)


# ----------------------------------------------------------------------------- the replay
def test_a_first_contribution_replays_as_the_program_says() -> None:
    outcome = replay.replay(first_packet_test())
    assert outcome.kind == replay.FIRST_PASS
    assert outcome.mismatches == []


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        ({"trace": "Ingress.check_packet.malformed"}, "drop reason: the program DROP_MALFORMED"),
        ({"bitmap": {"set0": 1, "set1": 1}}, "worker_bitmap"),
        ({"count": 0}, "count"),
        ({"pair": {"first": 8, "second": 7}}, "pair05"),
    ],
)
def test_the_replay_fails_where_the_program_disagrees(change: dict, expect: str) -> None:
    outcome = replay.replay(first_packet_test(**change))
    assert any(expect in m for m in outcome.mismatches), outcome.mismatches


def test_a_result_the_program_does_not_send_is_a_mismatch() -> None:
    t = first_packet_test()
    t.entries = [set_worker(num_workers=1)]  # W = 1: the packet completes the slot
    t.registers = []
    outcome = replay.replay(t)
    assert outcome.mismatches == ["the program drops it (AGGREGATED), the emulator: MULTICAST"]


def test_control_planes_the_controller_never_writes_are_set_apart() -> None:
    for kw, why in [
        ({"worker_bit": 2}, "worker_bit"),
        ({"worker_id": 2}, "worker 2 of 2"),
        ({"size_code": 2}, "size code 2"),
        ({"pool_base": L.NUM_POOL_SLOTS - 4}, "pool"),
    ]:
        t = first_packet_test()
        t.entries = [set_worker(**kw)]
        outcome = replay.replay(t)
        assert outcome.kind == replay.UNWRITTEN and why in outcome.note


def test_other_traffic_is_not_replayed() -> None:
    t = first_packet_test()
    t.packet = t.packet[:12] + b"\x08\x06" + t.packet[14:]  # ARP
    assert replay.replay(t).kind == replay.NOT_SWITCHML


# ----------------------------------------------------------------------------- the corpus
@pytest.fixture(scope="module")
def corpus() -> tuple[dict, list[ptf.TestCase]]:
    if not generate.CORPUS.exists():
        pytest.skip(
            f"no corpus at {generate.CORPUS} yet: p4/model/build-p4testgen.sh builds "
            "p4testgen, python -m p4.testgen.generate writes the corpus (p4/README.md)"
        )
    return generate.load()


def test_every_generated_test_replays_without_a_mismatch(corpus) -> None:
    record, tests = corpus
    assert record["tests"] == len(tests) > 0
    report = replay.replay_all(tests)
    assert not report.mismatched, report.summary()
    compared = {o.kind for o in report.outcomes if o.replayed}
    assert compared == {replay.FIRST_PASS, replay.LATER_PASS}, report.summary()


def test_a_changed_expectation_in_the_corpus_is_caught(corpus) -> None:
    """The replay is not vacuous: flip one cared-for bit of each expected packet of the
    first-pass tests, or the drop reason, and the replay reports it."""
    _, tests = corpus
    checked = 0
    for t in tests:
        if replay.replay(t).kind != replay.FIRST_PASS or t.expected is None:
            continue
        bad = copy.deepcopy(t)
        care = bad.expected.care_mask()
        i = next(i for i, c in enumerate(care) if c and i >= L.header_bytes("switchml_md_h"))
        bit = care[i] & -care[i]
        bad.expected.packet = (
            bad.expected.packet[:i]
            + bytes([bad.expected.packet[i] ^ bit])
            + bad.expected.packet[i + 1 :]
        )
        assert replay.replay(bad).mismatches, t.name
        checked += 1
    assert checked > 0


def test_drop_reasons_come_from_the_trace() -> None:
    t = first_packet_test(trace="Ingress.reject_slot.slot_out_of_range")
    assert replay.p4_action(t) == Action.DROP_SLOT_RANGE


def harvest_test(e1: int = 4, second: int = 20) -> ptf.TestCase:
    """A harvest pass (size code 1) of a unicast result back to the sender: the program
    reads e1 and the second halves of the value pairs at its pool_index."""
    pool_index = (100 << 1) | 1
    md = L.pack(
        "switchml_md_h",
        {
            "pass_type": L.const("PASS_HARVEST"),
            "value_op": L.const("VALUE_OP_READ"),
            "result": 1,
            "ingress_port": 4,
            "mgid": 5,
            "pool_index": pool_index,
        },
    )
    sent = frame(packet(slot=9, set_=1))
    result = bytearray(sent)
    result[replay.SWITCHML_AT + 9] = e1
    pair5 = replay.SWITCHML_AT + wire.HEADER_LEN + 4 * 37
    result[pair5 : pair5 + 4] = second.to_bytes(4, "big")
    for i in range(32, 64):  # the other pairs are 0 in the registers
        if i != 37:
            at = replay.SWITCHML_AT + wire.HEADER_LEN + 4 * i
            result[at : at + 4] = bytes(4)
    t = ptf.TestCase("Test2", port=L.recirculation_port(4), packet=md + sent)
    t.registers = [
        ptf.RegisterValue(L.EXPONENTS, pool_index, {"e0": 3, "e1": 4}, {"e0": 3, "e1": 4}),
        ptf.RegisterValue(
            "Ingress.aggregate.pair05.values", pool_index, {"first": 10, "second": 20}
        ),
    ]
    t.expected = ptf.Expected(4, replay.to_sender(bytes(result)))
    return t


def test_a_harvest_pass_replays_against_the_engines_unicast() -> None:
    outcome = replay.replay(harvest_test())
    assert (outcome.kind, outcome.mismatches) == (replay.LATER_PASS, [])


@pytest.mark.parametrize("change", [{"e1": 5}, {"second": 21}])
def test_a_harvest_pass_that_reads_something_else_is_a_mismatch(change: dict) -> None:
    outcome = replay.replay(harvest_test(**change))
    assert any(m.startswith("result:") for m in outcome.mismatches), outcome.mismatches


def test_the_coverage_report_is_read_from_the_generators_log() -> None:
    log = (
        "============ Test 3: Nodes covered: 0.5 (5/10) ============\n"
        "============ Test 4: Nodes covered: 0.6 (6/10) ============\n"
        "Not covered program nodes:\n"
        "\t/src/p4/result.p4\\52: hdr.ipv4.src_addr = hdr.ipv4.dst_addr;\n"
        "Covered program nodes:\n"
    )
    assert generate.coverage_of(log) == {
        "fraction": 0.6,
        "covered": 6,
        "statements": 10,
        "uncovered": ["p4/result.p4:52: hdr.ipv4.src_addr = hdr.ipv4.dst_addr;"],
    }


def later_pass(
    pass_type: str,
    op: str,
    result: int,
    multicast: int,
    body: bytes,
    pool_index: int = (101 << 1) | 1,
) -> bytes:
    md = L.pack(
        "switchml_md_h",
        {
            "pass_type": L.const(pass_type),
            "value_op": L.const(op),
            "result": result,
            "multicast": multicast,
            "ingress_port": 4,
            "mgid": 5,
            "pool_index": pool_index,
        },
    )
    return md + body


@pytest.mark.parametrize(("op", "after"), [("ADD", 10 + 7), ("WRITE", 7), ("READ", 10)])
def test_a_consume_pass_leaves_the_quarter_as_the_engine_does(op: str, after: int) -> None:
    code3 = frame(packet(code=3, values=7))
    body = (
        code3[: replay.SWITCHML_AT + wire.HEADER_LEN]
        + code3[replay.SWITCHML_AT + wire.HEADER_LEN + 256 :]
    )
    t = ptf.TestCase(
        "Test3",
        port=L.recirculation_port(4),
        packet=later_pass("PASS_CONSUME1", f"VALUE_OP_{op}", 0, 0, body),
    )
    pair = "Ingress.aggregate.pair09.values"
    t.registers = [
        ptf.RegisterValue(
            pair, (101 << 1) | 1, {"first": 10, "second": 10}, {"first": after, "second": after}
        )
    ]
    assert replay.replay(t).mismatches == []
    t.registers[0].after = {"first": after + 1, "second": after}
    assert replay.replay(t).mismatches[0].startswith(f"{pair}[{(101 << 1) | 1}] after")


def test_a_pass_the_solver_put_before_its_slots_first_entry_replays_one_slot_on() -> None:
    """P4Testgen puts a consume pass of quarter 2 on entry 0 (pool_index 0), where no slot
    can have its third entry: the replay moves the test's registers 4 entries on."""
    code3 = frame(packet(code=3, values=7))
    body = (
        code3[: replay.SWITCHML_AT + wire.HEADER_LEN]
        + code3[replay.SWITCHML_AT + wire.HEADER_LEN + 512 :]
    )
    pair = "Ingress.aggregate.pair09.values"
    t = ptf.TestCase(
        "Test3",
        port=L.recirculation_port(4),
        packet=later_pass("PASS_CONSUME2", "VALUE_OP_ADD", 0, 0, body, pool_index=1),
        registers=[
            ptf.RegisterValue(pair, 1, {"first": 10, "second": 10}, {"first": 17, "second": 17})
        ],
    )
    outcome = replay.replay(t)
    assert (outcome.kind, outcome.note, outcome.mismatches) == (replay.LATER_PASS, "", [])
    t.registers[0].after = {"first": 18, "second": 17}
    assert replay.replay(t).mismatches[0].startswith(f"{pair}[9] after")


def md_line(md: dict[str, int]) -> str:
    """A trace line of P4Testgen's extraction of ``switchml_md``."""
    fields = " | ".join(f"hdr.switchml_md.{k} = {v:#x}" for k, v in md.items())
    return f"[ExtractSuccess] hdr.switchml_md@0 | Extract Size: 56 -> {fields}"


def test_p4testgens_own_faults_are_set_apart_not_compared() -> None:
    """A sender or a replica on P4Testgen's drop port 511 (no Tofino port) is dropped by
    the generator's model; an egress that parsed a switchml_md other than the one ingress
    sent (its unicast hand-off) says nothing of the program. With the right switchml_md
    in egress the same test is compared."""
    t = harvest_test()
    md = L.unpack("switchml_md_h", t.packet)
    md_len = L.header_bytes("switchml_md_h")
    t.trace = [md_line(md), md_line(md)]
    assert replay.replay(t).replayed
    misread = copy.deepcopy(t)
    misread.trace[1] = md_line({**md, "pass_type": 5, "ingress_port": 0})
    assert replay.replay(misread).note.startswith("egress read a switchml_md")
    to_511 = copy.deepcopy(t)
    to_511.packet = L.pack("switchml_md_h", {**md, "ingress_port": 511}) + t.packet[md_len:]
    to_511.expected = None
    assert replay.replay(to_511).note.startswith("a sender on port 511")
    replica = copy.deepcopy(to_511)
    replica.packet = L.pack("switchml_md_h", {**md, "multicast": 1}) + t.packet[md_len:]
    replica.trace = [md_line({**md, "multicast": 1})] * 2
    replica.entries = [
        ptf.TableEntry(
            L.WORKER_ADDRESS,
            L.TO_WORKER,
            {"mac": 2, "ip": WORKER_IP, "udp_port": WORKER_PORT},
            [ptf.KeyField("eg_intr_md.egress_rid", 3 << 5)],
        )
    ]
    assert replay.replay(replica).note.startswith("a replica on port 511")
    replica.trace.append("[Table Branch: Egress.rewrite_result.worker_address ... no_worker]")
    assert replay.replay(replica).mismatches == ["the program drops; emulator MULTICAST"]


@pytest.mark.parametrize("formats", [0, 1])
def test_the_format_bit_goes_round_only_for_a_job_of_sixteen_bit_values(formats: int) -> None:
    """docs/protocol.md section 4.2: a result carries the packet's format bit only for a
    job registered with VALUE_FORMATS_INT32_AND_BLOCK16; the program's first pass clears
    it for the others before the packet goes round."""
    datagram = bytearray(packet(values=7))
    datagram[0] |= 0x08
    t = first_packet_test(trace="Ingress.next_step.multicast_result")
    t.packet = frame(bytes(datagram))
    t.entries = [set_worker(num_workers=1, value_formats=formats)]  # W = 1: a result
    t.registers = []
    md = L.pack(
        "switchml_md_h",
        {
            "pass_type": L.const("PASS_HARVEST"),
            "value_op": L.const("VALUE_OP_READ"),
            "result": 1,
            "multicast": 1,
            "ingress_port": 4,
            "mgid": 5,
            "pool_index": L.pool_index(16, 1, 2, 0),
        },
    )
    out = bytearray(t.packet)
    if not formats:
        out[replay.SWITCHML_AT] &= 0xF7
    t.expected = ptf.Expected(L.recirculation_port(4), md + bytes(out))
    assert replay.replay(t).mismatches == []
    out[replay.SWITCHML_AT] ^= 0x08
    t.expected = ptf.Expected(L.recirculation_port(4), md + bytes(out))
    assert replay.replay(t).mismatches[0].startswith("packet sent round")


def test_a_frame_shorter_than_its_udp_length_past_the_header_is_set_apart() -> None:
    """A size-code-5 datagram cut after its header: the program drops it for its size
    code (its parser reads the header only, Tofino's ingress has no packet length); a
    host never hands it to the emulator. A size-code-1 datagram cut inside its values
    ends the program's parse in an error: it is compared (malformed on both sides)."""
    t = first_packet_test()
    t.packet = frame(packet(code=5))[: replay.SWITCHML_AT + wire.HEADER_LEN + 100]
    assert replay.replay(t).kind == replay.TRUNCATED
    t.packet = frame(packet(code=1))[: replay.SWITCHML_AT + wire.HEADER_LEN + 100]
    t.trace = ["[Table] Ingress.check_packet.malformed"]
    t.registers = []  # a malformed packet touches none
    outcome = replay.replay(t)
    assert (outcome.kind, outcome.mismatches) == (replay.FIRST_PASS, [])


def test_a_collect_pass_puts_the_engines_half_in_front() -> None:
    body = frame(packet(code=3))[: replay.SWITCHML_AT + wire.HEADER_LEN]  # nothing collected yet
    t = ptf.TestCase(
        "Test4",
        port=L.recirculation_port(4),
        packet=later_pass("PASS_COLLECT_3_SECOND", "VALUE_OP_READ", 1, 0, body),
    )
    t.registers = [
        ptf.RegisterValue(
            "Ingress.aggregate.pair02.values", (101 << 1) | 1, {"first": 1, "second": 99}
        )
    ]
    half = bytearray(128)
    half[8:12] = (99).to_bytes(4, "big")  # pair 2's second: value 224 + 2 of the result
    md_len = L.header_bytes("switchml_md_h")
    out = t.packet[:md_len] + body + bytes(half)
    t.expected = ptf.Expected(L.recirculation_port(4), out, [(0, 8 * md_len)])
    assert replay.replay(t).mismatches == []
    t.expected.packet = out[:-1] + b"\x01"
    assert replay.replay(t).mismatches[0].startswith("half collected")


def test_negative_exponents_compare_at_their_width() -> None:
    t = first_packet_test()
    t.packet = frame(packet(e0=-3))
    t.registers[2].after = {"e0": -3, "e1": 0}  # int<8>, as the generator may write it
    assert replay.replay(t).mismatches == []
    t.registers[2].after = {"e0": -4, "e1": 0}
    assert "exponents" in replay.replay(t).mismatches[0]


def test_a_ptf_file_from_elsewhere_becomes_a_corpus(tmp_path) -> None:
    src = tmp_path / "switchml.py"
    src.write_text(PTF_SAMPLE)
    corpus = tmp_path / "corpus.json"
    assert generate.main(["--from-ptf", str(src), "--corpus", str(corpus)]) == 0
    record, tests = generate.load(corpus)
    assert record["tests"] == 1 and tests[0].name == "Test7"
