"""SwitchML/UDP wire format (docs/protocol.md §1): pure encode/decode, no state.

A SwitchML datagram is a 10-byte header followed by N big-endian int32 values::

    byte 0   msg_type (4 bits) | format (1 bit) | size code (3 bits)
    byte 1   job_number
    byte 2-5 tsi (uint32)
    byte 6-7 pool_index: set (bit 15) | 0 (bit 14) | slot (bits 13..0)
    byte 8   e0 (int8)
    byte 9   e1 (int8)
    10..     N x int32, N = 32 << size

The format bit (p4app-switchML's unused bit, 0 in its packets) is this
project's extension (docs/protocol.md §1, §4.2): set, the same 4N bytes carry
2N big-endian 16-bit values, two to a 32-bit word, which the switch adds as
the words they are.

Single packets are handled by :func:`encode` / :func:`decode`; whole batches by
numpy structured views over a 2-D ``uint8`` buffer (one datagram per row), so
that no per-field Python runs for batches. Decoding failures raise
:class:`PacketError`, a ``ValueError``, so an I/O layer can drop bad input with a
single ``except``.

This module is the protocol, not the emulator: the host library imports it too.
It must stay free of Numba, sockets and switch state.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

HEADER_LEN = 10
MSG_TYPE = 1
MAX_SLOTS = 1 << 14  # bits 13..0 of pool_index
MAX_WORKERS = 32  # one bit per worker in a 32-bit bitmap
UDP_PORT_BASE = 0xBEE0  # the switch matches port & 0xFFF0 == 0xBEE0
UDP_PORT_MASK = 0xFFF0
DEFAULT_UDP_PORT = UDP_PORT_BASE
DEFAULT_CONTROL_PORT = 50099
DEFAULT_SWITCH_MAC = 0x02_00_5E_BE_E0_00  # the emulator's MAC unless told (locally administered)
EXP_NONE = -128  # the exponent of an all-zero chunk (and "no next chunk")
EXP_TSI_BASE = 1 << 31  # tsi of exponent-only packets (docs/protocol.md §4)

SET_BIT = 1 << 15
SLOT_MASK = MAX_SLOTS - 1
#: byte 0's bit 3 (p4app-switchML's unused bit): the packet's values are 16-bit
#: (extension, docs/protocol.md §4.2); echoed in results of jobs registered for it
FORMAT_BIT = 0x08


class ValueFormats(IntEnum):
    """What a job registers as its value formats (UdpSession ``value_formats``,
    docs/protocol.md §5): p4app-switchML's 32-bit values only, or the 16-bit
    format beside them, said per packet by :data:`FORMAT_BIT`."""

    INT32 = 0
    INT32_AND_BLOCK16 = 1


class SizeCode(IntEnum):
    """Payload size codes; the value count of code c is ``32 << c``."""

    B128 = 0
    B256 = 1  # Tofino, one pipeline pass (p4app-switchML default)
    B512 = 2
    B1024 = 3  # Tofino, with recirculation
    B2048 = 4  # emulator extension
    B4096 = 5  # emulator extension
    B8192 = 6  # emulator extension: fits a 9000-byte jumbo frame
    B16384 = 7  # emulator extension: loopback / fragmenting networks only


HARDWARE_SIZE_CODES = frozenset({SizeCode.B256, SizeCode.B1024})
#: The size code the emulator serves fastest (fewest packets per byte that still
#: fit a jumbo frame): the host library's default against an emulator, which
#: says so in its UdpSession reply; against hardware the default is B1024.
EMULATOR_SIZE_CODE = SizeCode.B8192
HARDWARE_DEFAULT_SIZE_CODE = SizeCode.B1024
MAX_VALUES = 32 << 7
MAX_PACKET_LEN = HEADER_LEN + 4 * MAX_VALUES

#: The header as a numpy structured dtype; ``buf[:, :10].view(HEADER_DTYPE)``
#: gives every field of a batch at once.
HEADER_DTYPE = np.dtype(
    [
        ("type_size", "u1"),
        ("job_number", "u1"),
        ("tsi", ">u4"),
        ("pool_index", ">u2"),
        ("e0", "i1"),
        ("e1", "i1"),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_LEN

#: Payload values on the wire.
VALUE_DTYPE = np.dtype(">i4")
#: Payload values of a 16-bit packet (offset binary, docs/protocol.md §4.2).
VALUE16_DTYPE = np.dtype(">u2")


class PacketError(ValueError):
    """A datagram that is not a well-formed SwitchML packet."""


def values_per_packet(size_code: int) -> int:
    """Number of int32 values N carried by a packet of ``size_code``."""
    if not 0 <= size_code <= 7:
        raise ValueError(f"size code must be in 0..7, got {size_code}")
    return 32 << size_code


def values16_per_packet(size_code: int) -> int:
    """Number of 16-bit values 2N carried by a 16-bit packet of ``size_code``
    (the same 4N bytes as a 32-bit one)."""
    return 2 * values_per_packet(size_code)


def packet_len(size_code: int) -> int:
    """Datagram length in bytes for ``size_code``: ``10 + 4N``."""
    return HEADER_LEN + 4 * values_per_packet(size_code)


def pool_index(set_: int, slot: int) -> int:
    """Pack a shadow set and slot index into the 16-bit pool_index field."""
    return ((set_ & 1) << 15) | (slot & SLOT_MASK)


def split_pool_index(pi: int) -> tuple[int, int]:
    """Return ``(set, slot)`` of a pool_index; bit 14 is ignored, as on input."""
    return (pi >> 15) & 1, pi & SLOT_MASK


class Packet(NamedTuple):
    """One decoded SwitchML packet; ``values`` is a native-endian int32 array
    (the words the switch adds, whatever the format); ``format`` is byte 0's
    format bit (1: the words hold 16-bit values, :attr:`values16`)."""

    size_code: int
    job_number: int
    tsi: int
    set: int
    slot: int
    e0: int
    e1: int
    values: np.ndarray
    format: int = 0

    @property
    def pool_index(self) -> int:
        return pool_index(self.set, self.slot)

    @property
    def values16(self) -> np.ndarray:
        """The payload as 2N unsigned 16-bit values (the 16-bit format's view)."""
        return self.values.astype(VALUE_DTYPE).view(VALUE16_DTYPE).astype(np.uint16)


def encode(
    *,
    size_code: int,
    job_number: int,
    tsi: int,
    set: int,
    slot: int,
    values: np.ndarray,
    e0: int = 0,
    e1: int = 0,
    values16: bool = False,
) -> bytes:
    """Encode one packet. ``values`` must hold exactly ``32 << size_code`` ints,
    or with ``values16`` (the 16-bit format: byte 0's format bit set)
    ``64 << size_code`` values of 0..65535."""
    n = values16_per_packet(size_code) if values16 else values_per_packet(size_code)
    vals = np.asarray(values)
    if vals.shape != (n,):
        raise ValueError(f"size code {size_code} carries {n} values, got shape {vals.shape}")
    if values16 and (vals.min(initial=0) < 0 or vals.max(initial=0) > 0xFFFF):
        raise ValueError("16-bit values must be in 0..65535")
    if not 0 <= job_number <= 0xFF or not 0 <= tsi <= 0xFFFFFFFF:
        raise ValueError("job_number must fit 8 bits and tsi 32 bits")
    if not 0 <= slot < MAX_SLOTS or set not in (0, 1):
        raise ValueError(f"slot must be in [0, {MAX_SLOTS}) and set 0 or 1")
    if not -128 <= e0 <= 127 or not -128 <= e1 <= 127:
        raise ValueError("exponents are signed 8-bit")
    hdr = np.zeros(1, HEADER_DTYPE)
    hdr["type_size"] = (MSG_TYPE << 4) | (FORMAT_BIT if values16 else 0) | size_code
    hdr["job_number"] = job_number
    hdr["tsi"] = tsi
    hdr["pool_index"] = pool_index(set, slot)
    hdr["e0"] = e0
    hdr["e1"] = e1
    return hdr.tobytes() + vals.astype(VALUE16_DTYPE if values16 else VALUE_DTYPE).tobytes()


def decode(data: bytes | bytearray | memoryview, expected_size_code: int | None = None) -> Packet:
    """Decode one datagram, raising :class:`PacketError` if it is malformed."""
    if len(data) < HEADER_LEN:
        raise PacketError(f"datagram of {len(data)} bytes is shorter than the 10-byte header")
    b0 = data[0]
    msg_type, size_code = b0 >> 4, b0 & 0x7
    if msg_type != MSG_TYPE:
        raise PacketError(f"msg_type {msg_type} is not {MSG_TYPE}")
    if len(data) != packet_len(size_code):
        raise PacketError(
            f"size code {size_code} needs {packet_len(size_code)} bytes, got {len(data)}"
        )
    if expected_size_code is not None and size_code != expected_size_code:
        raise PacketError(f"size code {size_code}, expected {expected_size_code}")
    hdr = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
    set_, slot = split_pool_index(int(hdr["pool_index"]))
    values = np.frombuffer(data, VALUE_DTYPE, offset=HEADER_LEN).astype(np.int32)
    return Packet(
        size_code,
        int(hdr["job_number"]),
        int(hdr["tsi"]),
        set_,
        slot,
        int(hdr["e0"]),
        int(hdr["e1"]),
        values,
        1 if b0 & FORMAT_BIT else 0,
    )


def header_view(buf: np.ndarray) -> np.ndarray:
    """Structured view of the headers of a 2-D ``uint8`` batch (one row a datagram)."""
    if buf.dtype != np.uint8 or buf.ndim != 2 or buf.shape[1] < HEADER_LEN:
        raise ValueError("expected a 2-D uint8 batch with rows of at least 10 bytes")
    return buf[:, :HEADER_LEN].view(HEADER_DTYPE)[:, 0]


def values_view(buf: np.ndarray, size_code: int) -> np.ndarray:
    """Big-endian int32 view of the payloads of a 2-D batch of ``size_code`` packets."""
    n = values_per_packet(size_code)
    if buf.shape[1] < HEADER_LEN + 4 * n:
        raise ValueError(f"batch rows of {buf.shape[1]} bytes cannot hold size code {size_code}")
    return buf[:, HEADER_LEN : HEADER_LEN + 4 * n].view(VALUE_DTYPE)


def ipv4_to_int(ip: str) -> int:
    """Dotted quad to a 32-bit integer (the gRPC ``ipv4`` field's encoding)."""
    parts = ip.split(".")
    if len(parts) != 4:
        raise ValueError(f"not an IPv4 address: {ip!r}")
    value = 0
    for p in parts:
        octet = int(p)
        if not 0 <= octet <= 255:
            raise ValueError(f"not an IPv4 address: {ip!r}")
        value = (value << 8) | octet
    return value


def int_to_ipv4(value: int) -> str:
    """32-bit integer to a dotted quad."""
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
