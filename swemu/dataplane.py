"""The UDP data plane: one socket, drained in batches into the engine.

A thin asyncio adapter: the non-blocking socket is registered with
``loop.add_reader``; on readiness it drains datagrams straight into the rows of
a preallocated :class:`~swemu.engine.Batch` (``recvfrom_into``), runs the whole
batch through the Numba kernel in one call, and sends what the kernel asked for.

``tap``, when set, is called with every processed batch (after the engine ran,
before sending): packet capture and other observers hook in there and cost
nothing when unset.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import fastio
from .engine import Batch, SwitchEngine
from .kernels import _process_batch
from .netutil import set_socket_buffers
from .wire import MAX_PACKET_LEN, MAX_WORKERS

#: Batches drained per readiness callback before yielding to the loop, so the
#: control plane stays responsive under a flood.
MAX_BATCHES_PER_WAKEUP = 16


class _AddressCache:
    """``"a.b.c.d"`` <-> 32-bit int, memoised (few distinct hosts, many packets)."""

    def __init__(self) -> None:
        self._to_int: dict[str, int] = {}
        self._to_str: dict[int, str] = {}

    def to_int(self, ip: str) -> int:
        v = self._to_int.get(ip)
        if v is None:
            try:
                v = int(ipaddress.IPv4Address(ip))
            except ValueError:
                v = 0  # not IPv4 (cannot be a registered worker)
            if len(self._to_int) > 65536:
                self._to_int.clear()  # spoofed-source floods must not grow memory
            self._to_int[ip] = v
        return v

    def to_str(self, ip: int) -> str:
        s = self._to_str.get(ip)
        if s is None:
            s = str(ipaddress.IPv4Address(ip))
            if len(self._to_str) > 65536:
                self._to_str.clear()
            self._to_str[ip] = s
        return s


@dataclass
class DataPlaneStats:
    """Counters of the socket layer (the engine counts everything else)."""

    wakeups: int = 0
    batches: int = 0
    send_errors: int = 0
    recv_errors: int = 0


# columns of the compiled loop's stats array
S_BATCHES, S_PACKETS, S_SENT, S_SEND_DROPS = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def _drain(
    fd,
    max_batches,
    now,
    rx_hdr,
    rx_ptr,
    rx_names,
    tx_hdr,
    tx_ptr,
    tx_iov,
    tx_names,
    buf,
    lens,
    ip,
    port,
    action,
    out_buf,
    out_len,
    out_job,
    dest_row,
    dest_ip,
    dest_port,
    row_ptr,
    row_len,
    out_base,
    out_stride,
    stats,
    addr_keys,
    addr_vals,
    job_workers,
    job_pool,
    job_code,
    job_last_seen,
    values,
    exps,
    bitmap,
    count,
    dst_ip,
    dst_port,
    job_counters,
    worker_counters,
    global_counters,
):
    """The whole per-packet path in compiled code: recvmmsg a batch, run the
    switch kernel, sendmmsg the results; repeat until the socket is empty (or
    ``max_batches``, to let the event loop breathe). Returns packets received."""
    cap = buf.shape[0]
    total = 0
    for _ in range(max_batches):
        n = fastio.recv_batch(fd, rx_hdr, rx_ptr, cap, lens, ip, port, rx_names)
        if n == 0:
            break
        nd = _process_batch(
            buf,
            lens,
            ip,
            port,
            n,
            now,
            addr_keys,
            addr_vals,
            job_workers,
            job_pool,
            job_code,
            job_last_seen,
            values,
            exps,
            bitmap,
            count,
            dst_ip,
            dst_port,
            job_counters,
            worker_counters,
            global_counters,
            action,
            out_buf,
            out_len,
            out_job,
            dest_row,
            dest_ip,
            dest_port,
        )
        for d in range(nd):
            r = dest_row[d]
            row_ptr[d] = out_base + out_stride * r
            row_len[d] = out_len[r]
        sent = fastio.send_batch(
            fd, tx_hdr, tx_ptr, tx_iov, tx_names, nd, row_ptr, row_len, dest_ip, dest_port
        )
        stats[S_BATCHES] += 1
        stats[S_PACKETS] += n
        stats[S_SENT] += sent
        stats[S_SEND_DROPS] += nd - sent
        total += n
        if n < cap:
            break
    return total


@njit(cache=True, nogil=True)
def _echo_drain(
    fd,
    max_batches,
    rx_hdr,
    rx_ptr,
    rx_names,
    tx_hdr,
    tx_ptr,
    tx_iov,
    tx_names,
    buf,
    lens,
    ip,
    port,
    row_ptr,
    row_len,
    base,
    stride,
    stats,
):
    """The same I/O path as :func:`_drain` with the switch replaced by an echo:
    every datagram goes back to its sender. The baseline of ``bench`` that
    isolates the cost of aggregation from the cost of moving packets."""
    cap = buf.shape[0]
    total = 0
    for _ in range(max_batches):
        n = fastio.recv_batch(fd, rx_hdr, rx_ptr, cap, lens, ip, port, rx_names)
        if n == 0:
            break
        for r in range(n):
            row_ptr[r] = base + stride * r
            row_len[r] = lens[r]
        sent = fastio.send_batch(
            fd, tx_hdr, tx_ptr, tx_iov, tx_names, n, row_ptr, row_len, ip, port
        )
        stats[S_BATCHES] += 1
        stats[S_PACKETS] += n
        stats[S_SENT] += sent
        stats[S_SEND_DROPS] += n - sent
        total += n
        if n < cap:
            break
    return total


class DataPlane:
    """Feeds one UDP socket to the engine in batches, from the event loop.

    On 64-bit Linux the per-packet path runs in compiled code (``recvmmsg`` ->
    kernel -> ``sendmmsg``, see :func:`_drain`); elsewhere, or with
    ``fast=False``, a portable loop of ``recvfrom_into``/``sendto`` feeds the
    same kernel in the same batches, with the same results.
    """

    def __init__(
        self,
        engine: SwitchEngine,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        batch_capacity: int = 64,
        fast: bool | None = None,
        echo: bool = False,
    ) -> None:
        self.engine = engine
        if fast is None:  # SWEMU_PORTABLE=1 forces the portable path (tests run both)
            fast = os.environ.get("SWEMU_PORTABLE", "") in ("", "0")
        self.fast = fast and fastio.AVAILABLE
        self.echo = echo  # benchmark baseline: send every datagram back, no switch
        if echo and not self.fast:
            raise ValueError("echo mode needs the compiled I/O path (64-bit Linux)")
        self.sock = sock
        self.loop = loop
        # one spare byte a row: a datagram that fills it is longer than any packet
        self.batch = Batch(batch_capacity, MAX_PACKET_LEN + 1)
        self._rows = [memoryview(self.batch.buf[r]) for r in range(batch_capacity)]
        self._out_rows = [memoryview(self.batch.out_buf[r]) for r in range(batch_capacity)]
        self._addr = _AddressCache()
        self.stats = DataPlaneStats()
        self._reading = False
        self.tap: Callable[[Batch, float], None] | None = None
        if self.fast:
            b = self.batch
            self._rx = fastio.MsgVec(batch_capacity)
            self._rx.point_at_rows(b.buf)
            self._tx = fastio.MsgVec(min(1024, batch_capacity * MAX_WORKERS))
            self._row_ptr = np.zeros(batch_capacity * MAX_WORKERS, np.int64)
            self._row_len = np.zeros(batch_capacity * MAX_WORKERS, np.int64)
            self._fast_stats = np.zeros(4, np.int64)

    def start(self) -> None:
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
        self._reading = True

    def stop(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False

    def _on_readable(self) -> None:
        self.stats.wakeups += 1
        if self.fast:
            self._on_readable_fast()
            return
        batch = self.batch
        cap = batch.capacity
        recv_into = self.sock.recvfrom_into
        to_int = self._addr.to_int
        for _ in range(MAX_BATCHES_PER_WAKEUP):
            n = 0
            lens, ips, ports, rows = batch.lens, batch.ip, batch.port, self._rows
            while n < cap:
                try:
                    nbytes, addr = recv_into(rows[n])
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    self.stats.recv_errors += 1
                    continue
                lens[n] = nbytes
                ips[n] = to_int(addr[0])
                ports[n] = addr[1]
                n += 1
            if n == 0:
                return
            batch.n = n
            now = self.loop.time()
            self.engine.process(batch, now)
            self.stats.batches += 1
            if self.tap is not None:
                self.tap(batch, now)
            self._send(batch)
            if n < cap:
                return

    def _on_readable_fast(self) -> None:
        b, rx, tx, st = self.batch, self._rx, self._tx, self._fast_stats
        fd = self.sock.fileno()
        if self.echo:
            _echo_drain(
                fd,
                MAX_BATCHES_PER_WAKEUP,
                rx.hdr,
                rx.hdr_ptr,
                rx.names,
                tx.hdr,
                tx.hdr_ptr,
                tx.iov,
                tx.names,
                b.buf,
                b.lens,
                b.ip,
                b.port,
                self._row_ptr,
                self._row_len,
                b.buf.ctypes.data,
                b.buf.strides[0],
                st,
            )
        elif self.tap is None:
            _drain(
                fd,
                MAX_BATCHES_PER_WAKEUP,
                self.loop.time(),
                rx.hdr,
                rx.hdr_ptr,
                rx.names,
                tx.hdr,
                tx.hdr_ptr,
                tx.iov,
                tx.names,
                b.buf,
                b.lens,
                b.ip,
                b.port,
                b.action,
                b.out_buf,
                b.out_len,
                b.out_job,
                b.dest_row,
                b.dest_ip,
                b.dest_port,
                self._row_ptr,
                self._row_len,
                b.out_buf.ctypes.data,
                b.out_buf.strides[0],
                st,
                *self.engine.kernel_state(),
            )
        else:  # an observer wants every batch: same steps, with the tap between them
            for _ in range(MAX_BATCHES_PER_WAKEUP):
                n = fastio.recv_batch(
                    fd, rx.hdr, rx.hdr_ptr, b.capacity, b.lens, b.ip, b.port, rx.names
                )
                if n == 0:
                    break
                b.n = n
                now = self.loop.time()
                nd = self.engine.process(b, now)
                self.tap(b, now)
                rows = b.dest_row[:nd]
                self._row_ptr[:nd] = b.out_buf.ctypes.data + b.out_buf.strides[0] * rows
                self._row_len[:nd] = b.out_len[rows]
                sent = fastio.send_batch(
                    fd,
                    tx.hdr,
                    tx.hdr_ptr,
                    tx.iov,
                    tx.names,
                    nd,
                    self._row_ptr,
                    self._row_len,
                    b.dest_ip,
                    b.dest_port,
                )
                st[S_BATCHES] += 1
                st[S_PACKETS] += n
                st[S_SENT] += sent
                st[S_SEND_DROPS] += nd - sent
                if n < b.capacity:
                    break
        self.stats.batches = int(st[S_BATCHES])
        self.stats.send_errors = int(st[S_SEND_DROPS])

    def _send(self, batch: Batch) -> None:
        nd = batch.n_dest
        if nd == 0:
            return
        rows = batch.dest_row[:nd].tolist()
        ips = batch.dest_ip[:nd].tolist()
        ports = batch.dest_port[:nd].tolist()
        lens = batch.out_len
        to_str = self._addr.to_str
        sendto = self.sock.sendto
        out_rows = self._out_rows
        for r, ip, port in zip(rows, ips, ports):
            try:
                sendto(out_rows[r][: lens[r]], (to_str(ip), port))
            except OSError:
                # a full socket buffer is a switch queue overflow: the worker's
                # retransmission recovers, exactly as on hardware
                self.stats.send_errors += 1


def bind_udp(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to ``host:port`` with large buffers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        set_socket_buffers(sock)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for UDP on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
