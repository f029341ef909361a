"""asyncio adapter of the worker protocol: one UDP socket, one event loop.

Thin on purpose: the socket is registered with ``loop.add_reader``; on
readiness the adapter drains datagrams into the rows of a preallocated batch,
hands the batch to :class:`swemu.protocol.worker.protocol.Allreduce` (compiled kernels) and
sends the packets it asks for. One ``call_at`` timer drives retransmissions
and the no-progress check.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from swemu.protocol import fastio, wire
from swemu.protocol.jit import compiling_said
from swemu.protocol.netutil import (
    buffer_advice,
    mac_of_ipv4,
    parse_address,
    receive_buffer,
    resolve_ipv4,
    set_socket_buffers,
)
from swemu.protocol.proto import switchml_pb2 as pb
from swemu.protocol.worker import kernels as K
from swemu.protocol.worker.protocol import (
    HALF_DTYPES,
    Allreduce,
    Timing,
    WorkerProtocol,
    dtype_name,
    warmup,
    warmup16,
)

from . import fastpath
from .control import ControlClient, Membership
from .errors import ControlPlaneError, SwitchMLError
from .results import ResultPool

BATCH = 64
#: Restart recovery (docs/protocol.md §5): after this long without a result, a
#: worker asks the control plane whether the switch restarted (Status), and again
#: this often while nothing moves; a slow peer costs a small RPC now and then.
PROBE_AFTER = 0.5
PROBE_EVERY = 0.5
#: p4app-switchML's worker_port: the port all workers of a job share where the
#: switch knows workers by IP alone (see AsyncContext.open)
DEFAULT_WORKER_PORT = 4000
log = logging.getLogger("hostlib")


#: The default window's budget: bytes in flight of all the workers of a job
#: together, and of one worker at least and at most
IN_FLIGHT_BYTES = 3 << 20
IN_FLIGHT_MIN = 256 << 10
IN_FLIGHT_MAX = 1 << 20


def default_window(packet_size: int, world_size: int = 1) -> int:
    """Slots per worker when none are given: about 3 MiB in flight for the whole
    job, from 256 KiB to 1 MiB per worker (1 MiB up to W = 3, 768 KiB at W = 4,
    384 KiB at W = 8), at most 512 slots. At code 6 that is 127, 95 and 47 slots,
    at code 7 63, 47 and 23, at code 3 the 512 cap up to W = 8.

    Why: every wakeup of the switch and of the workers handles the packets that
    arrived meanwhile, so a larger window means longer batches and fewer
    wakeups, until what is in flight in the whole job outgrows the switch's
    caches (docs/performance.md, "The default window": on loopback the best
    window per worker fell as W grew, at about 3 MiB in all). The whole job's
    burst also has to fit the switch's UDP receive buffer."""
    per_worker = min(IN_FLIGHT_MAX, max(IN_FLIGHT_MIN, IN_FLIGHT_BYTES // max(1, world_size)))
    return max(8, min(512, per_worker // wire.packet_len(packet_size)))


@dataclass(frozen=True)
class Options:
    """Everything a worker is configured with (see :func:`hostlib.connect`)."""

    switch: str | None = None  # HOST:PORT of the data plane (None: from the controller)
    control: str = f"127.0.0.1:{wire.DEFAULT_CONTROL_PORT}"
    rank: int = 0
    world_size: int = 1
    # None: chosen when joining -- the emulator's fastest size code when the
    # controller says it is one, else 3 (hardware); see ControlClient.default_packet_size
    packet_size: int | None = None
    window: int | None = None  # default: default_window(packet_size, world_size)
    session_id: int | None = None
    timing: Timing = field(default_factory=Timing)
    connect_timeout: float = 10.0
    join_timeout: float = 120.0
    bind: str | None = None  # local IP to send from (None: the route to the switch)
    gso: bool = True  # UDP segmentation offload where the kernel and the route allow it
    # tell the controller when leaving (Release; the last rank's frees the job). False
    # leaves a finished job on the switch for inspection (stats) until it expires
    release: bool = True
    # the UDP port all workers of a job share on a switch that knows workers by IP
    # alone (p4app-switchML's worker_port); None: $SWITCHML_WORKER_PORT, else 4000
    worker_port: int | None = None
    # float32 calls on the 16-bit wire (docs/protocol.md §4.2) unless a call says
    # otherwise; float16 and bfloat16 tensors take it whenever the switch offers it
    values16: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} must be in 0..{self.world_size - 1}")
        if not 1 <= self.world_size <= wire.MAX_WORKERS:
            raise ValueError(f"world_size must be in 1..{wire.MAX_WORKERS}")
        if self.packet_size is not None and not 0 <= self.packet_size <= 7:
            raise ValueError(f"packet_size must be a size code 0..7, got {self.packet_size}")
        if self.window is None and self.packet_size is not None:
            object.__setattr__(self, "window", default_window(self.packet_size, self.world_size))
        if self.window is not None and not 1 <= self.window <= wire.MAX_SLOTS:
            raise ValueError(f"window must be in 1..{wire.MAX_SLOTS}")
        if self.worker_port is None:
            env = os.environ.get("SWITCHML_WORKER_PORT", "")
            if env and not env.isdigit():
                raise ValueError(f"SWITCHML_WORKER_PORT={env!r} is not a port number")
            object.__setattr__(self, "worker_port", int(env) if env else DEFAULT_WORKER_PORT)
        if not 1 <= self.worker_port <= 0xFFFF:
            raise ValueError(f"worker_port must be in 1..65535, got {self.worker_port}")

    def with_packet_size(self, packet_size: int) -> Options:
        """These options with the packet size chosen when it was left open (a
        window left open too is then sized for it; a given one is kept)."""
        return dataclasses.replace(self, packet_size=packet_size)


class AsyncContext:
    """A worker's membership of a job, for asyncio code (see :func:`hostlib.aconnect`)."""

    def __init__(
        self, options: Options, *, fast: bool | None = None, blocking: bool = False
    ) -> None:
        self.options = options
        #: made for :class:`hostlib.Context`: its calls take :meth:`allreduce_blocking`
        #: whenever :attr:`can_block`, so the event loop's compiled path is not warmed
        self.blocking = blocking
        if fast is None:  # SWEMU_PORTABLE=1 forces the portable socket path
            fast = os.environ.get("SWEMU_PORTABLE", "") in ("", "0")
        self.fast = fast and fastio.AVAILABLE
        # SWITCHML_POLL=0: blocking callers wait in the event loop, not in compiled code
        self._poll = os.environ.get("SWITCHML_POLL", "1") != "0"
        self.membership: Membership | None = None
        self.protocol: WorkerProtocol | None = None
        self._sock: socket.socket | None = None
        self._bsock: socket.socket | None = None  # loopback-broadcast results, if offered
        self._blocking_recovery = False  # a blocking call's _recover runs (_recover_blocking)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._op: Allreduce | None = None
        self._done: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._dests: list[tuple[str, int]] = []
        self._switch_ip = ""
        self._switch_ports: frozenset[int] = frozenset()
        self._local: tuple[int, int] = (0, 0)  # (ipv4, udp_port) registered: for Release
        # restart recovery: the registration to repeat, when to ask the switch
        # again, whether a missing control plane was reported, a probe running
        self._registration: pb.UdpSessionRequest | None = None
        self._next_probe = 0.0
        self._said_waiting = False
        self._recovering: asyncio.Task | None = None
        # between its report and the switch's answer a resuming worker sends
        # nothing and takes no result (docs/protocol.md §5)
        self._resuming = False
        self._released = True  # nothing to release before joining
        self._batch = np.zeros((BATCH, 1), np.uint8)  # sized once the packet size is known
        self._rows: list[memoryview] = []
        self._lens = np.zeros(BATCH, np.int32)
        self._ok = np.zeros(BATCH, np.uint8)
        self.stale = 0  # datagrams that arrived between calls
        self._wakeups = 0  # socket reads (batches) of the running call
        self.gso_segments = 1  # packets per send message (1: no segmentation offload)
        self._told_values16 = False  # the fallback to 32-bit values was logged
        self._had16 = False  # a call with 16-bit data has begun (see FIRST16_NO_PROGRESS)
        self.last_stats: dict[str, int] = {}  # counters of the last call
        #: the memory of results returned without ``out=``, reused once dropped
        self.results = ResultPool()

    # ---------------------------------------------------------------- lifetime
    async def __aenter__(self) -> AsyncContext:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Open the socket and join the job (idempotent)."""
        if self._sock is not None:
            return
        o = self.options
        self._loop = asyncio.get_running_loop()
        # compile before joining: the others wait for us at the barrier (the 16-bit
        # kernels too if the job says it sends 16-bit values; else on a first 16-bit call)
        _warmup_once(o.values16, self._pumps)
        ctl = ControlClient(o.control, connect_timeout=o.connect_timeout)
        try:
            await ctl.connect()
            if o.packet_size is None:  # the emulator's fastest, or 3 on hardware
                size = await ctl.default_packet_size(o.connect_timeout)
                self.options = o = o.with_packet_size(size)
            self._batch = np.zeros((BATCH, wire.packet_len(o.packet_size) + 1), np.uint8)
            self._rows = [memoryview(self._batch[r]) for r in range(BATCH)]
            switch_host = parse_address(o.switch, wire.DEFAULT_UDP_PORT)[0] if o.switch else ""
            probe_host = (
                resolve_ipv4(switch_host)
                if switch_host
                else resolve_ipv4(parse_address(o.control, wire.DEFAULT_CONTROL_PORT)[0])
            )
            local_ip = o.bind or _route_source(probe_host)
            sock = _worker_socket(local_ip, 0, o)
            shared: socket.socket | None = None

            def registered(reply: pb.UdpSessionResponse) -> None:
                # a switch that knows workers by IP alone sends each result to the
                # source port of the packet that completed the slot: every worker
                # must listen where the others send from (before any result comes)
                nonlocal shared
                if reply.worker_identity == pb.IDENTITY_IP and o.world_size > 1:
                    shared = _worker_socket(local_ip, o.worker_port, o)

            try:
                # on loopback, ask the emulator to send each result once to all
                # workers (127.255.255.255); needs the compiled path's second socket
                want_broadcast = (
                    self.fast
                    and ipaddress.IPv4Address(probe_host).is_loopback
                    and os.environ.get("SWITCHML_BROADCAST", "1") != "0"
                )
                membership = await ctl.join(
                    loopback_broadcast=want_broadcast,
                    rank=o.rank,
                    world_size=o.world_size,
                    ipv4=wire.ipv4_to_int(local_ip),
                    udp_port=sock.getsockname()[1],
                    packet_size=o.packet_size,
                    pool_size=o.window,
                    session_id=o.session_id,
                    timeout=o.join_timeout,
                    mac=mac_of_ipv4(local_ip),
                    registered=registered,
                )
                if membership.worker_identity == pb.IDENTITY_UNKNOWN and o.world_size > 1:
                    # the switch does not say: workers that share an IP can only be
                    # told apart by port (keep one each, as registered); workers on
                    # distinct IPs may face a switch that knows them by IP alone
                    # (p4app-switchML), so they move to the shared port, registered
                    # again, which a switch that honours udp_port follows as well
                    ips = await ctl.gather(
                        wire.ipv4_to_int(local_ip),
                        rank=o.rank,
                        world_size=o.world_size,
                        session_id=membership.session_id,
                        timeout=o.join_timeout,
                    )
                    if len(set(ips)) == len(ips):
                        shared = _worker_socket(local_ip, o.worker_port, o)
                        membership = await ctl.join(
                            loopback_broadcast=False,
                            rank=o.rank,
                            world_size=o.world_size,
                            ipv4=wire.ipv4_to_int(local_ip),
                            udp_port=o.worker_port,
                            packet_size=o.packet_size,
                            pool_size=o.window,
                            session_id=membership.session_id,
                            timeout=o.join_timeout,
                            mac=mac_of_ipv4(local_ip),
                        )
                        want_broadcast = False
            except BaseException:
                sock.close()
                if shared is not None:
                    shared.close()
                raise
        finally:
            await ctl.close()
        if shared is not None:
            sock.close()
            sock = shared
        self._sock = sock
        self._local = (wire.ipv4_to_int(local_ip), sock.getsockname()[1])
        self._released = False
        self._registration = pb.UdpSessionRequest(
            session_id=membership.session_id,
            rank=o.rank,
            num_workers=o.world_size,
            mac=mac_of_ipv4(local_ip),
            ipv4=self._local[0],
            packet_size=o.packet_size,
            udp_port=self._local[1],
            pool_size=o.window,
            loopback_broadcast=want_broadcast,
            value_formats=membership.value_formats,  # a resume registers the same formats
        )
        self.protocol = WorkerProtocol(
            num_workers=o.world_size, size_code=o.packet_size, window=o.window, timing=o.timing
        )
        self._use_membership(membership)
        self._loop.add_reader(sock.fileno(), self._on_readable)

    def _use_membership(self, membership: Membership) -> None:
        """Send to the data plane ``membership`` names (when joining, and again
        after a resume, which may come from a switch elsewhere): its address,
        unless one was given, its data ports, its loopback-broadcast port."""
        o = self.options
        self.membership = membership
        switch_host, switch_port = (
            parse_address(o.switch, wire.DEFAULT_UDP_PORT) if o.switch else ("", 0)
        )
        self._switch_ip = (
            resolve_ipv4(switch_host) if switch_host else wire.int_to_ipv4(membership.switch_ipv4)
        )
        if membership.data_ports and not (switch_port and len(membership.data_ports) == 1):
            ports = list(membership.data_ports)  # the switch's own, or its shards'
        else:  # a port given explicitly wins over a single advertised one
            ports = [switch_port or wire.DEFAULT_UDP_PORT]
        self._switch_ports = frozenset(ports)
        self._dests = [(self._switch_ip, ports[s % len(ports)]) for s in range(o.window)]
        if self.fast:
            self._close_broadcast()
            self._setup_fast(ports)
            if self._registration.loopback_broadcast and membership.broadcast_port:
                self._open_broadcast(membership.broadcast_port)

    def _open_broadcast(self, port: int) -> None:
        """Take the job's results on ``0.0.0.0:port`` too, where the emulator sends
        each of them once for all workers (UdpSessionResponse.broadcast_port)."""
        b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            b.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            set_socket_buffers(b)
            b.bind(("0.0.0.0", port))
            b.setblocking(False)
        except OSError as exc:
            b.close()
            self.close()
            raise SwitchMLError(
                f"cannot take the switch's broadcast results on UDP port {port}: "
                f"{exc.strerror or exc} (SWITCHML_BROADCAST=0 turns loopback broadcast off)"
            ) from None
        if self._io.gro:
            fastio.enable_gro(b)
        self._bsock = b
        self._io.bfd = b.fileno()
        if not self._blocking_recovery:  # else _recover_blocking adds it when done
            self._loop.add_reader(b.fileno(), self._on_readable)

    def _setup_fast(self, ports: list[int]) -> None:
        """Message vectors and arguments of the compiled I/O loop."""
        seg_max = 1
        if self.options.gso:
            seg_max = fastpath.enable_gso(self._sock, self.protocol.rows.shape[1], self._switch_ip)
        self.gso_segments = seg_max
        gro = (
            self.options.gso
            and os.environ.get("SWITCHML_GRO", "1") != "0"
            and fastio.enable_gro(self._sock)
        )
        self._io = fastpath.FastIO(
            self._batch,
            self._lens,
            self._ok,
            self.protocol.rows,
            wire.ipv4_to_int(self._switch_ip),
            ports,
            seg_max,
            gro,
        )

    async def aclose(self) -> None:
        """Leave: close the socket (:meth:`close`) and tell the controller this
        rank is done with the job (``Release``: the last rank's release frees it
        on the switch). Never raises for the controller: a controller that is
        gone or lacks the call leaves the job to its idle timeout."""
        self.close(release=False)
        await self._release()

    async def _release(self) -> None:
        if self._released or self.membership is None:
            return
        self._released = True
        if not self.options.release:
            return
        o, m = self.options, self.membership
        ctl = ControlClient(o.control)
        try:
            reply = await ctl.release(
                session_id=m.session_id,
                rank=o.rank,
                ipv4=self._local[0],
                udp_port=self._local[1],
                timeout=RELEASE_TIMEOUT,
            )
            if reply is not None and not reply.found and reply.remaining:
                # the session exists but does not hold this rank at this address
                log.warning(
                    "the switch at %s refused the release of session %d rank %d from %s:%d "
                    "(not the address it holds for the rank): the job stays on the switch "
                    "until its idle timeout",
                    o.control,
                    m.session_id,
                    o.rank,
                    wire.int_to_ipv4(self._local[0]),
                    self._local[1],
                )
        except SwitchMLError as exc:
            log.debug("release of session %d rank %d: %s", m.session_id, o.rank, exc)
        finally:
            await ctl.close()

    def close(self, *, release: bool = True) -> None:
        """Leave: stop reading and close the socket (a running call fails).

        Inside a running event loop the ``Release`` is sent in the background
        (``await aclose()`` waits for it); :class:`hostlib.Context` waits too."""
        self._close_broadcast()
        if self._recovering is not None:
            self._recovering.cancel()
            self._recovering = None
        if self._sock is None:
            return
        self.results.clear()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        self._finish(SwitchMLError("the SwitchML context was closed during an allreduce"))
        loop = self._loop
        if release and not self._released and loop is not None and loop.is_running():
            task = loop.create_task(self._release())
            _background.add(task)
            task.add_done_callback(_background.discard)

    def _close_broadcast(self) -> None:
        if self._bsock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._bsock.fileno())
            self._io.bfd = -1
            self._bsock.close()
            self._bsock = None

    @property
    def switch_address(self) -> str:
        return f"{self._switch_ip}:{min(self._switch_ports) if self._switch_ports else 0}"

    @property
    def values16_available(self) -> bool:
        """Whether the switch registered this job's 16-bit format (docs/protocol.md
        §4.2): a switch without the extension answers no, and every call then goes
        on the 32-bit wire."""
        m = self.membership
        return m is not None and m.value_formats == pb.VALUES_INT32_AND_BLOCK16

    def wire16(self, x: np.ndarray, values16: bool | None, bfloat16: bool = False) -> bool:
        """Whether a call of ``x`` goes on the 16-bit wire: asked for (``values16``
        True, or None and the context's :attr:`Options.values16`, for float32), or a
        float16/bfloat16 tensor by default; never for int32, and only where the
        switch offers it (else the 32-bit wire, said once in the log)."""
        dtype = dtype_name(x, bfloat16)
        if dtype == "int32":
            return bool(values16)  # True: the protocol refuses it (int32 sums are exact)
        if values16 is None:
            values16 = dtype != "float32" or self.options.values16
        if values16 and not self.values16_available:
            if not self._told_values16:
                log.info(
                    "the switch at %s did not register the 16-bit format (docs/protocol.md "
                    "§4.2): %s values travel as 32-bit ones",
                    self.switch_address,
                    dtype,
                )
                self._told_values16 = True
            return False
        return bool(values16)

    # --------------------------------------------------------------- allreduce
    async def allreduce(
        self,
        x: np.ndarray,
        out: np.ndarray | None = None,
        *,
        values16: bool | None = None,
        bfloat16: bool = False,
    ) -> np.ndarray:
        """Sum ``x`` over all workers of the job; return the result (``out`` if given).
        ``values16`` and ``bfloat16``: see :meth:`hostlib.Context.allreduce`."""
        await self.open()
        loop = self._loop
        op, result = self._begin(x, out, loop.time, values16, bfloat16)
        if op.done:
            return result
        self._wakeups = 0
        self._op = op
        self._done = loop.create_future()
        try:
            self._send(op, op.initial(loop.time()))
            self._arm()
            await self._done
            self.protocol.retain(op)
        finally:
            self._op = None
            self._done = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._recovering is not None:
                self._recovering.cancel()
                self._recovering = None
        return result

    def _begin(
        self,
        x: np.ndarray,
        out: np.ndarray | None,
        clock: Callable[[], float],
        values16: bool | None = None,
        bfloat16: bool = False,
    ) -> tuple[Allreduce, np.ndarray]:
        """Validate and start one call (both APIs): its state and its result array.
        The call's clock starts (``clock()``) after any compiling: a first call
        with 16-bit data compiles the kernels' 16-bit version here, unless it
        was warmed up (:func:`_warmup_once`), and it waits for a silent switch
        at least :data:`FIRST16_NO_PROGRESS`, as the other workers may be
        compiling theirs meanwhile."""
        if self._op is not None:
            raise RuntimeError("one allreduce at a time per context")
        if not isinstance(x, np.ndarray):
            raise TypeError(f"allreduce takes a numpy array, got {type(x).__name__}")
        wire16 = self.wire16(x, values16, bfloat16)
        dtype = dtype_name(x, bfloat16)
        # (int32 has no 16-bit version: the protocol refuses values16 for it below)
        first16 = not self._had16 and dtype != "int32" and (wire16 or dtype in HALF_DTYPES)
        if first16:
            _warmup16_once(self._pumps)
        result = self.results.empty_like(x) if out is None else out
        op = self.protocol.allreduce(x, result, clock(), values16=wire16, bfloat16=bfloat16)
        if first16:
            self._had16 = True
            op.no_progress = max(op.no_progress, FIRST16_NO_PROGRESS)
        return op, result

    def _retransmit(self, op: Allreduce, now: float) -> None:
        """The timer step (both APIs): raise :class:`NoProgressError` if nothing
        came back for too long, else resend the packets whose deadline passed."""
        op.check(now, where=f"the switch at {self.switch_address}")
        self._send(op, op.handle_timer(now))

    def _probe_due(self, op: Allreduce, now: float) -> bool:
        """Whether to ask the control plane about the switch now: nothing came
        back for PROBE_AFTER, the last probe was PROBE_EVERY ago, and the switch
        says its instance (a switch that does not cannot be resumed)."""
        m = self.membership
        if m is None or m.instance == 0 or self._recovering is not None:
            return False
        if now - op.last_progress < PROBE_AFTER or now < self._next_probe:
            return False
        self._next_probe = now + PROBE_EVERY
        return True

    async def _recover(self, op: Allreduce, clock) -> bool:
        """Restart recovery (docs/protocol.md §5): ask the control plane whether
        the switch is still the instance, and the job still at the epoch, this
        worker joined; if not, resume: report this worker's progress, wait for
        the other ranks to have reported, take the results it lacks and send
        every outstanding packet again. Returns True when the job was resumed.
        A control plane that does not answer is waited for (said once), within
        the call's no-progress limit (``op.no_progress``: ``no_progress``, or
        more for a first 16-bit call), which :meth:`Allreduce.check` keeps
        enforcing."""
        o, m = self.options, self.membership
        ctl = ControlClient(o.control, connect_timeout=1.0)
        try:
            try:
                status = await ctl.status(session_id=m.session_id, rank=o.rank, timeout=1.0)
            except ControlPlaneError as exc:
                if not self._said_waiting:
                    self._said_waiting = True
                    waited = clock() - op.last_progress
                    log.warning(
                        "rank %d: no result for %.1f s and the switch's control plane at %s "
                        "does not answer (%s); waiting up to %.0f s more for the switch to "
                        "come back (no_progress %g s)",
                        o.rank,
                        waited,
                        o.control,
                        exc,
                        max(0.0, op.no_progress - waited),
                        op.no_progress,
                    )
                return False
            if status is None:  # a controller without the call: no recovery here
                self.membership = dataclasses.replace(m, instance=0)
                return False
            if status.instance == m.instance and status.known and status.epoch == m.epoch:
                return False  # the same switch and job: a peer is slow, or packets are lost
            if status.instance != m.instance:
                why = f"restarted (instance {m.instance:x} is now {status.instance:x})"
            elif not status.known:
                why = "no longer holds the job"
            else:
                why = f"rebuilt the job (epoch {m.epoch} is now {status.epoch})"
            log.warning("rank %d: the switch %s; resuming session %d", o.rank, why, m.session_id)
            started = clock()
            budget = max(1.0, op.no_progress - (started - op.last_progress))
            self._resuming = True
            membership, repairs = await ctl.resume(
                self._registration, self.protocol.progress(op), timeout=budget
            )
        finally:
            await ctl.close()
            self._resuming = False
        self._said_waiting = False
        self._use_membership(membership)
        self._discard()
        now = clock()
        self._send(op, op.apply_repairs(repairs, now))
        log.warning(
            "rank %d: session %d resumed at epoch %d after %.2f s (%d lost result%s "
            "from other ranks)",
            o.rank,
            m.session_id,
            membership.epoch,
            now - started,
            len(repairs),
            "" if len(repairs) == 1 else "s",
        )
        return True

    @property
    def _compiled_wait(self) -> bool:
        """Whether this context's calls can wait in compiled code
        (:func:`hostlib.fastpath.wait_and_pump`): the compiled fast path, unless
        ``SWITCHML_POLL=0`` turned the compiled wait off."""
        return self.fast and self._poll

    @property
    def _pumps(self) -> bool:
        """Whether calls may take the event loop's compiled path
        (:func:`hostlib.fastpath.pump`): all but a blocking context's that can
        block (:attr:`can_block` once open)."""
        return not (self.blocking and self._compiled_wait)

    @property
    def can_block(self) -> bool:
        """Whether :meth:`allreduce_blocking` may be used: an open context that
        can wait in compiled code."""
        return self._compiled_wait and self._sock is not None

    def allreduce_blocking(
        self,
        x: np.ndarray,
        out: np.ndarray | None = None,
        *,
        values16: bool | None = None,
        bfloat16: bool = False,
    ) -> np.ndarray:
        """:meth:`allreduce` for blocking callers (:class:`hostlib.Context`), with
        the waiting done in compiled code (:func:`hostlib.fastpath.wait_and_pump`)
        instead of the event loop: the same packets, timers and errors, without
        the interpreter's work per socket wakeup. Needs :attr:`can_block`; the
        context's event loop must not be running."""
        op, result = self._begin(x, out, time.monotonic, values16, bfloat16)
        now = op.last_progress  # the call's start
        if op.done:
            return result
        fd = self._sock.fileno()
        self.stale += self._io.discard_all(fd)  # what arrived between calls, as the reader would
        clock = np.zeros(len(fastpath.Clock))
        clock[fastpath.Clock.NOW] = clock[fastpath.Clock.PROGRESS] = now
        no_progress = op.no_progress
        self._op = op
        try:
            self._send(op, op.initial(now))
            while True:
                # self._io anew each time: a resume may have moved the switch
                status = self._io.wait(fd, clock, op.expected_results, no_progress, op.state)
                op.last_progress = float(clock[fastpath.Clock.PROGRESS])
                if status == fastpath.Run.DONE:
                    break
                if self._sock is None:
                    raise SwitchMLError("the SwitchML context was closed during an allreduce")
                if status == fastpath.Run.TIMER:
                    t = float(clock[fastpath.Clock.NOW])
                    if self._probe_due(op, t) and self._recover_blocking(op):
                        clock[fastpath.Clock.PROGRESS] = op.last_progress
                        continue
                    self._retransmit(op, t)
            self.protocol.retain(op)
        finally:
            self._wakeups = int(clock[fastpath.Clock.WAKEUPS])
            self._record_stats(op)
            self._op = None
        return result

    def _recover_blocking(self, op: Allreduce) -> bool:
        """:meth:`_recover` for :meth:`allreduce_blocking`, with the sockets' readers
        off meanwhile: what arrives waits for the blocking loop (a resume drops
        what is stale itself), so the event loop's compiled path
        (:func:`hostlib.fastpath.pump`), which a blocking context does not warm
        up, is never compiled in the middle of a call."""
        loop = self._loop
        self._blocking_recovery = True
        for sock in (self._sock, self._bsock):
            if sock is not None:
                loop.remove_reader(sock.fileno())
        try:
            return loop.run_until_complete(self._recover(op, time.monotonic))
        finally:
            self._blocking_recovery = False
            for sock in (self._sock, self._bsock):  # a resume may have opened a new one
                if sock is not None:
                    loop.add_reader(sock.fileno(), self._on_readable)

    def _record_stats(self, op: Allreduce) -> None:
        self.last_stats = {
            **{c.name.lower(): int(op.counters[c]) for c in K.Counter},
            "wakeups": self._wakeups,
            "values16": int(op.values16),  # 1: the call was on the 16-bit wire (§4.2)
        }

    def _finish(self, exc: BaseException | None = None) -> None:
        op = self._op
        if op is not None:
            self._record_stats(op)
        if self._done is not None and not self._done.done():
            if exc is None:
                self._done.set_result(None)
            else:
                self._done.set_exception(exc)

    def _send(self, op: Allreduce, n: int) -> None:
        if n == 0:
            return
        if self.fast:
            self._io.send(self._sock.fileno(), op.send, n)
            return  # what the kernel did not take is resent by the retransmission timer
        sendto = self._sock.sendto
        dests = self._dests
        rows = op.proto.rows
        for s in op.send[:n].tolist():
            try:
                sendto(rows[s], dests[s])
            except (BlockingIOError, InterruptedError):
                pass  # buffer full: the retransmission timer resends it
            except OSError as exc:
                self._finish(SwitchMLError(f"cannot send to the switch at {dests[s]}: {exc}"))
                return

    def _discard(self) -> None:
        """Drop what the worker's sockets hold (counted as stale)."""
        sock = self._sock
        if sock is None:
            return
        if self.fast:
            self.stale += self._io.discard_all(sock.fileno())
            return
        while True:
            try:
                sock.recv_into(self._rows[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue
            self.stale += 1

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        if self._resuming:  # results from before the resume: not for the resumed job
            self._discard()
            return
        if self.fast:
            self._on_readable_fast(sock.fileno())
            return
        rows, lens, ok = self._rows, self._lens, self._ok
        ip, ports = self._switch_ip, self._switch_ports
        while True:
            n = 0
            while n < BATCH:
                try:
                    nbytes, addr = sock.recvfrom_into(rows[n])
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    continue
                lens[n] = nbytes
                ok[n] = addr[0] == ip and addr[1] in ports
                n += 1
            if n == 0:
                return
            op = self._op
            if op is None:
                self.stale += n
            else:
                self._wakeups += 1
                self._send(op, op.receive(self._batch, lens, ok, n, self._loop.time()))
                if op.done:
                    self._finish()
            if n < BATCH:
                return

    def _on_readable_fast(self, fd: int) -> None:
        op = self._op
        io = self._io
        if op is None:  # between calls: count and drop
            self.stale += io.discard_all(fd)
            return
        now = self._loop.time()
        before = op.counters[K.Counter.RESULTS]
        io.pump(fd, now, op.state)
        if io.bfd >= 0:
            io.pump(fd, now, op.state, rx_fd=io.bfd)
        self._wakeups += 1
        if op.counters[K.Counter.RESULTS] != before:
            op.last_progress = now
            if op.done:
                self._finish()

    def _arm(self) -> None:
        op = self._op
        if op is None:
            return
        when = min(op.get_timer(), op.last_progress + op.no_progress)
        self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        # read first: after this process was descheduled, results may be waiting in
        # the socket while their timers have expired; resending them would be spurious
        self._on_readable()
        op = self._op
        if op is None or op.done:
            return
        now = self._loop.time()
        if self._resuming:  # nothing is sent meanwhile; no_progress still bounds it
            try:
                op.check(now, where=f"the switch at {self.switch_address}")
            except SwitchMLError as exc:
                self._finish(exc)
                return
            self._arm()
            return
        if self._probe_due(op, now):
            self._recovering = self._loop.create_task(self._recover(op, self._loop.time))
            self._recovering.add_done_callback(self._recovered)
        try:
            self._retransmit(op, now)
        except SwitchMLError as exc:
            self._finish(exc)
            return
        self._arm()

    def _recovered(self, task: asyncio.Task) -> None:
        """A probe or resume of the async API ended (see :meth:`_recover`)."""
        if self._recovering is task:
            self._recovering = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._finish(exc)
        elif self._op is not None and self._op.done:
            self._finish()


#: the kernel versions this process has warmed up: (16-bit, with the event loop's path)
_warmed: set[tuple[bool, bool]] = set()
#: The no-progress limit of a context's first call with 16-bit data, at least:
#: every worker compiles the kernels' 16-bit version on its first such call
#: (unless the job warmed it up ahead, ``Options.values16``), the others wait
#: for its packets meanwhile, and a worker whose cache had them waits longest
#: (measured: 10 s alone; four workers at once on two busy cores, 68-70 s each,
#: 12 s of CPU; docs/performance.md).
FIRST16_NO_PROGRESS = 120.0
#: Seconds a closing worker waits for the controller to acknowledge its Release.
RELEASE_TIMEOUT = 2.0
_background: set[asyncio.Task] = set()  # release tasks of contexts closed in a running loop


def _check_buffer(sock: socket.socket, o: Options) -> None:
    """Warn once per process when the socket cannot hold a window of results
    (twice its bytes: the kernel counts per-datagram overhead too); the
    launcher that already warned sets ``SWITCHML_BUFFER_WARNING=0``."""
    global _buffer_warned
    if _buffer_warned or os.environ.get("SWITCHML_BUFFER_WARNING", "1") == "0":
        return
    need = 2 * o.window * wire.packet_len(o.packet_size)
    advice = buffer_advice(receive_buffer(sock), need, f"worker {o.rank}")
    if advice:
        log.warning(advice)
        _buffer_warned = True


_buffer_warned = False


def _warmup_once(values16: bool = False, pump: bool = True) -> None:
    """Compile (or load) the kernels of 32-bit calls, once per process, and with
    ``values16`` those of calls with 16-bit data too (:func:`_warmup16_once`).
    ``pump``: with the event loop's path (:func:`hostlib.fastpath.pump`), which
    a context that only blocks does not use."""
    if not _warmed_for(False, pump):
        _compile(False, pump)
        _warmed.add((False, pump))
    if values16:
        _warmup16_once(pump)


def _warmup16_once(pump: bool = True) -> None:
    """Compile (or load) the kernels' version for calls with 16-bit data, once
    per process: on the first such call, or ahead (``Options.values16``). A
    compile is logged, with how long the call waited for it."""
    if _warmed_for(True, pump):
        return
    with compiling_said(log, "16-bit kernels", "once per machine; later runs load them"):
        _compile(True, pump)
    _warmed.add((True, pump))


def _warmed_for(values16: bool, pump: bool) -> bool:
    """Whether this process has warmed up the version ``values16`` with (or,
    ``pump`` False, with or without) the event loop's path."""
    return (values16, True) in _warmed or (not pump and (values16, False) in _warmed)


def _compile(values16: bool, pump: bool) -> None:
    """Warm up the protocol's and the I/O loop's kernels: those of 32-bit calls,
    or (``values16``) those of calls with 16-bit data, the event loop's path
    with ``pump``; a Ctrl-C meanwhile is a KeyboardInterrupt
    (:func:`_sigint_noted`)."""
    with _sigint_noted() as interrupted:
        try:
            (warmup16 if values16 else warmup)()
            if fastio.AVAILABLE:
                (fastpath.warmup16 if values16 else fastpath.warmup)(pump=pump)
        except Exception:
            if interrupted:
                raise KeyboardInterrupt from None
            raise
    if interrupted:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _sigint_noted() -> Iterator[list[int]]:
    """Note every SIGINT while the body runs (the yielded list grows), raising
    KeyboardInterrupt as usual. Numba compiles through LLVM callbacks called by
    ctypes, which swallows an exception raised inside them: a Ctrl-C there would
    be lost or surface as "RuntimeError: no compiled object yet"; the caller
    turns either into the KeyboardInterrupt the user asked for. Only in the main
    thread with Python's default handler (elsewhere nothing changes)."""
    noted: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield noted
        return

    def handler(signum: int, frame: object) -> None:
        noted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _worker_socket(ip: str, port: int, o: Options) -> socket.socket:
    """A worker's UDP socket on ``ip:port`` (0: any free port), non-blocking,
    with large buffers; a port in use is a :class:`SwitchMLError` that says why
    that port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        set_socket_buffers(sock)
        _check_buffer(sock, o)
        sock.bind((ip, port))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if port == 0:
            raise
        raise SwitchMLError(
            f"cannot bind the shared worker port {ip}:{port}: {exc.strerror or exc} (the "
            "switch knows workers by IP alone, so all workers of the job send from one "
            "port; choose another with worker_port= or SWITCHML_WORKER_PORT)"
        ) from None
    return sock


def _route_source(host: str) -> str:
    """The local IPv4 address the kernel would send from to reach ``host``."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        return probe.getsockname()[0]
    except OSError as exc:
        raise OSError(f"no route to the switch at {host}: {exc.strerror or exc}") from None
    finally:
        probe.close()
