"""The racks themselves: per rack a switch namespace with a bridge, one namespace
per worker, veth pairs shaped with ``tc tbf`` (and ``netem``); with several racks
a root namespace and one shaped uplink per rack; optionally one more switch that
every worker also reaches directly; processes started inside.

Part of the emulated rack (:mod:`swemu.rack`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
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

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


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
    """The namespaces, bridges and shaped veth pairs of ``racks`` emulated racks.

    ``num_workers`` are placed rack by rack: worker i is host ``i % hosts`` of
    rack ``i // hosts`` (``hosts = num_workers / racks``). One rack (the default)
    is the topology of the package's drawing: a switch namespace with a bridge.
    Several racks add a root namespace whose bridge has one port per rack: the
    rack's **uplink**, a veth pair between the rack's switch namespace (which
    routes between its bridge and the uplink) and the root's bridge, shaped in
    each direction at ``hosts × host rate / oversubscription`` (:meth:`shape`).
    ``flat`` adds one more switch namespace with a bridge and a second link from
    every worker to it: one switch serving every worker, the baseline a fabric
    is measured against.

    Every name starts with ``prefix`` (default ``swml<pid>-``); interface names
    stay within Linux's 15 characters for up to 32 workers. Use as a context
    manager: the racks are removed on exit, on Ctrl-C, on SIGTERM/SIGHUP (with
    :func:`signals_as_exceptions`) and on error. Processes started with
    :meth:`popen` are stopped before their namespaces are deleted.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        racks: int = 1,
        flat: bool = False,
        prefix: str | None = None,
        subnet: str = "10.201.0",
        mtu: int = 9000,
    ) -> None:
        if not 1 <= num_workers <= 32:
            raise ValueError("a rack has 1..32 workers")
        if racks < 1 or num_workers % racks:
            raise ValueError(f"{num_workers} workers do not split evenly into {racks} racks")
        self.num_workers = num_workers
        self.racks = racks
        self.hosts = num_workers // racks
        self.flat = flat
        self.prefix = prefix or default_prefix()
        if len(self.prefix) + 3 > 15:
            raise ValueError(f"prefix {self.prefix!r} is too long for interface names")
        *net, third = subnet.split(".")
        # rack k's /24 is subnet + k; then the root's (the uplinks) and the flat switch's
        if len(net) != 2 or not third.isdigit() or int(third) + racks + 1 > 255:
            raise ValueError(f"subnet {subnet!r} leaves no room for {racks} racks' /24s")
        self.subnet = subnet
        self._net, self._third = ".".join(net), int(third)
        self.mtu = mtu
        self.shaping: Shaping | None = None
        self.oversubscription = 1.0
        self._created: list[str] = []  # namespaces, in creation order
        self._procs: list[subprocess.Popen] = []
        self._counted: dict[tuple[str, str], str] = {}  # (namespace, device) -> counter name

    # names and addresses
    def _net24(self, k: int) -> str:
        return f"{self._net}.{self._third + k}"

    @property
    def switch_ns(self) -> str:
        """The top switch's namespace: the rack's switch, or the root of several."""
        return f"{self.prefix}sw" if self.racks == 1 else f"{self.prefix}root"

    @property
    def switch_ip(self) -> str:
        """The top switch's address (the root's, on its bridge, with several racks)."""
        return f"{self._net24(0 if self.racks == 1 else self.racks)}.1"

    def rack_of(self, i: int) -> int:
        return i // self.hosts

    def rack_switch_ns(self, k: int) -> str:
        return f"{self.prefix}sw" if self.racks == 1 else f"{self.prefix}sw{k}"

    def rack_switch_ip(self, k: int) -> str:
        return f"{self._net24(k)}.1"

    def rack_bridge(self, k: int) -> str:
        return f"{self.prefix}br" if self.racks == 1 else f"{self.prefix}b{k}"

    def uplink_if(self, k: int) -> str:
        """Rack ``k``'s end of its uplink (in its switch namespace)."""
        return f"{self.prefix}u{k}"

    def root_port(self, k: int) -> str:
        """The root's end of rack ``k``'s uplink (a port of the root's bridge)."""
        return f"{self.prefix}r{k}"

    def uplink_ip(self, k: int) -> str:
        return f"{self._net24(self.racks)}.{10 + k}"

    def worker_ns(self, i: int) -> str:
        return f"{self.prefix}w{i}"

    def worker_if(self, i: int) -> str:
        """The worker's end of its link (in the worker's namespace)."""
        return f"{self.prefix}{i}w"

    def switch_port(self, i: int) -> str:
        """The switch's end of worker ``i``'s link (a port of its rack's bridge)."""
        return f"{self.prefix}{i}s"

    def worker_ip(self, i: int) -> str:
        return f"{self._net24(self.rack_of(i))}.{10 + i % self.hosts}"

    def worker_switch_ip(self, i: int) -> str:
        """The address of worker ``i``'s own switch (its rack's)."""
        return self.rack_switch_ip(self.rack_of(i))

    @property
    def flat_ns(self) -> str:
        return f"{self.prefix}flat"

    @property
    def flat_ip(self) -> str:
        """The flat switch's address (``flat``: one switch serving every worker)."""
        return f"{self._net24(self.racks + 1)}.1"

    def worker_flat_if(self, i: int) -> str:
        return f"{self.prefix}{i}f"

    def flat_port(self, i: int) -> str:
        return f"{self.prefix}{i}t"

    def worker_flat_ip(self, i: int) -> str:
        return f"{self._net24(self.racks + 1)}.{10 + i}"

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

    def _namespace(self, ns: str) -> None:
        _cmd(["ip", "netns", "add", ns])
        self._created.append(ns)
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _switch(self, ns: str, bridge: str, address: str) -> None:
        """A switch namespace: a bridge with ``address``/24."""
        self._namespace(ns)
        _cmd(["ip", "-n", ns, "link", "add", bridge, "type", "bridge"])
        # A switch does not run the host's firewall: with br_netfilter loaded,
        # bridged packets would pass the (empty) iptables hooks and a route lookup
        # each, CPU the workers need. The setting is per namespace.
        for table in ("iptables", "ip6tables", "arptables"):
            knob = f"/proc/sys/net/bridge/bridge-nf-call-{table}"
            _cmd(["ip", "netns", "exec", ns, "sh", "-c", f"[ ! -e {knob} ] || echo 0 > {knob}"])
        _cmd(["ip", "-n", ns, "link", "set", bridge, "mtu", str(self.mtu), "up"])
        _cmd(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", bridge])

    def _link(
        self, ns: str, dev: str, address: str | None, sw: str, port: str, bridge: str
    ) -> None:
        """A veth pair: ``dev`` in ``ns`` (with ``address``/24), ``port`` a port of
        ``bridge`` in ``sw``; created directly inside the namespaces, so nothing ever
        appears in the root one."""
        mtu = str(self.mtu)
        peer = ["peer", "name", port, "netns", sw, "mtu", mtu]
        _cmd(["ip", "link", "add", dev, "netns", ns, "mtu", mtu, "type", "veth", *peer])
        if address:
            _cmd(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", dev])
        _cmd(["ip", "-n", ns, "link", "set", dev, "up"])
        _cmd(["ip", "-n", sw, "link", "set", port, "master", bridge, "up"])

    def create(self) -> None:
        """Build the namespaces, the bridges, the (unshaped) links and the routes."""
        for k in range(self.racks):
            self._switch(self.rack_switch_ns(k), self.rack_bridge(k), self.rack_switch_ip(k))
        if self.racks > 1:
            self._switch(self.switch_ns, f"{self.prefix}rb", self.switch_ip)
        if self.flat:
            self._switch(self.flat_ns, f"{self.prefix}fb", self.flat_ip)
        for i in range(self.num_workers):
            k = self.rack_of(i)
            sw = self.rack_switch_ns(k)
            self._namespace(self.worker_ns(i))
            ns = self.worker_ns(i)
            self._link(
                ns,
                self.worker_if(i),
                self.worker_ip(i),
                sw,
                self.switch_port(i),
                self.rack_bridge(k),
            )
            self._counted[(ns, self.worker_if(i))] = f"up{i}"
            self._counted[(sw, self.switch_port(i))] = f"down{i}"
            if self.racks > 1:  # the other racks are behind its switch
                _cmd(["ip", "-n", ns, "route", "add", "default", "via", self.rack_switch_ip(k)])
            if self.flat:
                self._link(
                    ns,
                    self.worker_flat_if(i),
                    self.worker_flat_ip(i),
                    self.flat_ns,
                    self.flat_port(i),
                    f"{self.prefix}fb",
                )
                self._counted[(ns, self.worker_flat_if(i))] = f"flatup{i}"
                self._counted[(self.flat_ns, self.flat_port(i))] = f"flatdown{i}"
        for k in range(self.racks if self.racks > 1 else 0):
            sw = self.rack_switch_ns(k)
            self._link(
                sw,
                self.uplink_if(k),
                self.uplink_ip(k),
                self.switch_ns,
                self.root_port(k),
                f"{self.prefix}rb",
            )
            self._counted[(sw, self.uplink_if(k))] = f"rackup{k}"
            self._counted[(self.switch_ns, self.root_port(k))] = f"rackdown{k}"
            # the rack's switch routes between its bridge and its uplink
            _cmd(["ip", "netns", "exec", sw, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
            subnet = f"{self._net24(k)}.0/24"
            _cmd(["ip", "-n", self.switch_ns, "route", "add", subnet, "via", self.uplink_ip(k)])
            for other in range(self.racks):
                if other != k:
                    peer = f"{self._net24(other)}.0/24"
                    _cmd(["ip", "-n", sw, "route", "add", peer, "via", self.uplink_ip(other)])

    def uplink_gbps(self, host_gbps: float, oversubscription: float = 1.0) -> float:
        """A rack uplink's rate: ``hosts × host rate / oversubscription``."""
        return host_gbps * self.hosts / oversubscription

    def shape(self, shaping: Shaping, oversubscription: float = 1.0) -> None:
        """(Re)shape both directions of every link: host links at ``shaping``, rack
        uplinks at :meth:`uplink_gbps` (same delay and loss); processes may keep
        running."""
        if oversubscription <= 0:
            raise ValueError("oversubscription must be positive")
        uplink = replace(shaping, rate_gbps=self.uplink_gbps(shaping.rate_gbps, oversubscription))
        for (ns, dev), name in self._counted.items():
            self._shape(ns, dev, uplink if name.startswith("rack") else shaping)
        self.shaping = shaping
        self.oversubscription = oversubscription

    def _shape(self, ns: str, dev: str, shaping: Shaping) -> None:
        """A tbf root qdisc on ``dev``'s egress (and netem under it)."""
        burst = shaping.burst_bytes(self.mtu)
        tbf = ["tbf", "rate", f"{int(shaping.rate_gbps * 1e9)}bit", "burst", str(burst)]
        tbf += ["limit", str(max(shaping.queue_bytes, 2 * burst))]
        _cmd(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf])
        if not (shaping.delay_ms or shaping.loss_pct):
            return
        netem = ["netem", "limit", "100000"]
        if shaping.delay_ms:
            netem += ["delay", f"{shaping.delay_ms}ms"]
        if shaping.loss_pct:
            netem += ["loss", f"{shaping.loss_pct}%"]
        try:
            _cmd(
                [
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    *netem,
                ]
            )
        except ClusterError as exc:
            raise ClusterError(
                f"cannot add netem delay/loss ({exc}); the kernel may lack "
                "sch_netem: run without --delay/--loss"
            ) from None

    def link_counters(self, workers: int | None = None) -> dict[str, tuple[int, int]]:
        """Cumulative (bytes, drops) of the tbf qdisc of each link direction:
        ``up<i>`` (worker i to its switch), ``down<i>``, ``flatup<i>`` and
        ``flatdown<i>`` (its link to the flat switch) for workers ``0 ..
        workers-1`` (default: all), ``rackup<k>`` and ``rackdown<k>`` (rack k's
        uplink, toward the root and from it)."""
        out: dict[str, tuple[int, int]] = {}
        for ns in dict.fromkeys(ns for ns, _ in self._counted):
            for q in json.loads(_cmd(["tc", "-s", "-j", "-n", ns, "qdisc", "show"]) or "[]"):
                name = self._counted.get((ns, q.get("dev", "")))
                if q.get("kind") != "tbf" or name is None:
                    continue
                host_link = not name.startswith("rack")
                if host_link and workers is not None and int(name.strip(_LETTERS)) >= workers:
                    continue
                out[name] = (int(q["bytes"]), int(q["drops"]))
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
