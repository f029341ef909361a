"""An in-memory network: one switch engine, N worker protocol engines, virtual time.

No sockets and no clock: packets are events in a heap, delivered after a
latency plus a random extra delay (reordering), and may be dropped or
duplicated in either direction — all from one seeded RNG, so every failure
reproduces. Timers of the workers fire in virtual time. This is where the
exactly-once property of the shadow-copy protocol is tested.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

import numpy as np

from swemu.core.engine import EngineConfig, SwitchEngine
from swemu.protocol import wire
from swemu.protocol.worker.protocol import Timing, WorkerProtocol

SWITCH = (0x0A000064, wire.DEFAULT_UDP_PORT)


@dataclass
class Faults:
    """Per-direction fault probabilities and delays (seconds)."""

    loss_up: float = 0.0  # worker -> switch
    loss_down: float = 0.0  # switch -> worker
    dup: float = 0.0
    reorder: float = 0.0  # max extra random delay
    latency: float = 50e-6


class Fabric:
    """Wires a :class:`SwitchEngine` to ``num_workers`` :class:`WorkerProtocol` s."""

    def __init__(
        self,
        num_workers: int,
        *,
        size_code: int = 0,
        window: int = 4,
        faults: Faults | None = None,
        seed: int = 0,
        timing: Timing | None = None,
        value_formats: int = 1,
    ) -> None:
        self.w = num_workers
        self.faults = faults or Faults()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.engine = SwitchEngine(EngineConfig(pool_size=max(window, 1)))
        self.addrs = [(0x0A000001 + r, 40000 + r) for r in range(num_workers)]
        self.rank_of = {a: r for r, a in enumerate(self.addrs)}
        for r, (ip, port) in enumerate(self.addrs):
            self.engine.register(
                session_id=1,
                rank=r,
                num_workers=num_workers,
                ipv4=ip,
                udp_port=port,
                packet_size=size_code,
                pool_size=window,
                value_formats=value_formats,
            )
        # the workers are told how late the network may deliver (see Timing.reorder_guard)
        self.timing = timing or Timing(
            timeout=0.002, max_timeout=0.05, no_progress=30.0, reorder_guard=self.faults.reorder
        )
        self.protos = [
            WorkerProtocol(
                num_workers=num_workers, size_code=size_code, window=window, timing=self.timing
            )
            for _ in range(num_workers)
        ]
        self.plen = wire.packet_len(size_code)
        self._events: list = []
        self._seq = 0
        self.delivered = {"up": 0, "down": 0, "lost": 0, "dup": 0}

    def _post(self, data: bytes, direction: str, who: int) -> None:
        f = self.faults
        loss = f.loss_up if direction == "up" else f.loss_down
        _send_over(self, f, loss, self.delivered, direction, who, data)

    def allreduce(
        self,
        inputs: list[np.ndarray],
        max_time: float = 600.0,
        outs: list[np.ndarray] | None = None,
        values16: bool = False,
        bfloat16: bool = False,
    ) -> list[np.ndarray]:
        """Run one allreduce of ``inputs`` (one per worker) to completion, into
        ``outs`` if given (``values16``: on the 16-bit wire, docs/protocol.md §4.2;
        ``bfloat16``: uint16 inputs hold bfloat16 patterns)."""
        outs_in = outs or [None] * len(inputs)
        ops = [
            p.allreduce(x, o, self.now, values16=values16, bfloat16=bfloat16)
            for p, x, o in zip(self.protos, inputs, outs_in)
        ]
        outs = [op.out for op in ops]
        for r, op in enumerate(ops):
            for pkt in op.packets(op.initial(self.now)):
                self._post(bytes(pkt), "up", r)
        buf = np.zeros((1, self.plen + 1), np.uint8)
        lens = np.zeros(1, np.int32)
        ok = np.ones(1, np.uint8)
        while not all(op.done for op in ops):
            timers = [(op.get_timer(), r) for r, op in enumerate(ops) if not op.done]
            t_timer, r_timer = min(timers)
            if self._events and self._events[0][0] <= t_timer:
                when, _, direction, who, data = heapq.heappop(self._events)
                self.now = max(self.now, when)
                if direction == "up":
                    self.delivered["up"] += 1
                    _, out = self.engine.receive_datagram(data, self.addrs[who], self.now)
                    for pkt, dst in out:
                        self._post(pkt, "down", self.rank_of[dst])
                else:
                    self.delivered["down"] += 1
                    op = ops[who]
                    buf[0, : len(data)] = np.frombuffer(data, np.uint8)
                    lens[0] = len(data)
                    for s in op.packets(op.receive(buf, lens, ok, 1, self.now)):
                        self._post(bytes(s), "up", who)
            else:
                self.now = max(self.now, t_timer)
                op = ops[r_timer]
                op.check(self.now)
                for s in op.packets(op.handle_timer(self.now)):
                    self._post(bytes(s), "up", r_timer)
            if self.now > max_time:
                raise TimeoutError(f"allreduce did not finish in {max_time} s of virtual time")
        return [o.view(x.dtype).reshape(x.shape) for o, x in zip(outs, inputs)]


class RestartFabric(Fabric):
    """A :class:`Fabric` whose switch can restart, and whose workers run their
    own sequences of calls (a worker that finishes a call starts its next one at
    once, so workers drift apart by up to a call, as real ones do).

    A restart replaces the engine with a fresh one (a new instance): packets on
    their way to the switch land on the new one (unknown sources until the job
    is resumed), results already sent still arrive. The workers follow the host
    library's recovery (hostlib.client): a worker that has had no result for
    ``probe_after`` asks the "control plane" (here: compares the instance it
    joined with the current one); once every rank asked, the job is registered
    anew, :func:`~swemu.protocol.worker.recovery.plan_repairs` decides which
    results each rank lacks, and each applies them and resends what is
    outstanding (:meth:`~swemu.protocol.worker.protocol.Allreduce.apply_repairs`).
    A worker with no call left joins the resume at once (a real one joins at
    its next call)."""

    def __init__(self, *args, probe_after: float = 0.02, values16: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.values16 = values16  # every call on the 16-bit wire (docs/protocol.md §4.2)
        self.instance = 1
        self.joined = [1] * self.w  # the instance each worker registered with
        self.probe_after = probe_after
        self.restarts = 0
        self.repaired = 0  # results handed from rank to rank at resumes
        self._config = (kwargs.get("window", 4), kwargs.get("size_code", 0))

    def restart(self) -> None:
        """The switch crashes and comes back empty, on the same address."""
        window, _ = self._config
        self.engine = SwitchEngine(EngineConfig(pool_size=max(window, 1)))
        self.instance += 1
        self.restarts += 1

    def _resume(self, ops: list) -> None:
        from swemu.protocol.worker.recovery import plan_repairs

        window, code = self._config
        progress = {r: p.progress(ops[r]) for r, p in enumerate(self.protos)}
        repairs = plan_repairs(progress)
        for r, (ip, port) in enumerate(self.addrs):
            self.engine.register(
                session_id=1,
                rank=r,
                num_workers=self.w,
                ipv4=ip,
                udp_port=port,
                packet_size=code,
                pool_size=window,
                value_formats=1,
            )
        for r, op in enumerate(ops):
            self.joined[r] = self.instance
            self.repaired += len(repairs[r])
            if op is None:
                assert not repairs[r], "a worker with no call cannot lack a result"
                continue
            for pkt in op.packets(op.apply_repairs(repairs[r], self.now)):
                self._post(bytes(pkt), "up", r)

    def run(
        self,
        calls: list[list[np.ndarray]],
        restart_after: list[int] = (),
        max_time: float = 600.0,
    ) -> list[list[np.ndarray]]:
        """Worker r runs ``calls[r]`` in order; the switch restarts once
        ``restart_after[i]`` packets have reached it (counting both
        directions). Returns each worker's results."""
        w = self.w
        pending = sorted(restart_after)
        results: list[list[np.ndarray]] = [[] for _ in range(w)]
        nxt = [0] * w
        ops: list = [None] * w
        asked: set[int] = set()  # ranks waiting in the resume rendezvous
        resuming = False  # every rank asked: the switch resumes the job soon
        next_probe = [0.0] * w
        buf = np.zeros((1, self.plen + 1), np.uint8)
        lens = np.zeros(1, np.int32)
        ok = np.ones(1, np.uint8)
        moved = 0

        def start(r: int) -> None:
            if nxt[r] == len(calls[r]):
                ops[r] = None
                return
            op = self.protos[r].allreduce(calls[r][nxt[r]], None, self.now, values16=self.values16)
            ops[r] = op
            for pkt in op.packets(op.initial(self.now)):
                self._post(bytes(pkt), "up", r)

        def finished(r: int) -> None:
            op = ops[r]
            self.protos[r].retain(op)
            x = calls[r][nxt[r]]
            results[r].append(op.out.copy().view(x.dtype).reshape(x.shape))
            nxt[r] += 1
            start(r)

        for r in range(w):
            start(r)
        while any(op is not None for op in ops):
            for r in range(w):
                if ops[r] is not None and ops[r].done:
                    finished(r)
            # idle workers join a resume at once (a real one at its next call)
            if len(asked) and any(ops[r] is None and r not in asked for r in range(w)):
                asked |= {r for r in range(w) if ops[r] is None}
            if len(asked) == w and not resuming:
                # every rank has asked and sends no more: the switch registers the
                # job once what they sent before has arrived (docs/protocol.md §5)
                resuming = True
                self._seq += 1
                when = self.now + self.faults.latency + self.faults.reorder + 1e-6
                heapq.heappush(self._events, (when, self._seq, "resume", -1, b""))
            live = [(op.get_timer(), r) for r, op in enumerate(ops) if op is not None]
            if not live:
                break
            t_timer, r_timer = min(live)
            if self._events and self._events[0][0] <= t_timer:
                when, _, direction, who, data = heapq.heappop(self._events)
                self.now = max(self.now, when)
                moved += 1
                if pending and moved >= pending[0]:
                    pending.pop(0)
                    self.restart()
                if direction == "resume":
                    asked.clear()
                    resuming = False
                    self._resume(ops)
                elif direction == "up":
                    self.delivered["up"] += 1
                    _, out = self.engine.receive_datagram(data, self.addrs[who], self.now)
                    for pkt, dst in out:
                        self._post(pkt, "down", self.rank_of[dst])
                else:
                    self.delivered["down"] += 1
                    op = ops[who]
                    if op is None or who in asked:  # resuming: results are dropped
                        continue
                    buf[0, : len(data)] = np.frombuffer(data, np.uint8)
                    lens[0] = len(data)
                    for s in op.packets(op.receive(buf, lens, ok, 1, self.now)):
                        self._post(bytes(s), "up", who)
            else:
                self.now = max(self.now, t_timer)
                op = ops[r_timer]
                if (
                    self.now - op.last_progress >= self.probe_after
                    and self.now >= next_probe[r_timer]
                ):
                    next_probe[r_timer] = self.now + self.probe_after
                    if self.joined[r_timer] != self.instance:
                        asked.add(r_timer)
                op.check(self.now)
                sent = op.packets(op.handle_timer(self.now))
                if r_timer in asked:
                    continue  # resuming: nothing is sent (the timers still run)
                for s in sent:
                    self._post(bytes(s), "up", r_timer)
            if self.now > max_time:
                raise TimeoutError(f"the calls did not finish in {max_time} s of virtual time")
        return results


