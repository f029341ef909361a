"""The control-plane model shared by the emulator and the Tofino: what a SwitchML
controller writes into a switch, and the session rules (docs/protocol.md §5) that decide it.

Theory of operation
-------------------
A SwitchML switch is programmed through a handful of tables (p4/README.md, "The
control plane's part"):

* the switch's own address: IPv4, MAC (ARP and ping replies; what UdpSession
  returns) and, in the emulator, its data-plane UDP ports;
* per job: num_workers, size code and a pool of P slots -- on a Tofino a range
  ``[pool_base, pool_base + P)`` of the one register pool that all jobs share,
  in the emulator arrays of its own;
* the worker table: source ``(ipv4, udp_port)`` (port 0 = any port) -> job,
  worker id, num_workers, multicast group;
* the destination table: ``(job, worker id)`` -> ipv4, udp_port, mac, and per
  job the multicast group of those destinations;
* drop simulation: the probability of dropping a packet on ingress and a result
  on egress (as p4app-switchML's controller sets it), for testing loss recovery.

A :class:`Target` writes those tables and decides nothing: it allocates what its
hardware needs (job entries, slot ranges, multicast groups), says whether it has
room, and reports what it holds. :class:`SessionController` holds every rule of
§5 -- validation, rank 0 replacing the session and fixing its parameters, other
ranks agreeing with it, a rank registering again replacing its address, an
address belonging to one worker of one job -- and drives any target with the
same calls -- and the job lifetime rules (docs/lifetime.md): a job is freed
when every one of its ranks released it (:meth:`SessionController.release_rank`,
the ``Release`` RPC), and a rank 0 registration that finds the switch full may
evict the jobs idle longest (:attr:`TargetLimits.evict_after`). Two targets exist:

* :class:`swemu.core.engine.EmulatorTarget`, over the engine's tables (it lives beside
  them in the engine module);
* ``p4.controller.TofinoTarget``, over BF Runtime and the mirror P4 program.

Both answer :meth:`Target.read_state` in one normalised form, in session terms
(see :func:`table_state`), so that one registration sequence applied to both
can be compared entry for entry; what only one target has (job indices, slot
ranges, multicast group ids) is kept apart under the ``"target"`` key.

This module imports nothing heavy (no numpy, no Numba): a hardware controller
runs it on the switch's CPU next to the SDE's Python.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("swemu.controller")

INVALID_ARGUMENT = "INVALID_ARGUMENT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

#: Size codes docs/protocol.md §1 defines (a request above is refused whatever the target).
SIZE_CODES = range(8)
#: Value formats docs/protocol.md §5 defines (``ValueFormats``): 0, p4app-switchML's
#: 32-bit values; 1, the 16-bit format beside them (extension, §4.2).
VALUE_FORMATS = range(2)
#: Bits of the worker bitmap: the most workers any SwitchML job can have.
BITMAP_WORKERS = 32


class RegistrationError(Exception):
    """A refused control-plane request; ``code`` names the gRPC status to answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # INVALID_ARGUMENT or RESOURCE_EXHAUSTED
        self.message = message


# ----------------------------------------------------------------------------- model
@dataclass(frozen=True)
class SwitchAddress:
    """Where workers reach the switch: what UdpSession answers, what ARP resolves."""

    ipv4: int
    mac: int = 0
    data_ports: tuple[int, ...] = ()  # empty: the port the worker was configured with


@dataclass(frozen=True)
class DropSimulation:
    """Simulated loss: the probability of dropping a worker's packet on ingress and
    each result copy on egress. p4app-switchML quantises them to 16 bits
    (``int(0xFFFF * p)``); :meth:`threshold` gives that value."""

    ingress: float = 0.0
    egress: float = 0.0

    def __post_init__(self) -> None:
        for name in ("ingress", "egress"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} drop probability must be in [0, 1], got {p}")

    @property
    def active(self) -> bool:
        return self.ingress > 0.0 or self.egress > 0.0

    @staticmethod
    def threshold(p: float) -> int:
        """A 16-bit random number below this is a drop (p4app-switchML's encoding)."""
        return int(0xFFFF * p)


