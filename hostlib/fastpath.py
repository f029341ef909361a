"""The worker's compiled I/O loop: receive, match, answer, in one Numba call.

On every readiness callback the client calls :func:`pump` once. It drains the
socket with ``recvmmsg`` in batches, marks which datagrams came from the
switch, feeds each batch to :func:`swemu.protocol.worker.kernels.on_results` and sends the
packets that batch released with ``sendmmsg``, until the socket is empty. No
Python runs per batch: the only interpreter work per wakeup is the call
itself. The blocking API waits in compiled code too (:func:`wait_and_pump`).

The loops take a socket's vectors as one record, :class:`WorkerIO` (built once
per membership by :class:`FastIO`), and the call's state as another,
:class:`swemu.protocol.worker.kernels.WorkerState`.
"""

from __future__ import annotations

import math
import os
import socket
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from swemu.protocol import fastio
from swemu.protocol.fastio import GroVec, Rows, TxVec
from swemu.protocol.jit import kernel, min2
from swemu.protocol.rawmem import unowned
from swemu.protocol.worker import kernels as K


class Slots(NamedTuple):
    """Where each slot's packet goes: slot s is ``len[s]`` bytes at ``ptr[s]``
    (its row of the protocol's ``rows``), to ``ip[s]`` and ``port[s]`` (its
    shard's, docs/protocol.md §5 ``data_ports``); ``ports`` lists the distinct
    ports, the order in which messages are built."""

    ptr: np.ndarray
    len: np.ndarray
    ip: np.ndarray
    port: np.ndarray
    ports: np.ndarray


class WorkerIO(NamedTuple):
    """One worker socket as the compiled loops use it: how it is read (``rx``,
    up to ``cap`` datagrams per batch, read where they landed: ``rx.addr[r]``
    is datagram r's address, ``rows`` its length and source, ``ok[r]`` whether
    it came from ``switch_ip`` and one of the ports), how packets leave (``tx``
    and ``slots``), and the ``struct pollfd`` pair (int32[4]: its socket, the
    loopback-broadcast one) and ``struct timespec`` (int64[2]) the blocking
    wait uses."""

    rx: GroVec
    rows: Rows
    ok: np.ndarray
    cap: int
    switch_ip: int
    tx: TxVec
    slots: Slots
    pollfd: np.ndarray
    ts: np.ndarray


@kernel(linked=False)
def send_slots(fd, tx, send, n, slots):
    """Send the packets of the first ``n`` slots listed in ``send``: each slot's
    row, to its shard's port (``slots``, :class:`Slots`). Returns the count of
    messages the kernel refused (their slots are resent by the retransmission
    timer).

    With UDP segmentation offload (the socket's ``UDP_SEGMENT`` option set to
    the packet length, ``tx.seg_max`` > 1), up to ``seg_max`` packets for the
    same port travel as one message whose iovecs are their rows: the kernel
    builds one buffer and cuts it into datagrams of the packet length late, so
    the per-datagram cost of the send path is paid once per message. The
    receiver sees ordinary datagrams. ``tx`` needs room for ``n`` messages.

    The emulator's :func:`swemu.protocol.fastio.send_batch_gso` is the general
    form (any lengths and destinations); this one knows that its packets are of
    one length and grouped by port, so it needs no control message per
    message, no lookahead and no retry (docs/performance.md: folding it into
    the general one cost every worker's first run a quarter more compiling)."""
    hdr, iov, seg_max = tx.hdr, tx.iov, tx.seg_max
    m = 0  # messages built
    j = 0  # iovecs used
    iov_ptr = np.uint64(iov.ctypes.data)
    for p in slots.ports:
        g = 0
        for d in range(n):
            s = send[d]
            if slots.port[s] != p:
                continue
            if g == 0:
                hdr[m, 1] = 16
                hdr[m, 2] = iov_ptr + np.uint64(16 * j)
                fastio.set_name(tx.names, m, slots.ip[s], p)
                m += 1
            iov[j, 0] = np.uint64(slots.ptr[s])
            iov[j, 1] = np.uint64(slots.len[s])
            j += 1
            g += 1
            hdr[m - 1, 3] = g
            if g == seg_max:
                g = 0
    done = 0
    hdr_ptr = hdr.ctypes.data
    while done < m:
        r = fastio.c_sendmmsg(fd, hdr_ptr + 64 * done, m - done, fastio.MSG_DONTWAIT)
        if r <= 0:
            break
        done += r
    return m - done


