"""Batched UDP I/O from compiled code: libc ``recvmmsg``/``sendmmsg`` called from Numba.

The functions are declared with ``numba.types.ExternalFunction`` (resolved by
symbol name when the kernel is compiled, so ``cache=True`` keeps working; ctypes
function pointers would not cache). Pointers are passed as pointer-sized
integers (``intp``), which the C ABI of the supported platforms passes exactly
like pointers.

Buffers (all preallocated, their addresses taken once):

* ``hdr[B, 8]`` uint64: one ``struct mmsghdr`` per row (64 bytes on 64-bit Linux):
  words 0 ``msg_name``, 1 ``msg_namelen``, 2 ``msg_iov``, 3 ``msg_iovlen``,
  4-5 control (``msg_control``, ``msg_controllen``), 6 ``msg_flags``, 7
  ``msg_len`` (low 32 bits);
* ``iov[B, 2]`` uint64: one ``struct iovec`` (base, length) per row;
* ``names[B, 16]`` uint8: one ``struct sockaddr_in`` per row.

The compiled functions take them as records, each declared once here:
:class:`Rows` (where received datagrams go), :class:`Sends` (what to send),
:class:`RxVec` and :class:`TxVec` (a :class:`MsgVec` for receiving or
sending) and :class:`GroVec` (a :class:`GroRx` landing area, what
:func:`receive` takes).
Records are NamedTuples: Numba passes their fields as it would separate
arguments, and compiled code reads them by name.

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
from enum import IntEnum
from typing import NamedTuple

import numpy as np
from numba import types

from .jit import kernel, max2, min2

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


# libc's poll and clock_gettime, for compiled loops that wait for their socket
# themselves (the worker's blocking wait, the emulator's serve slice)
c_poll = types.ExternalFunction("poll", types.intc(types.intp, types.uintp, types.intc))
c_clock_gettime = types.ExternalFunction("clock_gettime", types.intc(types.intc, types.intp))
CLOCK_MONOTONIC = 1  # the clock of time.monotonic() and of the event loops (uvloop's too)
POLLIN = 1
POLLNVAL = 0x20


@kernel(inline=True)
def monotonic(ts):
    """CLOCK_MONOTONIC in seconds; ``ts`` is a ``struct timespec`` as int64[2]."""
    c_clock_gettime(CLOCK_MONOTONIC, ts.ctypes.data)
    return np.float64(ts[0]) + np.float64(ts[1]) * 1e-9


SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h: gso_size, as a socket option or a cmsg (Linux 4.18+)
CMSG_SPACE_U16 = 24  # CMSG_SPACE(sizeof(uint16_t)) on 64-bit Linux
GSO_MAX_BYTES = 65000  # one message stays under the 64 KiB IP datagram limit
GSO_MAX_SEGMENTS = 64  # UDP_MAX_SEGMENTS of Linux 4.18-6.x (newer kernels allow 128)
GSO_LOOKAHEAD = 512  # datagrams scanned for partners of one message


def gso_available() -> bool:
    """Whether this kernel knows UDP segmentation offload (``UDP_SEGMENT``)."""
    if not AVAILABLE:
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(SOL_UDP, UDP_SEGMENT, 1000)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Rows(NamedTuple):
    """Where received datagrams go: datagram r in row r of ``buf`` (uint8
    ``[B, L]``; a longer one is cut to L), its length ``lens[r]`` (int32) and
    source address ``ip[r]`` (uint32, host order) and ``port[r]`` (int32)."""

    buf: np.ndarray
    lens: np.ndarray
    ip: np.ndarray
    port: np.ndarray


class Sends(NamedTuple):
    """Datagrams to send: datagram d is ``len[d]`` bytes at address ``ptr[d]``
    (int64 each), to ``ip[d]`` (uint32) and ``port[d]`` (int32)."""

    ptr: np.ndarray
    len: np.ndarray
    ip: np.ndarray
    port: np.ndarray


class RxVec(NamedTuple):
    """A :class:`MsgVec` for ``recvmmsg`` into the rows its iovecs point at.
    (The record holds every array the headers point into: it keeps them alive.)"""

    hdr: np.ndarray
    iov: np.ndarray
    names: np.ndarray


class TxVec(NamedTuple):
    """A :class:`MsgVec` for ``sendmmsg``; ``seg_max`` > 1 sends up to that many
    datagrams per message with UDP segmentation offload (:func:`send_batch_gso`)."""

    hdr: np.ndarray
    iov: np.ndarray
    names: np.ndarray
    cmsg: np.ndarray
    seg_max: int


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
        # one UDP_SEGMENT control message per row (send_batch_gso's, recv_rows's):
        # cmsg_len (size_t), cmsg_level, cmsg_type (int), then the u16 gso_size
        self.cmsg = np.zeros((capacity, CMSG_SPACE_U16 // 8), np.uint64)
        self.cmsg_ptr = self.cmsg.ctypes.data
        self.cmsg[:, 0] = 18  # CMSG_LEN(2) = 16 + 2
        self.cmsg[:, 1] = SOL_UDP | (UDP_SEGMENT << 32)

    def point_at_rows(self, buf: np.ndarray) -> None:
        """Make iovec i cover row i of ``buf`` (for receiving)."""
        base = buf.ctypes.data
        stride = buf.strides[0]
        for i in range(min(self.capacity, buf.shape[0])):
            self.iov[i, 0] = base + stride * i
            self.iov[i, 1] = buf.shape[1]

    def rx(self) -> RxVec:
        """This vector as :func:`recv_batch_flags` takes it (after :meth:`point_at_rows`)."""
        return RxVec(self.hdr, self.iov, self.names)

    def tx(self, seg_max: int = 1) -> TxVec:
        """This vector as the senders take it, ``seg_max`` datagrams per message."""
        return TxVec(self.hdr, self.iov, self.names, self.cmsg, max(1, int(seg_max)))


@kernel
def recv_batch_flags(fd, v, cap, rows, flags):
    """Receive up to ``cap`` datagrams into the rows the iovecs of ``v``
    (:class:`RxVec`) point at; fill ``rows``' lengths and source addresses
    (:class:`Rows`). Returns the count (0 if none). ``flags`` are
    ``recvmmsg``'s: :data:`MSG_DONTWAIT`, or 0 to block until a datagram
    arrives or the socket's SO_RCVTIMEO expires. (The switch and the workers
    receive through :func:`receive`; this is ``bench switch``'s plain
    receive.)"""
    hdr = v.hdr
    for i in range(cap):
        hdr[i, 1] = 16  # msg_namelen is in/out
    n = c_recvmmsg(fd, hdr.ctypes.data, cap, flags, 0)
    if n <= 0:
        return 0
    for i in range(n):
        rows.lens[i] = np.int32(hdr[i, 7] & np.uint64(0xFFFFFFFF))
        rows.ip[i], rows.port[i] = get_name(v.names, i)
    return n


@kernel(inline=True)
def get_name(names, i):
    """``(ip, port)`` of ``struct sockaddr_in`` row ``i`` of ``names``."""
    nm = names[i]
    port = (np.int32(nm[2]) << 8) | np.int32(nm[3])
    ip = (
        (np.uint32(nm[4]) << np.uint32(24))
        | (np.uint32(nm[5]) << np.uint32(16))
        | (np.uint32(nm[6]) << np.uint32(8))
        | np.uint32(nm[7])
    )
    return ip, port


@kernel(inline=True)
def set_name(names, i, ip, port):
    """Write (ip, port) into ``struct sockaddr_in`` row ``i`` of ``names``.
    (Inlined where it is used: as a function of its own it compiled twice per
    process, for a literal 0 and for int64.)"""
    nm = names[i]
    nm[2] = np.uint8((port >> 8) & 0xFF)
    nm[3] = np.uint8(port & 0xFF)
    u = np.uint32(ip)
    nm[4] = np.uint8(u >> np.uint32(24))
    nm[5] = np.uint8((u >> np.uint32(16)) & np.uint32(0xFF))
    nm[6] = np.uint8((u >> np.uint32(8)) & np.uint32(0xFF))
    nm[7] = np.uint8(u & np.uint32(0xFF))


@kernel
def send_batch(fd, tx, n, out):
    """Send the first ``n`` datagrams of ``out`` (:class:`Sends`) through ``tx``
    (:class:`TxVec`), one per message, in chunks of the vector's capacity;
    returns how many the kernel accepted (the rest found a full socket buffer:
    a queue overflow, recovered by retransmission)."""
    hdr, iov = tx.hdr, tx.iov
    cap = hdr.shape[0]
    sent = 0
    while sent < n:
        m = min2(cap, n - sent)
        for i in range(m):
            d = sent + i
            iov[i, 0] = np.uint64(out.ptr[d])
            iov[i, 1] = np.uint64(out.len[d])
            set_name(tx.names, i, out.ip[d], out.port[d])
            hdr[i, 1] = 16
        r = c_sendmmsg(fd, hdr.ctypes.data, m, MSG_DONTWAIT)
        if r <= 0:
            return sent
        sent += r
    return sent


@kernel(linked=False)
def send_batch_gso(fd, tx, n, out):
    """:func:`send_batch` with UDP segmentation offload: datagrams of equal
    length to the same address travel as one message of up to ``tx.seg_max``
    iovecs with a ``UDP_SEGMENT`` cmsg, which the kernel cuts into the same
    datagrams late on its send path (one route lookup, one skb, one trip down
    the stack per message instead of per datagram). Datagrams to one address
    keep their order. Returns how many datagrams the kernel accepted.

    A message the kernel refuses (a full buffer, or a route whose MTU is below
    the datagram size, where GSO is not allowed) is retried datagram by
    datagram, so GSO never loses what plain sends would deliver. ``seg_max`` 1
    is exactly :func:`send_batch`."""
    seg_max = tx.seg_max
    if seg_max <= 1:
        return send_batch(fd, tx, n, out)
    hdr, iov, cmsg = tx.hdr, tx.iov, tx.cmsg
    hdr_ptr = hdr.ctypes.data
    cmsg_ptr = cmsg.ctypes.data
    cap = hdr.shape[0]
    iov_base = np.uint64(iov.ctypes.data)
    taken = np.zeros(n, np.uint8)
    first = np.zeros(cap, np.int64)  # per message: its first iovec
    sent = 0
    d = 0
    full = False
    while d < n and not full:
        # build up to cap messages (and at most cap iovecs) from the untaken datagrams
        m = 0
        j = 0
        while d < n and m < cap and j < cap:
            if taken[d]:
                d += 1
                continue
            ln = out.len[d]
            ip = out.ip[d]
            pt = out.port[d]
            hdr[m, 1] = 16
            hdr[m, 2] = iov_base + np.uint64(16 * j)
            set_name(tx.names, m, ip, pt)
            first[m] = j
            g = 0
            e = d
            while e < n and g < seg_max and j < cap and (g + 1) * ln <= GSO_MAX_BYTES:
                if e - d > GSO_LOOKAHEAD:  # bounded: O(n) per batch
                    break
                if taken[e] == 0 and out.ip[e] == ip and out.port[e] == pt:
                    if out.len[e] != ln:
                        break  # never let a later datagram overtake one to the same address
                    iov[j, 0] = np.uint64(out.ptr[e])
                    iov[j, 1] = np.uint64(ln)
                    taken[e] = 1
                    j += 1
                    g += 1
                e += 1
            hdr[m, 3] = g
            if g > 1:
                cmsg[m, 2] = np.uint64(ln)  # gso_size (u16, little-endian)
                hdr[m, 4] = np.uint64(cmsg_ptr + CMSG_SPACE_U16 * m)
                hdr[m, 5] = CMSG_SPACE_U16
            else:
                hdr[m, 4] = 0
                hdr[m, 5] = 0
            m += 1
            d += 1
        done = 0
        while done < m:
            r = c_sendmmsg(fd, hdr_ptr + 64 * done, m - done, MSG_DONTWAIT)
            if r > 0:
                for i in range(done, done + r):
                    sent += np.int64(hdr[i, 3])
                done += r
                continue
            # message `done` was refused: a full buffer drops the rest, as in
            # send_batch; a refused GSO message is tried datagram by datagram
            g = np.int64(hdr[done, 3])
            if g <= 1:
                full = True
                break
            hdr[done, 4] = 0
            hdr[done, 5] = 0
            hdr[done, 3] = 1
            base = first[done]
            ok = 0
            for k in range(g):
                hdr[done, 2] = iov_base + np.uint64(16 * (base + k))
                if c_sendmmsg(fd, hdr_ptr + 64 * done, 1, MSG_DONTWAIT) == 1:
                    ok += 1
            sent += ok
            if ok < g:
                full = True
                break
            done += 1
        # restore the plain layout send_batch expects (message i -> iovec i, no cmsg)
        for i in range(m):
            hdr[i, 2] = iov_base + np.uint64(16 * i)
            hdr[i, 3] = 1
            hdr[i, 4] = 0
            hdr[i, 5] = 0
    return sent


UDP_GRO = 104  # linux/udp.h: receive coalesced datagrams with their segment size (5.0+)
GRO_MSG_BYTES = 65536  # one coalesced message is at most one IP datagram
# Messages landed per recvmmsg (emulator and worker): up to GRO_MESSAGES, but only
# as many as fill GRO_LAND_BYTES at the size of the last receive's messages (the
# landing budget). Coalesced messages of 16 KiB datagrams are ~48 KiB each: sixteen
# of them spread a receive over 768 KiB, which leaves the cache before the kernels
# read it, while four to five stay there (docs/performance.md has the figures).
# Single datagrams (senders without GSO) still come sixteen at a time, so that
# small packets keep their long batches.
GRO_MESSAGES = 16
GRO_LAND_BYTES = 256 << 10
GRO_LAND_MIN = 2  # messages per receive at least


class Cursor(IntEnum):
    """Entries of :class:`GroRx`'s ``cursor`` (int64[5]): where cutting stands."""

    NEXT = 0  # the next landed message to cut
    OFFSET = 1  # the byte offset in it
    LANDED = 2  # messages the last receive landed
    MORE = 3  # 1 while landed messages remain or the last receive was full
    MEAN = 4  # mean message length of the last receive (sizes the next one)


