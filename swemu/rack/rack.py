"""The rack itself: a switch namespace with a bridge, one namespace per worker,
veth pairs shaped with ``tc tbf`` (and ``netem``), and processes started inside.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .netns import (
    ETH_HEADER,
    ClusterError,
    _cmd,
    _remove_namespace,
    _signals_blocked,
    default_prefix,
    leftovers,
)


@dataclass(frozen=True)
class Shaping:
    """One direction of every link: a token bucket at ``rate_gbps`` (tbf) and,
    optionally, netem ``delay_ms`` / ``loss_pct`` under it."""

    rate_gbps: float
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_bytes: int = 4 << 20

    def burst_bytes(self, mtu: int) -> int:
        """Bucket depth: 2 ms of the rate, so that late softirq wake-ups on a loaded
        machine do not lose tokens, and never less than a few full frames (tbf drops
        a frame bigger than its bucket)."""
        return int(max(4 * (mtu + ETH_HEADER), self.rate_gbps * 1e9 / 8 * 2e-3))


class Rack:
    """The namespaces, bridge and shaped veth pairs of one emulated rack.

    Every name starts with ``prefix`` (default ``swml<pid>-``); interface names
    stay within Linux's 15 characters for up to 32 workers. Use as a context
    manager: the rack is removed on exit, on Ctrl-C, on SIGTERM/SIGHUP (with
    :func:`signals_as_exceptions`) and on error. Processes started with
    :meth:`popen` are stopped before their namespaces are deleted.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        prefix: str | None = None,
        subnet: str = "10.201.0",
        mtu: int = 9000,
    ) -> None:
        if not 1 <= num_workers <= 32:
            raise ValueError("a rack has 1..32 workers")
        self.num_workers = num_workers
        self.prefix = prefix or default_prefix()
        if len(self.prefix) + 3 > 15:
            raise ValueError(f"prefix {self.prefix!r} is too long for interface names")
        self.subnet = subnet
        self.mtu = mtu
        self.switch_ns = f"{self.prefix}sw"
        self.bridge = f"{self.prefix}br"
        self.shaping: Shaping | None = None
        self._created: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen] = []

    # names and addresses
    def worker_ns(self, i: int) -> str:
        return f"{self.prefix}w{i}"

    def worker_if(self, i: int) -> str:
        """The worker's end of its link (in the worker's namespace)."""
        return f"{self.prefix}{i}w"

    def switch_port(self, i: int) -> str:
        """The switch's end of worker ``i``'s link (a bridge port)."""
        return f"{self.prefix}{i}s"

    @property
    def switch_ip(self) -> str:
        return f"{self.subnet}.1"

    def worker_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    # lifetime
    def __enter__(self) -> Rack:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def create(self) -> None:
        """Build the namespaces, the bridge and the (unshaped) links."""
        for ns in [self.switch_ns, *map(self.worker_ns, range(self.num_workers))]:
            _cmd(["ip", "netns", "add", ns])
            self._created.append(ns)
            _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        sw = self.switch_ns
        _cmd(["ip", "-n", sw, "link", "add", self.bridge, "type", "bridge"])
        # A switch does not run the host's firewall: with br_netfilter loaded,
        # bridged packets would pass the (empty) iptables hooks and a route lookup
        # each, CPU the workers need. The setting is per namespace.
        for table in ("iptables", "ip6tables", "arptables"):
            knob = f"/proc/sys/net/bridge/bridge-nf-call-{table}"
            _cmd(["ip", "netns", "exec", sw, "sh", "-c", f"[ ! -e {knob} ] || echo 0 > {knob}"])
        for i in range(self.num_workers):
            ns, wif, port = self.worker_ns(i), self.worker_if(i), self.switch_port(i)
            # created directly inside the namespaces: nothing ever appears in the root one
            mtu = str(self.mtu)
            peer = ["peer", "name", port, "netns", sw, "mtu", mtu]
            _cmd(["ip", "link", "add", wif, "netns", ns, "mtu", mtu, "type", "veth", *peer])
            _cmd(["ip", "-n", ns, "addr", "add", f"{self.worker_ip(i)}/24", "dev", wif])
            _cmd(["ip", "-n", ns, "link", "set", wif, "up"])
            _cmd(["ip", "-n", sw, "link", "set", port, "master", self.bridge, "up"])
        _cmd(["ip", "-n", sw, "link", "set", self.bridge, "mtu", str(self.mtu), "up"])
        _cmd(["ip", "-n", sw, "addr", "add", f"{self.switch_ip}/24", "dev", self.bridge])

    def shape(self, shaping: Shaping) -> None:
        """(Re)shape both directions of every link; processes may keep running."""
        burst = shaping.burst_bytes(self.mtu)
        tbf = ["tbf", "rate", f"{int(shaping.rate_gbps * 1e9)}bit", "burst", str(burst)]
        tbf += ["limit", str(max(shaping.queue_bytes, 2 * burst))]
        netem = []
        if shaping.delay_ms or shaping.loss_pct:
            netem = ["netem", "limit", "100000"]
            if shaping.delay_ms:
                netem += ["delay", f"{shaping.delay_ms}ms"]
            if shaping.loss_pct:
                netem += ["loss", f"{shaping.loss_pct}%"]
        for i in range(self.num_workers):
            for ns, dev in (
                (self.worker_ns(i), self.worker_if(i)),
                (self.switch_ns, self.switch_port(i)),
            ):
                _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf])
                if netem:
                    try:
                        child = ["parent", "1:1", "handle", "10:", *netem]
                        _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, *child])
                    except ClusterError as exc:
                        raise ClusterError(
                            f"cannot add netem delay/loss ({exc}); the kernel may lack "
                            "sch_netem: run without --delay/--loss"
                        ) from None
        self.shaping = shaping

    def link_counters(self, workers: int) -> dict[str, tuple[int, int]]:
        """Cumulative (bytes, drops) of the tbf qdisc of each link direction of
        workers ``0 .. workers-1``: ``up<i>`` (worker i to switch), ``down<i>``."""
        out: dict[str, tuple[int, int]] = {}
        where = [(self.switch_ns, "down")] + [(self.worker_ns(i), "up") for i in range(workers)]
        for ns, direction in where:
            for q in json.loads(_cmd(["tc", "-s", "-j", "-n", ns, "qdisc", "show"]) or "[]"):
                if q.get("kind") == "tbf" and q["dev"].startswith(self.prefix):
                    i = int(q["dev"][len(self.prefix) : -1])
                    if i < workers:
                        out[f"{direction}{i}"] = (int(q["bytes"]), int(q["drops"]))
        return out

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *argv]

    def popen(self, ns: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a process in ``ns``; it is stopped when the rack is removed, and
        dies with this process. It gets its own session, so a Ctrl-C reaches only
        the launcher, which then tears down in order."""
        from swemu.launch import spawn  # SIGTERM when this process dies, SIGKILL included

        proc = spawn(self.exec_argv(ns, argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def destroy(self) -> None:
        """Stop our processes, delete our namespaces (and with them every veth and
        the bridge); idempotent, uninterruptible. Raises if anything is left."""
        with _signals_blocked():
            for p in self._procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self._procs.clear()
            for ns in reversed(self._created):
                _remove_namespace(ns)
            self._created.clear()
        left = leftovers(self.prefix)
        if left:
            raise ClusterError(
                f"could not remove {', '.join(left)}; try `switchml cluster --cleanup`"
            )