@kernel
def pump(now, fd, io, ws, tx_fd):
    """:func:`_pump` from Python (the event loop's readiness callback). Compiled
    only for a context that uses the event loop's path: the blocking API's
    :func:`wait_and_pump` has the loop inlined, so a process that only blocks
    compiles it once, not also on its own (see :func:`warmup`)."""
    return _pump(now, fd, io, ws, tx_fd)


@kernel(inline=True)
def _pump(now, fd, io, ws, tx_fd):
    """Drain the socket ``fd`` (``io.cap`` datagrams per ``recvmmsg``) into
    ``io.rows``, match every batch against the call ``ws``
    (:class:`swemu.protocol.worker.kernels.WorkerState`) and send what it releases from
    ``tx_fd`` (the worker's own socket; ``fd`` may be its loopback-broadcast
    socket). Returns the datagrams received."""
    rows, ok, ports = io.rows, io.ok, io.slots.ports
    total = 0
    while True:
        n, more = fastio.receive(fd, io.cap, rows, io.rx)
        if n == 0:
            return total
        total += n
        for r in range(n):
            good = 0
            if rows.ip[r] == io.switch_ip:
                for p in ports:
                    if rows.port[r] == p:
                        good = 1
            ok[r] = good
        m = K.on_results(io.rx.addr, rows.lens, ok, n, now, ws)  # where they landed
        ws.counters[K.Counter.SENT] += m
        if m > 0:
            send_slots(tx_fd, io.tx, ws.send, m, io.slots)
        if not more:
            return total


# -------------------------------------------------------- blocking wait loop
WAIT_SLICE_MS = 100  # the longest wait without a return to Python (signals, Ctrl-C)


class Run(IntEnum):
    """What :func:`wait_and_pump` returns."""

    DONE = 0  # every result is in
    TIMER = 1  # a retransmission deadline or the no-progress limit is due
    RETURN = 2  # a wait slice ended, or a signal interrupted the wait


class Clock(IntEnum):
    """Entries of the wait's clock (a float64 array shared with Python)."""

    NOW = 0  # the clock when the loop returned
    PROGRESS = 1  # when a result last arrived (Allreduce.last_progress)
    WAKEUPS = 2  # socket reads


