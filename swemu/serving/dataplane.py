"""The UDP data plane: one socket, drained in batches into the engine.

A thin asyncio adapter: the non-blocking socket is registered with
``loop.add_reader``; on readiness it drains datagrams straight into the rows of
a preallocated :class:`~swemu.core.engine.Batch` (``recvfrom_into``), runs the whole
batch through the Numba kernel in one call, and sends what the kernel asked for.

``tap``, when set, is called with every processed batch (after the engine ran,
before sending): packet capture and other observers hook in there and cost
nothing when unset. A tap with an ``uplink`` method (:class:`UplinkTap`) also
sees a child switch's traffic with its parent (docs/protocol.md §7): the
partial aggregates it sends up and what comes to its uplink sockets.

The compiled loops it runs (``recvmmsg`` -> the switch -> ``sendmmsg``) are
:mod:`swemu.serving.loops`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from swemu.core import faults as faults_mod
from swemu.core import kernels as switch_kernels
from swemu.core.engine import Batch, EngineConfig, Job, SwitchEngine
from swemu.core.faults import DelayQueue
from swemu.core.state import FaultFlag
from swemu.protocol import fastio
from swemu.protocol.fastio import Sends
from swemu.protocol.netutil import set_socket_buffers
from swemu.protocol.wire import MAX_PACKET_LEN, MAX_WORKERS
from swemu.serving.loops import (
    SERVE_IDLE_MS,
    SERVE_SLICE_MS,
    BatchIO,
    LoopStat,
    Serve,
    compile_fault_stages,
    drain,
    echo_drain,
    send_up,
    step,
    uplink_drain,
)

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


class UplinkTap(Protocol):
    """What a tap implements to see a child switch's uplinks too."""

    def uplink(
        self,
        buf: np.ndarray,
        lens: np.ndarray,
        rows: np.ndarray,
        uplink: tuple[int, int],
        peer_ip: np.ndarray | int,
        peer_port: np.ndarray | int,
        now: float,
        *,
        up: bool,
    ) -> None:
        """``buf[r, :lens[r]]`` for r in ``rows``: sent from the ``uplink`` socket
        (``(ip, port)``, ip 0 for a wildcard bind) to the parent at ``peer``
        (``up``), or received there from ``peer``."""


@dataclass
class DataPlaneStats:
    """Counters of the socket layer (the engine counts everything else)."""

    wakeups: int = 0
    batches: int = 0
    send_errors: int = 0
    recv_errors: int = 0


