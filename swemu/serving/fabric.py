"""A fabric of emulators on sockets and gRPC (docs/protocol.md §7).

:class:`FabricNode` is one switch's part of a tree of switches: toward its parent
(``serve --parent HOST:PORT``) it forwards what its workers ask of the control
plane -- registrations, resume reports, releases, barriers and broadcasts -- up
to the root, where the session rules of docs/protocol.md §5 are applied once for
the whole job; toward its children it serves the ``swemu.Fabric`` service. When
the root has all of a job's ranks it plans the job's tree
(:func:`swemu.core.fabric.plan_tree`) and sends each switch its part, down the
tree: each switch registers its members (workers and child uplinks) as its
job's workers, and a switch below the top gets the job's parent
(:meth:`swemu.core.engine.SwitchEngine.set_parent`) and sends its partial
aggregates up from a socket of its own for the job (the child's uplink, which
its parent knows as one worker).

Jobs end everywhere at once: when every rank released it (the root counts),
when rank 0 registers the session again, or when any switch freed its part by
itself (idle, evicted: it says so up to the root, which frees the rest). A
restarted switch anywhere in a job's tree is restart recovery's case
(docs/protocol.md §5): its workers resume, the root collects every rank's
report, plans the tree anew at the next epoch and configures it. A child whose
uplinks stall asks its parent's instance (``Hello``): a restarted parent makes
it free the jobs it had under it, so that their workers resume.

A switch with neither parent nor children is the plain switch of §2–§6: none of
this runs, and nothing changes for it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from swemu.core.controller import RegistrationError, SessionController, TargetLimits
from swemu.core.fabric import FabricError, Hop, Member, Plan, RankAt, plan_tree
from swemu.protocol.netutil import parse_address, set_socket_buffers
from swemu.protocol.proto import CONTROL_MESSAGE_BYTES
from swemu.protocol.proto import fabric_pb2 as fb
from swemu.protocol.proto import fabric_pb2_grpc as fb_grpc
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.proto import switchml_pb2_grpc as pb_grpc
from swemu.protocol.worker.recovery import Progress, RecoveryError, SlotResult, plan_repairs
from swemu.serving.control_plane import peer_ipv4, registration_kwargs

log = logging.getLogger("swemu.fabric")

#: A child asks its parent's instance when an uplink has had no result this long
#: while waiting for one, and this often while it stalls.
PARENT_PROBE_AFTER = 1.0
#: Why a job is freed whose workers resume (its switches keep their uplink sockets).
RESUMING = "resuming"
#: How long a call to a neighbour switch may take (a rendezvous call waits longer).
CALL_TIMEOUT = 10.0
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", CONTROL_MESSAGE_BYTES),
    ("grpc.max_send_message_length", CONTROL_MESSAGE_BYTES),
]


def _ip(value: int) -> str:
    return str(ipaddress.IPv4Address(value))


class _Registry:
    """The root's record of fabric jobs: a :class:`SessionController` over no
    switch (the session rules hold once for the whole job; each switch's own
    controller then holds its part), plus where each rank registered."""

    def __init__(self, limits: TargetLimits) -> None:
        self._limits = limits
        self.controller = SessionController(self)
        self.where: dict[int, dict[int, RankAt]] = {}  # session -> rank -> RankAt
        self.configured: dict[int, int] = {}  # session -> epoch its tree was set up at

    # the Target protocol, recording nothing but the handle
    @property
    def limits(self) -> TargetLimits:
        return self._limits

    def set_switch_address(self, address: Any) -> None:
        pass

    def room_for_job(self, job: Any, replacing: Any) -> None:
        return None  # each switch checks its own room when it sets up its part

    def check_worker(self, worker: Any) -> None:
        return None

    def create_job(self, job: Any, *, now: float) -> Any:
        return job

    def delete_job(self, handle: Any, *, why: str) -> None:
        pass

    def set_worker(self, handle: Any, rank: int, worker: Any, *, now: float) -> None:
        pass

    def remove_worker(self, handle: Any, rank: int) -> None:
        pass

    def broadcast_port(self, handle: Any) -> int:
        return 0

    def set_drop_simulation(self, drops: Any) -> None:
        pass

    def watch_releases(self, callback: Callable[[Any], None]) -> None:
        pass

    def read_state(self) -> dict[str, Any]:
        return {}


@dataclass
class _Child:
    """A child switch as its parent knows it."""

    instance: int
    control: str
    channel: grpc.aio.Channel
    stub: fb_grpc.FabricStub


@dataclass
class _Resuming:
    """A root's resume rendezvous of one job: each rank's report and where it is."""

    num_workers: int
    reports: dict[int, tuple[pb.ResumeRequest, tuple[Hop, ...], asyncio.Future]] = field(
        default_factory=dict
    )


class FabricNode:
    """One switch's part of a fabric (see the module).

    ``server`` is the emulator (:class:`swemu.serving.server.Emulator`): its
    engine, controller, data plane, addresses and instance. ``parent`` is the
    parent's control address (``HOST:PORT``), or None for a root.
    ``always_up``: send every job up, even one whose workers are all here.
    """

    def __init__(self, server: Any, *, parent: str | None, always_up: bool = False) -> None:
        self.server = server
        self.parent = parent
        self.always_up = always_up
        self.children: dict[int, _Child] = {}
        self.parent_instance = 0
        self.parent_data: tuple[int, int] = (0, 0)
        self._parent_channel: grpc.aio.Channel | None = None
        self._parent: fb_grpc.FabricStub | None = None
        self._parent_sync: pb_grpc.SyncStub | None = None
        self._registry: _Registry | None = None
        self._uplinks: dict[int, socket.socket] = {}  # session -> this switch's uplink socket
        self._resuming: dict[int, _Resuming] = {}
        self._dropping: set[int] = set()  # sessions this node frees itself (not "gone")
        self._up_progress: dict[int, tuple[int, float]] = {}  # session -> (results, when)
        self._here: dict[int, dict[int, int]] = {}  # session -> worker rank -> member index
        # session -> member index -> (child switch id, its uplink's ip, port)
        self._kids: dict[int, dict[int, tuple[int, int, int]]] = {}
        #: the uplinks of the child switches among this switch's members, every job's
        #: (a capture marks their packets); a new set whenever it changes
        self.child_uplinks: frozenset[tuple[int, int]] = frozenset()
        self._watch: asyncio.TimerHandle | None = None
        self._said_parent_down = False
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ setup
    @property
    def active(self) -> bool:
        """Whether registrations go through the fabric: the switch has a parent,
        or children have introduced themselves."""
        return self.parent is not None or bool(self.children)

    @property
    def instance(self) -> int:
        return self.server.session_service.instance

    @property
    def controller(self) -> SessionController:
        return self.server.engine.controller

    @property
    def registry(self) -> _Registry:
        if self._registry is None:
            self._registry = _Registry(self.controller.target.limits)
        return self._registry

    def _knows(self, host: str) -> bool:
        """Whether this switch can tell other switches an address of its own:
        ``--advertise-ip``, or bound to one (not every) address. A switch bound
        to every address gives them 0.0.0.0, and whoever takes it fills in the
        address the switch's call came from (:func:`_fill_hop`): what workers
        are told, 127.0.0.1, would point a switch on another host at itself."""
        return self.server.advertise_ip is not None or host not in _WILDCARD

    def _data_address(self) -> tuple[int, int]:
        switch = self.controller.switch
        port = switch.data_ports[0] if switch.data_ports else self.server.port
        return (switch.ipv4 if self._knows(self.server.host) else 0, port)

    def _control_address(self) -> str:
        host, port = self.server.control_address
        if not self._knows(self.server.control_host):
            return f"0.0.0.0:{port}"
        return f"{self.server.advertise_ip or host}:{port}"

    async def start(self) -> None:
        """Introduce this switch to its parent (a child), and watch its uplinks."""
        self.server.engine.release_hooks.append(self._released)
        if self.parent is None:
            return
        self._parent_channel = grpc.aio.insecure_channel(self.parent, options=_CHANNEL_OPTIONS)
        self._parent = fb_grpc.FabricStub(self._parent_channel)
        self._parent_sync = pb_grpc.SyncStub(self._parent_channel)
        try:
            await self._hello()
        except FabricError as exc:
            log.warning("the parent switch at %s does not answer yet: %s", self.parent, exc)
        self._watch = asyncio.get_running_loop().call_later(
            PARENT_PROBE_AFTER / 2, self._watch_uplinks
        )

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for task in list(self._tasks):
            task.cancel()
        for rounds in self._resuming.values():
            for _, _, fut in rounds.reports.values():
                if not fut.done():
                    fut.set_exception(ConnectionAbortedError("the switch is shutting down"))
        for sock in self._uplinks.values():
            sock.close()
        self._uplinks.clear()
        for child in self.children.values():
            await child.channel.close()
        if self._parent_channel is not None:
            await self._parent_channel.close()

    async def _call(self, what: str, method: Callable, request: Any, timeout: float | None) -> Any:
        """A call to a neighbour switch; its failures become FabricError."""
        try:
            return await method(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            details = exc.details() or code.name
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise FabricError(
                    "UNAVAILABLE", f"{what}: the switch does not answer ({details})"
                ) from None
            raise FabricError(code.name, details) from None

    async def _hello(self) -> bool:
        """Ask the parent who it is; True when it is a new instance (restarted)."""
        resp = await self._call(
            f"Hello to the parent switch at {self.parent}",
            self._parent.Hello,
            fb.HelloRequest(instance=self.instance, control=self._control_address()),
            CALL_TIMEOUT,
        )
        changed = self.parent_instance not in (0, resp.instance)
        if self.parent_instance != resp.instance:
            log.info(
                "parent switch at %s: instance %x, data plane %s:%d",
                self.parent,
                resp.instance,
                _ip(resp.data_ipv4),
                resp.data_port,
            )
        self.parent_instance = resp.instance
        # a parent that does not know its address is where its control plane is
        self.parent_data = (resp.data_ipv4 or await self._parent_ip(), resp.data_port)
        self._said_parent_down = False
        return changed

    async def _parent_ip(self) -> int:
        """The IPv4 address of the parent's control plane (``--parent``'s host)."""
        host, _ = parse_address(self.parent, 0)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, family=socket.AF_INET)
        except OSError as exc:
            raise FabricError("UNAVAILABLE", f"cannot resolve the parent {host}: {exc}") from None
        return int(ipaddress.IPv4Address(infos[0][4][0]))

    # ----------------------------------------------------- this switch's hop
    def _uplink(self, session_id: int) -> socket.socket:
        """This switch's uplink socket for a job (made on first use)."""
        sock = self._uplinks.get(session_id)
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            set_socket_buffers(sock)
            sock.bind((self.server.host, 0))
            sock.setblocking(False)
            self._uplinks[session_id] = sock
        return sock

    def _hop(self, session_id: int) -> fb.Hop:
        """This switch on a registration's way up (it has a parent)."""
        data_ip, data_port = self._data_address()
        up_host, up_port = self._uplink(session_id).getsockname()
        up_ip = data_ip if up_host in _WILDCARD else int(ipaddress.IPv4Address(up_host))
        return fb.Hop(
            switch=self.instance,
            data_ipv4=data_ip,
            data_port=data_port,
            uplink_ipv4=up_ip,
            uplink_port=up_port,
            always_up=self.always_up,
            control=self._control_address(),
        )

    def _close_uplink(self, session_id: int) -> None:
        sock = self._uplinks.pop(session_id, None)
        if sock is not None:
            sock.close()

    # ------------------------------------------------ what workers ask here
    async def join(self, registration: pb.UdpSessionRequest) -> int:
        """A worker registered here: send it up to the root (or take it, at the
        root); return the job's epoch. Raises FabricError or RegistrationError."""
        return await self.on_join(registration, [])

    async def resume(self, report: pb.ResumeRequest) -> pb.ResumeResponse:
        """A worker's resume report: up to the root, which answers when every
        rank has reported and the job's tree is set up again."""
        return await self.on_resume(report, [])

    async def release(self, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        """A worker's Release: counted at the root."""
        if self.parent is not None:
            return await self._call(
                "Release at the parent switch", self._parent.Release, request, CALL_TIMEOUT
            )
        return await self._root_release(request)

    async def barrier(self, request: pb.BarrierRequest) -> pb.BarrierResponse:
        """Barriers meet at the root, where every rank of the job can come."""
        return await self._call(
            "Barrier at the parent switch", self._parent_sync.Barrier, request, None
        )

    async def broadcast(self, request: pb.BroadcastRequest) -> pb.BroadcastResponse:
        return await self._call(
            "Broadcast at the parent switch", self._parent_sync.Broadcast, request, None
        )

    # -------------------------------------------------- what children ask
    def on_hello(self, request: fb.HelloRequest, peer_ip: int) -> fb.HelloResponse:
        """A child introduced itself: from now on registrations go through the
        fabric here too."""
        try:
            control = _filled(request.control, peer_ip)
            port = parse_address(control, 0)[1]
        except ValueError as exc:
            raise FabricError("INVALID_ARGUMENT", f"Hello: {exc}") from None
        if not 0 < port <= 0xFFFF:
            raise FabricError("INVALID_ARGUMENT", f"Hello: no control port in {request.control!r}")
        self._add_child(request.instance, control)
        ip, port = self._data_address()
        return fb.HelloResponse(instance=self.instance, data_ipv4=ip, data_port=port)

    def _add_child(self, instance: int, control: str) -> None:
        """Know a child switch: its instance and control address (a restarted
        child, at the same address with a new instance, replaces itself)."""
        old = self.children.get(instance)
        if old is not None and old.control == control:
            return
        for other in [c for c in self.children.values() if c.control == control]:
            del self.children[other.instance]
            self._spawn(other.channel.close())
        if old is not None and instance in self.children:
            del self.children[instance]
            self._spawn(old.channel.close())
        channel = grpc.aio.insecure_channel(control, options=_CHANNEL_OPTIONS)
        self.children[instance] = _Child(instance, control, channel, fb_grpc.FabricStub(channel))
        log.info("child switch %x at %s", instance, control)

    def _child_from(self, path: list[fb.Hop]) -> None:
        """Learn a child from the first hop below this switch (a registration
        that came up through a child that has not said Hello to us yet)."""
        if path and path[-1].switch not in self.children:
            self._add_child(path[-1].switch, path[-1].control)

    async def on_join(
        self, registration: pb.UdpSessionRequest, path: list[fb.Hop], peer_ip: int = 0
    ) -> int:
        """A registration on its way up (``path``: the switches below, child-most
        first; ``peer_ip``: where the child's call came from). Above: add this
        switch and pass it on; at the root: apply the session rules, and set
        the job's tree up once every rank is in."""
        _fill_hop(path, peer_ip)
        self._child_from(path)
        if self.parent is not None:
            up = [*path, self._hop(registration.session_id)]
            resp = await self._call(
                "Join at the parent switch",
                self._parent.Join,
                fb.JoinRequest(registration=registration, path=up),
                CALL_TIMEOUT * 3,
            )
            return int(resp.epoch)
        return await self._root_join(registration, path)

    async def _root_join(self, reg: pb.UdpSessionRequest, path: list[fb.Hop]) -> int:
        reg_ctl = self.registry.controller
        old = reg_ctl.sessions.get(reg.session_id)
        if reg.rank == 0 and old is not None:
            await self._drop_tree(reg.session_id, "replaced")
        session = reg_ctl.register(
            session_id=reg.session_id,
            rank=reg.rank,
            num_workers=reg.num_workers,
            ipv4=reg.ipv4,
            udp_port=reg.udp_port,
            packet_size=int(reg.packet_size),
            pool_size=reg.pool_size,
            mac=reg.mac,
            now=self.server.clock(),
            value_formats=int(reg.value_formats),
        )
        where = self.registry.where.setdefault(reg.session_id, {})
        where[reg.rank] = RankAt(tuple(_hop(h) for h in path), _member(reg))
        log.info(
            "fabric session %d: rank %d/%d registered %s",
            reg.session_id,
            reg.rank,
            reg.num_workers,
            f"via {len(path)} switch(es) below" if path else "here",
        )
        if len(session.workers) == reg.num_workers:
            await self._set_up(reg.session_id, session.epoch)
        return session.epoch

    async def _set_up(self, session_id: int, epoch: int) -> None:
        """Plan the job's tree and configure it, down from here (the root)."""
        session = self.registry.controller.sessions[session_id]
        where = self.registry.where[session_id]
        plan = plan_tree(self.instance, self._data_address(), where)
        params = session.params
        request = fb.ConfigureRequest(
            session_id=session_id,
            num_workers=params.num_workers,
            packet_size=params.size_code,
            pool_size=params.pool_size,
            epoch=epoch,
            plan=_plan_message(plan),
            value_formats=params.value_formats,
        )
        await self.on_configure(request)
        self.registry.configured[session_id] = epoch
        tops = [p for p in plan.walk() if p.involved and p.parent is None]
        log.info(
            "fabric session %d: tree set up at epoch %d (%d switches aggregate, top %x)",
            session_id,
            epoch,
            sum(1 for p in plan.walk() if p.involved),
            tops[0].switch if tops else 0,
        )

    async def on_configure(self, request: fb.ConfigureRequest) -> None:
        """Set up this switch's part of a job's tree, then its children's."""
        plan = request.plan
        sid = request.session_id
        if plan.involved:
            # the switch above is this one's parent: where it did not know its own
            # address (0), the address this switch reaches it at
            parent_ip = plan.parent_ipv4
            if plan.parent_port and not parent_ip:
                parent_ip = self.parent_data[0] or await self._parent_ip()
            self._configure_here(request, parent_ip)
        else:
            self._free_here(sid, "not in the job's tree")
        calls = []
        for below in plan.below:
            child = self.children.get(below.switch)
            if child is None:
                raise FabricError(
                    "UNAVAILABLE",
                    f"session {sid}: child switch {below.switch:x} is not known here",
                )
            sub = fb.ConfigureRequest()
            sub.CopyFrom(request)
            sub.plan.CopyFrom(below)
            calls.append(
                self._call(
                    f"Configure at child switch {child.control}",
                    child.stub.Configure,
                    sub,
                    CALL_TIMEOUT,
                )
            )
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    def _configure_here(self, request: fb.ConfigureRequest, parent_ip: int) -> None:
        plan = request.plan
        sid = request.session_id
        members = list(plan.members)
        requests = [
            {
                "session_id": sid,
                "rank": i,
                "num_workers": len(members),
                "ipv4": m.ipv4,
                "udp_port": m.udp_port,
                "packet_size": request.packet_size,
                "pool_size": request.pool_size,
                "mac": m.mac,
                "loopback_broadcast": False,
                "value_formats": request.value_formats,
            }
            for i, m in enumerate(members)
        ]
        self._dropping.add(sid)
        try:
            self.server.data_plane.flush()  # what came before counts under the old tables
            session = self.controller.resume(requests, now=self.server.clock())
        finally:
            self._dropping.discard(sid)
        session.epoch = request.epoch
        self._here[sid] = {m.rank: i for i, m in enumerate(members) if m.child == 0}
        self._kids[sid] = {
            i: (m.child, m.ipv4, m.udp_port) for i, m in enumerate(members) if m.child != 0
        }
        self._kids_changed()
        job = session.handle
        if plan.parent_port:
            self.server.engine.set_parent(job, parent_ip, plan.parent_port)
            self.server.data_plane.add_uplink(job, self._uplink(sid))
            self._up_progress[sid] = (0, self.server.clock())
        else:
            self._close_uplink(sid)
        self.server.on_fabric_change()

    def _free_here(self, session_id: int, why: str) -> None:
        """Free this switch's part of a job (its own doing: not 'gone'). A job
        being resumed keeps its uplink socket: the reports on their way up name
        its address, and the new tree is set up with it."""
        self._dropping.add(session_id)
        try:
            self.controller.release(session_id)
        finally:
            self._dropping.discard(session_id)
        if why != RESUMING:
            self._close_uplink(session_id)
        self._forget(session_id)
        self.server.on_fabric_change()

    def _forget(self, session_id: int) -> None:
        """Drop what this node kept of a job's part here."""
        self._up_progress.pop(session_id, None)
        self._here.pop(session_id, None)
        if self._kids.pop(session_id, None):
            self._kids_changed()

    def _kids_changed(self) -> None:
        self.child_uplinks = frozenset(
            (ip, port) for kids in self._kids.values() for _, ip, port in kids.values()
        )

    def status(self, session_id: int, rank: int) -> tuple[bool, int]:
        """``(known, epoch)`` of a rank registered here (the Status call): its
        job's part is set up here, with this rank among its members."""
        session = self.controller.sessions.get(session_id)
        if session is None or rank not in self._here.get(session_id, {}):
            return False, 0
        return True, session.epoch

    async def on_drop(self, request: fb.DropRequest) -> None:
        """Free a job here and at every child (they may not all hold it)."""
        self._free_here(request.session_id, request.why)
        calls = [
            self._call(f"Drop at {c.control}", c.stub.Drop, request, CALL_TIMEOUT)
            for c in self.children.values()
        ]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                log.info("session %d: a child did not take the drop: %s", request.session_id, r)

    async def _drop_tree(self, session_id: int, why: str) -> None:
        """The root frees a job everywhere."""
        self.registry.configured.pop(session_id, None)
        await self.on_drop(fb.DropRequest(session_id=session_id, why=why))

    async def _root_release(self, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        found, freed, remaining = self.registry.controller.release_rank(
            request.session_id, request.rank, request.ipv4, request.udp_port
        )
        if freed:
            self.registry.where.pop(request.session_id, None)
            await self._drop_tree(request.session_id, "explicit")
            log.info("fabric session %d released by its workers", request.session_id)
        elif not found:
            log.warning(
                "refused Release(session=%d rank=%d) from %s:%d: not the rank's registered "
                "address in the fabric",
                request.session_id,
                request.rank,
                _ip(request.ipv4) if request.ipv4 else "?",
                request.udp_port,
            )
        return pb.ReleaseResponse(found=found, freed=freed, remaining=remaining)

    async def on_gone(self, request: fb.GoneRequest) -> None:
        """A switch below freed its part of a job by itself: free the rest."""
        if self.parent is not None:
            await self._call("Gone at the parent", self._parent.Gone, request, CALL_TIMEOUT)
            return
        if self.registry.controller.release(request.session_id):
            self.registry.where.pop(request.session_id, None)
            await self._drop_tree(request.session_id, request.why)
            log.info(
                "fabric session %d freed everywhere (%s below)", request.session_id, request.why
            )

    def _released(self, job: Any) -> None:
        """The engine freed a job: by itself (idle, evicted) for a fabric job
        means the whole job goes (said up to the root)."""
        sid = job.session_id
        self._forget(sid)
        self.server.data_plane.remove_uplink(job.index)
        if sid in self._dropping or not self.active:
            return
        self._close_uplink(sid)
        if self.parent is None and sid not in self.registry.controller.sessions:
            return
        self._spawn(self.on_gone(fb.GoneRequest(session_id=sid, why="freed below")))

    # ------------------------------------------------------------- resume
    async def on_resume(
        self, report: pb.ResumeRequest, path: list[fb.Hop], peer_ip: int = 0
    ) -> pb.ResumeResponse:
        """A resume report on its way up; at the root, the rendezvous."""
        _fill_hop(path, peer_ip)
        self._child_from(path)
        reg = report.registration
        if self.parent is not None:
            up = [*path, self._hop(reg.session_id)]
            return await self._call(
                "Resume at the parent switch",
                self._parent.Resume,
                fb.FabricResumeRequest(report=report, path=up),
                None,
            )
        rnd = self._resuming.get(reg.session_id)
        if rnd is None:
            rnd = self._resuming[reg.session_id] = _Resuming(reg.num_workers)
            if reg.session_id in self.registry.configured:
                # the others' switches must tell their workers: free the job everywhere
                await self._drop_tree(reg.session_id, RESUMING)
        if reg.num_workers != rnd.num_workers:
            raise FabricError(
                "INVALID_ARGUMENT",
                f"rank {reg.rank} resumes with num_workers {reg.num_workers}, "
                f"another rank with {rnd.num_workers}",
            )
        earlier = rnd.reports.get(reg.rank)
        if earlier is not None and not earlier[2].done():
            earlier[2].cancel()
        fut = asyncio.get_running_loop().create_future()
        rnd.reports[reg.rank] = (report, tuple(_hop(h) for h in path), fut)
        log.info(
            "fabric session %d: rank %d asks to resume (%d of %d)",
            reg.session_id,
            reg.rank,
            len(rnd.reports),
            rnd.num_workers,
        )
        if len(rnd.reports) == rnd.num_workers:
            del self._resuming[reg.session_id]
            await self._resume_all(reg.session_id, rnd)
        try:
            answer = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if rnd.reports.get(reg.rank, (None, None, None))[2] is fut:
                del rnd.reports[reg.rank]
            raise
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def _resume_all(self, session_id: int, rnd: _Resuming) -> None:
        try:
            progress = {
                rank: Progress(
                    tuple(rep.rounds),
                    {r.slot: SlotResult.from_message(r) for r in rep.last},
                )
                for rank, (rep, _, _) in rnd.reports.items()
            }
            try:
                repairs = plan_repairs(progress)
            except RecoveryError as exc:
                raise FabricError("FAILED_PRECONDITION", str(exc)) from None
            requests = []
            for rank, (rep, _, _) in sorted(rnd.reports.items()):
                reg = rep.registration
                requests.append(
                    {**registration_kwargs(reg, ipv4=reg.ipv4, udp_port=reg.udp_port), "rank": rank}
                )
            try:
                session = self.registry.controller.resume(requests, now=self.server.clock())
            except RegistrationError as exc:
                raise FabricError(exc.code, exc.message) from None
            self.registry.where[session_id] = {
                rank: RankAt(path, _member(rep.registration))
                for rank, (rep, path, _) in rnd.reports.items()
            }
            await self._set_up(session_id, session.epoch)
        except Exception as exc:  # every rank hears it
            log.warning("fabric session %d could not be resumed: %s", session_id, exc)
            for _, _, fut in rnd.reports.values():
                if not fut.done():
                    fut.set_result(exc)
            return
        log.info(
            "fabric session %d resumed at epoch %d (%d lost results handed on)",
            session_id,
            session.epoch,
            sum(len(r) for r in repairs.values()),
        )
        for rank, (_, _, fut) in rnd.reports.items():
            if not fut.done():
                fut.set_result(
                    pb.ResumeResponse(
                        registration=pb.UdpSessionResponse(
                            session_id=session_id, epoch=session.epoch
                        ),
                        repairs=[r.message() for r in repairs[rank]],
                    )
                )

    # ------------------------------------------------------ uplink watch
    def _watch_uplinks(self) -> None:
        """A child: when a job's uplink has waited for its parent's results for
        PARENT_PROBE_AFTER, ask the parent who it is."""
        loop = asyncio.get_running_loop()
        self._watch = loop.call_later(PARENT_PROBE_AFTER / 2, self._watch_uplinks)
        now = self.server.clock()
        eng = self.server.engine
        stalled = False
        for sid, (seen, since) in list(self._up_progress.items()):
            job = eng.jobs.get(sid)
            if job is None or job.parent is None:
                continue
            got = eng.job_counters_of(sid)["up_results"]
            if got != seen:
                self._up_progress[sid] = (got, now)
            elif eng.uplink_deadline(job) < float("inf") and now - since >= PARENT_PROBE_AFTER:
                stalled = True
        if stalled and not any(t.get_name() == "hello" for t in self._tasks):
            self._spawn(self._probe_parent(), name="hello")

    async def _probe_parent(self) -> None:
        try:
            restarted = await self._hello()
        except FabricError as exc:
            if not self._said_parent_down:
                self._said_parent_down = True
                log.warning(
                    "the parent switch at %s does not answer (%s); its jobs here wait for it",
                    self.parent,
                    exc,
                )
            return
        if restarted:
            sessions = [sid for sid, sock in self._uplinks.items() if sock is not None]
            log.warning(
                "the parent switch at %s restarted: freeing %d job(s) here, whose workers resume",
                self.parent,
                len(sessions),
            )
            for sid in sessions:
                self._free_here(sid, RESUMING)

    def _spawn(self, coro: Any, name: str | None = None) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("fabric: %s", task.exception())

    # ------------------------------------------------------------- stats
    def snapshot(self) -> dict[str, Any]:
        """The fabric as a snapshot shows it (``stats``, ``top``)."""
        return {
            "instance": self.instance,
            "parent": self.parent,
            "parent_instance": self.parent_instance,
            "always_up": self.always_up,
            "children": sorted(c.control for c in self.children.values()),
            "jobs_up": sorted(self._uplinks),
        }

    def annotate(self, jobs: list[dict[str, Any]]) -> None:
        """Mark the fabric's part in a snapshot's jobs: a job below the top of
        its tree gets ``parent`` (the data address its partial aggregates go
        to) and ``uplink`` (where they leave from); a member that is a child
        switch gets ``child`` (its control address)."""
        eng = self.server.engine
        for entry in jobs:
            sid = entry["session_id"]
            job = eng.jobs.get(sid)
            if job is not None and job.parent is not None:
                entry["parent"] = "%s:%d" % (_ip(job.parent[0]), job.parent[1])
                sock = self._uplinks.get(sid)
                if sock is not None:
                    entry["uplink"] = "%s:%d" % sock.getsockname()[:2]
            for index, (switch, _, _) in self._kids.get(sid, {}).items():
                child = self.children.get(switch)
                if index < len(entry["workers"]):
                    entry["workers"][index]["child"] = child.control if child else f"{switch:x}"


_WILDCARD = ("0.0.0.0", "")


def _filled(control: str, peer_ip: int) -> str:
    """A control address with a wildcard host replaced by ``peer_ip`` (see
    :meth:`FabricNode._knows`)."""
    host, port = parse_address(control, 0)
    if host in _WILDCARD and peer_ip:
        host = _ip(peer_ip)
    return f"{host}:{port}"


def _fill_hop(path: list[fb.Hop], peer_ip: int) -> None:
    """Fill in the addresses the hop of the child that called (the last of
    ``path``) left unknown with ``peer_ip``, where its call came from."""
    if not path or not peer_ip:
        return
    hop = path[-1]
    hop.data_ipv4 = hop.data_ipv4 or peer_ip
    hop.uplink_ipv4 = hop.uplink_ipv4 or peer_ip
    hop.control = _filled(hop.control, peer_ip)


def _hop(h: fb.Hop) -> Hop:
    return Hop(h.switch, (h.data_ipv4, h.data_port), (h.uplink_ipv4, h.uplink_port), h.always_up)


def _member(reg: pb.UdpSessionRequest) -> Member:
    return Member(reg.rank, 0, reg.ipv4, reg.udp_port, reg.mac, False)


def _plan_message(plan: Plan) -> fb.Plan:
    msg = fb.Plan(
        switch=plan.switch,
        involved=plan.involved,
        members=[
            fb.Member(
                rank=m.rank,
                child=m.child,
                ipv4=m.ipv4,
                udp_port=m.udp_port,
                mac=m.mac,
                loopback_broadcast=m.loopback_broadcast,
            )
            for m in plan.members
        ],
        parent_ipv4=plan.parent[0] if plan.parent else 0,
        parent_port=plan.parent[1] if plan.parent else 0,
    )
    msg.below.extend(_plan_message(p) for p in plan.below)
    return msg


class FabricService(fb_grpc.FabricServicer):
    """The ``swemu.Fabric`` gRPC service over a :class:`FabricNode`."""

    def __init__(self, node: FabricNode) -> None:
        self.node = node

    async def _run(self, context: grpc.aio.ServicerContext, coro: Any) -> Any:
        try:
            return await coro
        except (FabricError, RegistrationError) as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        except ValueError as exc:  # a malformed request (an address, a field out of range)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise AssertionError("unreachable")  # abort raises

    async def Hello(self, request, context):
        async def hello():
            return self.node.on_hello(request, peer_ipv4(context))

        return await self._run(context, hello())

    async def Join(self, request, context):
        path = list(request.path)
        epoch = await self._run(
            context, self.node.on_join(request.registration, path, peer_ipv4(context))
        )
        return fb.JoinResponse(epoch=epoch)

    async def Resume(self, request, context):
        path = list(request.path)
        return await self._run(
            context, self.node.on_resume(request.report, path, peer_ipv4(context))
        )

    async def Release(self, request, context):
        return await self._run(context, self.node.release(request))

    async def Gone(self, request, context):
        await self._run(context, self.node.on_gone(request))
        return fb.GoneResponse()

    async def Configure(self, request, context):
        await self._run(context, self.node.on_configure(request))
        return fb.ConfigureResponse()

    async def Drop(self, request, context):
        await self._run(context, self.node.on_drop(request))
        return fb.DropResponse()


__all__ = ["FabricError", "FabricNode", "FabricService"]
