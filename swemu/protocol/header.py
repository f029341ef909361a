"""The SwitchML header for compiled code: inline readers and one writer.

:mod:`swemu.protocol.wire` is the header's definition (layout, constants, the
plain-Python codec); this module is the same layout for Numba kernels, on
wire's constants, so that the switch's kernels (:mod:`swemu.core.kernels`) and
the worker's (:mod:`swemu.protocol.worker.kernels`) read and write one codec. Each function
takes ``row``, a uint8 array holding at least the 10 header bytes of one
datagram, and is inlined into its compiled callers (no call, no CPython
entry is compiled until plain Python calls them, as the kernel-body tests do).

Layout (docs/protocol.md §1)::

    byte 0   msg_type (4 bits) | format (1 bit) | size code (3 bits)
    byte 1   job_number
    byte 2-5 tsi (uint32, big-endian)
    byte 6-7 pool_index: set (bit 15) | 0 (bit 14) | slot (bits 13..0)
    byte 8   e0 (int8)
    byte 9   e1 (int8)

May import: numpy, numba, swemu.protocol.{wire, jit}.
"""

from __future__ import annotations

import numpy as np

from .jit import kernel
from .wire import FORMAT_BIT, MSG_TYPE, SLOT_MASK

_SET_SHIFT = 15  # bit 15 of pool_index (wire.SET_BIT)


@kernel(inline=True)
def read_msg_type(row):
    """The 4-bit message type (1 for a SwitchML UDP packet)."""
    return np.int64(row[0] >> 4)


@kernel(inline=True)
def read_size_code(row):
    """The 3-bit size code: the packet holds ``32 << code`` values."""
    return np.int64(row[0] & 7)


@kernel(inline=True)
def read_format(row):
    """Byte 0's format bit (extension, docs/protocol.md §4.2): 1 when the
    payload holds 16-bit values; p4app-switchML's unused bit, 0 in its packets."""
    return np.int64((row[0] & FORMAT_BIT) >> 3)


@kernel(inline=True)
def read_pool_index(row):
    """The 16-bit pool_index field (set, unused bit, slot)."""
    return (np.int64(row[6]) << 8) | np.int64(row[7])


@kernel(inline=True)
def pool_set(pi):
    """The shadow set of a pool_index."""
    return (pi >> _SET_SHIFT) & 1


@kernel(inline=True)
def pool_slot(pi):
    """The slot of a pool_index (bit 14 ignored, as on input)."""
    return pi & SLOT_MASK


@kernel(inline=True)
def read_tsi(row):
    """The 32-bit tensor/stream index."""
    return (
        (np.int64(row[2]) << 24)
        | (np.int64(row[3]) << 16)
        | (np.int64(row[4]) << 8)
        | np.int64(row[5])
    )


@kernel(inline=True)
def read_e0(row):
    """The first signed exponent byte."""
    return np.int8(row[8])


@kernel(inline=True)
def read_e1(row):
    """The second signed exponent byte."""
    return np.int8(row[9])


@kernel(inline=True)
def type_size_byte(code):
    """Byte 0 of a packet of size ``code``: msg_type 1, the format bit clear."""
    return np.uint8((MSG_TYPE << 4) | (code & 7))


@kernel(inline=True)
def set_format(row, fmt):
    """Set byte 0's format bit to ``fmt`` (0 or 1) in a header already written."""
    row[0] = np.uint8((row[0] & ~FORMAT_BIT) | ((fmt & 1) << 3))


@kernel(inline=True)
def write_header(row, code, job_number, tsi, set_, slot, e0, e1):
    """Write a whole header: msg_type 1 and ``code``, the fields given, the
    unused bits cleared; exponents are stored as their low byte."""
    row[0] = np.uint8((MSG_TYPE << 4) | (code & 7))
    row[1] = np.uint8(job_number & 0xFF)
    row[2] = np.uint8((tsi >> 24) & 0xFF)
    row[3] = np.uint8((tsi >> 16) & 0xFF)
    row[4] = np.uint8((tsi >> 8) & 0xFF)
    row[5] = np.uint8(tsi & 0xFF)
    row[6] = np.uint8(((set_ & 1) << 7) | ((slot & SLOT_MASK) >> 8))
    row[7] = np.uint8(slot & 0xFF)
    row[8] = np.uint8(np.int64(e0) & 0xFF)
    row[9] = np.uint8(np.int64(e1) & 0xFF)
