"""gRPC control plane (docs/protocol.md §5) on grpc.aio: Session.UdpSession, Sync.*.

Besides p4app-switchML's calls, ``Session.Release`` (a rank is done with its
job; the last rank's release frees it) and ``Session.SwitchInfo`` (what the
switch is, before registering: an emulator says so and names its fastest
packet size) -- see docs/lifetime.md -- and restart recovery (docs/protocol.md
§5): ``Session.Status`` (is this the switch instance and the job's epoch a
worker joined?) and ``Session.Resume`` (every rank reports its progress; once
all have, the job is made anew and each rank learns the results it lacks).

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
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from swemu.core.controller import RegistrationError, Session, SessionController
from swemu.core.fabric import FabricError
from swemu.protocol.proto import CONTROL_MESSAGE_BYTES
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.protocol.worker.recovery import Progress, RecoveryError, SlotResult, plan_repairs

if TYPE_CHECKING:
    from swemu.core.engine import SwitchEngine

log = logging.getLogger("swemu.control")

#: How a switch may tell a job's workers apart (``serve --identify-by``).
IDENTITY_MODES = ("ip-port", "ip")


def peer_ipv4(context: grpc.aio.ServicerContext) -> int:
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

    ``instance`` identifies this run of the switch (default: drawn at random);
    registrations answer it with the job's epoch, and ``Status``/``Resume``
    use both (restart recovery). ``flush``, when given, is called before a
    resumed job is registered: the data plane processes what its socket holds
    first (:meth:`swemu.serving.dataplane.DataPlane.flush`), so that packets the
    workers sent before they resumed never count in the fresh slots.
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
        instance: int | None = None,
        flush: Callable[[], None] | None = None,
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
        self.instance = instance if instance is not None else random.getrandbits(63) | 1
        self.flush = flush
        self._resumes: dict[int, dict[int, _Resumer]] = {}  # session -> rank -> waiting
        self.fabric: Any = None

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
        error: the job may already have been freed some other way. The address
        is taken as :meth:`UdpSession` took it: by IP alone (``--identify-by
        ip``), the ``udp_port`` a worker names is not part of it. A release the
        session refuses (not the address it holds for the rank) is logged as a
        warning: it leaves the job to its idle timeout."""
        ipv4 = request.ipv4 or peer_ipv4(context)
        udp_port = request.udp_port if self.by_port else 0
        if self.fabric is not None and self.fabric.active:
            up = pb.ReleaseRequest()
            up.CopyFrom(request)
            up.ipv4, up.udp_port = ipv4, udp_port
            return await self._fabric_call(context, self.fabric.release(up), "Release", request)
        try:
            found, freed, remaining = self.controller.release_rank(
                request.session_id, request.rank, ipv4, udp_port
            )
            if freed and self.commit is not None:
                await self.commit()
        except Exception as exc:  # the target failed (a BF Runtime error on hardware)
            log.exception("Release(session=%d rank=%d) failed", request.session_id, request.rank)
            await context.abort(grpc.StatusCode.INTERNAL, f"the switch refused a write: {exc}")
            raise  # unreachable: abort raises
        if freed:
            log.info("session %d released by its workers", request.session_id)
        elif not found and remaining:
            held = self.controller.sessions[request.session_id].workers.get(request.rank)
            log.warning(
                "refused Release(session=%d rank=%d) from %s:%d: the session holds %s for "
                "that rank; the job stays until --idle-timeout",
                request.session_id,
                request.rank,
                ipaddress.IPv4Address(ipv4),
                udp_port,
                "no address"
                if held is None
                else f"{ipaddress.IPv4Address(held.ipv4)}:{held.udp_port}",
            )
        elif not found:
            log.info(
                "Release(session=%d rank=%d): no such session (already freed?)",
                request.session_id,
                request.rank,
            )
        return pb.ReleaseResponse(found=found, freed=freed, remaining=remaining)

    async def UdpSession(
        self, request: pb.UdpSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.UdpSessionResponse:
        switch = self.controller.switch
        if switch is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the controller has no switch address configured"
            )
        ipv4 = request.ipv4 or peer_ipv4(context)
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
        if self.fabric is not None and self.fabric.active:
            return await self._fabric_register(request, ipv4, udp_port, context)
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
        return self._registered(session, broadcast)

    async def _fabric_register(
        self,
        request: pb.UdpSessionRequest,
        ipv4: int,
        udp_port: int,
        context: grpc.aio.ServicerContext,
    ) -> pb.UdpSessionResponse:
        """UdpSession of a fabric's switch: the registration goes up to the root,
        which applies the session rules for the whole job (docs/protocol.md §7);
        the worker is answered with this switch's address (it sends here). No
        loopback broadcast for a fabric's jobs."""
        reg = pb.UdpSessionRequest()
        reg.CopyFrom(request)
        reg.ipv4, reg.udp_port, reg.loopback_broadcast = ipv4, udp_port, False
        epoch = await self._fabric_call(context, self.fabric.join(reg), "UdpSession", request)
        log.info(
            "session %d: rank %d/%d at %s:%d registered through the fabric",
            request.session_id,
            request.rank,
            request.num_workers,
            ipaddress.IPv4Address(ipv4),
            udp_port,
        )
        # the root applied the session rules, value formats included (every
        # emulator offers both): the job has the formats this rank asked for
        return self._answer(request.session_id, epoch, 0, int(request.value_formats))

    async def _fabric_call(self, context, coro, what: str, request) -> Any:
        """Await a fabric call; its refusals and failures become gRPC statuses."""
        try:
            return await coro
        except RegistrationError as exc:
            log.info("refused %s (session %d): %s", what, request.session_id, exc.message)
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        except FabricError as exc:
            log.info("%s (session %d) failed in the fabric: %s", what, request.session_id, exc)
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        raise AssertionError("unreachable")  # abort raises

    def _answer(
        self, session_id: int, epoch: int, broadcast_port: int = 0, value_formats: int = 0
    ) -> pb.UdpSessionResponse:
        switch = self.controller.switch
        return pb.UdpSessionResponse(
            session_id=session_id,
            mac=switch.mac,
            ipv4=switch.ipv4,
            data_ports=list(switch.data_ports),
            broadcast_port=broadcast_port,
            emulator=self._emulator_info(),
            worker_identity=self.identity,
            instance=self.instance,
            epoch=epoch,
            value_formats=value_formats,
        )

    def _registered(self, session: Session, broadcast: bool) -> pb.UdpSessionResponse:
        """What UdpSession (and Resume) answer a registered rank."""
        port = self.controller.broadcast_port(session) if broadcast else 0
        return self._answer(session.session_id, session.epoch, port, session.params.value_formats)

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        """Restart recovery: this switch's instance, and whether it holds the
        session (with this rank registered) and at which epoch. A worker whose
        results stopped coming asks it to tell a restarted or rebuilt switch
        (resume) from a slow peer (wait)."""
        if self.fabric is not None and self.fabric.active:
            known, epoch = self.fabric.status(request.session_id, request.rank)
            return pb.StatusResponse(instance=self.instance, known=known, epoch=epoch)
        session = self.controller.sessions.get(request.session_id)
        known = session is not None and request.rank in session.workers
        return pb.StatusResponse(
            instance=self.instance, known=known, epoch=session.epoch if known else 0
        )

    async def Resume(
        self, request: pb.ResumeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResumeResponse:
        """Restart recovery: wait until every rank of the job has reported, then
        register them all at once at a new epoch (:meth:`SessionController.resume`)
        and answer each with its registration and the results it lacks
        (:func:`~swemu.protocol.worker.recovery.plan_repairs`). A rank that reports again
        replaces its earlier report; a caller that goes away no longer counts."""
        reg = request.registration
        if reg.num_workers == 0 or reg.rank >= reg.num_workers or reg.session_id == 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a resume needs a session, and rank {reg.rank} below num_workers "
                f"{reg.num_workers}",
            )
        if self.controller.switch is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the controller has no switch address configured"
            )
        if self.fabric is not None and self.fabric.active:
            report = pb.ResumeRequest()
            report.CopyFrom(request)
            r = report.registration
            r.ipv4 = r.ipv4 or peer_ipv4(context)
            r.udp_port = r.udp_port if self.by_port else 0
            r.loopback_broadcast = False
            resp = await self._fabric_call(context, self.fabric.resume(report), "Resume", reg)
            answer = pb.ResumeResponse()
            answer.CopyFrom(resp)
            answer.registration.CopyFrom(
                self._answer(reg.session_id, resp.registration.epoch, 0, int(reg.value_formats))
            )
            return answer
        waiting = self._resumes.setdefault(reg.session_id, {})
        me = _Resumer(
            request=request,
            ipv4=reg.ipv4 or peer_ipv4(context),
            done=asyncio.get_running_loop().create_future(),
        )
        earlier = waiting.get(reg.rank)
        if earlier is not None and not earlier.done.done():
            earlier.done.cancel()
        others = [w for w in waiting.values() if w.request.registration.rank != reg.rank]
        if others and others[0].request.registration.num_workers != reg.num_workers:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"rank {reg.rank} resumes session {reg.session_id} with num_workers "
                f"{reg.num_workers}, another rank with "
                f"{others[0].request.registration.num_workers}",
            )
        waiting[reg.rank] = me
        log.info(
            "session %d: rank %d asks to resume (%d of %d ranks so far)",
            reg.session_id,
            reg.rank,
            len(waiting),
            reg.num_workers,
        )
        if len(waiting) == reg.num_workers:
            del self._resumes[reg.session_id]
            await self._resume_all(reg.session_id, waiting)
        try:
            answer = await asyncio.shield(me.done)
        except asyncio.CancelledError:
            if waiting.get(reg.rank) is me:
                del waiting[reg.rank]
                if not waiting:
                    self._resumes.pop(reg.session_id, None)
            raise
        if isinstance(answer, RegistrationError):
            await context.abort(getattr(grpc.StatusCode, answer.code), answer.message)
        return answer

    async def _resume_all(self, session_id: int, waiting: dict[int, _Resumer]) -> None:
        """Every rank has reported: resume the job and answer each caller."""
        by_port = self.by_port
        requests = []
        progress = {}
        for rank, w in sorted(waiting.items()):
            reg = w.request.registration
            requests.append(
                registration_kwargs(
                    reg,
                    ipv4=w.ipv4,
                    udp_port=reg.udp_port if by_port else 0,
                    loopback_broadcast=reg.loopback_broadcast and by_port,
                )
            )
            progress[rank] = Progress(
                tuple(w.request.rounds),
                {r.slot: SlotResult.from_message(r) for r in w.request.last},
            )
        try:
            try:
                repairs = plan_repairs(progress)
            except RecoveryError as exc:
                raise RegistrationError("FAILED_PRECONDITION", str(exc)) from None
            if self.flush is not None:
                self.flush()
            session = self.controller.resume(requests, now=self.clock())
            if self.commit is not None:
                await self.commit()
        except RegistrationError as exc:
            log.warning("refused to resume session %d: %s", session_id, exc.message)
            for w in waiting.values():
                if not w.done.done():
                    w.done.set_result(exc)
            return
        fixed = sum(len(r) for r in repairs.values())
        log.info(
            "session %d resumed at epoch %d with its %d ranks (%d lost results handed on)",
            session_id,
            session.epoch,
            len(waiting),
            fixed,
        )
        if self.on_register is not None:
            self.on_register(session_id, 0)
        for rank, w in waiting.items():
            broadcast = requests[rank]["loopback_broadcast"]
            answer = pb.ResumeResponse(
                registration=self._registered(session, broadcast),
                repairs=[r.message() for r in repairs[rank]],
            )
            if not w.done.done():
                w.done.set_result(answer)


