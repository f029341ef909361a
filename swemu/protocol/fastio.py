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
from numba import types

from .jit import kernel

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
        # one UDP_SEGMENT control message per row (used by send_batch_gso only):
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


@kernel
def recv_batch(fd, hdr, hdr_ptr, cap, lens, src_ip, src_port, names):
    """Receive up to ``cap`` datagrams without blocking into the rows the iovecs
    point at; fill lengths and source addresses. Returns the count (0 if none)."""
    return recv_batch_flags(fd, hdr, hdr_ptr, cap, lens, src_ip, src_port, names, MSG_DONTWAIT)


@kernel
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


@kernel
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
def send_batch_gso(
    fd, hdr, hdr_ptr, iov, names, cmsg, cmsg_ptr, n, row_ptr, row_len, dst_ip, dst_port, seg_max
):
    """:func:`send_batch` with UDP segmentation offload: datagrams of equal
    length to the same address travel as one message of up to ``seg_max``
    iovecs with a ``UDP_SEGMENT`` cmsg, which the kernel cuts into the same
    datagrams late on its send path (one route lookup, one skb, one trip down
    the stack per message instead of per datagram). Datagrams to one address
    keep their order. Returns how many datagrams the kernel accepted.

    A message the kernel refuses (a full buffer, or a route whose MTU is below
    the datagram size, where GSO is not allowed) is retried datagram by
    datagram, so GSO never loses what plain sends would deliver. ``seg_max`` 1
    is exactly :func:`send_batch`."""
    if seg_max <= 1:
        return send_batch(fd, hdr, hdr_ptr, iov, names, n, row_ptr, row_len, dst_ip, dst_port)
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
            ln = row_len[d]
            ip = dst_ip[d]
            pt = dst_port[d]
            hdr[m, 1] = 16
            hdr[m, 2] = iov_base + np.uint64(16 * j)
            set_name(names, m, ip, pt)
            first[m] = j
            g = 0
            e = d
            while e < n and g < seg_max and j < cap and (g + 1) * ln <= GSO_MAX_BYTES:
                if e - d > GSO_LOOKAHEAD:  # bounded: O(n) per batch
                    break
                if taken[e] == 0 and dst_ip[e] == ip and dst_port[e] == pt:
                    if row_len[e] != ln:
                        break  # never let a later datagram overtake one to the same address
                    iov[j, 0] = np.uint64(row_ptr[e])
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
# as many as fill GRO_LAND_BYTES at the size of the last receive's messages. Coalesced
# messages of 16 KiB datagrams are ~48 KiB each: sixteen of them spread a receive over
# 768 KiB, which left the cache before the kernels read it, while four to five keep it
# there. Measured with W = 4, 64 MiB float32, two emulators side by side in
# alternating rounds, four messages against sixteen: 90-114 against 100-134 ms of
# emulator CPU per call at 16 KiB packets (8 of 8 rounds), 189-208 against 229-249 at
# 1 KiB (in a later, slower phase of the host the landing budget against sixteen
# messages was within noise). Single datagrams (senders without GSO) still come
# sixteen at a time: capping the count at four had cost bench switch its batches.
GRO_MESSAGES = 16
GRO_LAND_BYTES = 256 << 10
GRO_LAND_MIN = 2  # messages per receive at least


class GroRx:
    """Receiving with UDP generic receive offload (``UDP_GRO``).

    A socket with ``UDP_GRO`` on receives a run of equal-size datagrams from one
    sender (a GSO message of a worker, say) as one message of up to 64 KiB plus
    a cmsg with the segment size: one skb and one queue operation in the kernel
    instead of one per datagram. :func:`recv_rows` lands up to ``capacity``
    messages and cuts them back into datagrams, one per row of the caller's
    batch, so the code behind it sees exactly what plain ``recvmmsg`` gave.
    The cursor keeps what did not fit into one batch for the next call.
    With ``rows`` > 0 it copies nothing: it gives each datagram's address in the
    landing area instead (``addr``), valid until the next call.

    ``cursor``: [next message, byte offset in it, messages landed, more, mean
    message length of the last receive (sizes the next: ``GRO_LAND_BYTES``)] where
    ``more`` is 1 while landed messages remain or the last receive was full."""

    def __init__(self, capacity: int, rows: int = 0) -> None:
        self.vec = MsgVec(capacity)
        # rows > 0: zero copy, recv_rows gives each datagram's address here
        self.addr = np.zeros(rows, np.int64)
        self._no_addr = self.addr[:0]
        self.land = np.zeros((capacity, GRO_MSG_BYTES), np.uint8)
        self.vec.point_at_rows(self.land)
        self.mlens = np.zeros(capacity, np.int32)
        self.gso = np.zeros(capacity, np.int32)
        self.mip = np.zeros(capacity, np.uint32)
        self.mport = np.zeros(capacity, np.int32)
        self.cursor = np.zeros(5, np.int64)

    def args(self, zero_copy: bool = True) -> tuple:
        """The arguments of :func:`recv_rows` before the batch's arrays;
        ``zero_copy`` False copies into the rows even if ``rows`` > 0."""
        v = self.vec
        return (
            v.hdr,
            v.hdr_ptr,
            v.names,
            v.cmsg,
            v.cmsg_ptr,
            self.land,
            self.mlens,
            self.gso,
            self.mip,
            self.mport,
            self.cursor,
            self.addr if zero_copy else self._no_addr,
        )


