"""Joining a job through the SwitchML control plane (PROTOCOL.md §5), on grpc.aio.

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
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

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
            raise ControlPlaneError(
                f"{what} refused by {self.target}: {exc.code().name}: {exc.details()}"
            ) from None

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