@dataclass(frozen=True)
class JobParams:
    """What rank 0's UdpSession fixes for a session (docs/protocol.md §5)."""

    session_id: int
    num_workers: int
    size_code: int
    pool_size: int
    # ValueFormats: 1 = the job's packets may carry 16-bit values (docs/protocol.md
    # §4.2), and its results echo the format bit of the packet that triggered them
    value_formats: int = 0


@dataclass(frozen=True)
class WorkerAddress:
    """A worker's address: it sends from it and gets results there (udp_port 0: any
    source port, results to the triggering packet's source port)."""

    ipv4: int
    udp_port: int = 0
    mac: int = 0
    broadcast: bool = False  # also takes results on 127.255.255.255 (UdpSession extension)


@dataclass(frozen=True)
class TargetLimits:
    """What a target can hold per job; requests beyond are INVALID_ARGUMENT.

    ``emulator_size_code`` is set by software switches only: the size code they
    serve fastest, which UdpSession's reply announces (``EmulatorInfo``) so that
    the host library uses it by default. ``evict_after``: a rank 0 registration
    that finds no room may evict jobs idle at least this long (None: never; a
    target must also offer ``last_active`` and ``room_after``).
    """

    max_workers: int
    max_pool_size: int
    default_pool_size: int  # what a request with pool_size 0 gets
    size_codes: frozenset[int]
    emulator_size_code: int | None = None
    evict_after: float | None = None
    value_formats: frozenset[int] = frozenset({0})  # ValueFormats the target echoes


@dataclass
class Session:
    """The controller's record of one registered session."""

    params: JobParams
    handle: Any  # the target's job (an engine Job, a Tofino job entry, ...)
    workers: dict[int, WorkerAddress] = field(default_factory=dict)  # rank -> address
    released_ranks: set[int] = field(default_factory=set)  # ranks done with the job
    # restart recovery: 1 when registered, one more each time the job is resumed
    # (:meth:`SessionController.resume`); workers compare it with the one they joined
    epoch: int = 1

    @property
    def session_id(self) -> int:
        return self.params.session_id