@kernel
def wait_and_pump(fd, bfd, clock, expected, no_progress, io, ws):
    """Run an allreduce to the next event that needs Python: wait for the
    sockets with ``poll`` and read them (:func:`pump`'s loop, inlined), until
    every result is in (``Run.DONE``), a retransmission deadline or the
    no-progress limit is due (``Run.TIMER``: the caller runs the timer path),
    or a wait slice of ``WAIT_SLICE_MS`` ended or a signal interrupted it
    (``Run.RETURN``).

    This is the blocking API's loop (``Context.allreduce``): the event loop's
    readiness callback cost ~60 µs of interpreter work per wakeup, a fifth of
    a worker's CPU. Called with the GIL released (``nogil``), so other threads
    run meanwhile. ``fd`` is the worker's socket, ``bfd`` its
    loopback-broadcast socket or -1; ``clock`` holds :class:`Clock`.

    The records go on as owner-less views (:func:`swemu.protocol.rawmem.unowned`):
    a compiled callee takes each array argument as a new reference, two atomic
    count updates per array per call, and :func:`pump` passes some fifty arrays
    on per received batch (~6 % of a worker's CPU at 16 KiB packets). The
    caller holds the arrays for the whole call."""
    io, ws = unowned((io, ws))
    counters, ts, pollfd = ws.counters, io.ts, io.pollfd
    pollfd[0] = fd
    while True:
        now = fastio.monotonic(ts)
        clock[Clock.NOW] = now
        if counters[K.Counter.RESULTS] >= expected:
            return Run.DONE
        due = min2(K.next_deadline(ws.chunk, ws.deadline), clock[Clock.PROGRESS] + no_progress)
        own = True  # which sockets to read: both when a deadline is due
        shared = bfd >= 0
        if now < due:
            wait = min2(math.ceil((due - now) * 1000.0), WAIT_SLICE_MS)
            pollfd[1] = fastio.POLLIN
            pollfd[2] = bfd  # negative: poll skips the entry
            pollfd[3] = fastio.POLLIN
            r = fastio.c_poll(pollfd.ctypes.data, 2, wait)
            closed = r > 0 and ((pollfd[1] >> 16) & fastio.POLLNVAL) != 0  # closed meanwhile
            if r < 0 or closed or (r == 0 and wait == WAIT_SLICE_MS):  # or EINTR, or slice over
                clock[Clock.NOW] = fastio.monotonic(ts)
                return Run.RETURN
            if r == 0:
                continue
            own = (pollfd[1] >> 16) != 0  # revents
            shared = bfd >= 0 and (pollfd[3] >> 16) != 0
            now = fastio.monotonic(ts)
        # readable, or a deadline is due: read first (results may be waiting
        # after this process was descheduled; resending their packets is spurious)
        before = counters[K.Counter.RESULTS]
        got = 0
        # one call site for both sockets: the inlined loop is compiled once
        for rx_fd in (fd if own else -1, bfd if shared else -1):
            if rx_fd >= 0:
                got += _pump(now, rx_fd, io, ws, fd)
        if got > 0:
            clock[Clock.WAKEUPS] += 1
        if counters[K.Counter.RESULTS] != before:
            clock[Clock.PROGRESS] = now
        elif got == 0 and now >= due:
            clock[Clock.NOW] = now
            return Run.TIMER


class FastIO:
    """The preallocated message vectors of one worker socket, as the record
    :class:`WorkerIO` the compiled loops take, built once per membership.

    ``batch``'s shape bounds a batch (its rows) and a datagram's length (its
    columns; the datagrams are read where they landed, ``lens``/``ok`` per
    datagram), ``rows``
    are the protocol's outstanding packets (one per slot), slot s goes to
    ``switch_ip:ports[s % len(ports)]`` (docs/protocol.md §5 ``data_ports``).
    ``seg_max`` > 1 sends up to that many packets per message (the socket must
    have ``UDP_SEGMENT`` set to the packet length, see :func:`enable_gso`)."""

    def __init__(
        self,
        batch: np.ndarray,
        lens: np.ndarray,
        ok: np.ndarray,
        rows: np.ndarray,
        switch_ip: int,
        ports: list[int],
        seg_max: int = 1,
        gro: bool = False,
    ) -> None:
        cap = batch.shape[0]
        k = rows.shape[0]
        #: UDP_GRO is on for the socket (and the broadcast one): coalesced results
        self.gro = bool(gro)
        # the datagrams are read where the kernel landed them (zero copy), with
        # UDP_GRO or without (then each landed message is one datagram)
        self._landing = fastio.GroRx(fastio.GRO_MESSAGES, cap)
        self.bfd = -1  # the loopback-broadcast socket, if the job has one
        self.io = WorkerIO(
            rx=self._landing.landing(),
            rows=Rows(batch, lens, np.zeros(cap, np.uint32), np.zeros(cap, np.int32)),
            ok=ok,
            cap=cap,
            switch_ip=int(switch_ip),
            tx=fastio.MsgVec(k).tx(seg_max),
            slots=Slots(
                ptr=rows.ctypes.data + rows.strides[0] * np.arange(k, dtype=np.int64),
                len=np.full(k, rows.shape[1], np.int64),
                ip=np.full(k, switch_ip, np.uint32),
                port=np.array([ports[s % len(ports)] for s in range(k)], np.int32),
                ports=np.array(sorted(set(ports)), np.int32),
            ),
            pollfd=np.zeros(4, np.int32),  # 2 x struct pollfd {int fd; short events, revents}
            ts=np.zeros(2, np.int64),
        )

    def pump(self, fd: int, now: float, ws: K.WorkerState, rx_fd: int | None = None) -> int:
        """:func:`pump` for the call ``ws``: receive from ``rx_fd`` (default
        ``fd``), send from ``fd``."""
        return pump(float(now), fd if rx_fd is None else rx_fd, self.io, ws, fd)

    def wait(
        self, fd: int, clock: np.ndarray, expected: int, no_progress: float, ws: K.WorkerState
    ) -> int:
        """:func:`wait_and_pump` for the call ``ws``; returns its :class:`Run` status."""
        # int/float exactly as the warm-up typed them: an int ``no_progress`` (60)
        # would otherwise compile a second specialization inside the first allreduce
        return wait_and_pump(fd, self.bfd, clock, int(expected), float(no_progress), self.io, ws)

    def send(self, fd: int, send: np.ndarray, n: int) -> int:
        """Send the packets of the first ``n`` slots in ``send``."""
        return send_slots(fd, self.io.tx, send, n, self.io.slots)

    def discard_all(self, fd: int) -> int:
        """:meth:`discard` the worker's socket ``fd`` and its broadcast socket, if any."""
        return self.discard(fd) + (self.discard(self.bfd) if self.bfd >= 0 else 0)

    def discard(self, fd: int) -> int:
        """Drain the socket between calls; return how many datagrams were dropped."""
        io = self.io
        total = 0
        while True:
            n, more = fastio.receive_here(fd, io.cap, io.rows, io.rx)
            total += n
            if not more:
                return total


