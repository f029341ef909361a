"""swemu.observe.scapy_switchml: golden bytes in both directions against swemu.protocol.wire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("scapy")

from scapy.layers.inet import IP, UDP
from scapy.packet import Raw

from swemu.observe.scapy_switchml import SwitchML, switchml_packets
from swemu.protocol import wire

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@st.composite
def packets(draw: st.DrawFn, code: st.SearchStrategy[int] | None = None) -> dict:
    """Header fields and values of one packet; values mix random ints and int32 extremes."""
    size_code = draw(code if code is not None else st.integers(0, 7))
    n = 32 << size_code
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.integers(INT32_MIN, INT32_MAX, n, endpoint=True)
    # plant extremes and small numbers where hypothesis says
    for v in draw(st.lists(st.sampled_from([INT32_MIN, INT32_MAX, -1, 0, 1]), max_size=8)):
        values[draw(st.integers(0, n - 1))] = v
    return {
        "size_code": size_code,
        "job_number": draw(st.integers(0, 255)),
        "tsi": draw(st.integers(0, 2**32 - 1)),
        "set": draw(st.integers(0, 1)),
        "slot": draw(st.integers(0, wire.MAX_SLOTS - 1)),
        "e0": draw(st.integers(-128, 127)),
        "e1": draw(st.integers(-128, 127)),
        "values": values,
    }


def layer_of(p: dict) -> SwitchML:
    return SwitchML(
        size=p["size_code"],
        job_number=p["job_number"],
        tsi=p["tsi"],
        set=p["set"],
        slot=p["slot"],
        e0=p["e0"],
        e1=p["e1"],
        values=[int(v) for v in p["values"]],
    )


def assert_fields(sw: SwitchML, p: dict) -> None:
    assert (sw.msg_type, sw.unused, sw.reserved) == (1, 0, 0)
    got = (sw.size, sw.job_number, sw.tsi, sw.set, sw.slot, sw.e0, sw.e1)
    want = tuple(p[k] for k in ("size_code", "job_number", "tsi", "set", "slot", "e0", "e1"))
    assert got == want
    assert sw.values == [int(v) for v in p["values"]]
    assert sw.pool_index == wire.pool_index(p["set"], p["slot"])


@pytest.mark.parametrize("code", range(8))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_golden_bytes_every_size_code(code: int, data: st.DataObject) -> None:
    p = data.draw(packets(st.just(code)))
    wire_bytes = wire.encode(**p)
    assert bytes(layer_of(p)) == wire_bytes  # scapy builds what our codec encodes
    sw = SwitchML(wire_bytes)  # and dissects what it encodes
    assert_fields(sw, p)
    assert Raw not in sw and len(sw.values) == 32 << code
    back = wire.decode(bytes(sw))
    assert back.values.tolist() == sw.values


@settings(max_examples=40, deadline=None)
@given(p=packets())
def test_through_udp_to_and_from_every_switch_port(p: dict) -> None:
    payload = wire.encode(**p)
    port = wire.UDP_PORT_BASE + p["slot"] % 16
    for sport, dport in ((1234, port), (port, 40000)):  # worker -> switch, switch -> worker
        frame = IP(
            bytes(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=sport, dport=dport) / payload)
        )
        assert SwitchML in frame, (sport, dport)
        assert_fields(frame[SwitchML], p)


def test_the_brief_example_and_unbound_ports() -> None:
    payload = wire.encode(size_code=1, job_number=9, tsi=77, set=1, slot=5, values=np.arange(64))
    pkt = IP(bytes(IP() / UDP(sport=1234, dport=0xBEE5) / payload))
    assert pkt[SwitchML].tsi == 77 and pkt[SwitchML].values == list(range(64))
    # 0xBEF0 and 0xBEDF are outside port & 0xFFF0 == 0xBEE0
    for port in (0xBEF0, 0xBEDF, 53):
        other = IP(bytes(IP() / UDP(sport=1234, dport=port) / payload))
        assert SwitchML not in other and bytes(other[UDP].payload) == payload


def test_building_on_udp_defaults_to_the_switch_port() -> None:
    pkt = IP(bytes(IP() / UDP(sport=40000) / SwitchML(size=0, values=[7] * 32)))
    assert pkt[UDP].dport == wire.DEFAULT_UDP_PORT
    assert pkt[SwitchML].values == [7] * 32


@pytest.mark.parametrize("code", [0, 7])
def test_int32_extremes_and_negative_exponents(code: int) -> None:
    n = 32 << code
    values = np.resize(np.array([INT32_MIN, INT32_MAX, -1, 0]), n)
    enc = wire.encode(
        size_code=code,
        job_number=255,
        tsi=2**32 - 1,
        set=1,
        slot=wire.MAX_SLOTS - 1,
        e0=-128,
        e1=-1,
        values=values,
    )
    sw = SwitchML(enc)
    assert (sw.e0, sw.e1, sw.tsi, sw.slot, sw.set) == (-128, -1, 2**32 - 1, 16383, 1)
    assert sw.values[:4] == [INT32_MIN, INT32_MAX, -1, 0]
    built = SwitchML(
        size=code,
        job_number=255,
        tsi=2**32 - 1,
        set=1,
        slot=16383,
        e0=-128,
        e1=-1,
        values=values.tolist(),
    )
    assert bytes(built) == enc
    assert enc[6:10] == b"\xbf\xff\x80\xff"  # pool_index 0xBFFF, e0 0x80, e1 0xFF


def test_malformed_datagrams_still_dissect() -> None:
    good = wire.encode(size_code=0, job_number=1, tsi=2, set=0, slot=3, values=np.arange(32))
    longer = SwitchML(good + b"xy")
    assert longer.values == list(range(32)) and bytes(longer[Raw]) == b"xy"
    shorter = SwitchML(good[:21])  # 2 whole values and a 3-byte tail
    assert shorter.values == [0, 1]
    assert SwitchML(bytes([0x20]) + good[1:]).msg_type == 2
    # a header cut short inside UDP falls back to Raw, as scapy does for any layer
    pkt = IP(bytes(IP() / UDP(dport=0xBEE0) / good[:5]))
    assert bytes(pkt[UDP].payload) == good[:5]


def test_result_answers_request() -> None:
    req = SwitchML(size=0, job_number=1, tsi=5, set=1, slot=9, values=[1] * 32)
    res = SwitchML(size=0, job_number=1, tsi=5, set=1, slot=9, values=[3] * 32)
    assert res.answers(req) and res.hashret() == req.hashret()
    other = SwitchML(size=0, job_number=1, tsi=5, set=0, slot=9, values=[3] * 32)
    assert not other.answers(req) and other.hashret() != req.hashret()


def test_switchml_packets_reads_our_capture(tmp_path: Path) -> None:
    from swemu.observe.pcap import PcapWriter

    rng = np.random.default_rng(1)
    sent = [
        wire.encode(
            size_code=c,
            job_number=c,
            tsi=100 + c,
            set=c & 1,
            slot=c,
            values=rng.integers(INT32_MIN, INT32_MAX, 32 << c, endpoint=True),
        )
        for c in range(8)
    ]
    path = tmp_path / "c.pcap"
    with PcapWriter(path) as w:
        for i, data in enumerate(sent):
            w.write(data, (1, 4000), (2, 0xBEE0 + i), float(i))
        w.write(b"not switchml", (1, 4000), (2, 53), 9.0)
    layers = switchml_packets(path)
    assert [bytes(sw) for sw in layers] == sent
    assert [sw.tsi for sw in layers] == [100 + c for c in range(8)]
