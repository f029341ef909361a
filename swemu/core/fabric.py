"""A fabric of switches, sans-IO: who aggregates what for a job spread over them.

Theory of operation (docs/protocol.md §7)
------------------------------------------
Switches form a tree: a child knows its parent (``serve --parent``); a worker
talks to its own switch only, exactly as to a switch alone. Every registration
travels up to the root, hop by hop, and each hop adds itself to the way up
(:class:`Hop`: its id, the data address its children send to, the address of
the socket it sends this job's partial aggregates up from). The root keeps the
job's registrations with their ways up (the session rules of docs/protocol.md §5
apply there, once, for the whole job) and, once all W ranks are in, plans the
job's tree (:func:`plan_tree`):

* a switch's **members** are the workers registered at it and the children below
  which some of the job's ranks are; each member is one worker of the switch's
  job (its fan-in), numbered by the lowest rank below it;
* the **top** is the highest switch that aggregates: going down from the root,
  a switch with a single member that is a child hands the job to it (no needless
  hop), unless that child asked to send every job up (``always_up``);
* every switch below the top has the switch above as its **parent**: it sends
  its partial aggregates there, and sends the parent's results down.

The plan travels down the tree (each switch configures its own part and passes
on its children's), so each switch needs only what concerns it.

Nothing here opens a socket or waits: :mod:`swemu.serving.fabric` moves the
messages. Plain Python (no numpy): a tree of a few switches is small.

May import: the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class FabricError(RuntimeError):
    """A switch of the fabric refused a request or could not be reached;
    ``code`` names the gRPC status to answer the caller with (as
    :class:`swemu.core.controller.RegistrationError` does)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Hop:
    """One switch on a registration's way up: its id (its instance), the data
    address its children send to, the address it sends this job's partial
    aggregates up from, and whether it sends every job up (``always_up``)."""

    switch: int
    data: tuple[int, int]
    uplink: tuple[int, int]
    always_up: bool = False


@dataclass(frozen=True)
class Member:
    """One member of a switch's job: a worker (``rank``, its address) or a child
    switch (``child``, the address of its uplink socket for the job)."""

    rank: int  # the worker's rank, or the lowest rank below the child
    child: int  # the child switch's id, 0 for a worker
    ipv4: int
    udp_port: int
    mac: int = 0
    loopback_broadcast: bool = False


@dataclass
class Plan:
    """A switch's part of a job's tree, and its children's below it.

    ``involved``: the switch aggregates for the job (False for switches above
    the top, which only pass the plan on). ``members`` in worker-id order;
    ``parent``: the data address partial aggregates go up to (None at the top)."""

    switch: int
    involved: bool = False
    members: list[Member] = field(default_factory=list)
    parent: tuple[int, int] | None = None
    below: list[Plan] = field(default_factory=list)

    def walk(self):
        """This plan and every plan below it."""
        yield self
        for p in self.below:
            yield from p.walk()


@dataclass(frozen=True)
class RankAt:
    """Where a rank registered: its way up (child-most hop first; empty for a
    worker of the root itself) and its worker address."""

    path: tuple[Hop, ...]
    worker: Member


def plan_tree(root: int, root_data: tuple[int, int], ranks: dict[int, RankAt]) -> Plan:
    """The job's tree under the switch ``root`` (see the module): the plan of
    every switch some rank's way up passes through."""
    # a node of the tree: its direct workers and its children
    workers: dict[int, list[Member]] = {}
    children: dict[int, dict[int, Hop]] = {}  # switch -> child id -> the child's hop
    data: dict[int, tuple[int, int]] = {root: root_data}
    lowest: dict[int, int] = {}  # switch -> lowest rank below it
    for rank, at in sorted(ranks.items()):
        chain = [h.switch for h in at.path] + [root]
        workers.setdefault(chain[0], []).append(at.worker)
        for i, hop in enumerate(at.path):
            data[hop.switch] = hop.data
            children.setdefault(chain[i + 1], {})[hop.switch] = hop
        for s in chain:
            lowest[s] = min(lowest.get(s, rank), rank)

    def members_of(s: int) -> list[Member]:
        out = list(workers.get(s, []))
        for child, hop in children.get(s, {}).items():
            out.append(Member(lowest[child], child, hop.uplink[0], hop.uplink[1]))
        return sorted(out, key=lambda m: m.rank)

    def build(s: int, parent: tuple[int, int] | None, involved: bool) -> Plan:
        plan = Plan(s, involved)
        if involved:
            plan.members = members_of(s)
            plan.parent = parent
        for child in sorted(children.get(s, {}), key=lambda c: lowest[c]):
            plan.below.append(build(child, data[s] if involved else None, True))
        return plan

    # the top: down from the root while a switch's only member is a child that
    # does not send every job up
    path_down = [root]
    s = root
    while not workers.get(s) and len(children.get(s, {})) == 1:
        ((child, hop),) = children[s].items()
        if hop.always_up:
            break
        s = child
        path_down.append(s)
    top = s

    def above(i: int) -> Plan:
        s = path_down[i]
        if s == top:
            return build(s, None, True)
        plan = Plan(s, False)
        plan.below.append(above(i + 1))
        return plan

    return above(0)
