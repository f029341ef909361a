"""One rank of tests/test_fabric_hosts.py: DDP training through a two-level fabric.

Started by ``torchrun --nnodes 2 --node-rank N ...`` in the network namespace of
its "host", with ``SWITCHML_CONTROL`` naming that host's own child switch. The
rank trains the same small model twice from the same initial weights on the
same data: once with the default process group (backend ``switchml``: DDP's
gradient buckets go through the child switch, up to the root and down), once
with a gloo group beside it. It writes ``OUT/rank<R>.json``: the losses of both
runs, digests of the parameters (replicas must be identical), the largest
difference between the two runs' parameters and, on rank 0, what every switch
of the fabric says about the job while it still exists.

``python torch_fabric_worker.py OUT ROOT_CONTROL CHILD_CONTROL...``
"""

# No ``from __future__ import annotations``: DDP inspects hook annotations.
import faulthandler
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import hostlib.torch  # noqa: F401  (registers the backend)

STEPS = 12
BATCH = 32


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 4)
    )


def _train(group) -> tuple[list[float], torch.Tensor]:
    """SGD on this rank's batches through DDP over ``group``: the loss of each
    step and the parameters at the end."""
    net = _model()
    # small buckets: several allreduces per step, overlapping backward
    ddp = nn.parallel.DistributedDataParallel(net, process_group=group, bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + dist.get_rank())
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 32, generator=g)
        y = (x[:, :4] * 2.0 + x[:, 4:8].sin()).detach()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def _fabric_view(controls: list[str], session_id: int) -> dict:
    """The job as each switch shows it (``GetStats``): its fabric and the job's
    entry (members, counters), by control address."""
    from swemu.observe.stats import fetch_stats

    view = {}
    for control in controls:
        snap = fetch_stats(control)
        jobs = [j for j in snap["jobs"] if j["session_id"] == session_id]
        view[control] = {"fabric": snap.get("fabric"), "job": jobs[0] if jobs else None}
    return view


def main() -> int:
    out_dir = Path(sys.argv[1])
    controls = sys.argv[2:]
    faulthandler.dump_traceback_later(float(os.environ.get("HANG_DUMP_AFTER", "240")), exit=True)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    dist.init_process_group("switchml")
    rank = dist.get_rank()
    world = dist.group.WORLD
    out: dict = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "node": int(os.environ["GROUP_RANK"]),
        "control": os.environ["SWITCHML_CONTROL"],
        "session_id": world.session_id,
        "init_s": time.monotonic() - t0,
    }
    gloo = dist.new_group(backend="gloo")
    losses, params = _train(world)
    out["switchml"] = {"losses": losses, "digest": _digest(params), "stats": world.switchml_stats()}
    gloo_losses, gloo_params = _train(gloo)
    out["gloo"] = {"losses": gloo_losses, "digest": _digest(gloo_params)}
    out["max_param_diff"] = float((params - gloo_params).abs().max())
    out["max_param"] = float(params.abs().max())
    dist.barrier(group=gloo)
    if rank == 0:
        out["fabric"] = _fabric_view(controls, world.session_id)
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    out["total_s"] = time.monotonic() - t0
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
