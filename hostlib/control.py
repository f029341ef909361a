"""Joining a job through the SwitchML control plane (docs/protocol.md §5), on grpc.aio.

The join sequence works against the emulator and a p4app-switchML-style
controller alike:

1. rank 0 picks the session id (unless one is given), registers with
   ``UdpSession`` (rank 0 replaces the session), then ``Broadcast``\\ s the id;
2. every other rank receives the id from ``Broadcast`` — which returns only after
   rank 0 has registered — and registers itself;
3. all ranks meet in a ``Barrier`` before any data is sent.

The ``session_id`` extension of Broadcast/Barrier scopes the rendezvous to the
job when the id is known in advance (``switchml run`` sets it); a
p4app-switchML controller ignores the field and keeps them global.

Two extension calls frame a job (docs/lifetime.md): :meth:`ControlClient.switch_info`
before joining (an emulator names its fastest packet size; a controller without
the call is hardware, default size code 3) and :meth:`ControlClient.release` when
a worker is done (the last rank's release frees the job; a controller without
the call answers UNIMPLEMENTED, which is fine: its jobs live until replaced).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from swemu.protocol import wire
from swemu.protocol.proto import CONTROL_MESSAGE_BYTES
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.protocol.worker.recovery import Progress, SlotResult

from .errors import ControlPlaneError


@dataclass(frozen=True)
class Membership:
    """What a worker learns when it joins: the session and the switch's data plane."""

    session_id: int
    switch_ipv4: int
    switch_mac: int
    data_ports: tuple[int, ...]
    broadcast_port: int = 0  # non-zero: results also come to 127.255.255.255:this port
    emulator_size_code: int | None = None  # set by an emulator: its fastest size code
    # how the switch tells workers apart (pb.WorkerIdentity): IDENTITY_UNKNOWN when
    # the reply does not say (a p4app-switchML controller, an older switch)
    worker_identity: int = pb.IDENTITY_UNKNOWN
    # restart recovery: the switch instance and the job's epoch this worker joined
    # (instance 0: the switch does not say, so it cannot be resumed)
    instance: int = 0
    epoch: int = 0
    # the job's value formats as the switch registered them (pb.ValueFormats):
    # VALUES_INT32_AND_BLOCK16 lets a call send 16-bit values (docs/protocol.md §4.2);
    # a switch without the extension answers VALUES_INT32
    value_formats: int = pb.VALUES_INT32

    @classmethod
    def from_reply(cls, resp: pb.UdpSessionResponse, session_id: int) -> Membership:
        """What a registration's (or a resume's) reply tells the worker."""
        return cls(
            session_id,
            resp.ipv4,
            resp.mac,
            tuple(resp.data_ports),
            int(resp.broadcast_port),
            int(resp.emulator.packet_size) if resp.HasField("emulator") else None,
            int(resp.worker_identity),
            int(resp.instance),
            int(resp.epoch),
            int(resp.value_formats),
        )


def new_session_id() -> int:
    """A fresh non-zero 63-bit session id (time-based, as p4app-switchML does, plus pid)."""
    return ((time.time_ns() << 16) ^ (os.getpid() & 0xFFFF)) & ((1 << 63) - 1) | 1


