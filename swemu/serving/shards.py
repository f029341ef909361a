"""Several data-plane processes behind one control plane: ``serve --shards S``.

Theory of operation
-------------------
One data plane (:mod:`swemu.serving.dataplane`) drains one UDP socket on one core. To
go past one core the emulator runs S data-plane *shards*, each a process of its
own with its own event loop, :class:`~swemu.serving.dataplane.DataPlane` and
:class:`~swemu.core.engine.SwitchEngine`, shard i on UDP port P + i. The main process
keeps everything that is not per packet: the gRPC control plane
(:class:`~swemu.core.controller.SessionController`, Barrier/Broadcast, ``GetStats``,
``SetFaults``), the metrics endpoint and the live view.

*Slots are split by number.* Shard i holds slot s of every job iff
``s % S == i``, at local index ``s // S`` (:func:`swemu.core.engine.shard_slots`
slots of each job), so the S pools of a job take together exactly what one
unsharded pool takes and the control plane's ``--max-pool-memory`` budget stays
honest. Workers learn the ports from ``UdpSessionResponse.data_ports``
(docs/protocol.md §5) and send slot s to ``data_ports[s % S]``, so every packet of a
slot, its retransmissions and its results stay in one process and §2 holds
unchanged. A packet that reaches a shard for a slot another shard holds is
dropped and counted (``drop_wrong_shard``), never aggregated.

*Control channel.* Each shard has a :func:`multiprocessing.Pipe` to the main
process carrying ``(seq, op, args)`` requests and ``(seq, ok, value)`` replies.
:class:`ShardedTarget` implements :class:`swemu.core.controller.Target` by sending
every table write (create/drop job, set/remove worker, drop simulation) to
every shard, in order, and :meth:`ShardedTarget.commit` waits until all of
them were acknowledged: the UdpSession reply waits there (the ``commit`` hook
of :class:`~swemu.serving.control_plane.SessionService`), so a worker never sends to a shard
that does not know its job yet. Snapshots and fault settings are requests to
every shard too; :func:`merge_snapshots` sums the shards' counters into the one
snapshot shape ``GetStats``, ``stats``, ``top``, the metrics and the TUI read.

*Lifetime.* The main process binds the S sockets itself (a port in use is its
error, and port 0 finds S consecutive free ports) and hands them to shards
started with multiprocessing's ``spawn`` context. Shards ignore SIGINT (a
Ctrl-C reaches the whole process group; the main process stops them in order)
and exit when their pipe closes, so a main process that is killed leaves no
orphans. A shard that dies closes its pipe: the main process logs one line and
resolves :attr:`ShardedEmulator.failed`, on which ``serve`` exits non-zero.

*Idle timeout.* Each shard knows when it last saw a job's packet; the main
process polls the shards' idle times (a few times per ``--idle-timeout``, only
while jobs exist) and releases a job once every shard has been idle that long.

The code: a shard process is :mod:`swemu.serving.shard_process`, the main
process's target over the shard pipes :mod:`swemu.serving.sharded_target`, and
:class:`ShardedEmulator` (here) ties them to the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import multiprocessing
import socket
import time
from typing import TYPE_CHECKING, Any

from swemu.core.controller import BITMAP_WORKERS, SessionController
from swemu.protocol.netutil import SWITCH_BUFFER_BYTES, buffer_advice, interface_mac, receive_buffer
from swemu.protocol.version import __version__
from swemu.protocol.wire import DEFAULT_CONTROL_PORT, DEFAULT_UDP_PORT
from swemu.serving.shard_process import ShardError, bind_shard_sockets, check_shards, shard_main
from swemu.serving.sharded_target import (
    REQUEST_TIMEOUT,
    ShardedTarget,
    ShardLink,
    _answers,
    merge_snapshots,
)

if TYPE_CHECKING:
    from swemu.core.engine import EngineConfig
    from swemu.core.faults import FaultConfig
    from swemu.observe.metrics import MetricsServer

# Numba, numpy and gRPC load where they are used: a shard needs no gRPC, the
# main process no data-plane kernels, and `serve --help`/option errors neither.

log = logging.getLogger("swemu.shards")


# ----------------------------------------------------------------------------- emulator
class ShardedEmulator:
    """The emulator with S data-plane processes and the control plane here.

    The counterpart of :class:`swemu.serving.server.Emulator` (same addresses, start,
    stop, snapshot — but :meth:`snapshot` is a coroutine: it asks the shards).
    ``faults``/``seed`` are the fault injection every shard starts with (shard i
    seeded ``seed + i``). :attr:`failed` resolves to a message if a shard dies.
    """

    def __init__(
        self,
        *,
        shards: int,
        host: str = "0.0.0.0",
        port: int = DEFAULT_UDP_PORT,
        control_host: str | None = None,
        control_port: int = DEFAULT_CONTROL_PORT,
        config: EngineConfig | None = None,
        advertise_ip: str | None = None,
        switch_mac: int | None = None,
        identify_by: str = "ip-port",
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        faults: FaultConfig | None = None,
        seed: int | None = None,
        log_level: str = "info",
        startup_timeout: float = 120.0,
    ) -> None:
        from swemu.core.engine import EngineConfig
        from swemu.serving.control_plane import SyncService

        check_shards(port, shards)
        self.shards = shards
        self.host = host
        self.requested_port = port
        self.control_host = control_host or host
        self.requested_control_port = control_port
        self.config = config or EngineConfig()
        self.advertise_ip = advertise_ip
        self.switch_mac = switch_mac  # None: interface_mac() of the address given to workers
        self.identify_by = identify_by
        self.faults = faults
        self.seed = seed
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self.ports: list[int] = []
        self.port = 0
        self.control_port = 0
        self.sync_service = SyncService()
        self.metrics: MetricsServer | None = None
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host or self.control_host
        self.links: list[ShardLink] = []
        self.target: ShardedTarget | None = None
        self.controller: SessionController | None = None
        self.started_at = time.monotonic()
        self.failed: asyncio.Future | None = None
        self._stopping = False
        self._serving = False
        self._grpc = None
        self._idle_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --------------------------------------------------------------- addresses
    @staticmethod
    def _reachable(host: str) -> str:
        return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host

    @property
    def data_address(self) -> tuple[str, int]:
        """Shard 0's address (the others are on the next ports, :attr:`ports`)."""
        return (self._reachable(self.host), self.port)

    @property
    def data_addresses(self) -> list[tuple[str, int]]:
        """Every shard's address, shard i at index i."""
        return [(self._reachable(self.host), p) for p in self.ports]

    @property
    def control_address(self) -> tuple[str, int]:
        return (self._reachable(self.control_host), self.control_port)

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        if self.metrics is None:
            return None
        return (self._reachable(self._metrics_host), self.metrics.port)

    # ---------------------------------------------------------------- lifetime
    async def start(self) -> None:
        """Bind the ports, start the shards, wait until they serve, then start
        the control plane."""
        from swemu.observe.metrics import MetricsServer
        from swemu.observe.stats import EmulatorControlService, add_to_server
        from swemu.serving.control_plane import SessionService, start_control_server

        loop = self._loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        socks = bind_shard_sockets(self.host, self.requested_port, self.shards)
        advice = buffer_advice(receive_buffer(socks[0]), SWITCH_BUFFER_BYTES, "the emulator")
        if advice:
            log.warning(advice)
        self.ports = [s.getsockname()[1] for s in socks]
        self.port = self.ports[0]
        self.started_at = time.monotonic()
        try:
            self._spawn(socks)
        finally:
            for s in socks:  # the shards have their own copies
                s.close()
        try:
            await self._wait_ready()
            self.target = ShardedTarget(self.config, self.links)
            self.controller = SessionController(self.target)
            ip = self.advertise_ip or self.data_address[0]
            switch_ipv4 = int(ipaddress.IPv4Address(ip))
            if self.switch_mac is None:
                self.switch_mac = interface_mac(self.host, self.advertise_ip)
            session = SessionService(
                self.controller,
                switch_ipv4=switch_ipv4,
                switch_mac=self.switch_mac,
                data_ports=self.ports,
                clock=loop.time,
                commit=self.target.commit,
                identify_by=self.identify_by,
            )
            control = EmulatorControlService(self.snapshot, self.set_faults)
            self._grpc, self.control_port = await start_control_server(
                self.control_host,
                self.requested_control_port,
                (session, self.sync_service),
                extra=[lambda server: add_to_server(control, server)],
            )
            if self._metrics_port is not None:
                self.metrics = MetricsServer(self.snapshot, self._metrics_host, self._metrics_port)
                await self.metrics.start()
        except BaseException:
            await self._shutdown()
            raise
        if self.config.idle_timeout is not None or self.config.evict_after is not None:
            self._idle_task = asyncio.ensure_future(
                self._idle_loop(self.config.idle_timeout, self.config.evict_after)
            )
        self._serving = True
        for link in self.links:
            if link.closed:  # died between its ready message and now
                self._lost(link)
        log.info(
            "data plane on udp %s:%d-%d (%d shards), control plane on grpc %s:%d",
            self.host,
            self.ports[0],
            self.ports[-1],
            self.shards,
            self.control_host,
            self.control_port,
        )

    def _spawn(self, socks: list[socket.socket]) -> None:
        mp = multiprocessing.get_context("spawn")
        assert self._loop is not None
        for i, sock in enumerate(socks):
            here, there = mp.Pipe()
            proc = mp.Process(
                target=shard_main,
                args=(i, self.shards, sock, there, self.config, self.faults, self.seed),
                kwargs={"log_level": self.log_level},
                name=f"swemu-shard-{i}",
                daemon=True,  # a main process that exits without stop() takes them along
            )
            proc.start()
            there.close()
            self.links.append(ShardLink(i, self.ports[i], proc, here, self._loop, self._lost))

    async def _wait_ready(self) -> None:
        answers = await _answers([link.ready for link in self.links], self.startup_timeout)
        for link, answer in zip(self.links, answers):
            if isinstance(answer, BaseException):
                code = link.process.exitcode
                why = str(answer) if code is None else f"exited with status {code}"
                raise OSError(f"data-plane shard {link.index} did not start: {why}")
            link.pid = answer["pid"]

    def _lost(self, link: ShardLink) -> None:
        if self._stopping or not self._serving:  # at start, start() raises instead
            return
        link.process.join(1.0)
        message = (
            f"data-plane shard {link.index} (udp port {link.port}) exited with status "
            f"{link.process.exitcode}; stopping"
        )
        if self.failed is not None and not self.failed.done():
            log.error("%s", message)
            self.failed.set_result(message)

    async def stop(self) -> None:
        """Stop serving, stop the shards (waiting for them) and log the counters."""
        summary = None
        if not self._stopping and self.target is not None:
            with contextlib.suppress(Exception):
                summary = await asyncio.wait_for(self.snapshot(), 2.0)
        await self._shutdown()
        if summary is not None:
            from swemu.serving.server import summary_line

            log.info("shutdown: %s", summary_line(summary))

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
        self.sync_service.cancel_all("the emulator is shutting down")
        if self.metrics is not None:
            await self.metrics.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        await _answers([link.request("stop") for link in self.links if not link.closed], 5.0)
        for link in self.links:
            link.close()
        deadline = time.monotonic() + 5.0
        for link in self.links:
            while link.process.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if link.process.is_alive():
                link.process.kill()
            link.process.join()  # reaped: no zombies

    # ------------------------------------------------------------------ observers
    async def _ask_all(self, op: str, *args: Any) -> list[Any]:
        """One request to every shard: the answers, or the exceptions, in shard order."""
        return await _answers([link.request(op, *args) for link in self.links], REQUEST_TIMEOUT)

    async def snapshot(self) -> dict[str, Any]:
        """Every counter, summed over the shards (see :func:`merge_snapshots`),
        in the shape of :meth:`swemu.serving.server.Emulator.snapshot`; a shard that
        does not answer is left out (``shards`` lists who answered)."""
        answers = await self._ask_all("snapshot")
        parts = [a for a in answers if not isinstance(a, BaseException)]
        assert self._loop is not None and self.target is not None
        snap = merge_snapshots(parts, self._loop.time())
        now = time.monotonic()
        snap["data_plane"]["shards"] = self.shards
        snap.update(
            {
                "released": dict(self.target.released),
                "memory_in_use": self.target.memory_in_use,
                "max_pool_memory": self.config.max_pool_memory,
                "time": now,
                "uptime": now - self.started_at,
                "version": __version__,
                "data_address": "%s:%d-%d" % (self.data_address[0], self.ports[0], self.ports[-1]),
                "control_address": "%s:%d" % self.control_address,
                "shards": [
                    {
                        "index": link.index,
                        "port": link.port,
                        "pid": link.pid,
                        "answered": not isinstance(a, BaseException),
                        "pkts_in": 0 if isinstance(a, BaseException) else a["counters"]["pkts_in"],
                    }
                    for link, a in zip(self.links, answers)
                ],
            }
        )
        cfg = self.config
        snap["limits"] = {
            "pool_size": cfg.pool_size,
            "max_workers": cfg.max_workers,
            "max_jobs": cfg.max_jobs,
            "max_pool_memory": cfg.max_pool_memory,
            "idle_timeout": cfg.idle_timeout,
            "evict_after": cfg.evict_after,
        }
        return snap

    async def set_faults(self, msg: Any) -> Any:
        """The ``SetFaults`` handler: checked here, applied in every shard
        (a seed s becomes s + i in shard i)."""
        from swemu.serving.fault_control import FaultError, UnknownSessionError, request_config

        cfg, rank = request_config(msg)
        assert self.target is not None
        if msg.session_id and msg.session_id not in self.target.jobs:
            raise UnknownSessionError(f"no session {msg.session_id} is registered")
        if rank is not None and not 0 <= rank < BITMAP_WORKERS:
            raise FaultError(f"rank {rank} is not a worker id (0..{BITMAP_WORKERS - 1})")
        seed = msg.seed or None
        answers = await _answers(
            [
                link.request(
                    "faults", cfg, msg.session_id, rank, None if seed is None else seed + link.index
                )
                for link in self.links
            ],
            REQUEST_TIMEOUT,
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                raise ShardError(str(answer))
        return msg

    async def _idle_loop(self, timeout: float | None, evict_after: float | None) -> None:
        """Learn when each job was last active on any shard (for eviction) and
        release jobs every shard has been idle on for ``timeout`` seconds."""
        assert self.target is not None and self.controller is not None and self._loop
        limits = [t for t in (timeout, evict_after) if t]
        period = min(max(min(limits, default=1.0) / 4, 0.05), 1.0)
        while True:
            await asyncio.sleep(period)
            if not self.target.jobs:
                continue
            answers = await self._ask_all("idle")
            if any(isinstance(a, BaseException) for a in answers):
                continue  # a shard is gone or slow: decide next time
            now = self._loop.time()
            for sid in list(self.target.jobs):
                idle = [a[sid] for a in answers if sid in a]
                if len(idle) < len(answers):
                    continue  # created since the shards answered
                active = self.target.active
                active[sid] = max(active.get(sid, 0.0), now - min(idle))
                if timeout is not None and min(idle) >= timeout:
                    self.target.release_idle(sid)
                    log.info("session %d released after %.0f s idle", sid, timeout)
            with contextlib.suppress(ShardError):
                await self.target.commit()