class TreeFabric:
    """Two levels of switch engines: workers -> child switches -> a root, all in
    memory, with loss, duplication and reordering on every link (each direction
    of worker-child and child-root links), from one seeded RNG.

    ``groups[c]`` lists the ranks whose switch is child c. Each child's job has
    its local workers as members and the root as parent
    (:meth:`SwitchEngine.set_parent`); the root's job has the children's
    uplinks as members. A single group is one switch serving the job alone (no
    root, no hop), as the fabric's control plane arranges it. Children time
    their uplinks like workers (the workers' Timing, reorder guard included)."""

    ROOT = (0x0A00FF01, wire.DEFAULT_UDP_PORT)

    def __init__(
        self,
        groups: list[list[int]],
        *,
        size_code: int = 0,
        window: int = 4,
        faults: Faults | None = None,
        uplink_faults: Faults | None = None,
        seed: int = 0,
    ) -> None:
        self.groups = groups
        self.w = sum(len(g) for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(self.w))
        self.faults = faults or Faults()
        self.uplink_faults = uplink_faults or self.faults  # child <-> root links
        self.rng = random.Random(seed)
        self.now = 0.0
        self.plen = wire.packet_len(size_code)
        self.timing = Timing(
            timeout=0.002,
            max_timeout=0.05,
            no_progress=60.0,
            reorder_guard=max(self.faults.reorder, self.uplink_faults.reorder),
        )
        self.addrs = [(0x0A000001 + r, 40000 + r) for r in range(self.w)]
        self.child_of = {r: c for c, g in enumerate(groups) for r in g}
        self.children = []  # (engine, job, data address, uplink address)
        tree = len(groups) > 1
        self.root = SwitchEngine(EngineConfig(pool_size=window)) if tree else None
        for c, group in enumerate(groups):
            eng = SwitchEngine(EngineConfig(pool_size=window))
            eng.set_up_timing(self.timing)
            data = (0x0A000100 + c, wire.DEFAULT_UDP_PORT)
            uplink = (0x0A000100 + c, 50000 + c)
            job = None
            for d, r in enumerate(group):
                job = eng.register(
                    session_id=7,
                    rank=d,
                    num_workers=len(group),
                    ipv4=self.addrs[r][0],
                    udp_port=self.addrs[r][1],
                    packet_size=size_code,
                    pool_size=window,
                )
            if tree:
                eng.set_parent(job, *self.ROOT)
                self.root.register(
                    session_id=7,
                    rank=c,
                    num_workers=len(groups),
                    ipv4=uplink[0],
                    udp_port=uplink[1],
                    packet_size=size_code,
                    pool_size=window,
                )
            self.children.append((eng, job, data, uplink))
        self.child_of_uplink = {ch[3]: c for c, ch in enumerate(self.children)}
        self.rank_at = {a: r for r, a in enumerate(self.addrs)}
        self.protos = [
            WorkerProtocol(
                num_workers=self.w, size_code=size_code, window=window, timing=self.timing
            )
            for _ in range(self.w)
        ]
        self._events: list = []
        self._seq = 0
        self.counts = {"lost": 0, "dup": 0, "delivered": 0}

    def _post(self, data: bytes, kind: str, who) -> None:
        f = self.uplink_faults if kind in ("c2r", "r2c") else self.faults
        loss = f.loss_up if kind in ("w2c", "c2r") else f.loss_down
        _send_over(self, f, loss, self.counts, kind, who, data)

    def _route_child_output(self, c: int, out) -> None:
        """What child c sent: results down to its workers, partial aggregates up."""
        for pkt, dst in out:
            if dst == self.ROOT:
                self._post(pkt, "c2r", c)
            else:
                self._post(pkt, "c2w", self.rank_at[dst])

    def allreduce(self, inputs: list[np.ndarray], max_time: float = 600.0) -> list[np.ndarray]:
        ops = [p.allreduce(x, None, self.now) for p, x in zip(self.protos, inputs)]
        for r, op in enumerate(ops):
            for pkt in op.packets(op.initial(self.now)):
                self._post(bytes(pkt), "w2c", r)
        buf = np.zeros((1, self.plen + 1), np.uint8)
        lens = np.zeros(1, np.int32)
        ok = np.ones(1, np.uint8)
        while not all(op.done for op in ops):
            timers = [(op.get_timer(), "worker", r) for r, op in enumerate(ops) if not op.done]
            if self.root is not None:
                timers += [
                    (eng.uplink_deadline(job), "child", c)
                    for c, (eng, job, _, _) in enumerate(self.children)
                ]
            t_timer, what, who = min(timers)
            if self._events and self._events[0][0] <= t_timer:
                when, _, kind, who, data = heapq.heappop(self._events)
                self.now = max(self.now, when)
                self.counts["delivered"] += 1
                if kind == "w2c":
                    eng = self.children[self.child_of[who]][0]
                    _, out = eng.receive_datagram(data, self.addrs[who], self.now)
                    self._route_child_output(self.child_of[who], out)
                elif kind == "c2r":
                    _, out = self.root.receive_datagram(data, self.children[who][3], self.now)
                    for pkt, dst in out:
                        self._post(pkt, "r2c", self.child_of_uplink[dst])
                elif kind == "r2c":
                    eng, job = self.children[who][:2]
                    self._route_child_output(who, eng.receive_from_parent(job, data, self.now))
                else:
                    op = ops[who]
                    buf[0, : len(data)] = np.frombuffer(data, np.uint8)
                    lens[0] = len(data)
                    for s in op.packets(op.receive(buf, lens, ok, 1, self.now)):
                        self._post(bytes(s), "w2c", who)
            else:
                self.now = max(self.now, t_timer)
                if what == "worker":
                    op = ops[who]
                    op.check(self.now)
                    for s in op.packets(op.handle_timer(self.now)):
                        self._post(bytes(s), "w2c", who)
                else:
                    eng, job = self.children[who][:2]
                    self._route_child_output(who, eng.uplink_due(job, self.now))
            if self.now > max_time:
                raise TimeoutError(f"allreduce did not finish in {max_time} s of virtual time")
        return [(op.of if op.is_float else op.oi).reshape(x.shape) for op, x in zip(ops, inputs)]


def _send_over(net, f, loss: float, counts: dict, kind: str, who, data: bytes) -> None:
    """One datagram over a link of ``net`` (a Fabric or TreeFabric: its rng,
    clock and event queue) with faults ``f``: duplicated, lost with ``loss``,
    delivered after the latency plus up to ``f.reorder``; counted in ``counts``."""
    copies = 1 + (net.rng.random() < f.dup)
    counts["dup"] += copies - 1
    for _ in range(copies):
        if net.rng.random() < loss:
            counts["lost"] += 1
            continue
        when = net.now + f.latency + net.rng.random() * f.reorder
        net._seq += 1
        heapq.heappush(net._events, (when, net._seq, kind, who, data))