class GroVec(NamedTuple):
    """A :class:`GroRx` as :func:`recv_rows` takes it: its message vector
    (``hdr``, ``iov``, ``names``, ``cmsg``), the landing area ``land`` (one coalesced
    message per row), per landed message its length ``mlens``, segment size
    ``gso`` (0: one datagram) and source ``mip``/``mport``, the ``cursor``
    (:class:`Cursor`) and ``addr``: empty, or the datagrams' addresses (zero
    copy)."""

    hdr: np.ndarray
    iov: np.ndarray
    names: np.ndarray
    cmsg: np.ndarray
    land: np.ndarray
    mlens: np.ndarray
    gso: np.ndarray
    mip: np.ndarray
    mport: np.ndarray
    cursor: np.ndarray
    addr: np.ndarray


class GroRx:
    """Receiving with UDP generic receive offload (``UDP_GRO``).

    A socket with ``UDP_GRO`` on receives a run of equal-size datagrams from one
    sender (a GSO message of a worker, say) as one message of up to 64 KiB plus
    a cmsg with the segment size: one skb and one queue operation in the kernel
    instead of one per datagram. :func:`recv_rows` lands up to ``capacity``
    messages and cuts them back into datagrams, one per row of the caller's
    batch, so the code behind it sees exactly what plain ``recvmmsg`` gave.
    The cursor (:class:`Cursor`) keeps what did not fit into one batch for the
    next call. With ``rows`` > 0 it copies nothing: it gives each datagram's
    address in the landing area instead (``addr``), valid until the next call.

    The compiled paths receive this way whether ``UDP_GRO`` is on or not (off,
    or a sender without GSO: each landed message is one datagram)."""

    def __init__(self, capacity: int, rows: int = 0) -> None:
        self.vec = MsgVec(capacity)
        # rows > 0: zero copy, recv_rows gives each datagram's address here
        self.addr = np.zeros(rows, np.int64)
        self.land = np.zeros((capacity, GRO_MSG_BYTES), np.uint8)
        self.vec.point_at_rows(self.land)
        self.mlens = np.zeros(capacity, np.int32)
        self.gso = np.zeros(capacity, np.int32)
        self.mip = np.zeros(capacity, np.uint32)
        self.mport = np.zeros(capacity, np.int32)
        self.cursor = np.zeros(len(Cursor), np.int64)

    def landing(self, zero_copy: bool = True) -> GroVec:
        """This landing area as :func:`recv_rows` takes it; ``zero_copy`` False
        copies into the rows even if ``rows`` > 0."""
        v = self.vec
        return GroVec(
            v.hdr,
            v.iov,
            v.names,
            v.cmsg,
            self.land,
            self.mlens,
            self.gso,
            self.mip,
            self.mport,
            self.cursor,
            self.addr if zero_copy else self.addr[:0],
        )

    def leftover(self) -> bool:
        """Whether landed datagrams wait to be cut (what still waits in the
        socket, its readiness says)."""
        c = self.cursor
        return bool(c[Cursor.NEXT] < c[Cursor.LANDED])


