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
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from swemu import wire
from swemu.proto import switchml_pb2 as pb
from swemu.proto import switchml_pb2_grpc as pb_grpc

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


def new_session_id() -> int:
    """A fresh non-zero 63-bit session id (time-based, as p4app-switchML does, plus pid)."""
    return ((time.time_ns() << 16) ^ (os.getpid() & 0xFFFF)) & ((1 << 63) - 1) | 1


class ControlClient:
    """A gRPC channel to the controller with the calls a worker needs."""

    def __init__(self, target: str, *, connect_timeout: float = 10.0) -> None:
        self.target = target
        self.connect_timeout = connect_timeout
        self.channel = grpc.aio.insecure_channel(target)
        self.session = pb_grpc.SessionStub(self.channel)
        self.sync = pb_grpc.SyncStub(self.channel)

    async def connect(self) -> None:
        try:
            await asyncio.wait_for(self.channel.channel_ready(), self.connect_timeout)
        except asyncio.TimeoutError:
            raise ControlPlaneError(
                f"cannot reach the SwitchML controller at {self.target} "
                f"within {self.connect_timeout:g} s (is `switchml-emu serve` running?)"
            ) from None

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, what: str, coro):
        try:
            return await coro
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise ControlPlaneError(
                    f"{what} at {self.target} timed out: not every worker joined in time"
                ) from None
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise ControlPlaneError(
                    f"{what} at {self.target} failed: the SwitchML controller went away "
                    f"(it shut down or restarted; {exc.code().name}: {exc.details()})"
                ) from None
            raise ControlPlaneError(
                f"{what} refused by {self.target}: {exc.code().name}: {exc.details()}"
            ) from None

    async def switch_info(self, timeout: float = 10.0) -> int | None:
        """The size code the switch serves fastest if it is an emulator, else None
        (hardware, or a controller that predates ``SwitchInfo``)."""
        try:
            resp = await self.session.SwitchInfo(pb.SwitchInfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            await self._call("SwitchInfo", _raise(exc))
            raise  # unreachable: _call raised
        return int(resp.emulator.packet_size) if resp.HasField("emulator") else None

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
        try:
            return await self.session.Release(req, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            await self._call(f"Release(rank {rank})", _raise(exc))
            raise  # unreachable: _call raised

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
    ) -> Membership:
        """Register this worker and wait for the others (steps 1–3 above).

        ``registered`` is called with the switch's reply as soon as this worker
        is registered, before it waits for the others (it may open a socket that
        must be ready before any result can come)."""
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
            )
            return self._call(
                f"UdpSession(rank {rank})", self.session.UdpSession(req, timeout=timeout)
            )

        def broadcast(value: int):
            req = pb.BroadcastRequest(
                value=value, rank=rank, num_workers=world_size, root=0, session_id=scope
            )
            return self._call(
                "Broadcast of the session id", self.sync.Broadcast(req, timeout=timeout)
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
        await self._call(
            "Barrier",
            self.sync.Barrier(
                pb.BarrierRequest(num_workers=world_size, session_id=scope), timeout=timeout
            ),
        )
        return Membership(
            sid,
            resp.ipv4,
            resp.mac,
            tuple(resp.data_ports),
            int(resp.broadcast_port),
            int(resp.emulator.packet_size) if resp.HasField("emulator") else None,
            int(resp.worker_identity),
        )

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
            resp = await self._call(
                f"Broadcast of rank {root}'s address", self.sync.Broadcast(req, timeout=timeout)
            )
            values.append(resp.value)
        return values


async def _raise(exc: BaseException):
    """A coroutine that raises ``exc`` (to reuse :meth:`ControlClient._call`'s messages)."""
    raise exc