def enable_gro(sock: socket.socket) -> bool:
    """Turn ``UDP_GRO`` on for ``sock``; False where the kernel lacks it."""
    if not AVAILABLE:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return True
    except OSError:
        return False


@kernel
def recv_rows(
    fd,
    hdr,
    hdr_ptr,
    names,
    cmsg,
    cmsg_ptr,
    land,
    mlens,
    gso,
    mip,
    mport,
    cursor,
    addr,
    buf,
    lens,
    ip,
    port,
    max_rows,
):
    """Fill up to ``max_rows`` rows of ``buf`` (with ``lens``/``ip``/``port``)
    with received datagrams, cutting coalesced messages at their segment size;
    receives (without blocking) only when the landed messages are used up.
    Returns the rows filled: 0 when the socket is empty. A datagram longer than
    a row is cut to the row's length, as ``recvmmsg`` into the row would.

    With a non-empty ``addr`` (zero copy) nothing is copied into ``buf``:
    ``addr[r]`` is the address of datagram r in the landing area, and a call
    never lands new messages over datagrams it has already given out."""
    cap = hdr.shape[0]
    row_len = buf.shape[1]
    zero_copy = addr.shape[0] > 0
    r = 0
    while r < max_rows:
        if cursor[0] >= cursor[2]:
            if r > 0 and (cursor[3] == 0 or zero_copy):
                break  # the last receive was not full: the socket is (nearly) empty
            want = cap
            if cursor[4] > 0:  # as many messages as fill the landing budget at the last size
                want = min(cap, max(GRO_LAND_MIN, GRO_LAND_BYTES // cursor[4]))
            for i in range(want):
                hdr[i, 1] = 16
                hdr[i, 4] = np.uint64(cmsg_ptr + CMSG_SPACE_U16 * i)
                hdr[i, 5] = CMSG_SPACE_U16
            n = c_recvmmsg(fd, hdr_ptr, want, MSG_DONTWAIT, 0)
            cursor[0] = 0
            cursor[1] = 0
            cursor[2] = max(n, 0)
            cursor[3] = 1 if n == want else 0
            if n <= 0:
                break
            landed = 0
            for i in range(n):
                mlens[i] = np.int32(hdr[i, 7] & np.uint64(0xFFFFFFFF))
                landed += mlens[i]
                g = 0
                if hdr[i, 5] >= 20 and cmsg[i, 1] == np.uint64(SOL_UDP | (UDP_GRO << 32)):
                    g = np.int32(cmsg[i, 2] & np.uint64(0xFFFFFFFF))
                gso[i] = g
                nm = names[i]
                mport[i] = (np.int32(nm[2]) << 8) | np.int32(nm[3])
                mip[i] = (
                    (np.uint32(nm[4]) << np.uint32(24))
                    | (np.uint32(nm[5]) << np.uint32(16))
                    | (np.uint32(nm[6]) << np.uint32(8))
                    | np.uint32(nm[7])
                )
            cursor[4] = max(1, landed // n)
        i = cursor[0]
        off = cursor[1]
        total = mlens[i]
        seg = total - off
        if gso[i] > 0 and gso[i] < seg:
            seg = gso[i]
        keep = min(seg, row_len)
        if zero_copy:
            addr[r] = land.ctypes.data + i * land.strides[0] + off
        else:
            # a loop over two views indexed alike, which LLVM turns into wide copies:
            # Numba's slice assignment ran element by element (27 vs 2.8 ms per
            # 64 MiB), and indexing ``land`` at ``off + b`` (int32) was slower still
            dst = buf[r, :keep]
            src = land[i, off : off + keep]
            for b in range(keep):
                dst[b] = src[b]
        lens[r] = keep
        ip[r] = mip[i]
        port[r] = mport[i]
        r += 1
        off += seg
        if off >= total:
            cursor[0] = i + 1
            cursor[1] = 0
        else:
            cursor[1] = off
    if cursor[0] < cursor[2]:
        cursor[3] = 1
    return r


@kernel
def receive(
    fd,
    cap,
    buf,
    lens,
    ip,
    port,
    rx_hdr,
    rx_ptr,
    rx_names,
    gro,
    g_hdr,
    g_hdr_ptr,
    g_names,
    g_cmsg,
    g_cmsg_ptr,
    g_land,
    g_mlens,
    g_gso,
    g_mip,
    g_mport,
    g_cursor,
    g_addr,
):
    """One batch of up to ``cap`` datagrams into the rows of ``buf``: ``recvmmsg``
    straight into them (``rx_*``, a :class:`MsgVec` pointed at the rows), or with
    ``UDP_GRO`` on, cut from landed coalesced messages (``g_*``: :meth:`GroRx.args`,
    :func:`recv_rows`). Returns (datagrams, whether more may be waiting)."""
    if gro:
        n = recv_rows(
            fd,
            g_hdr,
            g_hdr_ptr,
            g_names,
            g_cmsg,
            g_cmsg_ptr,
            g_land,
            g_mlens,
            g_gso,
            g_mip,
            g_mport,
            g_cursor,
            g_addr,
            buf,
            lens,
            ip,
            port,
            cap,
        )
        return n, n == cap or g_cursor[3] != 0
    n = recv_batch(fd, rx_hdr, rx_ptr, cap, lens, ip, port, rx_names)
    return n, n == cap