class Target(Protocol):
    """The tables of a SwitchML switch, written by :class:`SessionController`.

    A target checks nothing about sessions: the controller calls it only with
    writes that follow §5 (an address is free before :meth:`set_worker`, a rank
    is removed before it is set again, ...). Methods that may refuse return the
    :class:`RegistrationError` to raise instead of raising it, so that the
    controller can ask every question before it changes anything.
    """

    @property
    def limits(self) -> TargetLimits: ...

    def set_switch_address(self, address: SwitchAddress) -> None:
        """Install the switch's address (ARP/ping entries on hardware)."""

    def room_for_job(self, job: JobParams, replacing: Any | None) -> RegistrationError | None:
        """None if ``job`` fits once ``replacing`` (a handle, or None) is gone."""

    def check_worker(self, worker: WorkerAddress) -> RegistrationError | None:
        """None if the target can reach ``worker`` (hardware: a port and a MAC)."""

    def create_job(self, job: JobParams, *, now: float) -> Any:
        """Allocate a job with a fresh (zeroed) pool and no workers; return its handle."""

    def delete_job(self, handle: Any, *, why: str) -> None:
        """Remove a job, its workers' entries and its pool (``why``: replaced/explicit)."""

    def set_worker(self, handle: Any, rank: int, worker: WorkerAddress, *, now: float) -> None:
        """Add worker ``rank`` of a job: worker-table entry, destination, group member."""

    def remove_worker(self, handle: Any, rank: int) -> None:
        """Remove what :meth:`set_worker` added for ``rank``."""

    def broadcast_port(self, handle: Any) -> int:
        """The port a job's loopback workers may take its results on (127.255.255.255;
        the emulator's extension of UdpSession); 0 where the target has none."""

    def set_drop_simulation(self, drops: DropSimulation) -> None:
        """Set the simulated loss (hardware without a drop simulator refuses)."""

    def watch_releases(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(handle)`` whenever the target frees a job by itself (the
        emulator's idle timeout); a target that never does may ignore it."""

    def read_state(self) -> dict[str, Any]:
        """The tables as :func:`table_state` builds them (tests, inspection)."""

    # Optional, for eviction (limits.evict_after); a target without them never evicts:
    #   last_active(handle) -> float | None: the controller's clock at the job's last
    #       packet or registration (None: unknown);
    #   room_after(job, freeing: list[handle]) -> RegistrationError | None: room_for_job
    #       once every job in ``freeing`` is gone.


# ----------------------------------------------------------------------------- state
def ipv4_str(ip: int) -> str:
    return str(ipaddress.IPv4Address(ip))


def mac_str(mac: int) -> str:
    return ":".join(f"{(mac >> s) & 0xFF:02x}" for s in range(40, -8, -8))


def table_state(
    *,
    switch: SwitchAddress | None,
    drops: DropSimulation,
    jobs: dict[int, JobParams],
    workers: list[tuple[int, int, int, int]],
    destinations: list[tuple[int, int, WorkerAddress]],
    multicast: dict[int, list[int]],
    target: dict[str, Any],
) -> dict[str, Any]:
    """The normalised table state both targets report.

    ``workers`` are worker-table entries ``(ipv4, udp_port, session_id, worker_id)``
    (num_workers is the job's), ``destinations`` are ``(session_id, worker_id,
    address)``, ``multicast`` maps a session to the worker ids of its group.
    Lists are sorted, so that equal tables give equal dicts.
    """
    return {
        "switch": None
        if switch is None
        else {
            "ipv4": ipv4_str(switch.ipv4),
            "mac": mac_str(switch.mac),
            "data_ports": list(switch.data_ports),
        },
        "drop_simulation": {"ingress": drops.ingress, "egress": drops.egress},
        "jobs": {
            sid: {
                "num_workers": p.num_workers,
                "size_code": p.size_code,
                "pool_size": p.pool_size,
                "value_formats": p.value_formats,
            }
            for sid, p in sorted(jobs.items())
        },
        "workers": [
            {
                "ipv4": ipv4_str(ip),
                "udp_port": port,
                "session_id": sid,
                "worker_id": w,
                "num_workers": jobs[sid].num_workers,
            }
            for ip, port, sid, w in sorted(workers)
        ],
        "destinations": [
            {
                "session_id": sid,
                "worker_id": w,
                "ipv4": ipv4_str(a.ipv4),
                "udp_port": a.udp_port,
                "mac": mac_str(a.mac),
            }
            for sid, w, a in sorted(destinations, key=lambda d: (d[0], d[1]))
        ],
        "multicast": {sid: sorted(ranks) for sid, ranks in sorted(multicast.items())},
        "target": target,
    }


# ----------------------------------------------------------------------------- rules
class SessionController:
    """docs/protocol.md §5 on top of a :class:`Target`: the one place its rules live.

    Every request is checked completely before anything is written, so a refused
    request leaves the switch as it was.
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.sessions: dict[int, Session] = {}
        self._owner: dict[tuple[int, int], tuple[int, int]] = {}  # (ip, port) -> (sid, rank)
        self.switch: SwitchAddress | None = None
        self.drops = DropSimulation()
        target.watch_releases(self._released)

    # -------------------------------------------------------------- switch-wide
    def set_switch_address(
        self, ipv4: int, mac: int = 0, data_ports: tuple[int, ...] | list[int] = ()
    ) -> SwitchAddress:
        """Set the address UdpSession answers with (and the target's ARP entries)."""
        if not 0 < ipv4 < (1 << 32):
            raise ValueError(f"switch ipv4 {ipv4} is not a usable IPv4 address")
        if not 0 <= mac < (1 << 48):
            raise ValueError(f"switch mac {mac:#x} is not a 48-bit MAC address")
        address = SwitchAddress(ipv4, mac, tuple(int(p) for p in data_ports))
        self.target.set_switch_address(address)
        self.switch = address
        return address

    def set_drop_simulation(self, ingress: float = 0.0, egress: float = 0.0) -> DropSimulation:
        """Set the simulated loss; ValueError for a probability outside [0, 1]."""
        drops = DropSimulation(ingress, egress)
        self.target.set_drop_simulation(drops)
        self.drops = drops
        return drops

    # ------------------------------------------------------------------ sessions
    def register(
        self,
        *,
        session_id: int,
        rank: int,
        num_workers: int,
        ipv4: int,
        udp_port: int = 0,
        packet_size: int = 1,
        pool_size: int = 0,
        mac: int = 0,
        now: float = 0.0,
        loopback_broadcast: bool = False,
        value_formats: int = 0,
    ) -> Session:
        """Register worker ``rank`` of a session (UdpSession); raise RegistrationError.

        Rank 0 replaces the session (its registrations and slot state go) and fixes
        num_workers, packet_size, pool_size and value_formats; other ranks must match them. A rank
        registering again replaces its address; an address registered again leaves
        whichever worker of whichever job held it.
        """
        params, worker = self._check_request(
            session_id=session_id,
            rank=rank,
            num_workers=num_workers,
            ipv4=ipv4,
            udp_port=udp_port,
            packet_size=packet_size,
            pool_size=pool_size,
            mac=mac,
            loopback_broadcast=loopback_broadcast,
            value_formats=value_formats,
        )
        return self._register(params, rank, worker, now)

    def _check_request(
        self,
        *,
        session_id: int,
        rank: int,
        num_workers: int,
        ipv4: int,
        udp_port: int,
        packet_size: int,
        pool_size: int,
        mac: int,
        loopback_broadcast: bool,
        value_formats: int = 0,
    ) -> tuple[JobParams, WorkerAddress]:
        """A registration's own checks (none against other sessions): its job's
        parameters and the worker's address, or RegistrationError."""
        limits = self.target.limits
        bad = INVALID_ARGUMENT
        if session_id == 0:
            raise RegistrationError(bad, "session_id must be non-zero")
        if packet_size not in SIZE_CODES:
            raise RegistrationError(bad, f"packet_size {packet_size} is not a size code 0..7")
        if packet_size not in limits.size_codes:
            codes = ", ".join(map(str, sorted(limits.size_codes)))
            raise RegistrationError(
                bad, f"packet_size {packet_size} is not supported by this switch (it has: {codes})"
            )
        if value_formats not in VALUE_FORMATS:
            raise RegistrationError(
                bad, f"value_formats {value_formats} is not a ValueFormats value 0..1"
            )
        if value_formats not in limits.value_formats:
            raise RegistrationError(
                bad, f"value_formats {value_formats} is not supported by this switch"
            )
        if not 1 <= num_workers <= limits.max_workers:
            raise RegistrationError(
                bad, f"num_workers {num_workers} must be in 1..{limits.max_workers}"
            )
        if not 0 <= rank < num_workers:
            raise RegistrationError(bad, f"rank {rank} must be in 0..{num_workers - 1}")
        if not 0 <= udp_port <= 0xFFFF:
            raise RegistrationError(bad, f"udp_port {udp_port} must be in 0..65535")
        if not 0 < ipv4 < (1 << 32):
            raise RegistrationError(bad, f"ipv4 {ipv4} is not a usable IPv4 address")
        if not 0 <= mac < (1 << 48):
            raise RegistrationError(bad, f"mac {mac:#x} is not a 48-bit MAC address")
        if pool_size > limits.max_pool_size:
            raise RegistrationError(
                bad,
                f"pool_size {pool_size} exceeds this switch's per-job limit of "
                f"{limits.max_pool_size}",
            )
        params = JobParams(
            session_id,
            num_workers,
            packet_size,
            pool_size or limits.default_pool_size,
            value_formats,
        )
        return params, WorkerAddress(ipv4, udp_port, mac, bool(loopback_broadcast))

    def _register(self, params: JobParams, rank: int, worker: WorkerAddress, now: float) -> Session:
        """Register a checked request (:meth:`register`'s rules against the
        other sessions, then the writes)."""
        bad = INVALID_ARGUMENT
        session_id, num_workers = params.session_id, params.num_workers
        packet_size = params.size_code
        session = self.sessions.get(session_id)
        evict: list[Session] = []
        no_room: RegistrationError | None = None  # why a rank 0 must evict
        if rank == 0:
            no_room = self.target.room_for_job(params, session.handle if session else None)
            if no_room is not None:
                evict = self._eviction(params, session, no_room, now)
        elif session is None:
            raise RegistrationError(
                bad, f"session {session_id} has no rank 0 registration; rank 0 registers first"
            )
        elif params != session.params:
            have = session.params
            raise RegistrationError(
                bad,
                f"rank {rank} asks for num_workers={num_workers}, packet_size={packet_size}, "
                f"pool_size={params.pool_size}, value_formats={params.value_formats} but rank 0 "
                f"registered num_workers={have.num_workers}, packet_size={have.size_code}, "
                f"pool_size={have.pool_size}, value_formats={have.value_formats}",
            )
        refusal = self.target.check_worker(worker)
        if refusal is not None:
            raise refusal

        # every check passed: write
        for victim in evict:
            last = self._last_active(victim)
            log.info(
                "evicted session %d (idle for %.1f s, --evict-after %g s) to make room "
                "for session %d: %s",
                victim.session_id,
                now - (now if last is None else last),
                self.target.limits.evict_after,
                session_id,
                no_room.message if no_room is not None else "no room",
            )
            self._delete(victim, "evicted")
        if rank == 0:
            if session is not None:
                self._delete(session, "replaced")
            session = Session(params, self.target.create_job(params, now=now))
            self.sessions[session_id] = session
        assert session is not None
        session.released_ranks.discard(rank)  # registering again: not done any more
        self._place(session, rank, worker, now)
        return session

    def resume(self, requests: list[dict[str, Any]], now: float = 0.0) -> Session:
        """Register every rank of a job at once (the ``Resume`` RPC, after a switch
        restart or a rebuild); ``requests[r]`` holds :meth:`register`'s keyword
        arguments for rank r (``now`` apart). Raise RegistrationError.

        All requests are checked first, against each other too (one per rank
        0..W-1, the same job parameters); then the job is made anew exactly as
        rank 0's registration followed by the others' would make it (a job of the
        session still here is replaced: its pools go), and its epoch is one more
        than the replaced job's (1 when there was none: a restarted switch)."""
        if not requests:
            raise RegistrationError(INVALID_ARGUMENT, "a resume needs the job's ranks")
        checked = [self._check_request(**req) for req in requests]
        params = checked[0][0]
        ranks = sorted(req["rank"] for req in requests)
        if ranks != list(range(params.num_workers)):
            raise RegistrationError(
                INVALID_ARGUMENT,
                f"a resume of session {params.session_id} needs each of its "
                f"{params.num_workers} ranks once, got ranks {ranks}",
            )
        for req, (other, _) in zip(requests, checked):
            if other != params:
                raise RegistrationError(
                    INVALID_ARGUMENT,
                    f"rank {req['rank']} resumes with {other} but rank {requests[0]['rank']} "
                    f"with {params}",
                )
        old = self.sessions.get(params.session_id)
        epoch = old.epoch + 1 if old is not None else 1
        order = sorted(zip(requests, checked), key=lambda pair: pair[0]["rank"])
        session = None
        for req, (job, worker) in order:
            session = self._register(job, req["rank"], worker, now)
        assert session is not None
        session.epoch = epoch
        return session

    def broadcast_port(self, session: Session) -> int:
        """The port a job's workers may take its results on (127.255.255.255:port,
        emulator on loopback only); 0 where the target offers none."""
        return self.target.broadcast_port(session.handle)

    def release(self, session_id: int) -> bool:
        """Remove a session and free its pool; False if it does not exist."""
        session = self.sessions.get(session_id)
        if session is None:
            return False
        self._delete(session, "explicit")
        return True

    def release_rank(
        self, session_id: int, rank: int, ipv4: int, udp_port: int = 0
    ) -> tuple[bool, bool, int]:
        """Rank ``rank`` (registered at ``ipv4:udp_port``) is done with its job
        (the ``Release`` RPC); return ``(found, freed, remaining)``.

        The job is freed once every one of its ranks released it, not at rank 0's
        release: a worker that lost a result may still be retransmitting, and the
        switch answers it from the shadow copy only while the job exists. A
        release from an address the session does not hold for ``rank`` (a worker
        of a session since replaced, expired or evicted) changes nothing.
        """
        session = self.sessions.get(session_id)
        if session is None:
            return False, False, 0
        worker = session.workers.get(rank)
        if worker is None or (worker.ipv4, worker.udp_port) != (ipv4, udp_port):
            return False, False, session.params.num_workers - len(session.released_ranks)
        session.released_ranks.add(rank)
        remaining = session.params.num_workers - len(session.released_ranks)
        if remaining > 0:
            return True, False, remaining
        self._delete(session, "explicit")
        return True, True, 0

    def owner_of(self, ipv4: int, udp_port: int) -> tuple[int, int] | None:
        """``(session_id, rank)`` registered at exactly this address, or None."""
        return self._owner.get((ipv4, udp_port))

    def read_state(self) -> dict[str, Any]:
        """The target's tables (see :func:`table_state`)."""
        return self.target.read_state()

    # ------------------------------------------------------------------ helpers
    def _place(self, session: Session, rank: int, worker: WorkerAddress, now: float) -> None:
        """Put ``rank`` at ``worker``: the address leaves its previous holder, the rank
        leaves its previous address."""
        addr = (worker.ipv4, worker.udp_port)
        holder = self._owner.get(addr)
        if holder is not None:
            other = self.sessions[holder[0]]
            del other.workers[holder[1]]
            del self._owner[addr]
            self.target.remove_worker(other.handle, holder[1])
        previous = session.workers.pop(rank, None)
        if previous is not None:
            del self._owner[(previous.ipv4, previous.udp_port)]
            self.target.remove_worker(session.handle, rank)
        session.workers[rank] = worker
        self._owner[addr] = (session.session_id, rank)
        self.target.set_worker(session.handle, rank, worker, now=now)

    def _forget(self, session: Session) -> None:
        del self.sessions[session.session_id]
        for w in session.workers.values():
            self._owner.pop((w.ipv4, w.udp_port), None)

    def _delete(self, session: Session, why: str) -> None:
        self._forget(session)
        self.target.delete_job(session.handle, why=why)

    def _last_active(self, session: Session) -> float | None:
        last_active = getattr(self.target, "last_active", None)
        return None if last_active is None else last_active(session.handle)

    def _eviction(
        self, job: JobParams, session: Session | None, refusal: RegistrationError, now: float
    ) -> list[Session]:
        """The sessions to evict, idle longest first, so that ``job`` fits (the
        fewest that do); raise ``refusal`` if no such set exists. Only jobs idle
        for ``evict_after`` seconds are candidates, never the session being
        replaced; nothing is written here."""
        limit = self.target.limits.evict_after
        room_after = getattr(self.target, "room_after", None)
        if (
            refusal.code != RESOURCE_EXHAUSTED
            or limit is None
            or room_after is None
            or not hasattr(self.target, "last_active")
        ):
            raise refusal
        idle: list[tuple[float, Session]] = []
        for other in self.sessions.values():
            last = self._last_active(other)
            if other is not session and last is not None and now - last >= limit:
                idle.append((last, other))
        idle.sort(key=lambda pair: pair[0])
        freeing = [session.handle] if session is not None else []
        chosen: list[Session] = []
        for _, other in idle:
            chosen.append(other)
            if room_after(job, freeing + [c.handle for c in chosen]) is None:
                return chosen
        raise RegistrationError(
            refusal.code,
            f"{refusal.message}, and no job can be evicted for it: "
            f"{len(idle)} of {len(self.sessions)} jobs have been idle for {limit:g} s "
            "(--evict-after)",
        )

    def _released(self, handle: Any) -> None:
        """The target freed a job by itself (idle timeout): forget the session."""
        for session in list(self.sessions.values()):
            if session.handle is handle:
                self._forget(session)