def enable_gro(sock: socket.socket) -> bool:
    """Turn ``UDP_GRO`` on for ``sock``; False where the kernel lacks it."""
    if not AVAILABLE:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return True
    except OSError:
        return False


@kernel(linked=False)
def recv_rows(fd, g, rows, max_rows):
    """Fill up to ``max_rows`` of ``rows`` (:class:`Rows`) with received
    datagrams, cutting the coalesced messages of ``g`` (:class:`GroVec`) at
    their segment size; receives (without blocking) only when the landed
    messages are used up. Returns the rows filled: 0 when the socket is empty.
    A datagram longer than a row is cut to the row's length, as ``recvmmsg``
    into the row would.

    With a non-empty ``g.addr`` (zero copy) nothing is copied into the rows:
    ``g.addr[r]`` is the address of datagram r in the landing area, and a call
    never lands new messages over datagrams it has already given out."""
    hdr, cmsg, land, mlens, gso, cursor = g.hdr, g.cmsg, g.land, g.mlens, g.gso, g.cursor
    cap = hdr.shape[0]
    row_len = rows.buf.shape[1]
    zero_copy = g.addr.shape[0] > 0
    cmsg_ptr = cmsg.ctypes.data
    r = 0
    while r < max_rows:
        if cursor[Cursor.NEXT] >= cursor[Cursor.LANDED]:
            if r > 0 and (cursor[Cursor.MORE] == 0 or zero_copy):
                break  # the last receive was not full: the socket is (nearly) empty
            want = cap
            if cursor[Cursor.MEAN] > 0:  # as many messages as fill the landing budget
                want = min2(cap, max2(GRO_LAND_MIN, GRO_LAND_BYTES // cursor[Cursor.MEAN]))
            for i in range(want):
                hdr[i, 1] = 16
                hdr[i, 4] = np.uint64(cmsg_ptr + CMSG_SPACE_U16 * i)
                hdr[i, 5] = CMSG_SPACE_U16
            n = c_recvmmsg(fd, hdr.ctypes.data, want, MSG_DONTWAIT, 0)
            cursor[Cursor.NEXT] = 0
            cursor[Cursor.OFFSET] = 0
            cursor[Cursor.LANDED] = max2(n, 0)
            cursor[Cursor.MORE] = 1 if n == want else 0
            if n <= 0:
                break
            landed = 0
            for i in range(n):
                mlens[i] = np.int32(hdr[i, 7] & np.uint64(0xFFFFFFFF))
                landed += mlens[i]
                seg = 0
                if hdr[i, 5] >= 20 and cmsg[i, 1] == np.uint64(SOL_UDP | (UDP_GRO << 32)):
                    seg = np.int32(cmsg[i, 2] & np.uint64(0xFFFFFFFF))
                gso[i] = seg
                g.mip[i], g.mport[i] = get_name(g.names, i)
            cursor[Cursor.MEAN] = max2(1, landed // n)
        i = cursor[Cursor.NEXT]
        off = cursor[Cursor.OFFSET]
        total = mlens[i]
        seg = total - off
        if gso[i] > 0 and gso[i] < seg:
            seg = gso[i]
        keep = min2(seg, row_len)
        if zero_copy:
            g.addr[r] = land.ctypes.data + i * land.strides[0] + off
        else:
            # a loop over two views indexed alike, which LLVM turns into wide copies
            # (Numba's slice assignment copies element by element, and indexing
            # ``land`` at ``off + b`` does not vectorize either)
            dst = rows.buf[r, :keep]
            src = land[i, off : off + keep]
            for b in range(keep):
                dst[b] = src[b]
        rows.lens[r] = keep
        rows.ip[r] = g.mip[i]
        rows.port[r] = g.mport[i]
        r += 1
        off += seg
        if off >= total:
            cursor[Cursor.NEXT] = i + 1
            cursor[Cursor.OFFSET] = 0
        else:
            cursor[Cursor.OFFSET] = off
    if cursor[Cursor.NEXT] < cursor[Cursor.LANDED]:
        cursor[Cursor.MORE] = 1
    return r


@kernel(inline=True)
def receive(fd, cap, rows, g):
    """One batch of up to ``cap`` datagrams into ``rows`` (:class:`Rows`), cut
    from the messages landed in ``g`` (:class:`GroVec`, :func:`recv_rows`).
    Returns (datagrams, whether more may be waiting).

    Every compiled receive goes this way, with ``UDP_GRO`` on the socket or
    not (a message that is one datagram is cut into itself): one receive path
    to compile on a first run, not a plain ``recvmmsg`` one beside it."""
    n = recv_rows(fd, g, rows, cap)
    return n, n == cap or g.cursor[Cursor.MORE] != 0


def receive_here(fd: int, cap: int, rows: Rows, g: GroVec) -> tuple[int, bool]:
    """:func:`receive` called from Python: its Python body, which calls the
    compiled :func:`recv_rows`, so that :func:`receive` (inlined into the
    compiled loops) never compiles on its own, on a first run or at a tapped
    data plane's first packet."""
    return receive.py_func(fd, cap, rows, g)
