"""Bounded pcap capture of SwitchML traffic, in pure Python (struct + numpy).

The emulator sees datagrams, not frames: it has no Ethernet or IP headers to
record. :class:`PcapWriter` synthesises them — Ethernet II, IPv4 (valid header
checksum, DF clear, TTL 64) and UDP (checksum 0, which IPv4 allows) around each
SwitchML payload — so that Wireshark, tcpdump, scapy and :func:`read_pcap` can
open the file. MAC addresses are ``02:00:<IPv4 bytes>`` (locally administered),
so a reader can tell hosts apart at layer 2 too.

The file is classic libpcap (magic ``0xa1b2c3d4``, microsecond timestamps,
link type 1), written little-endian. A capture is bounded by a packet count and
a file size: once a packet does not fit, the capture is *full* and every later
packet is counted in :attr:`PcapWriter.dropped` instead of being written, so the
file is always a prefix of the traffic and never grows without limit.

This module never imports scapy (GPL-2.0, an optional extra): the core writes
and reads captures on its own.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from os import PathLike
from types import TracebackType
from typing import BinaryIO

import numpy as np
from numpy.typing import ArrayLike

PCAP_MAGIC = 0xA1B2C3D4  # microsecond timestamps
PCAP_MAGIC_NS = 0xA1B23C4D  # nanosecond timestamps (read only)
PCAP_VERSION = (2, 4)
LINKTYPE_ETHERNET = 1
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
LINKTYPES_RAW_IPV4 = frozenset({12, 101, 228})  # DLT_RAW, LINKTYPE_RAW, LINKTYPE_IPV4

ETH_LEN = 14
IPV4_LEN = 20
UDP_LEN = 8
FRAME_OVERHEAD = ETH_LEN + IPV4_LEN + UDP_LEN  # 42 bytes before the payload
MAX_UDP_PAYLOAD = 0xFFFF - IPV4_LEN - UDP_LEN  # the IPv4 total length is 16 bits
GLOBAL_HEADER_LEN = 24
RECORD_HEADER_LEN = 16
DEFAULT_MAX_PACKETS = 100_000
DEFAULT_MAX_BYTES = 256 << 20
TTL = 64
IPPROTO_UDP = 17
ETHERTYPE_IPV4 = 0x0800

_GLOBAL = struct.Struct("<IHHiIII")  # magic, version, thiszone, sigfigs, snaplen, linktype
_RECORD = struct.Struct("<IIII")  # ts_sec, ts_usec, incl_len, orig_len
_ETH = struct.Struct("!HIHIH")  # dst MAC 02:00:<ip>, src MAC 02:00:<ip>, ethertype
_IPV4 = struct.Struct("!BBHHHBBHII")  # ver/ihl, tos, len, id, flags/frag, ttl, proto, sum, src, dst
_UDP = struct.Struct("!HHHH")  # sport, dport, length, checksum
assert _ETH.size + _IPV4.size + _UDP.size == FRAME_OVERHEAD
_IP_WORDS = struct.Struct("!10H")

#: Record header and synthesised frame headers of one packet, as numpy sees them:
#: :meth:`PcapWriter.write_batch` fills one row per packet without Python loops.
_RECORD_DTYPE = np.dtype(
    [
        ("ts_sec", "<u4"),
        ("ts_usec", "<u4"),
        ("incl_len", "<u4"),
        ("orig_len", "<u4"),
        ("eth_dst_oui", ">u2"),
        ("eth_dst_ip", ">u4"),
        ("eth_src_oui", ">u2"),
        ("eth_src_ip", ">u4"),
        ("eth_type", ">u2"),
        ("ver_ihl", "u1"),
        ("tos", "u1"),
        ("ip_len", ">u2"),
        ("ip_id", ">u2"),
        ("frag", ">u2"),
        ("ttl", "u1"),
        ("proto", "u1"),
        ("ip_sum", ">u2"),
        ("ip_src", ">u4"),
        ("ip_dst", ">u4"),
        ("sport", ">u2"),
        ("dport", ">u2"),
        ("udp_len", ">u2"),
        ("udp_sum", ">u2"),
    ]
)
assert _RECORD_DTYPE.itemsize == RECORD_HEADER_LEN + FRAME_OVERHEAD
_IP_START = RECORD_HEADER_LEN + ETH_LEN
_MAC_OUI = 0x0200  # first two MAC bytes: locally administered, unicast


class PcapError(ValueError):
    """A file that is not a pcap capture this module can read."""


def ipv4_checksum(header: bytes | bytearray) -> int:
    """The Internet checksum of an IPv4 header whose checksum field is zero."""
    total = sum(_IP_WORDS.unpack(header))
    total = (total & 0xFFFF) + (total >> 16)
    total += total >> 16
    return ~total & 0xFFFF


def _split_ts(ts: float) -> tuple[int, int]:
    """Seconds and microseconds of a non-negative timestamp, rounded to the µs."""
    if not 0 <= ts < 2**32:
        raise ValueError(f"timestamp {ts} is outside the pcap range [0, 2^32) seconds")
    us = round(ts * 1_000_000)
    return us // 1_000_000, us % 1_000_000


def _check_addr(name: str, addr: tuple[int, int]) -> tuple[int, int]:
    ip, port = addr
    if not 0 <= ip <= 0xFFFFFFFF or not 0 <= port <= 0xFFFF:
        raise ValueError(f"{name} address {addr} needs a 32-bit IP and a 16-bit port")
    return int(ip), int(port)


class PcapWriter:
    """Write SwitchML datagrams as Ethernet/IPv4/UDP frames to a bounded pcap file.

    ``max_packets`` and ``max_bytes`` (the file size, headers included) bound
    the capture; ``None`` lifts a bound. ``snaplen`` truncates long frames as
    tcpdump's ``-s`` does; it must keep the 42 bytes of frame headers so that
    every record still says who sent it to whom.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        *,
        max_packets: int | None = DEFAULT_MAX_PACKETS,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        snaplen: int = 65535,
    ) -> None:
        if max_packets is not None and max_packets < 0:
            raise ValueError("max_packets must not be negative")
        if max_bytes is not None and max_bytes < GLOBAL_HEADER_LEN:
            raise ValueError(f"max_bytes must leave room for the {GLOBAL_HEADER_LEN}-byte header")
        if not FRAME_OVERHEAD <= snaplen <= 0x3FFFFFFF:
            raise ValueError(f"snaplen must be at least {FRAME_OVERHEAD} (the frame headers)")
        self.path = path
        self.max_packets = max_packets
        self.max_bytes = max_bytes
        self.snaplen = snaplen
        self._file: BinaryIO | None = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._file.write(_GLOBAL.pack(PCAP_MAGIC, *PCAP_VERSION, 0, 0, snaplen, LINKTYPE_ETHERNET))
        self._packets = 0
        self._bytes = GLOBAL_HEADER_LEN
        self._dropped = 0
        self._full = False
        self._ip_id = 0

    # ---------------------------------------------------------------- counters
    @property
    def packets(self) -> int:
        """Packets written so far."""
        return self._packets

    @property
    def bytes_written(self) -> int:
        """Size of the file so far, the 24-byte global header included."""
        return self._bytes

    @property
    def dropped(self) -> int:
        """Packets refused because the capture reached one of its bounds."""
        return self._dropped

    @property
    def full(self) -> bool:
        """True once a packet did not fit: every later packet is dropped."""
        return self._full

    @property
    def closed(self) -> bool:
        return self._file is None

    # ------------------------------------------------------------------ writes
    def _fits(self, n_packets: int, n_bytes: int) -> bool:
        if self.max_packets is not None and self._packets + n_packets > self.max_packets:
            return False
        return self.max_bytes is None or self._bytes + n_bytes <= self.max_bytes

    def _out(self) -> BinaryIO:
        if self._file is None:
            raise ValueError("write to a closed PcapWriter")
        return self._file

    def write(
        self,
        data: bytes | bytearray | memoryview,
        src: tuple[int, int],
        dst: tuple[int, int],
        ts: float,
    ) -> bool:
        """Record one datagram ``src -> dst`` (``(ip, port)`` with ip a 32-bit int)
        sent at ``ts`` (seconds since the epoch). Return False, and count a drop,
        when the capture is full."""
        out = self._out()
        n = len(data)
        if n > MAX_UDP_PAYLOAD:
            raise ValueError(f"a {n}-byte payload does not fit one IPv4/UDP datagram")
        src_ip, src_port = _check_addr("source", src)
        dst_ip, dst_port = _check_addr("destination", dst)
        sec, usec = _split_ts(ts)
        orig = FRAME_OVERHEAD + n
        incl = min(orig, self.snaplen)
        if self._full or not self._fits(1, RECORD_HEADER_LEN + incl):
            self._full = True
            self._dropped += 1
            return False
        ip_hdr = bytearray(
            _IPV4.pack(
                0x45, 0, IPV4_LEN + UDP_LEN + n, self._ip_id, 0, TTL, IPPROTO_UDP, 0, src_ip, dst_ip
            )
        )
        ip_hdr[10:12] = ipv4_checksum(ip_hdr).to_bytes(2, "big")
        out.write(
            _RECORD.pack(sec, usec, incl, orig)
            + _ETH.pack(_MAC_OUI, dst_ip, _MAC_OUI, src_ip, ETHERTYPE_IPV4)
            + ip_hdr
            + _UDP.pack(src_port, dst_port, UDP_LEN + n, 0)
        )
        out.write(memoryview(data)[: incl - FRAME_OVERHEAD])
        self._ip_id = (self._ip_id + 1) & 0xFFFF
        self._packets += 1
        self._bytes += RECORD_HEADER_LEN + incl
        return True

    def write_batch(
        self,
        buf: np.ndarray,
        lens: ArrayLike,
        src_ip: ArrayLike,
        src_port: ArrayLike,
        dst_ip: ArrayLike,
        dst_port: ArrayLike,
        ts: ArrayLike,
        *,
        rows: ArrayLike | None = None,
    ) -> int:
        """Record many datagrams with one file write; return how many were written.

        Packet ``i`` is ``buf[r, :lens[r]]`` with ``r = rows[i]`` (or ``r = i``
        without ``rows``), so the switch's result rows can be recorded once per
        destination straight from :class:`swemu.engine.Batch` (``rows=dest_row``).
        Addresses and ``ts`` are arrays with one entry per packet, or scalars
        shared by all (the switch's address for results). Packets past a bound
        are counted in :attr:`dropped`.
        """
        out = self._out()
        buf = np.asarray(buf)
        if buf.dtype != np.uint8 or buf.ndim != 2:
            raise ValueError("buf must be a 2-D uint8 array, one datagram per row")
        lens_all = np.asarray(lens, dtype=np.int64).reshape(-1)
        if rows is None:
            row_idx = np.arange(lens_all.shape[0])
        else:
            row_idx = np.asarray(rows, dtype=np.int64).reshape(-1)
            if row_idx.size and (row_idx.min() < 0 or row_idx.max() >= lens_all.shape[0]):
                raise ValueError("rows index past the end of lens")
        b = row_idx.shape[0]
        if b and row_idx.max() >= buf.shape[0]:
            raise ValueError(f"row {row_idx.max()} is past the {buf.shape[0]} rows of buf")
        plen = lens_all[row_idx]
        if b and (plen.min() < 0 or plen.max() > min(buf.shape[1], MAX_UDP_PAYLOAD)):
            raise ValueError("lens must be in [0, row length] and fit one IPv4/UDP datagram")

        def column(name: str, x: ArrayLike, hi: int) -> np.ndarray:
            a = np.broadcast_to(np.asarray(x, dtype=np.int64), (b,))
            if b and (a.min() < 0 or a.max() > hi):
                raise ValueError(f"{name} must be in [0, {hi}]")
            return a

        sip = column("src_ip", src_ip, 0xFFFFFFFF)
        sport = column("src_port", src_port, 0xFFFF)
        dip = column("dst_ip", dst_ip, 0xFFFFFFFF)
        dport = column("dst_port", dst_port, 0xFFFF)
        tsf = np.broadcast_to(np.asarray(ts, dtype=np.float64), (b,))
        if b and not (np.all(tsf >= 0) and np.all(tsf < 2**32)):
            raise ValueError("timestamps must be in [0, 2^32) seconds")

        # how many packets fit the bounds: the capture stays a prefix of the traffic
        orig = FRAME_OVERHEAD + plen
        incl = np.minimum(orig, self.snaplen)
        k = 0 if self._full else b
        if self.max_packets is not None:
            k = min(k, self.max_packets - self._packets)
        if self.max_bytes is not None and k:
            room = self.max_bytes - self._bytes
            k = min(k, int(np.searchsorted(np.cumsum(RECORD_HEADER_LEN + incl), room, "right")))
        if k < b:
            self._full = True
            self._dropped += b - k
        if k == 0:
            return 0

        hdr = np.zeros(k, _RECORD_DTYPE)
        us = np.round(tsf[:k] * 1e6).astype(np.int64)
        hdr["ts_sec"] = us // 1_000_000
        hdr["ts_usec"] = us % 1_000_000
        hdr["incl_len"] = incl[:k]
        hdr["orig_len"] = orig[:k]
        hdr["eth_dst_oui"] = _MAC_OUI
        hdr["eth_dst_ip"] = dip[:k]
        hdr["eth_src_oui"] = _MAC_OUI
        hdr["eth_src_ip"] = sip[:k]
        hdr["eth_type"] = ETHERTYPE_IPV4
        hdr["ver_ihl"] = 0x45
        hdr["ip_len"] = IPV4_LEN + UDP_LEN + plen[:k]
        hdr["ip_id"] = (self._ip_id + np.arange(k)) & 0xFFFF
        hdr["ttl"] = TTL
        hdr["proto"] = IPPROTO_UDP
        hdr["ip_src"] = sip[:k]
        hdr["ip_dst"] = dip[:k]
        hdr["sport"] = sport[:k]
        hdr["dport"] = dport[:k]
        hdr["udp_len"] = UDP_LEN + plen[:k]
        # Internet checksum of the ten 16-bit words of each IPv4 header (checksum 0)
        raw = hdr.view(np.uint8).reshape(k, _RECORD_DTYPE.itemsize)
        words = raw[:, _IP_START : _IP_START + IPV4_LEN].copy().view(">u2").astype(np.uint32)
        total = words.sum(axis=1)
        total = (total & 0xFFFF) + (total >> 16)
        total += total >> 16
        hdr["ip_sum"] = ~total & 0xFFFF

        caplen = incl[:k] - FRAME_OVERHEAD
        size = _RECORD_DTYPE.itemsize
        if (caplen == caplen[0]).all():
            # one length for the whole batch (the usual case: one job, one size code):
            # records are fixed-size rows, assembled by two numpy copies
            n = int(caplen[0])
            rec = np.empty((k, size + n), np.uint8)
            rec[:, :size] = raw
            rec[:, size:] = buf[row_idx[:k], :n]
            out.write(rec.data)
        else:
            hdr_bytes = memoryview(hdr.tobytes())
            flat = memoryview(np.ascontiguousarray(buf).reshape(-1))
            width = buf.shape[1]
            parts: list[memoryview] = []
            for i, (r, n) in enumerate(zip(row_idx[:k].tolist(), caplen.tolist(), strict=True)):
                parts.append(hdr_bytes[i * size : (i + 1) * size])
                parts.append(flat[r * width : r * width + n])
            out.write(b"".join(parts))
        self._ip_id = (self._ip_id + k) & 0xFFFF
        self._packets += k
        self._bytes += int(RECORD_HEADER_LEN * k + incl[:k].sum())
        return k

    # --------------------------------------------------------------- lifecycle
    def flush(self) -> None:
        """Push buffered records to the file, e.g. for a reader following a live capture."""
        self._out().flush()

    def close(self) -> None:
        """Close the file; further writes raise ValueError. Closing twice is fine."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------- reading
@dataclass(frozen=True)
class CapturedPacket:
    """One UDP/IPv4 datagram read from a capture.

    ``truncated`` is set when the capture holds less than the whole datagram
    (snaplen, or the first fragment of a fragmented datagram).
    """

    ts: float
    src: tuple[int, int]
    dst: tuple[int, int]
    payload: bytes
    truncated: bool = False
    frame: int = 0  # record number in the file, counted from 1 as Wireshark does


def _l3_offset(linktype: int, data: bytes) -> int | None:
    """Offset of the IPv4 header in a record, or None if the record is not IPv4."""
    if linktype == LINKTYPE_ETHERNET:
        off, etype = ETH_LEN, None
        if len(data) >= ETH_LEN:
            etype = int.from_bytes(data[12:14], "big")
        while etype in (0x8100, 0x88A8) and len(data) >= off + 4:  # VLAN / QinQ tags
            etype = int.from_bytes(data[off + 2 : off + 4], "big")
            off += 4
        return off if etype == ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL:
        ok = len(data) >= 16 and data[14:16] == b"\x08\x00"
        return 16 if ok else None
    if linktype == LINKTYPE_LINUX_SLL2:
        return 20 if data[0:2] == b"\x08\x00" else None
    if linktype in LINKTYPES_RAW_IPV4:
        return 0
    raise PcapError(f"link type {linktype} is not supported (Ethernet, Linux SLL, raw IP are)")


_Udp = tuple[tuple[int, int], tuple[int, int], bytes, bool]


def _parse_udp(data: bytes, off: int) -> _Udp | None:
    """Addresses, payload and truncation flag of a UDP/IPv4 packet at ``off``."""
    if len(data) < off + IPV4_LEN or data[off] >> 4 != 4:
        return None
    ihl = (data[off] & 0x0F) * 4
    total_len, frag = struct.unpack_from("!H2xH", data, off + 2)
    if data[off + 9] != IPPROTO_UDP or ihl < IPV4_LEN or frag & 0x1FFF:
        return None  # not UDP, or a later fragment (no UDP header of its own)
    src_ip, dst_ip = struct.unpack_from("!II", data, off + 12)
    udp = off + ihl
    if len(data) < udp + UDP_LEN:
        return None
    sport, dport, udp_len = struct.unpack_from("!HHH", data, udp)
    want = max(udp_len - UDP_LEN, 0)
    end = min(udp + UDP_LEN + want, off + total_len, len(data))
    payload = data[udp + UDP_LEN : end]
    truncated = len(payload) < want or bool(frag & 0x2000)  # MF: first fragment only
    return (src_ip, sport), (dst_ip, dport), payload, truncated


def read_pcap(path: str | PathLike[str]) -> Iterator[CapturedPacket]:
    """Yield the UDP/IPv4 datagrams of a classic pcap file, in file order.

    Reads both byte orders, microsecond and nanosecond files, and Ethernet
    (VLAN-tagged too), Linux cooked (``tcpdump -i any``) and raw IPv4 link
    types; other packets are skipped. A record cut short at the end of the file
    (a capture still being written) ends the iteration quietly.
    """
    with open(path, "rb") as f:
        head = f.read(GLOBAL_HEADER_LEN)
        if len(head) < GLOBAL_HEADER_LEN:
            raise PcapError(f"{path}: too short for a pcap header")
        for order in "<>":
            magic = struct.unpack(order + "I", head[:4])[0]
            if magic in (PCAP_MAGIC, PCAP_MAGIC_NS):
                break
        else:
            raise PcapError(f"{path}: not a classic pcap file (pcapng is not supported)")
        scale = 1e-9 if magic == PCAP_MAGIC_NS else 1e-6
        *_, linktype = struct.unpack(order + "IHHiIII", head)
        linktype &= 0xFFFF  # the upper bits may hold FCS flags
        record = struct.Struct(order + "IIII")
        frame = 0
        while True:
            rh = f.read(RECORD_HEADER_LEN)
            if len(rh) < RECORD_HEADER_LEN:
                return
            sec, frac, incl, _orig = record.unpack(rh)
            if incl > 0x3FFFFFFF:
                raise PcapError(f"{path}: record {frame + 1} claims {incl} bytes")
            data = f.read(incl)
            if len(data) < incl:
                return
            frame += 1
            off = _l3_offset(linktype, data)
            parsed = None if off is None else _parse_udp(data, off)
            if parsed is None:
                continue
            src, dst, payload, truncated = parsed
            yield CapturedPacket(sec + frac * scale, src, dst, payload, truncated, frame)
