"""The emulator as a network service: UDP data plane + gRPC control plane.

A thin asyncio adapter around :class:`swemu.core.engine.SwitchEngine`. The UDP socket
is non-blocking and registered with ``loop.add_reader``: on readiness the
adapter drains datagrams straight into the rows of a preallocated
:class:`~swemu.core.engine.Batch` (``recvfrom_into``, no intermediate bytes), runs
the whole batch through the Numba kernel in one call, and sends what the kernel
asked for. The loop may be uvloop or the default asyncio loop; both are tested.

Use it from Python (tests, notebooks)::

    async with swemu.serve(host="127.0.0.1", port=0, control_port=0) as emu:
        print(emu.data_address, emu.control_address)
        ...
        print(emu.snapshot())

Observers never run per packet: :meth:`Emulator.snapshot` reads the counters
when asked (``GetStats`` of the ``swemu.EmulatorControl`` gRPC service on the
control port, the Prometheus endpoint with ``metrics_port``, the TUI), and a
pcap capture (``pcap=PATH``) is a :attr:`DataPlane.tap` that is not installed
at all when capture is off.

This is the single-process emulator (``serve --shards 1``); with several
data-plane processes, :class:`swemu.serving.shards.ShardedEmulator` takes its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from swemu.core.engine import Batch, EngineConfig, SwitchEngine
from swemu.observe.metrics import MetricsServer
from swemu.observe.pcap import DEFAULT_MAX_BYTES, DEFAULT_MAX_PACKETS, PcapWriter
from swemu.observe.stats import EmulatorControlService, FaultHandler, add_to_server
from swemu.protocol import fastio
from swemu.protocol.jit import compiling_said
from swemu.protocol.netutil import (
    SWITCH_BUFFER_BYTES,
    buffer_advice,
    hold_broadcast_port,
    interface_mac,
    receive_buffer,
)
from swemu.protocol.proto import fabric_pb2_grpc
from swemu.protocol.version import __version__
from swemu.protocol.wire import DEFAULT_CONTROL_PORT, DEFAULT_UDP_PORT
from swemu.serving.control_plane import SessionService, SyncService, start_control_server
from swemu.serving.dataplane import DataPlane, bind_udp
from swemu.serving.dataplane import warmup as dataplane_warmup
from swemu.serving.fabric import FabricNode, FabricService

log = logging.getLogger("swemu.server")


class PcapTap:
    """A :attr:`DataPlane.tap` that records every processed batch to a pcap file.

    Per batch, the received datagrams (worker -> switch) and then the results
    (switch -> each destination) go to :meth:`PcapWriter.write_batch` in two
    vectorised calls. In a fabric (docs/protocol.md §7) it records both levels:
    :meth:`uplink` takes a child switch's partial aggregates on their way up and
    the parent's results coming back, and ``children`` (a function returning the
    addresses of the child switches' uplinks among this switch's members) marks
    which senders at this switch's port are child switches; an uplink's end of a
    packet gets the MAC ``02:01:<IPv4>`` (:mod:`swemu.observe.pcap`), which is how
    ``switchml-emu decode`` tells them from workers. The file is bounded
    (``max_packets``, ``max_bytes``); once full, later packets are only
    counted. A write error (disk full) stops the capture with a log line
    instead of breaking the data plane.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        switch: tuple[int, int],
        *,
        max_packets: int | None = DEFAULT_MAX_PACKETS,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        clock_offset: float = 0.0,
        children: Callable[[], frozenset[tuple[int, int]]] | None = None,
    ) -> None:
        try:
            self.writer = PcapWriter(path, max_packets=max_packets, max_bytes=max_bytes)
        except OSError as exc:
            raise OSError(f"cannot write the capture {path}: {exc.strerror or exc}") from None
        self.path = path
        self.switch_ip, self.switch_port = switch
        # pcap wants epoch time to the µs: time.monotonic() (ns) plus this offset.
        # Not the data plane's `now`: uvloop's loop.time() moves in whole ms.
        self.clock_offset = clock_offset
        self.dropped = 0  # counted here once the writer is full (it is not called any more)
        self.failed: str | None = None
        self._children = children
        self._known: frozenset[tuple[int, int]] = frozenset()
        self._keys = np.zeros(0, np.int64)  # the children's uplinks as ip << 16 | port

    def _is_child(self, ip: np.ndarray, port: np.ndarray) -> np.ndarray | bool:
        """Per address: is it a child switch's uplink? (False without children.)"""
        known = self._children() if self._children is not None else frozenset()
        if known is not self._known:
            self._known = known
            self._keys = np.array(sorted((a << 16) | p for a, p in known), np.int64)
        if not self._keys.size:
            return False
        return np.isin((ip.astype(np.int64) << 16) | port, self._keys)

    def _write(self, n: int, *batches: tuple[tuple, dict[str, Any]]) -> None:
        """:meth:`PcapWriter.write_batch` of each ``(args, keywords)`` in ``batches``
        (``n`` packets in all), unless the capture is full or failed."""
        w = self.writer
        if w.full or self.failed is not None:
            self.dropped += n
            return
        try:
            for args, keywords in batches:
                w.write_batch(*args, **keywords)
        except (OSError, ValueError) as exc:
            self.failed = str(exc)
            log.error("packet capture to %s stopped: %s", self.path, exc)
            return
        if w.full:
            log.warning(
                "packet capture %s is full (%d packets, %d bytes): later packets are not recorded",
                self.path,
                w.packets,
                w.bytes_written,
            )

    def __call__(self, batch: Batch, now: float) -> None:
        n, nd = batch.n, batch.n_dest
        ts = time.monotonic() + self.clock_offset  # not `now` (see __init__)
        sw = (self.switch_ip, self.switch_port)
        ip, port = batch.ip[:n], batch.port[:n]
        dip, dport = batch.dest_ip[:nd], batch.dest_port[:nd]
        received = ((batch.buf, batch.lens[:n], ip, port, *sw, ts), {})
        sent = ((batch.out_buf, batch.out_len, *sw, dip, dport, ts), {"rows": batch.dest_row[:nd]})
        if self._children is not None:  # a fabric: which of them are child switches
            received[1]["src_uplink"] = self._is_child(ip, port)
            sent[1]["dst_uplink"] = self._is_child(dip, dport)
        self._write(n + nd, *((received,) if n else ()), *((sent,) if nd else ()))

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
        """Record packets of a child switch's ``uplink`` socket (``(ip, port)``; ip
        0 when bound to every address: the switch's): ``buf[rows]`` sent up to
        its parent at ``peer`` (``up``), or received there from ``peer``."""
        ts = time.monotonic() + self.clock_offset
        me = (uplink[0] or self.switch_ip, uplink[1])
        if up:
            write = ((buf, lens, *me, peer_ip, peer_port, ts), {"rows": rows, "src_uplink": True})
        else:
            write = ((buf, lens, peer_ip, peer_port, *me, ts), {"rows": rows, "dst_uplink": True})
        self._write(len(rows), write)

    @property
    def counters(self) -> dict[str, int]:
        """Packets and bytes written, packets not written (bound reached), full flag."""
        w = self.writer
        return {
            "packets": w.packets,
            "bytes": w.bytes_written,
            "dropped": w.dropped + self.dropped,
            "full": int(w.full or self.failed is not None),
        }

    def flush(self) -> None:
        if not self.writer.closed and self.failed is None:
            try:
                self.writer.flush()
            except OSError as exc:
                self.failed = str(exc)
                log.error("packet capture to %s stopped: %s", self.path, exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()


class Emulator:
    """A running emulator: engine, data plane and control plane, in one event loop.

    Optional observers: ``metrics_port`` serves Prometheus ``/metrics`` (on
    ``metrics_host``, default the control host; 0 = any free port), ``pcap``
    records every processed packet to a bounded capture file.
    """

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = DEFAULT_UDP_PORT,
        control_host: str | None = None,
        control_port: int = DEFAULT_CONTROL_PORT,
        config: EngineConfig | None = None,
        advertise_ip: str | None = None,
        switch_mac: int | None = None,
        identify_by: str = "ip-port",
        advertise_identity: bool = True,
        gso: bool | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        pcap: str | os.PathLike[str] | None = None,
        pcap_max_packets: int | None = DEFAULT_MAX_PACKETS,
        pcap_max_bytes: int | None = DEFAULT_MAX_BYTES,
        parent: str | None = None,
        always_up: bool = False,
    ) -> None:
        self.host = host
        self.parent = parent  # a fabric's parent switch (control address), docs/protocol.md §7
        self.always_up = always_up
        self.requested_port = port
        self.control_host = control_host or host
        self.requested_control_port = control_port
        self.engine = SwitchEngine(config)
        self.advertise_ip = advertise_ip
        # None: the MAC of the interface that holds the address given to workers
        self.switch_mac = switch_mac
        self.identify_by = identify_by
        self._advertise_identity = advertise_identity
        self._gso = gso
        self.port = 0
        self.control_port = 0
        self.sync_service = SyncService()
        self.metrics: MetricsServer | None = None
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host or self.control_host
        self._pcap = pcap
        self._pcap_limits = (pcap_max_packets, pcap_max_bytes)
        self.capture: PcapTap | None = None
        self.started_at = time.monotonic()
        self._sock: socket.socket | None = None
        self._data: DataPlane | None = None
        self._grpc = None
        self._timer: asyncio.TimerHandle | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.session_service: SessionService | None = None
        self.fabric: FabricNode | None = None

    def clock(self) -> float:
        """The emulator's clock: its event loop's (what the engine's times are)."""
        return self._loop.time()

    def on_fabric_change(self) -> None:
        """A fabric configured or freed a job here: the idle timer follows."""
        self._arm_timer()

    @property
    def data_address(self) -> tuple[str, int]:
        """Where workers send packets (a wildcard host is given as 127.0.0.1)."""
        return (self._reachable(self.host), self.port)

    @property
    def control_address(self) -> tuple[str, int]:
        return (self._reachable(self.control_host), self.control_port)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """Where ``/metrics`` is served, or None without ``metrics_port``."""
        if self.metrics is None:
            return None
        return (self._reachable(self._metrics_host), self.metrics.port)

    @staticmethod
    def _reachable(host: str) -> str:
        return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host

    @property
    def data_plane(self) -> DataPlane:
        assert self._data is not None, "emulator not started"
        return self._data

    def _enable_broadcast(self) -> None:
        """Offer loopback broadcast (:attr:`SwitchEngine.broadcast_ports`) when the
        data plane is bound to one 127/8 address that workers are also given, so
        that a broadcast leaves from the address they expect results from (bound
        to 0.0.0.0 it would leave from 127.0.0.1 whatever address they use).
        ``SWEMU_BROADCAST=0`` turns it off, and so do a capture (``--pcap``
        records every worker's copy, as the switch's ports would carry them) and
        ``identify_by="ip"`` (p4app-switchML's controller offers no broadcast)."""
        if os.environ.get("SWEMU_BROADCAST", "1") == "0" or not fastio.AVAILABLE:
            return
        if self._pcap is not None or self.identify_by != "ip-port":
            return
        try:
            bound = ipaddress.IPv4Address(self.host)
        except ValueError:
            return
        if not bound.is_loopback or self.advertise_ip not in (None, self.host):
            return
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        self.engine.broadcast_ports = hold_broadcast_port

    async def start(self) -> None:
        """Compile the kernels, then bind the ports and start serving.

        Every kernel is compiled (or loaded from Numba's cache: 30-50 s when it is
        cold) before any port is bound, so that a client that finds the ports open
        is answered at once (a p4app-switchML client that registered during the
        compilation got ``CANCELLED``)."""
        self._loop = asyncio.get_running_loop()
        # the data plane's kernels only: the engine's Python path (Batch, process),
        # which no part of a server calls, is not compiled (seconds of a first run)
        with compiling_said(log):
            dataplane_warmup(self._loop, tap=self._pcap is not None)
        self._sock = bind_udp(self.host, self.requested_port)
        self.port = self._sock.getsockname()[1]
        advice = buffer_advice(receive_buffer(self._sock), SWITCH_BUFFER_BYTES, "the emulator")
        if advice:
            log.warning(advice)
        self.started_at = time.monotonic()
        self._enable_broadcast()
        # made before the control plane (which may configure it), started after it
        self._data = DataPlane(self.engine, self._sock, self._loop, gso=self._gso)
        try:
            ip = self.advertise_ip or self.data_address[0]
            switch_ipv4 = int(ipaddress.IPv4Address(ip))
            if self.switch_mac is None:
                self.switch_mac = interface_mac(self.host, self.advertise_ip)
            session = SessionService(
                self.engine,
                switch_ipv4=switch_ipv4,
                switch_mac=self.switch_mac,
                # the one data port: workers given only the control address find it
                data_ports=[self.port],
                clock=self._loop.time,
                on_register=lambda *_: self._arm_timer(),
                identify_by=self.identify_by,
                advertise_identity=self._advertise_identity,
                flush=self._data.flush,
            )
            self.session_service = session
            control = EmulatorControlService(self.snapshot, self.set_faults_handler())
            self.fabric = FabricNode(self, parent=self.parent, always_up=self.always_up)
            session.fabric = self.sync_service.fabric = self.fabric
            fabric_service = FabricService(self.fabric)
            self._grpc, self.control_port = await start_control_server(
                self.control_host,
                self.requested_control_port,
                (session, self.sync_service),
                extra=[
                    lambda server: add_to_server(control, server),
                    lambda server: fabric_pb2_grpc.add_FabricServicer_to_server(
                        fabric_service, server
                    ),
                ],
            )
            if self._metrics_port is not None:
                self.metrics = MetricsServer(self.snapshot, self._metrics_host, self._metrics_port)
                await self.metrics.start()
            if self._pcap is not None:
                max_packets, max_bytes = self._pcap_limits
                self.capture = PcapTap(
                    self._pcap,
                    (switch_ipv4, self.port),
                    max_packets=max_packets,
                    max_bytes=max_bytes,
                    clock_offset=time.time() - time.monotonic(),
                    children=lambda: self.fabric.child_uplinks,
                )
        except BaseException:
            await self._close_listeners()
            raise
        if self.capture is not None:
            self._data.tap = self.capture
            self._flush_timer = self._loop.call_later(1.0, self._flush_capture)
        if self.parent is not None:
            self._data.compile_uplinks()
        self._data.start()
        await self.fabric.start()
        log.info(
            "data plane on udp %s:%d, control plane on grpc %s:%d",
            self.host,
            self.port,
            self.control_host,
            self.control_port,
        )
        if self.metrics is not None:
            log.info("metrics on http://%s:%d/metrics", self._metrics_host, self.metrics.port)
        if self.capture is not None:
            log.info("capturing packets to %s", self._pcap)

    def set_faults_handler(self) -> FaultHandler | None:
        """The ``SetFaults`` handler, or None: the call answers UNIMPLEMENTED.

        Fault injection (loss, duplication, reordering, delay, link rate) hooks
        in here: a callable taking a validated ``FaultConfig`` message and
        returning the configuration in force; the data plane already exists
        when this is called.
        """
        from swemu.serving.fault_control import FaultControl

        return FaultControl(self.engine, self._data)

    def snapshot(self) -> dict[str, Any]:
        """Every counter at this instant: the engine's snapshot plus the socket
        layer, the clock, the addresses, the limits and the capture.

        ``time`` is ``time.monotonic()``: counter deltas divided by the
        difference of two snapshots' ``time`` are rates.
        """
        snap = self.engine.snapshot()
        now = time.monotonic()
        snap["time"] = now
        snap["uptime"] = now - self.started_at
        snap["version"] = __version__
        snap["data_plane"] = _plain_counters(self._data.stats) if self._data is not None else {}
        snap["data_address"] = "%s:%d" % self.data_address
        snap["control_address"] = "%s:%d" % self.control_address
        cfg = self.engine.config
        snap["limits"] = {
            "pool_size": cfg.pool_size,
            "max_workers": cfg.max_workers,
            "max_jobs": cfg.max_jobs,
            "max_pool_memory": cfg.max_pool_memory,
            "idle_timeout": cfg.idle_timeout,
            "evict_after": cfg.evict_after,
        }
        if self.capture is not None:
            snap["capture"] = self.capture.counters
        if self.fabric is not None and self.fabric.active:
            snap["fabric"] = self.fabric.snapshot()
            self.fabric.annotate(snap["jobs"])
        return snap

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.engine.get_timer()
        if when is not None and self._loop is not None:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        for sid in self.engine.handle_timer(self._loop.time()):
            log.info("session %d released after %.0f s idle", sid, self.engine.config.idle_timeout)
        self._arm_timer()

    def _flush_capture(self) -> None:
        # a reader following the capture file sees at most a second's delay
        self._flush_timer = None
        if self.capture is not None and self._loop is not None:
            self.capture.flush()
            self._flush_timer = self._loop.call_later(1.0, self._flush_capture)

    async def _close_listeners(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        if self.capture is not None:
            self.capture.close()
        if self._sock is not None:
            self._sock.close()

    async def stop(self) -> None:
        """Stop serving and log the counters."""
        if self._timer is not None:
            self._timer.cancel()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._data is not None:
            self._data.stop()
            self._data.tap = None
        if self.fabric is not None:
            await self.fabric.stop()
        self.sync_service.cancel_all("the emulator is shutting down")
        await self._close_listeners()
        if self.capture is not None:
            c = self.capture.counters
            log.info(
                "capture %s: %d packets, %d bytes, %d not recorded",
                self._pcap,
                c["packets"],
                c["bytes"],
                c["dropped"],
            )
        log.info("shutdown: %s", summary_line(self.engine.snapshot()))


def _plain_counters(stats: object) -> dict[str, int]:
    """The integer fields of a stats object (a dataclass, or any object)."""
    fields = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else vars(stats)
    return {k: int(v) for k, v in fields.items() if isinstance(v, int) and not k.startswith("_")}


def summary_line(snap: dict) -> str:
    """One log line with the totals of a snapshot."""
    tot: dict[str, int] = {}
    for job in snap["jobs"]:
        for k, v in job["counters"].items():
            tot[k] = tot.get(k, 0) + v
    parts = [
        f"{len(snap['jobs'])} jobs",
        f"pkts_in={snap['counters']['pkts_in']}",
        f"drop_unknown_source={snap['counters']['drop_unknown_source']}",
    ]
    parts += [f"{k}={v}" for k, v in tot.items() if k not in ("pkts_in",)]
    return " ".join(parts)


@contextlib.asynccontextmanager
async def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    control_port: int = 0,
    *,
    config: EngineConfig | None = None,
    **kwargs,
) -> AsyncIterator[Emulator]:
    """Run an emulator inside the current event loop for the ``async with`` body.

    Ports default to 0 (any free port): read the bound ones from
    ``emu.data_address`` and ``emu.control_address``.
    """
    emu = Emulator(host=host, port=port, control_port=control_port, config=config, **kwargs)
    await emu.start()
    try:
        yield emu
    finally:
        await emu.stop()
