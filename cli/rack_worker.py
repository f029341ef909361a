"""One worker of the emulated rack (:mod:`swemu.rack`), run inside its namespace.

Started once per run with ``ip netns exec <worker ns> python -m cli.rack_worker``
(:data:`swemu.rack.runner.WORKER_MODULE`),
it joins every world the run measures — a hostlib context (SwitchML session) and a
gloo subgroup of ranks ``0 .. W-1`` for each W it belongs to — so that all worker
counts, link rates, sizes and methods can be interleaved without restarting
processes. The driver then steers it with JSON lines on stdin:

``{"cmd": "prepare", "w": W, "method": M, "nbytes": S, "iteration": I}``
    build the inputs and buffers (untimed, page faults included);
``{"cmd": "go"}``
    line the W workers up (a barrier through the same path), time one collective;
``{"cmd": "check"}``
    compare the result with the exact sum (:mod:`swemu.protocol.worker.testdata`);
``{"cmd": "quit"}``

and reads one ``CLUSTER {json}`` line per command on stdout (other output is
ignored), so the driver can sample CPU counters exactly around the timed part.

Methods: ``switchml`` (hostlib through the worker's own switch: the rack's, a
child of the root's with several racks), ``ring`` (gloo ``all_reduce``, a ring),
``ps`` (a parameter server at rank 0 built from gloo point-to-point messages,
pipelined in chunks), ``link`` (rank 1 sends S bytes to rank 0: a calibration of
one shaped link), ``flat`` (hostlib through the flat switch, which serves every
worker over a second link).

Configuration comes from the environment (set by the driver): ``CLUSTER_RANK``,
``CLUSTER_SIZE`` (processes), ``CLUSTER_WORLDS`` (comma list of W), ``CLUSTER_IP``
(this worker's address), ``CLUSTER_GLOO_INIT`` (``tcp://rank0-ip:port``),
``CLUSTER_SWITCH``, ``CLUSTER_CONTROL``, ``CLUSTER_SESSION`` (base session id),
``CLUSTER_PACKET_SIZE``, ``CLUSTER_WINDOW``, and for ``flat`` ``CLUSTER_FLAT_IP``,
``CLUSTER_FLAT_SWITCH``, ``CLUSTER_FLAT_CONTROL`` (empty: no flat switch);
``GLOO_SOCKET_IFNAME`` names the veth.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

from swemu.rack.runner import PREFIX

PS_CHUNK_BYTES = 1 << 20  # PS pipelining unit: small against S, large against per-message cost


def reply(**fields: Any) -> None:
    """One result line for the driver."""
    sys.stdout.write(PREFIX + json.dumps(fields) + "\n")
    sys.stdout.flush()


class Worker:
    """The state of one rank: its hostlib contexts and gloo groups, per world size."""

    def __init__(self) -> None:
        import datetime

        import torch.distributed as dist

        import hostlib

        env = os.environ
        self.rank = int(env["CLUSTER_RANK"])
        self.size = int(env["CLUSTER_SIZE"])
        self.worlds = sorted({int(w) for w in env["CLUSTER_WORLDS"].split(",")})
        self.packet_size = int(env["CLUSTER_PACKET_SIZE"])
        self.dist = dist
        dist.init_process_group(
            "gloo",
            init_method=env["CLUSTER_GLOO_INIT"],
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=600),
        )
        # every rank creates every group, in the same order (torch requires it)
        self.groups = {w: dist.new_group(list(range(w))) for w in self.worlds}
        # per switch the worker uses, a hostlib context per W (its own switch's, the flat one's)
        self.contexts: dict[str, dict[int, hostlib.Context]] = {"switchml": {}, "flat": {}}
        base = int(env["CLUSTER_SESSION"])
        switches = [("switchml", env["CLUSTER_SWITCH"], env["CLUSTER_CONTROL"], env["CLUSTER_IP"])]
        if env.get("CLUSTER_FLAT_SWITCH"):
            flat = env["CLUSTER_FLAT_SWITCH"], env["CLUSTER_FLAT_CONTROL"], env["CLUSTER_FLAT_IP"]
            switches.append(("flat", *flat))
        for k, (method, switch, control, ip) in enumerate(switches):
            for w in self.worlds:  # ascending W on every rank: joins cannot deadlock
                if self.rank >= w:
                    continue
                ctx = hostlib.connect(
                    switch=switch,
                    control=control,
                    rank=self.rank,
                    world_size=w,
                    packet_size=self.packet_size,
                    window=int(env["CLUSTER_WINDOW"]) if env.get("CLUSTER_WINDOW") else None,
                    session_id=base + 64 * k + w,
                    bind=ip,
                )
                ctx.open()
                self.contexts[method][w] = ctx
        self.step: dict[str, Any] = {}

    def warm_up(self) -> None:
        """Compile and exercise every path once before the driver starts any clock."""
        import torch

        from swemu.protocol.worker.testdata import check_result, worker_input

        for contexts in self.contexts.values():
            for w, ctx in contexts.items():
                x = worker_input(self.rank, 4096, 0, np.float32)
                y = ctx.allreduce(x)
                check_result(y, w, 0, 32 << self.packet_size)
        for w in self.worlds:
            if self.rank < w:
                self.dist.all_reduce(torch.ones(1024), group=self.groups[w])

    # ---------------------------------------------------------------- commands
    def prepare(self, w: int, method: str, nbytes: int, iteration: int) -> None:
        import torch

        from swemu.protocol.worker.testdata import worker_input

        n = nbytes // 4
        x = worker_input(self.rank, n, iteration, np.float32)
        step: dict[str, Any] = {"w": w, "method": method, "n": n, "iteration": iteration, "x": x}
        if method in self.contexts:
            # written now, so that no page faults fall into the timed call (np.zeros
            # maps untouched zero pages: the allreduce would fault in every one)
            step["out"] = np.empty(n, np.float32)
            step["out"].fill(0)
        elif method == "ps":
            chunk = PS_CHUNK_BYTES // 4
            step["bounds"] = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
            if self.rank == 0:
                step["inbox"] = torch.zeros((w - 1, n))
            step["out"] = torch.zeros(n)
        elif method == "link":
            step["out"] = torch.zeros(n)
        self.step = step

    def go(self) -> dict[str, Any]:
        import torch

        s, dist = self.step, self.dist
        w, method = s["w"], s["method"]
        group = self.groups[w]
        stats: dict[str, int] = {}
        if method in self.contexts:
            ctx = self.contexts[method][w]
            tick = np.zeros(1, np.int32)
            ctx.allreduce(tick, out=tick)  # barrier through the switch
            t0 = time.perf_counter()
            ctx.allreduce(s["x"], out=s["out"])
            dt = time.perf_counter() - t0
            stats = ctx.last_stats
        else:
            x = torch.from_numpy(s["x"])
            dist.barrier(group=group)
            t0 = time.perf_counter()
            if method == "ring":
                dist.all_reduce(x, group=group)
                s["out"] = x
            elif method == "ps":
                self._parameter_server(x, s["out"], s.get("inbox"), s["bounds"], w, group)
            elif method == "link":
                if self.rank == 1:
                    dist.send(x, dst=0, group=group)
                elif self.rank == 0:
                    dist.recv(s["out"], src=1, group=group)
            else:
                raise ValueError(f"unknown method {method!r}")
            dt = time.perf_counter() - t0
        return {"time": dt, **stats}

    def _parameter_server(self, x, out, inbox, bounds, w: int, group) -> None:
        """Rank 0 is the server: every worker pushes its tensor, rank 0 sums and
        pushes the sum back, chunk by chunk so that receiving and sending overlap
        on the server's full-duplex link (the best a PS can do)."""
        dist = self.dist
        nchunks = len(bounds)
        if self.rank != 0:
            reqs = [
                dist.isend(x[lo:hi], dst=0, group=group, tag=c) for c, (lo, hi) in enumerate(bounds)
            ]
            reqs += [
                dist.irecv(out[lo:hi], src=0, group=group, tag=nchunks + c)
                for c, (lo, hi) in enumerate(bounds)
            ]
            for r in reqs:
                r.wait()
            return
        recvs = [
            [dist.irecv(inbox[p - 1, lo:hi], src=p, group=group, tag=c) for p in range(1, w)]
            for c, (lo, hi) in enumerate(bounds)
        ]
        sends = []
        for c, (lo, hi) in enumerate(bounds):
            for r in recvs[c]:
                r.wait()
            acc = out[lo:hi]
            acc.copy_(x[lo:hi])
            for p in range(w - 1):
                acc.add_(inbox[p, lo:hi])
            sends += [dist.isend(acc, dst=p, group=group, tag=nchunks + c) for p in range(1, w)]
        for r in sends:
            r.wait()

    def check(self) -> dict[str, Any]:
        from swemu.protocol.worker.testdata import check_result

        s = self.step
        if s["method"] == "link":
            if self.rank != 0:
                return {"ok": True, "worst": 0.0}
            # rank 1's input is exactly twice rank 0's (testdata: (r + 1) * base)
            ok = bool(np.array_equal(s["out"].numpy(), 2 * s["x"]))
            return {"ok": ok, "worst": 0.0}
        out = s["out"]
        y = out if isinstance(out, np.ndarray) else out.numpy()
        nvals = 32 << self.packet_size if s["method"] in self.contexts else 1
        ok, worst = check_result(y, s["w"], s["iteration"], nvals)
        return {"ok": ok, "worst": worst}

    def close(self) -> None:
        for contexts in self.contexts.values():
            for ctx in contexts.values():
                ctx.close()
        self.dist.destroy_process_group()


def main() -> int:
    try:
        worker = Worker()
        worker.warm_up()
    except Exception as exc:  # reported to the driver, which shows the log
        reply(error=f"{type(exc).__name__}: {exc}")
        raise
    reply(ready=True, rank=worker.rank)
    for line in sys.stdin:  # EOF (the driver died) ends the worker
        cmd = json.loads(line)
        try:
            if cmd["cmd"] == "prepare":
                worker.prepare(cmd["w"], cmd["method"], cmd["nbytes"], cmd["iteration"])
                reply(prepared=True)
            elif cmd["cmd"] == "go":
                reply(**worker.go())
            elif cmd["cmd"] == "check":
                reply(**worker.check())
            elif cmd["cmd"] == "quit":
                break
        except Exception as exc:
            reply(error=f"{type(exc).__name__}: {exc}")
            raise
    worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