@dataclass
class _Resumer:
    """A rank waiting in Resume: its report, its address and its answer."""

    request: pb.ResumeRequest
    ipv4: int
    done: asyncio.Future


def registration_kwargs(
    reg: pb.UdpSessionRequest, *, ipv4: int, udp_port: int, loopback_broadcast: bool = False
) -> dict[str, Any]:
    """:meth:`SessionController.register`'s keyword arguments (``now`` apart) for
    a registration as it arrived, with the worker's address as this switch
    identifies it (a ``Resume``, a fabric's resume)."""
    return {
        "session_id": reg.session_id,
        "rank": reg.rank,
        "num_workers": reg.num_workers,
        "ipv4": ipv4,
        "udp_port": udp_port,
        "packet_size": int(reg.packet_size),
        "pool_size": reg.pool_size,
        "mac": reg.mac,
        "loopback_broadcast": loopback_broadcast,
        "value_formats": int(reg.value_formats),
    }


@dataclass
class _Round:
    """One rendezvous generation: who has arrived, and the future they wait on."""

    needed: int
    arrived: set = field(default_factory=set)
    done: asyncio.Future | None = None


class SyncService(pb_grpc.SyncServicer):
    """Barrier and Broadcast, global as in p4app-switchML or scoped by session_id."""

    def __init__(self) -> None:
        #: a fabric's child switch (swemu.serving.fabric.FabricNode with a parent):
        #: rendezvous meet at the root, where every rank of a job can come
        self.fabric: Any = None
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
        if self.fabric is not None and self.fabric.parent is not None:
            return await self._up(context, self.fabric.barrier(request))
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
        if self.fabric is not None and self.fabric.parent is not None:
            return await self._up(context, self.fabric.broadcast(request))
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

    async def _up(self, context: grpc.aio.ServicerContext, coro: Any) -> Any:
        """A rendezvous forwarded to the parent switch."""
        try:
            return await coro
        except FabricError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        raise AssertionError("unreachable")  # abort raises

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
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", CONTROL_MESSAGE_BYTES),
            ("grpc.max_send_message_length", CONTROL_MESSAGE_BYTES),
        ]
    )
    session, sync = services
    pb_grpc.add_SessionServicer_to_server(session, server)
    pb_grpc.add_SyncServicer_to_server(sync, server)
    for add in extra:
        add(server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {target}: {_why_not_bound(host, port)}")
    await server.start()
    return server, bound


def _why_not_bound(host: str, port: int) -> str:
    """Why gRPC could not bind ``host:port``, in the system's words (gRPC's own
    message only says that it failed, and to set GRPC_VERBOSITY): the error of
    binding a TCP socket there now."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(address)
            except OSError as exc:
                return exc.strerror or str(exc)
    return "gRPC refused the address"
