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
        copies = 1 + (self.rng.random() < f.dup)
        self.delivered["dup"] += copies - 1
        for _ in range(copies):
            if self.rng.random() < loss:
                self.delivered["lost"] += 1
                continue
            when = self.now + f.latency + self.rng.random() * f.reorder
            self._seq += 1
            heapq.heappush(self._events, (when, self._seq, direction, who, data))

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
