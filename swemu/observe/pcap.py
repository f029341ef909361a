"""Bounded pcap capture of SwitchML traffic, in pure Python (struct + numpy).

The emulator sees datagrams, not frames: it has no Ethernet or IP headers to
record. :class:`PcapWriter` synthesises them — Ethernet II, IPv4 (valid header
checksum, DF clear, TTL 64) and UDP (checksum 0, which IPv4 allows) around each
SwitchML payload — so that Wireshark, tcpdump, scapy and :func:`read_pcap` can
open the file. MAC addresses are ``02:00:<IPv4 bytes>`` (locally administered),
so a reader can tell hosts apart at layer 2 too; the address of a switch's
**uplink** (a child switch of a fabric speaking to its parent as one of its
workers, docs/protocol.md §7) is ``02:01:<IPv4 bytes>`` instead, which is how a
capture at any level tells a child switch's packets from a worker's
(:attr:`PacketBatch.src_uplink`).

The file is classic libpcap (magic ``0xa1b2c3d4``, microsecond timestamps,
link type 1), written little-endian. A capture is bounded by a packet count and
a file size: once a packet does not fit, the capture is *full* and every later
packet is counted in :attr:`PcapWriter.dropped` instead of being written, so the
file is always a prefix of the traffic and never grows without limit.

Reading is for any classic pcap (tcpdump's and Wireshark's too):
:func:`read_pcap_batches` parses a chunk of the file at a time with numpy into
:class:`PacketBatch` columns, so a 1 GiB capture costs no Python per packet;
:func:`read_pcap` hands the same packets out one :class:`CapturedPacket` at a
time.

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
_MAC_OUI_UPLINK = 0x0201  # the same, for a switch's uplink (a child switch's address)


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
        *,
        src_uplink: bool = False,
        dst_uplink: bool = False,
    ) -> bool:
        """Record one datagram ``src -> dst`` (``(ip, port)`` with ip a 32-bit int)
        sent at ``ts`` (seconds since the epoch); ``src_uplink``/``dst_uplink``:
        that end is a switch's uplink (see the module). Return False, and count
        a drop, when the capture is full."""
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
            + _ETH.pack(
                _MAC_OUI_UPLINK if dst_uplink else _MAC_OUI,
                dst_ip,
                _MAC_OUI_UPLINK if src_uplink else _MAC_OUI,
                src_ip,
                ETHERTYPE_IPV4,
            )
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
        src_uplink: ArrayLike = False,
        dst_uplink: ArrayLike = False,
    ) -> int:
        """Record many datagrams with one file write; return how many were written.

        Packet ``i`` is ``buf[r, :lens[r]]`` with ``r = rows[i]`` (or ``r = i``
        without ``rows``), so the switch's result rows can be recorded once per
        destination straight from :class:`swemu.core.engine.Batch` (``rows=dest_row``).
        Addresses, ``ts`` and the uplink flags (which end is a switch's uplink,
        see the module) are arrays with one entry per packet, or scalars shared
        by all (the switch's address for results). Packets past a bound are
        counted in :attr:`dropped`.
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
        up = np.broadcast_to(np.asarray(dst_uplink, bool), (b,))[:k]
        hdr["eth_dst_oui"] = np.where(up, _MAC_OUI_UPLINK, _MAC_OUI)
        hdr["eth_dst_ip"] = dip[:k]
        up = np.broadcast_to(np.asarray(src_uplink, bool), (b,))[:k]
        hdr["eth_src_oui"] = np.where(up, _MAC_OUI_UPLINK, _MAC_OUI)
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
    (snaplen, or the first fragment of a fragmented datagram);
    ``src_uplink``/``dst_uplink`` when that end is a switch's uplink (see the module).
    """

    ts: float
    src: tuple[int, int]
    dst: tuple[int, int]
    payload: bytes
    truncated: bool = False
    frame: int = 0  # record number in the file, counted from 1 as Wireshark does
    src_uplink: bool = False
    dst_uplink: bool = False


@dataclass
class PacketBatch:
    """The UDP/IPv4 datagrams of a stretch of a capture, as columns.

    Packet ``i`` is ``data[start[i] : start[i] + length[i]]`` (its captured
    payload), sent by ``(src_ip[i], src_port[i])`` to ``(dst_ip[i], dst_port[i])``
    at ``ts[i]``; ``frame`` is its record number in the file (from 1). Columns
    are int64 (``ts`` float64, ``truncated`` bool), so that a decoder can work
    on all packets of a batch at once and touch single packets only where it
    must. ``src_uplink``/``dst_uplink`` mark the ends that are a switch's
    uplink (the MAC ``02:01:<its IPv4>`` of an emulator's capture, see the
    module); None where the capture cannot say (no Ethernet header).
    """

    data: np.ndarray  # uint8: the bytes the payloads lie in
    frame: np.ndarray
    ts: np.ndarray
    src_ip: np.ndarray
    src_port: np.ndarray
    dst_ip: np.ndarray
    dst_port: np.ndarray
    start: np.ndarray
    length: np.ndarray
    truncated: np.ndarray
    src_uplink: np.ndarray | None = None
    dst_uplink: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.frame.shape[0])

    def payload(self, i: int) -> bytes:
        """The captured payload of packet ``i``."""
        s = int(self.start[i])
        return self.data[s : s + int(self.length[i])].tobytes()

    def packets(self) -> Iterator[CapturedPacket]:
        """The batch as :class:`CapturedPacket` objects, one at a time."""
        cols = (self.ts, self.src_ip, self.src_port, self.dst_ip, self.dst_port)
        ts, sip, sport, dip, dport = (c.tolist() for c in cols)
        none = [False] * len(self)
        src_up = none if self.src_uplink is None else self.src_uplink.tolist()
        dst_up = none if self.dst_uplink is None else self.dst_uplink.tolist()
        for i, (frame, trunc) in enumerate(zip(self.frame.tolist(), self.truncated.tolist())):
            yield CapturedPacket(
                ts[i],
                (sip[i], sport[i]),
                (dip[i], dport[i]),
                self.payload(i),
                trunc,
                frame,
                src_up[i],
                dst_up[i],
            )

    @classmethod
    def from_packets(cls, packets: list[CapturedPacket], first: int = 1) -> PacketBatch:
        """Columns of already-read packets (a frame of 0 becomes the packet's
        position, counted from ``first``)."""
        lengths = np.array([len(p.payload) for p in packets], np.int64)
        start = np.zeros(len(packets), np.int64)
        if len(packets) > 1:
            start[1:] = np.cumsum(lengths[:-1])
        data = np.frombuffer(b"".join(p.payload for p in packets), np.uint8)

        def col(values: list, dtype: type = np.int64) -> np.ndarray:
            return np.array(values, dtype).reshape(-1)

        return cls(
            data=data,
            frame=col([p.frame or first + i for i, p in enumerate(packets)]),
            ts=col([p.ts for p in packets], np.float64),
            src_ip=col([p.src[0] for p in packets]),
            src_port=col([p.src[1] for p in packets]),
            dst_ip=col([p.dst[0] for p in packets]),
            dst_port=col([p.dst[1] for p in packets]),
            start=start,
            length=lengths,
            truncated=col([p.truncated for p in packets], bool),
            src_uplink=col([p.src_uplink for p in packets], bool),
            dst_uplink=col([p.dst_uplink for p in packets], bool),
        )


def gather(a: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``a[at[i] : at[i] + width]`` for every i, as an (n, width) uint8 array;
    bytes past the end of ``a`` repeat its last byte (callers mask what lies
    outside a record)."""
    idx = at[:, None] + np.arange(width)
    np.clip(idx, 0, max(a.shape[0] - 1, 0), out=idx)
    return a[idx] if a.shape[0] else np.zeros(idx.shape, np.uint8)


def _be(a: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at ``at`` (int64)."""
    b = gather(a, at, width).astype(np.int64)
    out = b[:, 0]
    for k in range(1, width):
        out = (out << 8) | b[:, k]
    return out


def _record_offsets(buf: bytes, order: str, path: object) -> tuple[np.ndarray, int]:
    """Offsets of the whole records in ``buf`` (a stretch of a capture that starts
    with a record header) and the offset where the first incomplete one starts.

    Captures mostly hold runs of records of one size (one job, one size code):
    such a run is checked with one numpy comparison over guesses ``pos + k *
    size``, so Python runs once per run of equal records, not once per record.
    """
    a = np.frombuffer(buf, np.uint8)
    n = len(buf)
    byteorder = "little" if order == "<" else "big"
    u32 = np.dtype(order + "u4")
    runs: list[np.ndarray] = []
    pos = 0
    while pos + RECORD_HEADER_LEN <= n:
        incl = int.from_bytes(buf[pos + 8 : pos + 12], byteorder)
        if incl > 0x3FFFFFFF:
            raise PcapError(f"{path}: a record claims {incl} bytes (a damaged capture?)")
        size = RECORD_HEADER_LEN + incl
        if pos + size > n:
            break
        run, window = 1, 16
        while True:  # how many records of this size follow, in windows growing 4x
            k = min(window, (n - pos) // size)
            if k <= run:
                break
            at = pos + size * np.arange(run, k, dtype=np.int64) + 8
            got = gather(a, at, 4).view(u32).reshape(-1)
            bad = np.flatnonzero(got != incl)
            if bad.size:
                run += int(bad[0])
                break
            run, window = k, window * 4
        runs.append(pos + size * np.arange(run, dtype=np.int64))
        pos += size * run
    offsets = np.concatenate(runs) if runs else np.zeros(0, np.int64)
    return offsets, pos


def _parse_records(
    a: np.ndarray, off: np.ndarray, order: str, scale: float, linktype: int
) -> tuple[np.ndarray, ...]:
    """Parse the records at ``off`` in ``a`` all at once: a mask of the UDP/IPv4
    ones and, for those, (ts, src_ip, src_port, dst_ip, dst_port, payload start,
    payload length, truncated, src_uplink, dst_uplink); the last two are None
    without an Ethernet header."""
    u32 = np.dtype(order + "u4")
    hdr = gather(a, off, RECORD_HEADER_LEN).view(u32)  # ts_sec, ts_frac, incl, orig
    sec, frac, caplen = hdr[:, 0], hdr[:, 1], hdr[:, 2].astype(np.int64)
    d = off + RECORD_HEADER_LEN  # each record's data
    n = off.shape[0]
    if linktype == LINKTYPE_ETHERNET:
        l3 = np.full(n, ETH_LEN, np.int64)
        ok = caplen >= ETH_LEN
        etype = np.where(ok, _be(a, d + 12, 2), -1)
        tagged = ((etype == 0x8100) | (etype == 0x88A8)) & (caplen >= l3 + 4)
        while tagged.any():  # VLAN / QinQ tags, as many as there are
            etype = np.where(tagged, _be(a, d + l3 + 2, 2), etype)
            l3 = l3 + 4 * tagged
            tagged = ((etype == 0x8100) | (etype == 0x88A8)) & (caplen >= l3 + 4) & tagged
        ok = etype == ETHERTYPE_IPV4
    elif linktype == LINKTYPE_LINUX_SLL:
        l3 = np.full(n, 16, np.int64)
        ok = (caplen >= 16) & (_be(a, d + 14, 2) == ETHERTYPE_IPV4)
    elif linktype == LINKTYPE_LINUX_SLL2:
        l3 = np.full(n, 20, np.int64)
        ok = (caplen >= 2) & (_be(a, d, 2) == ETHERTYPE_IPV4)
    elif linktype in LINKTYPES_RAW_IPV4:
        l3 = np.zeros(n, np.int64)
        ok = np.ones(n, bool)
    else:
        raise PcapError(f"link type {linktype} is not supported (Ethernet, Linux SLL, raw IP are)")
    ip = d + l3
    ip_hdr = gather(a, ip, IPV4_LEN).astype(np.int64)
    ok &= (caplen >= l3 + IPV4_LEN) & (ip_hdr[:, 0] >> 4 == 4)
    ihl = (ip_hdr[:, 0] & 0x0F) * 4
    total_len = (ip_hdr[:, 2] << 8) | ip_hdr[:, 3]
    frag = (ip_hdr[:, 6] << 8) | ip_hdr[:, 7]
    # not UDP, or a later fragment (no UDP header of its own)
    ok &= (ip_hdr[:, 9] == IPPROTO_UDP) & (ihl >= IPV4_LEN) & (frag & 0x1FFF == 0)
    udp = l3 + ihl  # relative to the record's data
    ok &= caplen >= udp + UDP_LEN
    keep = np.flatnonzero(ok)
    ip_hdr, d, udp, caplen, l3 = ip_hdr[keep], d[keep], udp[keep], caplen[keep], l3[keep]
    total_len, frag = total_len[keep], frag[keep]
    words = gather(a, d + udp, UDP_LEN).astype(np.int64)
    sport = (words[:, 0] << 8) | words[:, 1]
    dport = (words[:, 2] << 8) | words[:, 3]
    udp_len = (words[:, 4] << 8) | words[:, 5]
    src_ip = (ip_hdr[:, 12] << 24) | (ip_hdr[:, 13] << 16) | (ip_hdr[:, 14] << 8) | ip_hdr[:, 15]
    dst_ip = (ip_hdr[:, 16] << 24) | (ip_hdr[:, 17] << 16) | (ip_hdr[:, 18] << 8) | ip_hdr[:, 19]
    want = np.maximum(udp_len - UDP_LEN, 0)
    first = udp + UDP_LEN
    end = np.minimum(np.minimum(first + want, l3 + total_len), caplen)
    length = np.maximum(end - first, 0)
    truncated = (length < want) | (frag & 0x2000 != 0)  # MF: first fragment only
    ts = sec[keep].astype(np.float64) + frac[keep] * scale
    src_up = dst_up = None
    if linktype == LINKTYPE_ETHERNET:  # an uplink's MAC: 02:01:<its IPv4> (see the module)
        dst_up = (_be(a, d, 2) == _MAC_OUI_UPLINK) & (_be(a, d + 2, 4) == dst_ip)
        src_up = (_be(a, d + 6, 2) == _MAC_OUI_UPLINK) & (_be(a, d + 8, 4) == src_ip)
    return keep, ts, src_ip, sport, dst_ip, dport, d + first, length, truncated, src_up, dst_up


def read_pcap_batches(
    path: str | PathLike[str], *, chunk_bytes: int = 8 << 20
) -> Iterator[PacketBatch]:
    """Yield the UDP/IPv4 datagrams of a classic pcap file as
    :class:`PacketBatch` columns, about ``chunk_bytes`` of file at a time.

    Reads both byte orders, microsecond and nanosecond files, and Ethernet
    (VLAN-tagged too), Linux cooked (``tcpdump -i any``) and raw IPv4 link
    types; other packets are skipped. A record cut short at the end of the file
    (a capture still being written) ends the iteration quietly. Records are
    parsed with numpy, a chunk at a time: no Python runs per packet.
    """
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
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
        frames = 0
        rest = b""
        want = chunk_bytes
        while True:
            more = f.read(want)
            buf = rest + more if rest else more
            offsets, used = _record_offsets(buf, order, path)
            if offsets.shape[0] == 0:
                if not more:
                    return  # the end, or a record cut short at the end
                rest, want = buf, max(want, 2 * len(buf))  # one record larger than a chunk
                continue
            want = chunk_bytes
            a = np.frombuffer(buf, np.uint8)
            keep, *cols = _parse_records(a, offsets, order, scale, linktype)
            yield PacketBatch(a, frames + 1 + keep, *cols)
            frames += int(offsets.shape[0])
            rest = buf[used:]


def read_pcap(path: str | PathLike[str]) -> Iterator[CapturedPacket]:
    """Yield the UDP/IPv4 datagrams of a classic pcap file, in file order, one
    :class:`CapturedPacket` at a time (:func:`read_pcap_batches` reads them)."""
    for batch in read_pcap_batches(path):
        yield from batch.packets()
