"""Switches of a fabric on several hosts, each bound to every address (``serve``'s
default ``--host 0.0.0.0``, no ``--advertise-ip``): a switch that does not know
its own address tells the others 0.0.0.0, and the one that takes it fills in
the address the call came from (docs/protocol.md §7). Before, such a child told
its parent 127.0.0.1: the root configured the child's part of the job on itself,
sent Drop to itself, and the workers resumed forever.

Needs root and ``ip netns`` (two hosts and the root's machine as namespaces).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hosts import Hosts, skip_without_namespaces

pytestmark = pytest.mark.slow

#: one rank of the job, at its own host's switch (127.0.0.1:50099 from there)
RANK = """
import json, sys
import numpy as np
import hostlib
rank = int(sys.argv[1])
with hostlib.connect(control="127.0.0.1:50099", rank=rank, world_size=2, session_id=23,
                     join_timeout=60, no_progress=30, release=False) as ctx:
    ok = []
    for call in range(3):
        y = ctx.allreduce(np.arange(20_000, dtype=np.int32) * (rank + 1) + call)
        ok.append(bool((y == np.arange(20_000, dtype=np.int32) * 3 + 2 * call).all()))
print(json.dumps(ok))
"""


def test_switches_bound_to_every_address_on_two_hosts(tmp_path):
    skip_without_namespaces()
    with Hosts(2) as hosts:
        root = f"{hosts.bridge_ip}:50099"
        hosts.serve(hosts.net, "0.0.0.0", log=tmp_path / "root.log")
        for i, ns in enumerate(hosts.names):
            hosts.serve(ns, "0.0.0.0", "--parent", root, log=tmp_path / f"child{i}.log")
        ranks = [
            hosts.spawn(
                ns,
                [sys.executable, "-c", RANK, str(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, ns in enumerate(hosts.names)
        ]
        outs = []
        for p in ranks:
            try:
                out, err = p.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            assert p.returncode == 0, err[-3000:] + (tmp_path / "root.log").read_text()[-3000:]
            outs.append(json.loads(out))
        cmd = [sys.executable, "-m", "cli.main", "stats", "--json", "--control", root]
        snap = json.loads(hosts.run(hosts.net, cmd))
    assert outs == [[True] * 3, [True] * 3]
    # the root knows each child by the address it called from, on its own host
    children = [f"{hosts.ip(i)}:50099" for i in range(2)]
    assert sorted(snap["fabric"]["children"]) == children
    (job,) = snap["jobs"]
    assert [w["ip"] for w in job["workers"]] == [hosts.ip(0), hosts.ip(1)]
    assert [w["child"] for w in job["workers"]] == children
    assert job["counters"]["aggregated"] > 0 and job["counters"]["drop_malformed"] == 0
    # nothing had to be resumed: every switch was configured where it is
    assert "asks to resume" not in (tmp_path / "root.log").read_text()