class DataPlane:
    """Feeds one UDP socket to the engine in batches, from the event loop.

    On 64-bit Linux the per-packet path runs in compiled code (``recvmmsg`` ->
    switch kernel -> ``sendmmsg``, see :func:`swemu.serving.loops.drain`); elsewhere, or with
    ``fast=False`` (or ``SWEMU_PORTABLE=1``), a portable loop of
    ``recvfrom_into``/``sendto`` feeds the same compiled batch step with the
    same results. Fault injection (:mod:`swemu.core.faults`) runs in both.
    """

    def __init__(
        self,
        engine: SwitchEngine,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        batch_capacity: int = 64,
        fast: bool | None = None,
        echo: bool = False,
        queue_capacity: int = 4096,
        gso: bool | None = None,
    ) -> None:
        self.engine = engine
        self.sock = sock
        self.loop = loop
        if fast is None:  # SWEMU_PORTABLE=1 forces the portable path (tests run both)
            fast = os.environ.get("SWEMU_PORTABLE", "") in ("", "0")
        self.fast = fast and fastio.AVAILABLE
        self.echo = echo  # benchmark baseline: send every datagram back, no switch
        if echo and not self.fast:
            raise ValueError("echo mode needs the compiled I/O path (64-bit Linux)")
        self.capacity = batch_capacity
        # UDP segmentation offload of results: datagrams to the same worker leave
        # as one message (fastio.send_batch_gso); SWEMU_GSO=0 turns it off
        if gso is None:
            gso = os.environ.get("SWEMU_GSO", "") in ("", "1")
        self.gso_segments = (
            fastio.GSO_MAX_SEGMENTS if gso and self.fast and fastio.gso_available() else 1
        )
        # twice the rows: room for injected duplicates; one spare byte a row: a
        # datagram that fills it is longer than any packet
        self.batch = Batch(2 * batch_capacity, MAX_PACKET_LEN + 1)
        self._rows = [memoryview(self.batch.buf[r]) for r in range(batch_capacity)]
        self._addr = _AddressCache()
        self.stats = DataPlaneStats()
        self._reading = False
        self._tap: Callable[[Batch, float], None] | None = None
        self._stepwise_ready = False  # its kernels compiled (_compile_stepwise)
        engine.fault_hooks.append(self._on_fault_flags)
        self._queue_capacity = queue_capacity
        self.queue = DelayQueue(0, 1)  # grows to queue_capacity when a fault needs it
        self.link_free = np.zeros((engine.config.max_jobs, MAX_WORKERS), np.float64)
        # the send list: what leaves now, results and due delayed packets
        n_out = max(2 * batch_capacity * MAX_WORKERS, queue_capacity)
        self._sends = Sends(
            np.zeros(n_out, np.int64),
            np.zeros(n_out, np.int64),
            np.zeros(n_out, np.uint32),
            np.zeros(n_out, np.int32),
        )
        # a child switch's uplinks (docs/protocol.md §7): the socket of each job
        # entry that has one, its partial aggregates' send list, the timer
        self.up_fd = np.full(engine.config.max_jobs, -1, np.int32)
        self._uplinks: dict[int, socket.socket] = {}
        self._up_addr: dict[int, tuple[int, int]] = {}  # job entry -> its uplink's (ip, port)
        self._up_tap: UplinkTap | None = None
        self._up_sends = Sends(
            np.zeros(2 * batch_capacity, np.int64),
            np.zeros(2 * batch_capacity, np.int64),
            np.zeros(2 * batch_capacity, np.uint32),
            np.zeros(2 * batch_capacity, np.int32),
        )
        self._up_rows = np.zeros((64, MAX_PACKET_LEN), np.uint8)  # the uplink timer's
        self._up_lens = np.zeros(64, np.int32)
        self._up_timer: asyncio.TimerHandle | None = None
        self._up_due = np.inf
        self._fast_stats = np.zeros(len(LoopStat), np.int64)
        self._ts = np.zeros(2, np.int64)  # struct timespec
        self._pollfd = np.zeros(2, np.int32)  # struct pollfd: the socket's, the uplinks'
        self._callbacks = 0  # readiness callbacks from the event loop
        self._flush_handle: asyncio.TimerHandle | None = None
        self._again: asyncio.Handle | None = None  # a drain for datagrams left landed
        self._flush_due = 0.0
        self._records()
        self._tx = fastio.MsgVec(1024 if self.fast else 1).tx(self.gso_segments)
        # UDP_GRO: the workers' GSO messages arrive whole (one skb each) instead
        # of being cut into one skb per datagram on the sender's CPU and queued
        # one by one. The compiled paths receive through the landing area either
        # way (fastio.receive): the fast path reads the datagrams where they
        # landed (zero copy); the stepwise and echo paths cut them into the
        # batch's rows. On by default (docs/performance.md: a sixth less CPU per
        # allreduce at 8 and 16 KiB packets); SWEMU_GRO=0 turns it off.
        self._gro_socket = False  # UDP_GRO set on the socket now
        self._gro = fastio.GroRx(
            fastio.GRO_MESSAGES if self.fast else 1, batch_capacity if self.fast else 0
        )
        # how the compiled paths read the socket: the fast path where the
        # datagrams landed, the stepwise and echo paths copied into the rows
        self._landing = self._gro.landing(zero_copy=True)
        self._landing_copy = self._gro.landing(zero_copy=False)
        # a child switch's uplink sockets land in their own area: a drain may
        # leave datagrams of the switch socket landed in the first for its next
        # pass, which an uplink's receive must not cut as its own
        self._up_landing = fastio.GroRx(fastio.GRO_MESSAGES).landing()  # (no rows: copies)
        if self.fast and os.environ.get("SWEMU_GRO", "1") != "0":
            self._set_gro(True)

    def _records(self) -> None:
        """(Re)build the loops' records of this data plane's arrays (the delay
        queue is replaced when a delaying fault is first configured)."""
        self.io = BatchIO(
            self.batch.packets,
            self._sends,
            self.queue.arrays,
            self.link_free,
            self._up_sends,
            self.up_fd,
        )
        # no serve slice while a delay queue exists (its due packets need the loop's timer)
        slice_s = SERVE_SLICE_MS / 1000.0 if self.queue.len.shape[0] == 0 else 0.0
        self._serve = Serve(
            self._fast_stats,
            slice_s,
            SERVE_IDLE_MS,
            self._ts,
            self._pollfd,
            self.capacity,
            MAX_BATCHES_PER_WAKEUP,
        )

    def enable_delay_queue(self) -> None:
        """Allocate the delay queue (done when a fault that delays is configured)."""
        if self.queue.len.shape[0] == 0:
            self.queue = DelayQueue(self._queue_capacity)
            self._records()
        self._on_fault_flags()

    def _faulty(self) -> np.ndarray | None:
        """The ``faulty`` argument of the compiled paths
        (:func:`swemu.serving.loops.switch_batch`):
        the engine's fault flags while a fault acts on the way through the switch
        or the delay queue exists (it may hold packets), else None (the variant
        without fault stages)."""
        flags = self.engine.fault_flags
        if flags[FaultFlag.DUPLICATE] or flags[FaultFlag.EGRESS] or self.queue.len.shape[0]:
            return flags
        return None

    def _on_fault_flags(self) -> None:
        """Faults changed (:attr:`SwitchEngine.fault_hooks`): if they now act,
        compile (or load from the cache) the variants with fault stages of the
        paths compiled so far, here, before a packet needs them. On a first run
        that is a few seconds while the control-plane call that configured the
        faults waits; nothing is lost (datagrams wait in the socket's buffer)."""
        flags = self._faulty()
        if flags is None:
            return
        for kernel in (drain, step, uplink_drain):
            compile_fault_stages(kernel, flags)

    def start(self) -> None:
        self.sock.setblocking(False)
        self.compile()
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
        self._reading = True

    @property
    def tap(self) -> Callable[[Batch, float], None] | None:
        """The observer of every processed batch, or None (see the module)."""
        return self._tap

    @tap.setter
    def tap(self, tap: Callable[[Batch, float], None] | None) -> None:
        if tap is not None:
            self._compile_stepwise()  # a tap moves serving to the stepwise path
        self._tap = tap
        self._up_tap = tap if callable(getattr(tap, "uplink", None)) else None

    def compile(self) -> None:
        """Compile (or load from the cache) the kernels of the path that serves
        now, so that the first packets do not wait for Numba: the compiled drain
        (:func:`swemu.serving.loops.drain`, or :func:`swemu.serving.loops.echo_drain`),
        or the stepwise path when there is
        a tap or no compiled I/O. The stepwise path of a fast data plane compiles
        when a tap is installed (:attr:`tap`): a first run compiles only what it
        uses, seconds less."""
        self._send_due()
        if self.fast and self.echo:
            self._echo()  # the benchmark's echo mode: compiled before it is ready too
        elif self.fast and self._tap is None:
            # the switch's kernel first, then the receive path, then the loop
            # that joins them: a worker warm-up started beside this emulator
            # (switchml run) loads the receive path from the cache when it gets
            # to it, compiled here (each kernel once; docs/running.md)
            self._process_nothing()
            self._receive_nothing()
            self._drain_fast()  # an empty socket: returns at once, compiled
        else:
            self._compile_stepwise()

    def _process_nothing(self) -> None:
        """Run :func:`swemu.core.kernels.process_batch` on no rows (compiles or
        loads the version :func:`swemu.serving.loops.drain` calls)."""
        switch_kernels.process_batch(
            self.io.packets, 0, 0.0, self.engine.state, switch_kernels.NO_ADDRESSES, self.engine.up
        )

    def _receive_nothing(self) -> None:
        """Receive no datagrams (:func:`fastio.recv_rows`: compiles or loads the
        receive path, which :func:`fastio.receive` inlines)."""
        fastio.recv_rows(self.sock.fileno(), self._landing_copy, self.batch.rows, 0)

    def _compile_stepwise(self) -> None:
        """Compile (or load) the kernels of :meth:`_drain_stepwise`."""
        if self._stepwise_ready:
            return
        step(0.0, 0, self.io, self.engine.state, self._faulty(), self.engine.up)
        if self.fast:
            self._receive_nothing()
            self._send_rows(0)  # nothing to send: returns at once, compiled
        faults_mod.due_packets(0.0, self.io.queue, self._sends, 0)  # none due, limit 0
        self._stepwise_ready = True

    def stop(self) -> None:
        if self._reading:
            self.loop.remove_reader(self.sock.fileno())
            self._reading = False
        if self._again is not None:
            self._again.cancel()
            self._again = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for j in list(self._uplinks):
            self.remove_uplink(j)
        if self._up_timer is not None:
            self._up_timer.cancel()
            self._up_timer = None

    # ------------------------------------------------------------ uplinks
    def add_uplink(self, job: Job, sock: socket.socket) -> None:
        """Send ``job``'s partial aggregates up from ``sock`` and take its
        parent's results there (the job has a parent: :meth:`SwitchEngine.set_parent`).
        The socket stays the caller's; :meth:`remove_uplink` lets it go."""
        j = job.index
        self.remove_uplink(j)
        sock.setblocking(False)
        self._uplinks[j] = sock
        host, port = sock.getsockname()[:2]
        self._up_addr[j] = (self._addr.to_int(host), port)
        self.up_fd[j] = sock.fileno()
        self.loop.add_reader(sock.fileno(), self._on_uplink, j)
        self._watch_uplinks()

    def remove_uplink(self, j: int) -> None:
        """Stop using job entry ``j``'s uplink socket (the job was freed)."""
        sock = self._uplinks.pop(j, None)
        self._up_addr.pop(j, None)
        if sock is not None:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(sock.fileno())
            self._watch_uplinks()
        self.up_fd[j] = -1

    def _watch_uplinks(self) -> None:
        """The serve slice's poll set: the socket, then every uplink socket (a
        parent's result there ends the slice: :func:`swemu.serving.loops._slice_next`)."""
        fds = [s.fileno() for s in self._uplinks.values()]
        self._pollfd = np.zeros(2 * (1 + len(fds)), np.int32)
        self._pollfd[2::2] = fds
        self._records()

    def compile_uplinks(self) -> None:
        """Compile (or load) the uplink's kernels, before any parent's result or
        timer needs them (a child switch calls this at start)."""
        eng = self.engine
        up = eng.uplinks
        uplink_drain(-1, -1, 0.0, self._up_landing, self._tx, self.io, eng.state, 0, None, up)
        switch_kernels.uplink_deadline(eng.state, up, 0)
        switch_kernels.uplink_due(0.0, eng.state, up, 0, self._up_rows[:0], self._up_lens[:0], 0)
        send_up(self._tx, self.io, up, self._fast_stats)
        if self.fast and self._tap is None:  # the drain's variant with uplinks
            rx = self._landing_copy
            drain(-1, 0.0, rx, self._tx, self.io, eng.state, self._serve, self._faulty(), up)
        else:
            step(0.0, 0, self.io, eng.state, self._faulty(), up)
        self._on_fault_flags()  # and the variants with fault stages, if faults act

    def _on_uplink(self, j: int) -> None:
        sock = self._uplinks.get(j)
        if sock is None:
            return
        if self.fast and self.tap is None:
            uplink_drain(
                sock.fileno(),
                self.sock.fileno(),
                self.loop.time(),
                self._up_landing,
                self._tx,
                self.io,
                self.engine.state,
                j,
                self._faulty(),
                self.engine.uplinks,
            )
        else:
            self._uplink_stepwise(j, sock)
        self._arm_up_timer()

    def _uplink_stepwise(self, j: int, sock: socket.socket) -> None:
        """:meth:`_on_uplink` batch by batch from Python (a tap, or no compiled I/O)."""
        b = self.batch
        for _ in range(MAX_BATCHES_PER_WAKEUP):
            n = 0
            if self.fast:
                n, _ = fastio.receive_here(sock.fileno(), self.capacity, b.rows, self._up_landing)
            else:
                while n < self.capacity:
                    try:
                        nbytes, addr = sock.recvfrom_into(self._rows[n])
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        continue
                    b.lens[n] = nbytes
                    b.ip[n] = self._addr.to_int(addr[0])
                    b.port[n] = addr[1]
                    n += 1
            if n == 0:
                return
            now = self.loop.time()
            if self._up_tap is not None:  # before the kernel writes the rows' results
                self._up_tap.uplink(
                    b.buf,
                    b.lens,
                    np.arange(n),
                    self._up_addr[j],
                    b.ip[:n],
                    b.port[:n],
                    now,
                    up=False,
                )
            nd = switch_kernels.uplink_batch(
                b.packets, n, now, self.engine.state, self.engine.uplinks, j
            )
            # the tap sees the results going down; what came in it saw as the uplink's
            b.n, b.n_dest = (0 if self._up_tap is not None else n), nd
            if self.tap is not None:
                self.tap(b, now)
            m = faults_mod.egress(
                now,
                nd,
                b.packets,
                self.engine.state,
                self.link_free,
                self.queue.arrays,
                self._sends,
                bool(self.engine.fault_flags[FaultFlag.EGRESS]),
            )
            self._send_list(m)

    def _send_up(self, now: float) -> None:
        """Send the batch's partial aggregates going up (the stepwise paths)."""
        b = self.batch
        if b.n_up[0] == 0:
            return
        if self._up_tap is not None:
            rows = b.up_row[: int(b.n_up[0])]
            jobs = b.out_job[rows]
            up = self.engine.uplinks
            for j in np.unique(jobs).tolist():
                if j in self._uplinks:
                    self._up_tap.uplink(
                        b.out_buf,
                        b.out_len,
                        rows[jobs == j],
                        self._up_addr[j],
                        int(up.job_up_ip[j]),
                        int(up.job_up_port[j]),
                        now,
                        up=True,
                    )
        if self.fast:
            send_up(self._tx, self.io, self.engine.uplinks, self._fast_stats)
            return
        st = self.engine.uplinks
        for k in range(int(b.n_up[0])):
            r = int(b.up_row[k])
            j = int(b.out_job[r])
            sock = self._uplinks.get(j)
            if sock is None:
                continue
            try:
                sock.sendto(
                    b.out_buf[r, : b.out_len[r]],
                    (self._addr.to_str(int(st.job_up_ip[j])), int(st.job_up_port[j])),
                )
            except OSError:
                pass  # the uplink's timer resends it
        b.n_up[0] = 0

    def _arm_up_timer(self) -> None:
        """Wake up when the earliest upward packet is due (held or unanswered)."""
        if not self._uplinks:
            return
        st, up = self.engine.state, self.engine.uplinks
        due = min(switch_kernels.uplink_deadline(st, up, j) for j in self._uplinks)
        if due == np.inf:
            return
        if self._up_timer is not None:
            if self._up_due <= due:
                return
            self._up_timer.cancel()
        self._up_due = due
        self._up_timer = self.loop.call_at(due, self._on_up_timer)

    def _on_up_timer(self) -> None:
        self._up_timer = None
        self._up_due = np.inf
        now = self.loop.time()
        st, up = self.engine.state, self.engine.uplinks
        rows, lens = self._up_rows, self._up_lens
        stride = rows.strides[0]
        for j, sock in list(self._uplinks.items()):
            first = 0
            while True:
                n, first = switch_kernels.uplink_due(now, st, up, j, rows, lens, first)
                ip, port = int(up.job_up_ip[j]), int(up.job_up_port[j])
                if n and self._up_tap is not None:
                    self._up_tap.uplink(
                        rows, lens, np.arange(n), self._up_addr[j], ip, port, now, up=True
                    )
                if self.fast and n:
                    out = self._up_sends
                    out.ptr[:n] = rows.ctypes.data + stride * np.arange(n)
                    out.len[:n] = lens[:n]
                    out.ip[:n] = ip
                    out.port[:n] = port
                    fastio.send_batch_gso(sock.fileno(), self._tx, n, out)
                elif n:
                    for i in range(n):
                        with contextlib.suppress(OSError):
                            sock.sendto(rows[i, : lens[i]], (self._addr.to_str(ip), port))
                if n < rows.shape[0]:
                    break
        self._arm_up_timer()

    # ------------------------------------------------------------ the paths
    def _set_gro(self, on: bool) -> None:
        """Set or clear UDP_GRO on the socket (the landing area cuts coalesced
        messages and single datagrams alike, so nothing else changes)."""
        if on == self._gro_socket:
            return
        if on and not fastio.enable_gro(self.sock):
            return
        if not on:
            self.sock.setsockopt(fastio.SOL_UDP, fastio.UDP_GRO, 0)
        self._gro_socket = on

    def flush(self) -> None:
        """Process every datagram waiting in the socket now, under the tables as
        they are. A job resumed after a restart is registered only after this
        (docs/protocol.md §5): a packet its workers sent before resuming must
        not count in its fresh slots."""
        if self._reading:
            self._on_readable()

    def _on_readable(self) -> None:
        if self._again is not None:  # (woken by the socket before it ran)
            self._again.cancel()
            self._again = None
        self._callbacks += 1
        if self.echo:
            self._echo()
        elif self.fast and self.tap is None:
            self._drain_fast()
        else:
            self._drain_stepwise()
        if self._gro.leftover() and self._reading:
            # a pass ends on its batch limit or with its serve slice, and may
            # leave datagrams landed while the socket is empty: no readiness
            # callback would come for them before the next datagram arrives
            # (a worker's retransmission, a timeout later)
            self._again = self.loop.call_soon(self._on_readable)
        self._arm_flush()
        self._arm_up_timer()

    def _drain_fast(self) -> None:
        drain(
            self.sock.fileno(),
            self.loop.time(),
            self._landing,
            self._tx,
            self.io,
            self.engine.state,
            self._serve,
            self._faulty(),
            self.engine.up,
        )
        self._sync_stats()

    def _receive_portable(self) -> int:
        b, n = self.batch, 0
        recv_into, to_int = self.sock.recvfrom_into, self._addr.to_int
        while n < self.capacity:
            try:
                nbytes, addr = recv_into(self._rows[n])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.stats.recv_errors += 1
                continue
            b.lens[n] = nbytes
            b.ip[n] = to_int(addr[0])
            b.port[n] = addr[1]
            n += 1
        return n

    def _drain_stepwise(self) -> None:
        """The same steps one batch at a time from Python: the portable path, and
        the path with a tap (an observer sees each batch between the steps)."""
        b, st = self.batch, self._fast_stats
        self._send_due()
        for _ in range(MAX_BATCHES_PER_WAKEUP):
            more = False
            if self.fast:
                n, more = fastio.receive_here(
                    self.sock.fileno(), self.capacity, b.rows, self._landing_copy
                )
            else:
                n = self._receive_portable()
                more = n == self.capacity
            if n == 0:
                break
            now = self.loop.time()
            m, rows, dests = step(
                now, n, self.io, self.engine.state, self._faulty(), self.engine.up
            )
            if self.tap is not None:
                b.n, b.n_dest = rows, dests
                self.tap(b, now)
            self._send_list(m)
            self._send_up(now)
            st[LoopStat.BATCHES] += 1
            st[LoopStat.PACKETS] += n
            if not more:
                break
        self._sync_stats()

    def _echo(self) -> None:
        echo_drain(
            self.sock.fileno(),
            self._landing_copy,
            self._tx,
            self.batch.rows,
            self._sends,
            self._serve,
        )
        self._sync_stats()

    def _send_rows(self, m: int) -> int:
        """:func:`fastio.send_batch_gso` for the first ``m`` entries of the send
        list; returns how many datagrams left."""
        return fastio.send_batch_gso(self.sock.fileno(), self._tx, m, self._sends)

    def _send_list(self, m: int) -> None:
        """Send the first ``m`` packets of the compacted send list."""
        if m == 0:
            return
        st = self._fast_stats
        if self.fast:
            sent = self._send_rows(m)
        else:
            sent = 0
            to_str, sendto = self._addr.to_str, self.sock.sendto
            out = self._sends
            for ptr, ln, ip, port in zip(
                out.ptr[:m].tolist(),
                out.len[:m].tolist(),
                out.ip[:m].tolist(),
                out.port[:m].tolist(),
            ):
                try:
                    sendto((ctypes.c_char * ln).from_address(ptr), (to_str(ip), port))
                    sent += 1
                except OSError:
                    pass  # a full socket buffer is a queue overflow: retransmission recovers
        st[LoopStat.SENT] += sent
        st[LoopStat.SEND_DROPS] += m - sent

    def _send_due(self) -> None:
        """Send the delayed packets that are due (both paths)."""
        q = self.queue
        if q.len.shape[0] == 0:
            return
        m = faults_mod.due_packets(self.loop.time(), q.arrays, self._sends, len(self._sends.ptr))
        self._send_list(m)

    def _arm_flush(self) -> None:
        """Wake up when the earliest delayed packet is due (nothing if none)."""
        if self.queue.len.shape[0] == 0:
            return
        due = self.queue.next_due()
        if due is None:
            return
        h = self._flush_handle
        if h is not None:
            if self._flush_due <= due:
                return
            h.cancel()
        self._flush_due = due  # (uvloop's timer handles do not expose when())
        self._flush_handle = self.loop.call_at(due, self._on_flush)

    def _on_flush(self) -> None:
        self._flush_handle = None
        self._send_due()
        self._sync_stats()
        self._arm_flush()

    def _sync_stats(self) -> None:
        st = self._fast_stats
        self.stats.batches = int(st[LoopStat.BATCHES])
        # wakeups: the event loop's callbacks and the waits within serve slices
        self.stats.wakeups = self._callbacks + int(st[LoopStat.POLLS])
        self.stats.send_errors = int(st[LoopStat.SEND_DROPS])


def warmup(loop: asyncio.AbstractEventLoop, tap: bool = False) -> None:
    """Compile (or load from the cache) every kernel of the data plane's path,
    on a throwaway engine and an unbound socket: a server calls this before it
    binds any port, so that nobody reaches it while it compiles. ``tap``: the
    server will install a tap (a capture), so the stepwise path serves."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        data = DataPlane(SwitchEngine(EngineConfig(pool_size=4, max_jobs=1)), sock, loop)
        if tap:
            data.tap = lambda batch, now: None
        data.compile()


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