class ControlClient:
    """A gRPC channel to the controller with the calls a worker needs."""

    def __init__(self, target: str, *, connect_timeout: float = 10.0) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", CONTROL_MESSAGE_BYTES),
                ("grpc.max_send_message_length", CONTROL_MESSAGE_BYTES),
            ],
        )
        self.session = pb_grpc.SessionStub(self.channel)
        self.sync = pb_grpc.SyncStub(self.channel)

    async def connect(self) -> None:
        """Wait until the channel is up (``connect_timeout``), or raise
        :class:`ControlPlaneError` saying that nothing answers."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self.connect_timeout)
        except asyncio.TimeoutError:
            raise ControlPlaneError(
                f"cannot reach the SwitchML controller at {self.target} "
                f"within {self.connect_timeout:g} s (is `switchml-emu serve` running?)"
            ) from None
        except grpc.aio.UsageError as exc:
            raise control_plane_error(self.target, "connecting", exc) from None

    async def close(self) -> None:
        await self.channel.close()

    async def _rpc(
        self,
        what: str,
        method: Callable[..., Any],
        request: Any,
        *,
        timeout: float,
        rendezvous: bool = False,
        optional: bool = False,
    ) -> Any:
        """Call ``method(request)``: the one place where the control plane's
        failures become :class:`ControlPlaneError` (:func:`control_plane_error`).

        ``what`` names the call in the message; ``rendezvous``: the call waits
        for other workers (a timeout means they did not come); ``optional``: an
        extension a p4app-switchML controller lacks (UNIMPLEMENTED gives None).
        """
        try:
            return await method(request, timeout=timeout)
        except (grpc.RpcError, grpc.aio.UsageError) as exc:
            code = exc.code() if isinstance(exc, grpc.RpcError) else None
            if optional and code == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise control_plane_error(
                self.target, what, exc, timeout=timeout, rendezvous=rendezvous
            ) from None

    async def switch_info(self, timeout: float = 10.0) -> int | None:
        """The size code the switch serves fastest if it is an emulator, else None
        (hardware, or a controller that predates ``SwitchInfo``)."""
        resp = await self._rpc(
            "SwitchInfo",
            self.session.SwitchInfo,
            pb.SwitchInfoRequest(),
            timeout=timeout,
            optional=True,
        )
        if resp is None or not resp.HasField("emulator"):
            return None
        return int(resp.emulator.packet_size)

    async def default_packet_size(self, timeout: float = 10.0) -> int:
        """The packet size a worker that did not choose one uses: the emulator's
        fastest, on hardware size code 3 (MTU_1024)."""
        code = await self.switch_info(timeout)
        return int(wire.HARDWARE_DEFAULT_SIZE_CODE) if code is None else code

    async def release(
        self, *, session_id: int, rank: int, ipv4: int, udp_port: int, timeout: float = 5.0
    ) -> pb.ReleaseResponse | None:
        """Tell the controller this rank is done with its job; None if the
        controller has no ``Release`` (its jobs stay until replaced)."""
        req = pb.ReleaseRequest(session_id=session_id, rank=rank, ipv4=ipv4, udp_port=udp_port)
        return await self._rpc(
            f"Release(rank {rank})", self.session.Release, req, timeout=timeout, optional=True
        )

    async def status(self, *, session_id: int, rank: int, timeout: float = 2.0) -> Any | None:
        """Restart recovery: the switch's instance and whether it still holds
        this rank's job, at which epoch (``pb.StatusResponse``); None from a
        controller without the call (no recovery there)."""
        req = pb.StatusRequest(session_id=session_id, rank=rank)
        return await self._rpc(
            f"Status(rank {rank})", self.session.Status, req, timeout=timeout, optional=True
        )

    async def resume(
        self,
        registration: pb.UdpSessionRequest,
        progress: Progress,
        *,
        timeout: float,
    ) -> tuple[Membership, list[SlotResult]]:
        """Restart recovery: report this rank's progress and wait for every rank
        to have reported; return the new membership and the results this rank
        lacks (docs/protocol.md §5, "Surviving a switch restart")."""
        req = pb.ResumeRequest(
            registration=registration,
            rounds=list(progress.rounds),
            last=[r.message() for r in progress.last.values()],
        )
        resp = await self._rpc(
            f"Resume(rank {registration.rank})",
            self.session.Resume,
            req,
            timeout=timeout,
            rendezvous=True,
        )
        repairs = [SlotResult.from_message(r) for r in resp.repairs]
        return Membership.from_reply(resp.registration, registration.session_id), repairs

    async def join(
        self,
        *,
        rank: int,
        world_size: int,
        ipv4: int,
        udp_port: int,
        packet_size: int,
        pool_size: int,
        session_id: int | None = None,
        timeout: float = 120.0,
        mac: int = 0,
        loopback_broadcast: bool = False,
        registered: Callable[[pb.UdpSessionResponse], None] | None = None,
        value_formats: int = pb.VALUES_INT32_AND_BLOCK16,
    ) -> Membership:
        """Register this worker and wait for the others (steps 1–3 above).

        ``registered`` is called with the switch's reply as soon as this worker
        is registered, before it waits for the others (it may open a socket that
        must be ready before any result can come). ``value_formats`` asks for the
        16-bit format beside the 32-bit one (every rank asks the same); the reply
        says whether the switch registered it (:attr:`Membership.value_formats`)."""
        scope = session_id or 0

        def register(sid: int):
            req = pb.UdpSessionRequest(
                session_id=sid,
                rank=rank,
                num_workers=world_size,
                mac=mac,
                ipv4=ipv4,
                packet_size=packet_size,
                udp_port=udp_port,
                pool_size=pool_size,
                loopback_broadcast=loopback_broadcast,
                value_formats=value_formats,
            )
            return self._rpc(
                f"UdpSession(rank {rank})", self.session.UdpSession, req, timeout=timeout
            )

        def broadcast(value: int):
            req = pb.BroadcastRequest(
                value=value, rank=rank, num_workers=world_size, root=0, session_id=scope
            )
            return self._rpc(
                "Broadcast of the session id",
                self.sync.Broadcast,
                req,
                timeout=timeout,
                rendezvous=True,
            )

        if rank == 0:
            sid = session_id or new_session_id()
            resp = await register(sid)
            await broadcast(sid)
        else:
            sid = (await broadcast(0)).value
            if session_id and sid != session_id:
                raise ControlPlaneError(f"rank 0 announced session {sid}, expected {session_id}")
            resp = await register(sid)
        if registered is not None:
            registered(resp)
        await self._rpc(
            "Barrier",
            self.sync.Barrier,
            pb.BarrierRequest(num_workers=world_size, session_id=scope),
            timeout=timeout,
            rendezvous=True,
        )
        return Membership.from_reply(resp, sid)

    async def gather(
        self, value: int, *, rank: int, world_size: int, session_id: int, timeout: float = 120.0
    ) -> list[int]:
        """Every rank's ``value`` (one ``Broadcast`` per rank as root: the only
        all-to-all a p4app-switchML controller offers)."""
        values = []
        for root in range(world_size):
            req = pb.BroadcastRequest(
                value=value if rank == root else 0,
                rank=rank,
                num_workers=world_size,
                root=root,
                session_id=session_id,
            )
            resp = await self._rpc(
                f"Broadcast of rank {root}'s address",
                self.sync.Broadcast,
                req,
                timeout=timeout,
                rendezvous=True,
            )
            values.append(resp.value)
        return values


#: gRPC's text for an exception a Python servicer did not handle (UNKNOWN)
_UNEXPECTED = re.compile(r"Unexpected <class '(?:[\w.]*\.)?(\w+)'>:?\s*(.*)", re.S)
#: ... those that mean the controller was going away, not a bug in it
_GOING_AWAY = {"ConnectionAbortedError", "ConnectionResetError", "CancelledError"}


def control_plane_error(
    target: str,
    what: str,
    exc: BaseException,
    *,
    timeout: float | None = None,
    rendezvous: bool = False,
) -> ControlPlaneError:
    """The :class:`ControlPlaneError` for a failed control-plane call: it names
    the controller's address, the call, and what happened in words (with gRPC's
    status where it adds something), never gRPC's bare ``UNKNOWN: Unexpected
    <class ...>`` (a Python exception the controller did not handle).

    ``exc`` is a ``grpc.RpcError`` (``grpc.aio.AioRpcError``) or a
    ``grpc.aio.UsageError`` (the channel was closed under the call).
    """
    if not isinstance(exc, grpc.RpcError):
        return ControlPlaneError(
            f"{what} at {target} failed: the connection to the controller is closed ({exc})"
        )
    code = exc.code()
    details = (exc.details() or "").strip()
    status = f"{code.name}: {details}" if details else code.name
    after = f" after {timeout:g} s" if timeout is not None else ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if rendezvous:
            return ControlPlaneError(
                f"{what} at {target} timed out{after}: not every worker joined in time"
            )
        return ControlPlaneError(
            f"{what} at {target} timed out{after}: the controller did not answer"
        )
    if code == grpc.StatusCode.UNKNOWN:
        unexpected = _UNEXPECTED.match(details)
        if unexpected is not None:
            name, text = unexpected.groups()
            if name in _GOING_AWAY:
                return ControlPlaneError(
                    f"{what} at {target} failed: the SwitchML controller went away "
                    f"while answering ({name}{': ' + text if text else ''})"
                )
            return ControlPlaneError(
                f"{what} at {target} failed: the controller raised {name}"
                f"{': ' + text if text else ''}"
            )
        return ControlPlaneError(f"{what} at {target} failed ({status})")
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        # gRPC's text nests the socket's error: "failed to connect to all addresses;
        # last error: UNKNOWN: ipv4:...: Failed to connect to remote host: Connection refused"
        why = details.rsplit(": ", 1)[-1]
        return ControlPlaneError(
            f"{what}: no SwitchML controller answers at {target} "
            f"({why}; is `switchml-emu serve` running?)"
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return ControlPlaneError(
            f"{what} at {target} failed: the SwitchML controller went away "
            f"(it shut down or restarted; {status})"
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ControlPlaneError(f"the controller at {target} does not implement {what} ({status})")
    return ControlPlaneError(f"{what} refused by {target}: {status}")
