"""Batched UDP I/O from compiled code: libc ``recvmmsg``/``sendmmsg`` called from Numba.

The functions are declared with ``numba.types.ExternalFunction`` (resolved by
symbol name when the kernel is compiled, so ``cache=True`` keeps working; ctypes
function pointers would not cache). Pointers are passed as pointer-sized
integers (``intp``), which the C ABI of the supported platforms passes exactly
like pointers.

Buffers (all preallocated, their addresses taken once):

* ``hdr[B, 8]`` uint64: one ``struct mmsghdr`` per row (64 bytes on 64-bit Linux):
  words 0 ``msg_name``, 1 ``msg_namelen``, 2 ``msg_iov``, 3 ``msg_iovlen``,
  4-5 control (unused), 6 ``msg_flags``, 7 ``msg_len`` (low 32 bits);
* ``iov[B, 2]`` uint64: one ``struct iovec`` (base, length) per row;
* ``names[B, 16]`` uint8: one ``struct sockaddr_in`` per row.

:data:`AVAILABLE` is False where this layout cannot be trusted (not 64-bit
Linux, or no ``recvmmsg`` in libc): the callers then use their portable
``recvfrom_into``/``sendto`` paths, which give the same results.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import struct
import sys

import numpy as np
from numba import njit, types

MSG_DONTWAIT = 0x40
AF_INET = socket.AF_INET
SOCKADDR_IN_LEN = 16


def _libc_has(name: str) -> bool:
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return hasattr(lib, name)
    except OSError:
        return False


AVAILABLE = (
    sys.platform.startswith("linux")
    and struct.calcsize("P") == 8
    and sys.byteorder == "little"
    and _libc_has("recvmmsg")
    and _libc_has("sendmmsg")
)

_sig = types.intc(types.intc, types.intp, types.uintc, types.intc, types.intp)
c_recvmmsg = types.ExternalFunction("recvmmsg", _sig)
_sig_send = types.intc(types.intc, types.intp, types.uintc, types.intc)
c_sendmmsg = types.ExternalFunction("sendmmsg", _sig_send)


class MsgVec:
    """Preallocated mmsghdr/iovec/sockaddr arrays for ``capacity`` datagrams."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.hdr = np.zeros((capacity, 8), np.uint64)
        self.iov = np.zeros((capacity, 2), np.uint64)
        self.names = np.zeros((capacity, SOCKADDR_IN_LEN), np.uint8)
        self.hdr_ptr = self.hdr.ctypes.data
        self.iov_ptr = self.iov.ctypes.data
        self.names_ptr = self.names.ctypes.data
        for i in range(capacity):
            self.hdr[i, 0] = self.names_ptr + SOCKADDR_IN_LEN * i
            self.hdr[i, 1] = SOCKADDR_IN_LEN
            self.hdr[i, 2] = self.iov_ptr + 16 * i
            self.hdr[i, 3] = 1
        self.names[:, 0] = AF_INET & 0xFF  # sa_family, little-endian u16
        self.names[:, 1] = AF_INET >> 8

    def point_at_rows(self, buf: np.ndarray) -> None:
        """Make iovec i cover row i of ``buf`` (for receiving)."""
        base = buf.ctypes.data
        stride = buf.strides[0]
        for i in range(min(self.capacity, buf.shape[0])):
            self.iov[i, 0] = base + stride * i
            self.iov[i, 1] = buf.shape[1]


@njit(cache=True, nogil=True)
def recv_batch(fd, hdr, hdr_ptr, cap, lens, src_ip, src_port, names):
    """Receive up to ``cap`` datagrams without blocking into the rows the iovecs
    point at; fill lengths and source addresses. Returns the count (0 if none)."""
    return recv_batch_flags(fd, hdr, hdr_ptr, cap, lens, src_ip, src_port, names, MSG_DONTWAIT)


@njit(cache=True, nogil=True)
def recv_batch_flags(fd, hdr, hdr_ptr, cap, lens, src_ip, src_port, names, flags):
    """:func:`recv_batch` with explicit ``recvmmsg`` flags (0 blocks until a
    datagram arrives or the socket's SO_RCVTIMEO expires)."""
    for i in range(cap):
        hdr[i, 1] = 16  # msg_namelen is in/out
    n = c_recvmmsg(fd, hdr_ptr, cap, flags, 0)
    if n <= 0:
        return 0
    for i in range(n):
        lens[i] = np.int32(hdr[i, 7] & np.uint64(0xFFFFFFFF))
        nm = names[i]
        src_port[i] = (np.int32(nm[2]) << 8) | np.int32(nm[3])
        src_ip[i] = (
            (np.uint32(nm[4]) << np.uint32(24))
            | (np.uint32(nm[5]) << np.uint32(16))
            | (np.uint32(nm[6]) << np.uint32(8))
            | np.uint32(nm[7])
        )
    return n


@njit(cache=True, nogil=True)
def send_batch(fd, hdr, hdr_ptr, iov, names, n, row_ptr, row_len, dst_ip, dst_port):
    """Send ``n`` datagrams: datagram d is ``row_len[d]`` bytes at address
    ``row_ptr[d]`` to ``(dst_ip[d], dst_port[d])``. Sends in chunks of the
    vector's capacity; returns how many the kernel accepted (the rest found a
    full socket buffer — a queue overflow, recovered by retransmission)."""
    cap = hdr.shape[0]
    sent = 0
    while sent < n:
        m = min(cap, n - sent)
        for i in range(m):
            d = sent + i
            iov[i, 0] = np.uint64(row_ptr[d])
            iov[i, 1] = np.uint64(row_len[d])
            nm = names[i]
            p = dst_port[d]
            nm[2] = np.uint8((p >> 8) & 0xFF)
            nm[3] = np.uint8(p & 0xFF)
            ip = np.uint32(dst_ip[d])
            nm[4] = np.uint8(ip >> np.uint32(24))
            nm[5] = np.uint8((ip >> np.uint32(16)) & np.uint32(0xFF))
            nm[6] = np.uint8((ip >> np.uint32(8)) & np.uint32(0xFF))
            nm[7] = np.uint8(ip & np.uint32(0xFF))
            hdr[i, 1] = 16
        r = c_sendmmsg(fd, hdr_ptr, m, MSG_DONTWAIT)
        if r <= 0:
            return sent
        sent += r
    return sent
