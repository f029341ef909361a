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
import socket
from collections.abc import Callable
from dataclasses import dataclass

from .engine import Batch, SwitchEngine
from .netutil import set_socket_buffers
from .wire import MAX_PACKET_LEN

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


class DataPlane:
    """Feeds one UDP socket to the engine in batches, from the event loop."""

    def __init__(
        self,
        engine: SwitchEngine,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        batch_capacity: int = 64,
    ) -> None:
        self.engine = engine
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
