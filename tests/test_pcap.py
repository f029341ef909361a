"""swemu.observe.pcap: the synthesised frames must be what a real capture would hold.

Files are read back with our own reader and with scapy's ``rdpcap`` (an
independent parser), and the headers are checked field by field against what
the test itself computes from the inputs.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from swemu.launch import run
from swemu.observe.pcap import (
    MAX_UDP_PAYLOAD,
    CapturedPacket,
    PcapError,
    PcapWriter,
    read_pcap,
)
from swemu.protocol import wire

# a record: 16-byte pcap header + 14 Ethernet + 20 IPv4 + 8 UDP + payload
REC_OVERHEAD = 16 + 14 + 20 + 8
FILE_HEADER = 24

SWITCH = (wire.ipv4_to_int("10.1.2.3"), 0xBEE0)


def random_traffic(
    seed: int, count: int = 40, code: int | None = None
) -> list[tuple[bytes, tuple, tuple, float]]:
    """SwitchML packets of every size code (or only ``code``) in both directions,
    plus junk payloads when the size code is not fixed."""
    rng = np.random.default_rng(seed)
    out = []
    t = 1_700_000_000.0 + rng.random()
    for i in range(count):
        if code is None and i % 5 == 4:  # not a SwitchML packet: any length, including 0
            data = rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes()
        else:
            c = int(rng.integers(0, 8)) if code is None else code
            data = wire.encode(
                size_code=c,
                job_number=int(rng.integers(0, 256)),
                tsi=int(rng.integers(0, 2**32)),
                set=int(rng.integers(0, 2)),
                slot=int(rng.integers(0, wire.MAX_SLOTS)),
                e0=int(rng.integers(-128, 128)),
                e1=int(rng.integers(-128, 128)),
                values=rng.integers(-(2**31), 2**31, 32 << c),
            )
        worker = (int(rng.integers(1, 2**32)), int(rng.integers(0, 65536)))
        src, dst = (worker, SWITCH) if rng.random() < 0.5 else (SWITCH, worker)
        t += float(rng.random()) * 1e-3
        out.append((data, src, dst, t))
    return out


def write_all(path: Path, traffic, **kw) -> PcapWriter:
    with PcapWriter(path, **kw) as w:
        for data, src, dst, ts in traffic:
            assert w.write(data, src, dst, ts)
    return w


def mac_of(ip: int) -> str:
    return "02:00:" + ":".join(f"{b:02x}" for b in ip.to_bytes(4, "big"))


def inet_checksum(header: bytes) -> int:
    """RFC 1071, written out here so the test does not trust the writer's copy."""
    s = 0
    for i in range(0, len(header), 2):
        s += (header[i] << 8) | header[i + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def test_global_header(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    PcapWriter(path, snaplen=9000).close()
    raw = path.read_bytes()
    assert len(raw) == FILE_HEADER
    magic, major, minor, zone, sigfigs, snaplen, linktype = struct.unpack("<IHHiIII", raw)
    assert (magic, major, minor, zone, sigfigs) == (0xA1B2C3D4, 2, 4, 0, 0)
    assert (snaplen, linktype) == (9000, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roundtrip_read_pcap(tmp_path: Path, seed: int) -> None:
    traffic = random_traffic(seed)
    path = tmp_path / "t.pcap"
    w = write_all(path, traffic)
    expect_size = FILE_HEADER + sum(REC_OVERHEAD + len(d) for d, *_ in traffic)
    assert w.packets == len(traffic) and w.dropped == 0
    assert w.bytes_written == expect_size == os.path.getsize(path)
    got = list(read_pcap(path))
    assert len(got) == len(traffic)
    for i, (c, (data, src, dst, ts)) in enumerate(zip(got, traffic, strict=True)):
        assert isinstance(c, CapturedPacket)
        assert (c.src, c.dst, c.payload, c.truncated, c.frame) == (src, dst, data, False, i + 1)
        assert c.ts == pytest.approx(ts, abs=1e-6)


@pytest.mark.parametrize("seed", [3, 4])
def test_scapy_reads_valid_frames(tmp_path: Path, seed: int) -> None:
    scapy_all = pytest.importorskip("scapy.all")
    IP, UDP, Ether = scapy_all.IP, scapy_all.UDP, scapy_all.Ether
    traffic = random_traffic(seed, count=25)
    path = tmp_path / "s.pcap"
    write_all(path, traffic)
    pkts = scapy_all.rdpcap(str(path))
    assert len(pkts) == len(traffic)
    ids = []
    for pkt, (data, src, dst, ts) in zip(pkts, traffic, strict=True):
        frame = bytes(pkt)
        assert len(frame) == 42 + len(data)
        assert float(pkt.time) == pytest.approx(ts, abs=1e-6)
        eth = pkt[Ether]
        assert (eth.src, eth.dst, eth.type) == (mac_of(src[0]), mac_of(dst[0]), 0x0800)
        ip = pkt[IP]
        assert (ip.version, ip.ihl, ip.tos, ip.ttl, ip.proto) == (4, 5, 0, 64, 17)
        assert int(ip.flags) == 0 and ip.frag == 0  # DF clear: the switch's results may fragment
        assert ip.len == 20 + 8 + len(data)
        assert ip.src == wire.int_to_ipv4(src[0]) and ip.dst == wire.int_to_ipv4(dst[0])
        # the stored checksum equals the one scapy recomputes, and the header sums to 0xFFFF
        stored = ip.chksum
        assert inet_checksum(frame[14:34]) == 0xFFFF
        ip_copy = ip.copy()
        del ip_copy.chksum
        assert IP(bytes(ip_copy)).chksum == stored
        udp = pkt[UDP]
        assert (udp.sport, udp.dport) == (src[1], dst[1])
        assert udp.len == 8 + len(data) and udp.chksum == 0
        assert frame[42:] == data
        ids.append(ip.id)
    assert ids == list(range(len(traffic)))  # a fresh IP id per packet


def _as_batch(traffic):
    width = max(len(d) for d, *_ in traffic) + 7  # rows longer than the datagrams
    buf = np.full((len(traffic), width), 0xAA, np.uint8)
    for i, (d, *_) in enumerate(traffic):
        buf[i, : len(d)] = np.frombuffer(d, np.uint8)
    lens = np.array([len(d) for d, *_ in traffic])
    addrs = np.array([(*src, *dst) for _, src, dst, _ in traffic], dtype=np.int64)
    cols = [addrs[:, k] for k in range(4)]  # src ip, src port, dst ip, dst port
    ts = np.array([t for *_, t in traffic])
    return buf, lens, cols, ts


@pytest.mark.parametrize(
    ("seed", "code", "snaplen"), [(5, None, 65535), (6, None, 300), (7, 3, 65535), (8, 2, 300)]
)
def test_write_batch_matches_single_writes(
    tmp_path: Path, seed: int, code: int | None, snaplen: int
) -> None:
    """Mixed lengths and one length (the writer's two ways of assembling records),
    with and without snaplen cutting records."""
    traffic = random_traffic(seed, code=code)
    single = tmp_path / "single.pcap"
    batched = tmp_path / "batch.pcap"
    write_all(single, traffic, snaplen=snaplen)
    buf, lens, (sip, sport, dip, dport), ts = _as_batch(traffic)
    with PcapWriter(batched, snaplen=snaplen) as w:
        assert (
            w.write_batch(buf[:10], lens[:10], sip[:10], sport[:10], dip[:10], dport[:10], ts[:10])
            == 10
        )
        assert (
            w.write_batch(buf[10:], lens[10:], sip[10:], sport[10:], dip[10:], dport[10:], ts[10:])
            == len(traffic) - 10
        )
    assert w.packets == len(traffic)
    assert w.bytes_written == os.path.getsize(batched)
    assert batched.read_bytes() == single.read_bytes()


def test_write_batch_rows_and_scalars(tmp_path: Path) -> None:
    """The switch's shape: one result row sent to several workers from one address."""
    rng = np.random.default_rng(7)
    results = [
        wire.encode(size_code=1, job_number=1, tsi=t, set=0, slot=t, values=rng.integers(-9, 9, 64))
        for t in range(3)
    ]
    buf = np.zeros((4, wire.MAX_PACKET_LEN), np.uint8)
    for r, d in enumerate(results):
        buf[r, : len(d)] = np.frombuffer(d, np.uint8)
    lens = np.array([len(d) for d in results] + [0])
    rows = np.array([0, 0, 2, 1, 1, 1])
    dst_ip = np.arange(1, 7) + wire.ipv4_to_int("10.0.0.0")
    dst_port = np.arange(6) + 5000
    path = tmp_path / "r.pcap"
    with PcapWriter(path) as w:
        n = w.write_batch(buf, lens, SWITCH[0], SWITCH[1], dst_ip, dst_port, 12.5, rows=rows)
    assert n == 6
    got = list(read_pcap(path))
    assert [c.payload for c in got] == [results[r] for r in rows]
    assert [c.dst for c in got] == [(int(i), int(p)) for i, p in zip(dst_ip, dst_port, strict=True)]
    assert all(c.src == SWITCH and c.ts == 12.5 for c in got)


def test_max_packets_bound(tmp_path: Path) -> None:
    traffic = random_traffic(8, count=10)
    path = tmp_path / "b.pcap"
    with PcapWriter(path, max_packets=3) as w:
        ok = [w.write(d, s, t, ts) for d, s, t, ts in traffic[:5]]
        assert ok == [True, True, True, False, False]
        assert (w.packets, w.dropped, w.full) == (3, 2, True)
        buf, lens, (sip, sport, dip, dport), ts = _as_batch(traffic[5:])
        assert w.write_batch(buf, lens, sip, sport, dip, dport, ts) == 0
        assert (w.packets, w.dropped) == (3, 7)
    assert [c.payload for c in read_pcap(path)] == [d for d, *_ in traffic[:3]]
    assert os.path.getsize(path) == w.bytes_written


def test_max_bytes_bound_keeps_a_prefix(tmp_path: Path) -> None:
    big = wire.encode(size_code=0, job_number=0, tsi=0, set=0, slot=0, values=np.zeros(32))
    small = b"\x10\x00"
    rec_big = REC_OVERHEAD + len(big)
    # room for two big records and more than a small one, but not a third big one
    limit = FILE_HEADER + 2 * rec_big + REC_OVERHEAD + 10
    path = tmp_path / "m.pcap"
    with PcapWriter(path, max_bytes=limit) as w:
        assert w.write(big, (1, 1), SWITCH, 1.0)
        assert w.write(big, (1, 1), SWITCH, 2.0)
        assert not w.write(big, (1, 1), SWITCH, 3.0)
        # it would fit, but the capture stays a prefix of the traffic
        assert not w.write(small, (1, 1), SWITCH, 4.0)
        assert (w.packets, w.dropped) == (2, 2)
    assert os.path.getsize(path) == w.bytes_written == FILE_HEADER + 2 * rec_big <= limit
    assert [c.ts for c in read_pcap(path)] == [1.0, 2.0]


def test_batch_stops_inside_a_batch(tmp_path: Path) -> None:
    traffic = random_traffic(9, count=8)
    sizes = [REC_OVERHEAD + len(d) for d, *_ in traffic]
    limit = FILE_HEADER + sum(sizes[:5]) + sizes[5] - 1  # packet 5 misses by one byte
    buf, lens, (sip, sport, dip, dport), ts = _as_batch(traffic)
    path = tmp_path / "p.pcap"
    with PcapWriter(path, max_bytes=limit) as w:
        assert w.write_batch(buf, lens, sip, sport, dip, dport, ts) == 5
        assert (w.packets, w.dropped, w.full) == (5, 3, True)
    assert [c.payload for c in read_pcap(path)] == [d for d, *_ in traffic[:5]]
    with PcapWriter(tmp_path / "q.pcap", max_packets=6, max_bytes=None) as w2:
        assert w2.write_batch(buf, lens, sip, sport, dip, dport, ts) == 6
        assert w2.dropped == 2


def test_snaplen_truncates_records(tmp_path: Path) -> None:
    scapy_all = pytest.importorskip("scapy.all")
    data = wire.encode(size_code=0, job_number=1, tsi=2, set=1, slot=3, values=np.arange(32))
    path = tmp_path / "s.pcap"
    with PcapWriter(path, snaplen=100) as w:
        w.write(data, (5, 6), SWITCH, 1.0)
    head = path.read_bytes()[FILE_HEADER : FILE_HEADER + 16]
    assert struct.unpack("<IIII", head)[2:] == (100, 42 + len(data))
    (c,) = read_pcap(path)
    assert c.truncated and c.payload == data[: 100 - 42]
    (pkt,) = scapy_all.rdpcap(str(path))
    assert pkt.wirelen == 42 + len(data) and len(bytes(pkt)) == 100


def test_timestamps_round_to_microseconds(tmp_path: Path) -> None:
    path = tmp_path / "ts.pcap"
    stamps = [0.0, 1.9999996, 1_700_000_000.123456, 12.0000004]
    with PcapWriter(path) as w:
        for t in stamps:
            w.write(b"", (1, 1), SWITCH, t)
        w.write_batch(np.zeros((4, 1), np.uint8), np.zeros(4), 1, 1, *SWITCH, np.array(stamps))
    raw = path.read_bytes()
    got = []
    off = FILE_HEADER
    while off < len(raw):
        sec, usec, incl, _ = struct.unpack_from("<IIII", raw, off)
        got.append((sec, usec))
        off += 16 + incl
    expect = [(0, 0), (2, 0), (1_700_000_000, 123456), (12, 0)]
    assert got == expect + expect


def test_misuse_raises(tmp_path: Path) -> None:
    w = PcapWriter(tmp_path / "e.pcap")
    with pytest.raises(ValueError):
        w.write(bytes(MAX_UDP_PAYLOAD + 1), (1, 1), SWITCH, 0.0)
    w.write(bytes(MAX_UDP_PAYLOAD), (1, 1), SWITCH, 0.0)  # the largest datagram is fine
    with pytest.raises(ValueError):
        w.write(b"x", (1, 1), SWITCH, -1.0)
    with pytest.raises(ValueError):
        w.write(b"x", (2**32, 1), SWITCH, 0.0)
    with pytest.raises(ValueError):
        w.write(b"x", (1, 70000), SWITCH, 0.0)
    with pytest.raises(ValueError):
        w.write_batch(np.zeros((2, 4), np.uint8), [4, 5], 1, 1, 1, 1, 0.0)  # len > row
    with pytest.raises(ValueError):
        w.write_batch(np.zeros((2, 4), np.uint8), [4, 4], 1, 1, 1, 1, 0.0, rows=[0, 2])
    w.close()
    w.close()
    with pytest.raises(ValueError):
        w.write(b"x", (1, 1), SWITCH, 0.0)
    with pytest.raises(ValueError):
        PcapWriter(tmp_path / "f.pcap", snaplen=41)
    with pytest.raises(ValueError):
        PcapWriter(tmp_path / "g.pcap", max_bytes=10)
    (c,) = read_pcap(tmp_path / "e.pcap")  # the default snaplen of 65535 cuts it
    assert c.truncated and c.payload == bytes(65535 - 42)


def test_read_pcap_other_writers_and_link_types(tmp_path: Path) -> None:
    """Files written by scapy: VLAN, Linux cooked, raw IP, big-endian, nanoseconds."""
    s = pytest.importorskip("scapy.all")
    payload = b"\x11" + bytes(9) + bytes(128)
    udp = s.UDP(sport=4000, dport=0xBEE7) / s.Raw(payload)
    ip = s.IP(src="10.0.0.9", dst="10.0.0.100")
    want = CapturedPacket(
        5.25,
        (wire.ipv4_to_int("10.0.0.9"), 4000),
        (wire.ipv4_to_int("10.0.0.100"), 0xBEE7),
        payload,
    )

    def check(pkts, frames, **kw):
        path = tmp_path / "o.pcap"
        for p in pkts:
            p.time = 5.25
        s.wrpcap(str(path), pkts, **kw)
        got = list(read_pcap(path))
        assert [(g.src, g.dst, g.payload, g.truncated, g.ts) for g in got] == [
            (want.src, want.dst, want.payload, False, want.ts)
        ] * len(frames)
        assert [g.frame for g in got] == frames

    noise = [s.Ether() / s.ARP(), s.Ether() / s.IP() / s.TCP()]
    check([*noise, s.Ether() / ip / udp], [3])
    check([s.Ether() / s.Dot1Q(vlan=7) / ip / udp], [1])
    check([s.Ether() / ip / udp], [1], endianness=">")
    check([s.Ether() / ip / udp], [1], nano=True)
    check([s.CookedLinux(proto=0x0800) / ip / udp], [1])
    check([ip / udp, ip / udp], [1, 2], linktype=101)
    # a later fragment has no UDP header: skipped; a first fragment is truncated
    frags = s.fragment(s.IP(src="10.0.0.9", dst="10.0.0.100") / udp, fragsize=64)
    path = tmp_path / "frag.pcap"
    s.wrpcap(str(path), [s.Ether() / f for f in frags])
    got = list(read_pcap(path))
    assert len(got) == 1 and got[0].truncated and payload.startswith(got[0].payload)


def test_read_pcap_bad_and_cut_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"\x0a\x0d\x0d\x0a" + bytes(40))  # pcapng
    with pytest.raises(PcapError):
        list(read_pcap(bad))
    bad.write_bytes(b"abc")
    with pytest.raises(PcapError):
        list(read_pcap(bad))
    path = tmp_path / "cut.pcap"
    traffic = random_traffic(10, count=3)
    write_all(path, traffic)
    raw = path.read_bytes()
    path.write_bytes(raw[:-5])  # a capture cut while the last record was written
    assert [c.payload for c in read_pcap(path)] == [d for d, *_ in traffic[:2]]


@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed")
def test_tcpdump_reads_the_capture(tmp_path: Path) -> None:
    traffic = random_traffic(11, count=12)
    path = tmp_path / "td.pcap"
    write_all(path, traffic)
    out = run(["tcpdump", "-nn", "-v", "-r", str(path)], timeout=60).stdout
    assert out.count(" UDP, length ") == len(traffic)
    assert "bad cksum" not in out


# ------------------------------------------- the vectorised reader vs a plain one
def plain_read_pcap(path: Path) -> list[CapturedPacket]:
    """The reader written record by record with struct (the twin of
    :func:`swemu.observe.pcap.read_pcap_batches`, which parses whole chunks with numpy),
    Ethernet link type only."""
    raw = path.read_bytes()
    out = []
    off, frame = 24, 0
    while off + 16 <= len(raw):
        sec, usec, incl, _ = struct.unpack_from("<IIII", raw, off)
        data = raw[off + 16 : off + 16 + incl]
        if len(data) < incl:
            break
        off += 16 + incl
        frame += 1
        l3, etype = 14, None
        if len(data) >= 14:
            etype = int.from_bytes(data[12:14], "big")
        while etype in (0x8100, 0x88A8) and len(data) >= l3 + 4:
            etype = int.from_bytes(data[l3 + 2 : l3 + 4], "big")
            l3 += 4
        if etype != 0x0800 or len(data) < l3 + 20 or data[l3] >> 4 != 4:
            continue
        ihl = (data[l3] & 0x0F) * 4
        total_len, frag = struct.unpack_from("!H2xH", data, l3 + 2)
        if data[l3 + 9] != 17 or ihl < 20 or frag & 0x1FFF:
            continue
        src_ip, dst_ip = struct.unpack_from("!II", data, l3 + 12)
        udp = l3 + ihl
        if len(data) < udp + 8:
            continue
        sport, dport, udp_len = struct.unpack_from("!HHH", data, udp)
        want = max(udp_len - 8, 0)
        payload = data[udp + 8 : min(udp + 8 + want, l3 + total_len, len(data))]
        truncated = len(payload) < want or bool(frag & 0x2000)
        ts = sec + usec * 1e-6
        out.append(CapturedPacket(ts, (src_ip, sport), (dst_ip, dport), payload, truncated, frame))
    return out


def messy_capture(path: Path, seed: int, count: int = 300) -> None:
    """Ethernet records of every kind the reader must sort out: UDP with VLAN tags
    and IP options, ARP, TCP, fragments, lying length fields, cut records."""
    rng = np.random.default_rng(seed)
    recs = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    same = bytes(rng.integers(0, 256, 138, dtype=np.uint8))  # runs of equal records
    for i in range(count):
        kind = rng.integers(0, 10)
        payload = same if kind < 4 else bytes(rng.integers(0, 256, rng.integers(0, 300)))
        vlan = b"".join(
            struct.pack("!HH", int(rng.choice([0x8100, 0x88A8])), 7)
            for _ in range(int(rng.integers(0, 3)) if kind == 4 else 0)
        )
        ihl = 5 + (int(rng.integers(1, 3)) if kind == 5 else 0)
        proto = 6 if kind == 6 else 17
        frag = {7: 0x2000, 8: 0x0010}.get(int(kind), 0)
        udp_len = 8 + len(payload) + (int(rng.integers(-20, 20)) if kind == 9 else 0)
        total = 4 * ihl + 8 + len(payload) - (int(rng.integers(0, 30)) if kind == 9 else 0)
        ip = struct.pack(
            "!BBHHHBBHII",
            0x40 | ihl,
            0,
            max(total, 0) & 0xFFFF,
            i,
            frag,
            64,
            proto,
            0,
            int(rng.integers(0, 2**32)),
            int(rng.integers(0, 2**32)),
        ) + bytes(4 * ihl - 20)
        udp = struct.pack("!HHHH", int(rng.integers(0, 65536)), 0xBEE0, max(udp_len, 0) & 0xFFFF, 0)
        etype = 0x0806 if kind == 3 and rng.random() < 0.5 else 0x0800
        frame = bytes(12) + vlan + struct.pack("!H", etype) + ip + udp + payload
        if rng.random() < 0.1:
            frame = frame[: int(rng.integers(0, len(frame) + 1))]  # snaplen cut
        recs.append(struct.pack("<IIII", 1000 + i, int(rng.integers(0, 10**6)), len(frame), 9000))
        recs.append(frame)
    path.write_bytes(b"".join(recs) + b"\x00" * int(rng.integers(0, 16)))  # a cut header


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk", [40, 997, 8 << 20])
def test_batch_reader_matches_the_plain_reader(tmp_path: Path, seed: int, chunk: int) -> None:
    from swemu.observe.pcap import read_pcap_batches

    path = tmp_path / "messy.pcap"
    messy_capture(path, seed)
    want = plain_read_pcap(path)
    assert 50 < len(want) < 300  # some of each: kept and skipped
    assert any(p.truncated for p in want) and not all(p.truncated for p in want)
    got = [p for b in read_pcap_batches(path, chunk_bytes=chunk) for p in b.packets()]
    assert got == want
