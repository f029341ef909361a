"""A fabric over two hosts, launched by torchrun's own multi-node options.

Two network namespaces stand for two hosts on one bridge, a third for the
machine of the root switch. Each host runs a child switch
(``serve --parent ROOT:50099``) and ``torchrun --nnodes 2 --node-rank N
--nproc-per-node 2 --master-addr HOST0 --master-port 29500``, whose ranks use
the ``switchml`` backend with ``SWITCHML_CONTROL`` naming their own host's
child switch (docs/fabric.md is the recipe this follows). A DDP model trains
through the fabric and, from the same weights on the same data, through gloo:
the replicas are identical and the losses agree within float32 noise; every
switch shows its part of the job while it runs and has freed it afterwards.

Needs root, ``ip netns`` and torch; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hosts import Hosts, skip_without_namespaces

from swemu.launch import child_env

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torch_fabric_worker.py"
NODES, PER_NODE = 2, 2
W = NODES * PER_NODE
CONTROL = 50099
TIMEOUT = 420.0


def _stats(hosts: Hosts, ns: str, control: str, *args: str) -> str:
    """What ``switchml-emu stats --control CONTROL ARGS`` prints, run in namespace ``ns``."""
    return hosts.run(ns, [sys.executable, "-m", "cli.main", "stats", "--control", control, *args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The two-host launch: each rank's report, each switch's stats afterwards,
    and what ``switchml-emu stats`` printed for the root and a child."""
    skip_without_namespaces()
    out = tmp_path_factory.mktemp("ranks")
    logs = tmp_path_factory.mktemp("logs")
    with Hosts(NODES) as hosts:
        root = f"{hosts.bridge_ip}:{CONTROL}"
        children = [f"{hosts.ip(i)}:{CONTROL}" for i in range(NODES)]
        hosts.serve(hosts.net, hosts.bridge_ip, log=logs / "root.log")
        for i, ns in enumerate(hosts.names):
            hosts.serve(ns, hosts.ip(i), "--parent", root, log=logs / f"child{i}.log")
        t0 = time.monotonic()
        procs = []
        for i, ns in enumerate(hosts.names):
            cmd = [sys.executable, "-m", "torch.distributed.run"]
            cmd += ["--nnodes", str(NODES), "--node-rank", str(i)]
            cmd += ["--nproc-per-node", str(PER_NODE)]
            cmd += ["--master-addr", hosts.ip(0), "--master-port", "29500"]
            cmd += [str(WORKER), str(out), root, *children]
            env = child_env(
                OMP_NUM_THREADS="1",
                SWITCHML_CONTROL=children[i],  # this host's own switch
                GLOO_SOCKET_IFNAME="eth0",  # gloo's own traffic between the hosts
            )
            with open(logs / f"torchrun{i}.log", "w") as log:
                procs.append(hosts.spawn(ns, cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = []
        for i, proc in enumerate(procs):
            try:
                codes.append(proc.wait(max(TIMEOUT - (time.monotonic() - t0), 1.0)))
            except subprocess.TimeoutExpired:
                tail = (logs / f"torchrun{i}.log").read_text()[-6000:]
                pytest.fail(f"torchrun on host {i} did not finish in {TIMEOUT:g} s:\n{tail}")
        elapsed = time.monotonic() - t0
        if codes != [0] * NODES:
            tails = "\n".join(
                f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(logs.iterdir())
            )
            pytest.fail(f"torchrun exited {codes}:\n{tails}")
        after = {"root": json.loads(_stats(hosts, hosts.net, root, "--json"))}
        for i, ns in enumerate(hosts.names):
            after[f"child{i}"] = json.loads(_stats(hosts, ns, children[i], "--json"))
        text = {
            "root": _stats(hosts, hosts.net, root),
            "child0": _stats(hosts, hosts.names[0], children[0]),
        }
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(W)]
    return {
        "ranks": ranks,
        "after": after,
        "text": text,
        "root": root,
        "children": children,
        "elapsed": elapsed,
    }


def test_each_host_ran_its_ranks_against_its_own_switch(run):
    ranks = run["ranks"]
    assert [r["rank"] for r in ranks] == list(range(W))
    assert all(r["world_size"] == W for r in ranks)
    for r in ranks:
        # torchrun placed ranks node by node; each used its own host's child switch
        assert r["node"] == r["rank"] // PER_NODE
        assert r["control"] == run["children"][r["node"]]
    assert len({r["session_id"] for r in ranks}) == 1


def test_replicas_are_identical_and_the_loss_is_gloos(run):
    """Every rank ends with the very same parameters (bit for bit) through the
    fabric, as through gloo; the two runs' losses agree step by step within
    float32 noise, and so do their parameters."""
    ranks = run["ranks"]
    assert len({r["switchml"]["digest"] for r in ranks}) == 1
    assert len({r["gloo"]["digest"] for r in ranks}) == 1
    for r in ranks:
        ours, theirs = r["switchml"]["losses"], r["gloo"]["losses"]
        assert ours[0] == theirs[0]  # the same model on the same batch
        for a, b in zip(ours, theirs, strict=True):
            assert abs(a - b) <= 1e-5 * max(abs(b), 1e-3), (ours, theirs)
        assert ours[-1] < 0.5 * ours[0]  # it trained
        assert r["max_param_diff"] <= 1e-5 * r["max_param"], r["max_param_diff"]
        assert r["switchml"]["stats"]["calls"] >= 12  # every step's buckets: the switch's


def test_the_job_crossed_both_levels(run):
    """While the job ran: each child aggregated its host's two ranks and sent
    partial aggregates up (and took as many results back); the root's part of
    the job has the two children as its members and aggregated what they sent."""
    view = run["ranks"][0]["fabric"]
    root = view[run["root"]]
    assert root["fabric"]["parent"] is None
    assert sorted(root["fabric"]["children"]) == sorted(run["children"])
    rjob = root["job"]
    assert rjob["num_workers"] == NODES
    assert rjob["counters"]["up_sent"] == 0 and "parent" not in rjob
    assert [w["child"] for w in rjob["workers"]] == run["children"]
    sent = 0
    for child in run["children"]:
        c = view[child]
        assert c["fabric"]["parent"] == run["root"]
        job = c["job"]
        assert job["num_workers"] == PER_NODE
        assert job["parent"].startswith(run["root"].split(":")[0] + ":")
        assert not any("child" in w for w in job["workers"])
        cnt = job["counters"]
        assert cnt["up_sent"] > 0 and cnt["up_results"] == cnt["up_sent"]
        assert cnt["aggregated"] == PER_NODE * cnt["up_sent"]
        sent += cnt["up_sent"]
    assert rjob["counters"]["aggregated"] == sent
    assert rjob["counters"]["multicast"] == sent // NODES


def test_every_switch_freed_the_job(run):
    for name, snap in run["after"].items():
        assert snap["jobs"] == [], name
        assert snap["memory_in_use"] == 0, name
    assert run["after"]["root"]["released"]["explicit"] >= 1


def test_stats_shows_the_tree(run):
    """``switchml-emu stats`` of the root names its children; a child's names its parent."""
    for child in run["children"]:
        assert child in run["text"]["root"]
    assert run["root"] in run["text"]["child0"]
