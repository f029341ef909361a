"""The emulator as a network service: UDP data plane + gRPC control plane.

A thin asyncio adapter around :class:`swemu.engine.SwitchEngine`. The UDP socket
is non-blocking and registered with ``loop.add_reader``: on readiness the
adapter drains datagrams straight into the rows of a preallocated
:class:`~swemu.engine.Batch` (``recvfrom_into``, no intermediate bytes), runs
the whole batch through the Numba kernel in one call, and sends what the kernel
asked for. The loop may be uvloop or the default asyncio loop; both are tested.

Use it from Python (tests, notebooks)::

    async with swemu.serve(host="127.0.0.1", port=0, control_port=0) as emu:
        print(emu.data_address, emu.control_address)
        ...
        print(emu.engine.snapshot())
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator

from .control import SessionService, SyncService, start_control_server
from .dataplane import DataPlane, bind_udp
from .engine import EngineConfig, SwitchEngine, warmup
from .wire import DEFAULT_CONTROL_PORT, DEFAULT_UDP_PORT

log = logging.getLogger("swemu.server")


class Emulator:
    """A running emulator: engine, data plane and control plane, in one event loop."""

    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = DEFAULT_UDP_PORT,
        control_host: str | None = None,
        control_port: int = DEFAULT_CONTROL_PORT,
        config: EngineConfig | None = None,
        advertise_ip: str | None = None,
        switch_mac: int = 0x02_00_5E_BE_E0_00,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.control_host = control_host or host
        self.requested_control_port = control_port
        self.engine = SwitchEngine(config)
        self.advertise_ip = advertise_ip
        self.switch_mac = switch_mac
        self.port = 0
        self.control_port = 0
        self.sync_service = SyncService()
        self._sock: socket.socket | None = None
        self._data: DataPlane | None = None
        self._grpc = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def data_address(self) -> tuple[str, int]:
        """Where workers send packets (a wildcard host is given as 127.0.0.1)."""
        return (self._reachable(self.host), self.port)

    @property
    def control_address(self) -> tuple[str, int]:
        return (self._reachable(self.control_host), self.control_port)

    @staticmethod
    def _reachable(host: str) -> str:
        return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host

    @property
    def data_plane(self) -> DataPlane:
        assert self._data is not None, "emulator not started"
        return self._data

    async def start(self) -> None:
        """Bind both ports, compile the kernels and start serving."""
        self._loop = asyncio.get_running_loop()
        warmup()
        self._sock = bind_udp(self.host, self.requested_port)
        self.port = self._sock.getsockname()[1]
        try:
            ip = self.advertise_ip or self.data_address[0]
            session = SessionService(
                self.engine,
                switch_ipv4=int(ipaddress.IPv4Address(ip)),
                switch_mac=self.switch_mac,
                clock=self._loop.time,
                on_register=lambda *_: self._arm_timer(),
            )
            self._grpc, self.control_port = await start_control_server(
                self.control_host, self.requested_control_port, (session, self.sync_service)
            )
        except BaseException:
            self._sock.close()
            raise
        self._data = DataPlane(self.engine, self._sock, self._loop)
        self._data.start()
        log.info(
            "data plane on udp %s:%d, control plane on grpc %s:%d",
            self.host,
            self.port,
            self.control_host,
            self.control_port,
        )

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

    async def stop(self) -> None:
        """Stop serving and log the counters."""
        if self._timer is not None:
            self._timer.cancel()
        if self._data is not None:
            self._data.stop()
        self.sync_service.cancel_all("emulator shutting down")
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        if self._sock is not None:
            self._sock.close()
        log.info("shutdown: %s", summary_line(self.engine.snapshot()))


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
