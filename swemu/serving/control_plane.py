"""gRPC control plane (docs/protocol.md §5) on grpc.aio: Session.UdpSession, Sync.*.

Besides p4app-switchML's calls, ``Session.Release`` (a rank is done with its
job; the last rank's release frees it) and ``Session.SwitchInfo`` (what the
switch is, before registering: an emulator says so and names its fastest
packet size) -- see docs/lifetime.md.

A thin adapter: every rule of registration lives in
:class:`swemu.core.controller.SessionController`; this module turns requests into
its calls and :class:`~swemu.core.controller.RegistrationError` into gRPC status
codes. The same services serve the emulator (a controller over an
``EmulatorTarget``) and a Tofino (``p4/controller/switchml_ctl.py``, a controller
over a ``TofinoTarget``). Barrier and Broadcast are rendezvous helpers kept here
because they only involve waiting callers, never switch state.

Nothing here imports the engine (numpy, Numba): a hardware controller runs it
with the SDE's Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from swemu.core.controller import RegistrationError, SessionController
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from swemu.core.engine import SwitchEngine

log = logging.getLogger("swemu.control")

#: How a switch may tell a job's workers apart (``serve --identify-by``).
IDENTITY_MODES = ("ip-port", "ip")


def _peer_ipv4(context: grpc.aio.ServicerContext) -> int:
    """The IPv4 address of a gRPC peer (``ipv4:1.2.3.4:5``), or 0 if not IPv4."""
    peer = context.peer() or ""
    if peer.startswith("ipv4:"):
        host = peer[5:].rsplit(":", 1)[0]
        with contextlib.suppress(ValueError):
            return int(ipaddress.IPv4Address(host))
    if peer.startswith("ipv6:") and "::ffff:" in peer:
        host = peer.split("::ffff:", 1)[1].split("]", 1)[0]
        with contextlib.suppress(ValueError):
            return int(ipaddress.IPv4Address(host))
    return 0


class SessionService(pb_grpc.SessionServicer):
    """UdpSession through a :class:`SessionController`; RdmaSession is not implemented.

    ``controller`` may be an emulator's :class:`~swemu.core.engine.SwitchEngine`, which
    stands for its own controller (``engine.controller``). ``switch_ipv4`` (with
    ``switch_mac`` and ``data_ports``) sets the address the controller answers
    with; leave it out when the controller already has one.

    ``commit``, when given, is awaited after a registration was written and
    before the reply goes out: a sharded emulator (:mod:`swemu.serving.shards`) waits
    there until every data-plane process has applied it, so that a worker never
    sends to a shard that does not know its job yet.

    ``identify_by`` is how workers are told apart: ``"ip-port"`` (the request's
    ``udp_port``, the default) or ``"ip"``, as p4app-switchML's controller and
    Tofino program do: ``udp_port`` and ``loopback_broadcast`` are ignored, every
    worker is registered by its IPv4 alone and gets results at the source port of
    the packet that completed the slot. The reply says which
    (``worker_identity``); ``advertise_identity=False`` leaves that field out, as a
    switch from before it (tests of the host library's fallback use it).
    """

    def __init__(
        self,
        controller: SessionController | SwitchEngine,
        *,
        switch_ipv4: int | None = None,
        switch_mac: int = 0,
        data_ports: list[int] | None = None,
        clock: Callable[[], float],
        on_register: Callable[[int, int], None] | None = None,
        commit: Callable[[], Awaitable[None]] | None = None,
        identify_by: str = "ip-port",
        advertise_identity: bool = True,
    ) -> None:
        if identify_by not in IDENTITY_MODES:
            raise ValueError(f"identify_by must be one of {', '.join(IDENTITY_MODES)}")
        if not isinstance(controller, SessionController):
            controller = controller.controller
        self.controller = controller
        if switch_ipv4 is not None:
            controller.set_switch_address(switch_ipv4, switch_mac, tuple(data_ports or ()))
        self.clock = clock
        self.on_register = on_register
        self.commit = commit
        self.by_port = identify_by == "ip-port"
        self.identity = (
            (pb.IDENTITY_IP_PORT if self.by_port else pb.IDENTITY_IP)
            if advertise_identity
            else pb.IDENTITY_UNKNOWN
        )

    def _emulator_info(self) -> pb.EmulatorInfo | None:
        """UdpSessionResponse field 10: set only when the target is software."""
        code = self.controller.target.limits.emulator_size_code
        return None if code is None else pb.EmulatorInfo(packet_size=code)

    async def SwitchInfo(
        self, request: pb.SwitchInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.UdpSessionResponse:
        """The switch's address (and, from an emulator, ``emulator``) without
        registering: what a worker asks before joining to choose its packet size."""
        switch = self.controller.switch
        if switch is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the controller has no switch address configured"
            )
        return pb.UdpSessionResponse(
            mac=switch.mac,
            ipv4=switch.ipv4,
            data_ports=list(switch.data_ports),
            emulator=self._emulator_info(),
        )

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        """A rank is done with its job; the job is freed once all its ranks are
        (:meth:`SessionController.release_rank`). Unknown sessions are not an
        error: the job may already have been freed some other way."""
        ipv4 = request.ipv4 or _peer_ipv4(context)
        try:
            found, freed, remaining = self.controller.release_rank(
                request.session_id, request.rank, ipv4, request.udp_port
            )
            if freed and self.commit is not None:
                await self.commit()
        except Exception as exc:  # the target failed (a BF Runtime error on hardware)
            log.exception("Release(session=%d rank=%d) failed", request.session_id, request.rank)
            await context.abort(grpc.StatusCode.INTERNAL, f"the switch refused a write: {exc}")
            raise  # unreachable: abort raises
        if freed:
            log.info("session %d released by its workers", request.session_id)
        return pb.ReleaseResponse(found=found, freed=freed, remaining=remaining)

    async def UdpSession(
        self, request: pb.UdpSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.UdpSessionResponse:
        switch = self.controller.switch
        if switch is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the controller has no switch address configured"
            )
        ipv4 = request.ipv4 or _peer_ipv4(context)
        udp_port = request.udp_port if self.by_port else 0
        broadcast = request.loopback_broadcast and self.by_port
        if not self.by_port:
            # by IP alone, a second worker of the job on the same IP would take
            # the first one's place (as on the Tofino): say so instead
            owner = self.controller.owner_of(ipv4, 0)
            if owner is not None and owner[0] == request.session_id and owner[1] != request.rank:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"rank {request.rank} registers from {ipaddress.IPv4Address(ipv4)}, which is "
                    f"rank {owner[1]}'s: a switch that identifies workers by IP alone "
                    "needs one IP per worker",
                )
        try:
            session = self.controller.register(
                session_id=request.session_id,
                rank=request.rank,
                num_workers=request.num_workers,
                ipv4=ipv4,
                udp_port=udp_port,
                packet_size=int(request.packet_size),
                pool_size=request.pool_size,
                mac=request.mac,
                now=self.clock(),
                loopback_broadcast=broadcast,
                value_formats=int(request.value_formats),
            )
            if self.commit is not None:
                await self.commit()
        except RegistrationError as exc:
            log.info(
                "refused UdpSession(session=%d rank=%d): %s",
                request.session_id,
                request.rank,
                exc.message,
            )
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            raise  # unreachable: abort raises
        except Exception as exc:  # the target failed (a BF Runtime error on hardware)
            log.exception("UdpSession(session=%d rank=%d) failed", request.session_id, request.rank)
            await context.abort(grpc.StatusCode.INTERNAL, f"the switch refused a write: {exc}")
            raise  # unreachable: abort raises
        params = session.params
        log.info(
            "session %d: rank %d/%d at %s:%d (size code %d, pool %d%s)",
            params.session_id,
            request.rank,
            params.num_workers,
            ipaddress.IPv4Address(ipv4),
            udp_port,
            params.size_code,
            params.pool_size,
            ", 16-bit values too" if params.value_formats else "",
        )
        if self.on_register is not None:
            self.on_register(params.session_id, request.rank)
        return pb.UdpSessionResponse(
            session_id=request.session_id,
            mac=switch.mac,
            ipv4=switch.ipv4,
            data_ports=list(switch.data_ports),
            broadcast_port=self.controller.broadcast_port(session) if broadcast else 0,
            emulator=self._emulator_info(),
            worker_identity=self.identity,
            value_formats=params.value_formats,
        )


@dataclass
class _Round:
    """One rendezvous generation: who has arrived, and the future they wait on."""

    needed: int
    arrived: set = field(default_factory=set)
    done: asyncio.Future | None = None


class SyncService(pb_grpc.SyncServicer):
    """Barrier and Broadcast, global as in p4app-switchML or scoped by session_id."""

    def __init__(self) -> None:
        self._barriers: dict[int, list[_Round]] = {}
        self._broadcasts: dict[int, list[_Round]] = {}
        self._barrier_seq = 0
        self._closing: str | None = None  # set by cancel_all: the server is stopping

    async def _wait(
        self,
        rnd: _Round,
        rounds: list[_Round],
        who: object,
        context: grpc.aio.ServicerContext,
    ) -> int | None:
        """Wait for a round of ``rounds`` to complete; a caller that goes away no
        longer counts (a round nobody waits for any more is dropped: nothing would
        ever read its future), and a server that stops answers UNAVAILABLE saying so."""
        try:
            return await asyncio.shield(rnd.done)
        except asyncio.CancelledError:
            if not rnd.done.done():
                rnd.arrived.discard(who)
                if not rnd.arrived and rnd in rounds:
                    rounds.remove(rnd)
            raise
        except ConnectionAbortedError as exc:  # cancel_all: the server is shutting down
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # unreachable: abort raises

    async def _refuse_if_closing(self, context: grpc.aio.ServicerContext) -> None:
        if self._closing is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self._closing)

    @staticmethod
    def _join(rounds: list[_Round], needed: int, who: object) -> _Round:
        for rnd in rounds:
            if who not in rnd.arrived:
                break
        else:
            rnd = _Round(needed)
            rnd.done = asyncio.get_running_loop().create_future()
            rounds.append(rnd)
        rnd.arrived.add(who)
        return rnd

    async def Barrier(
        self, request: pb.BarrierRequest, context: grpc.aio.ServicerContext
    ) -> pb.BarrierResponse:
        await self._refuse_if_closing(context)
        if request.num_workers == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "num_workers must be positive")
        rounds = self._barriers.setdefault(request.session_id, [])
        self._barrier_seq += 1
        me = self._barrier_seq  # barrier callers are anonymous: each call is distinct
        rnd = self._join(rounds, request.num_workers, me)
        if len(rnd.arrived) >= rnd.needed:
            rounds.remove(rnd)
            rnd.done.set_result(None)
        await self._wait(rnd, rounds, me, context)
        return pb.BarrierResponse()

    async def Broadcast(
        self, request: pb.BroadcastRequest, context: grpc.aio.ServicerContext
    ) -> pb.BroadcastResponse:
        await self._refuse_if_closing(context)
        if request.num_workers == 0 or request.rank >= request.num_workers:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"rank {request.rank} / num_workers {request.num_workers} is not a valid pair",
            )
        if request.root >= request.num_workers:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"root {request.root} must be below num_workers {request.num_workers}",
            )
        rounds = self._broadcasts.setdefault(request.session_id, [])
        rnd = self._join(rounds, request.num_workers, request.rank)
        if request.rank == request.root and not rnd.done.done():
            rnd.done.set_result(request.value)
        if len(rnd.arrived) >= rnd.needed and rnd in rounds:
            rounds.remove(rnd)  # everyone has arrived: the next call starts a new round
        value = await self._wait(rnd, rounds, request.rank, context)
        return pb.BroadcastResponse(value=value)

    def cancel_all(self, why: str) -> None:
        """Fail every waiting call, and every later one, with UNAVAILABLE saying
        ``why`` (server shutdown: the callers learn it at once, not at the end
        of the gRPC server's grace period)."""
        self._closing = why
        for table in (self._barriers, self._broadcasts):
            for rounds in table.values():
                for rnd in rounds:
                    if rnd.done is not None and not rnd.done.done():
                        rnd.done.set_exception(ConnectionAbortedError(why))
            table.clear()


async def start_control_server(
    host: str, port: int, services: tuple[SessionService, SyncService], extra: list = ()
) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the services; return it and its bound port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    session, sync = services
    pb_grpc.add_SessionServicer_to_server(session, server)
    pb_grpc.add_SyncServicer_to_server(sync, server)
    for add in extra:
        add(server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {target}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {target} (address in use?)")
    await server.start()
    return server, bound