IP_MTU = 14  # linux/in.h: the path MTU of a connected socket


def enable_gso(sock: socket.socket, packet_len: int, switch_ip: str) -> int:
    """Turn on UDP segmentation offload for ``packet_len``-byte datagrams to the
    switch; return the packets per message to use (1 when it is not possible).

    It is possible when the kernel knows ``UDP_SEGMENT`` and one packet fits the
    route's MTU unfragmented (the kernel refuses GSO otherwise; without GSO such
    packets are IP-fragmented as before). ``SWITCHML_GSO=0`` turns it off."""
    if os.environ.get("SWITCHML_GSO", "1") == "0":
        return 1
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((switch_ip, 9))
        mtu = probe.getsockopt(socket.IPPROTO_IP, IP_MTU)
        if packet_len + 28 > mtu:  # IPv4 + UDP headers
            return 1
        sock.setsockopt(fastio.SOL_UDP, fastio.UDP_SEGMENT, packet_len)
    except OSError:
        return 1
    finally:
        probe.close()
    return max(1, min(fastio.GSO_MAX_SEGMENTS, fastio.GSO_MAX_BYTES // packet_len))


def warmup(pump: bool = True) -> None:
    """Compile (or load from the cache) :func:`wait_and_pump`, :func:`send_slots`
    and, with ``pump``, :func:`pump` (the event loop's path) for 32-bit calls
    (int32 and float32), on an unbound socket that never has data, so that no
    allreduce waits for the compiler. A process that only blocks (``switchml
    run``'s built-in workers) leaves :func:`pump` out: its loop is inlined into
    :func:`wait_and_pump`."""
    from swemu.protocol.worker import protocol

    _warmup_calls(protocol.WARMUP32, pump)


def warmup16(pump: bool = True) -> None:
    """:func:`warmup` of the version for calls with 16-bit data (see
    :func:`swemu.protocol.worker.protocol.warmup16`)."""
    from swemu.protocol.worker import protocol

    _warmup_calls(protocol.WARMUP16, pump)


def _warmup_calls(calls: tuple[tuple[type, bool], ...], pump: bool) -> None:
    from swemu.protocol.worker.protocol import warmup_call

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for dtype, wire16 in calls:
            proto, op = warmup_call(dtype, wire16)
            batch = np.zeros((2, proto.rows.shape[1] + 1), np.uint8)
            io = FastIO(
                batch,
                np.zeros(2, np.int32),
                np.zeros(2, np.uint8),
                proto.rows,
                0x7F000001,
                [9],
                2,
                True,
            )
            if pump:
                io.pump(sock.fileno(), 0.0, op.state)
            clock = np.zeros(len(Clock))
            io.wait(sock.fileno(), clock, 0, 1.0, op.state)  # returns at once: done
            io.send(sock.fileno(), op.send, 0)
            io.discard(sock.fileno())
    finally:
        sock.close()
