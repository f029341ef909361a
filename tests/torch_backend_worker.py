"""One rank of tests/test_torch_backend.py, started by torchrun.

``python -m torch.distributed.run --nproc-per-node 3 torch_backend_worker.py OUT``
with ``SWITCHML_CONTROL`` set: the rank runs every check of the ``switchml``
backend in one process group lifetime (torch's start-up dominates the test's
time, so one launch does it all) and writes what it saw to ``OUT/rank<R>.json``.
Each rank knows every rank's inputs (they are seeded by rank), so it checks its
own results against the exact ones; the test compares the ranks' digests and
the emulator's counters.

``--init-only``: join and leave (the test of the error when no switch answers).

``--elastic``: under ``torchrun --max-restarts 1``, train a small DDP model for
:data:`ELASTIC_STEPS` steps; rank 1 of the first attempt dies at step
:data:`ELASTIC_DIES_AT` (``os._exit``: a crash, nothing cleaned up), torchrun
restarts every rank, and the second attempt trains to the end. Each rank writes
``joined-<attempt>-<rank>.json`` once its group is up and, at the end,
``rank<R>.json``.
"""

# No ``from __future__ import annotations``: DDP inspects hook annotations.
import faulthandler
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import hostlib.torch  # registers the backend; its hooks are used below
from hostlib.quant import error_bound, simulate_allreduce16
from hostlib.torch_backend import SwitchMLProcessGroup
from swemu.protocol import wire

#: lengths of the allreduce checks: odd ones, one value, several chunks of any size code
LENGTHS = (1, 7, 2049, 30011)
#: ``--elastic``: training steps, and the step at which rank 1 of the first attempt dies
ELASTIC_STEPS, ELASTIC_DIES_AT = 10, 5


def _digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bytes
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def _ints(rank: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    # large magnitudes: the sum of 3 wraps around int32 sometimes, as the registers do
    return torch.randint(-(2**30), 2**30, (n,), generator=g, dtype=torch.int64).to(torch.int32)


def _floats(rank: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    # magnitudes that differ from chunk to chunk, and exact zeros
    x *= torch.logspace(-6, 3, n, dtype=torch.float64) if n > 1 else 1.0
    x[::17] = 0.0
    return x.to(torch.float32)


def _float_excess(result: torch.Tensor, inputs: list[torch.Tensor], nvals: int, div: int) -> float:
    """max(|result - exact| / bound) over elements, with the §4 bound of each
    element's chunk (M = max |x| over the chunk and every rank), divided by
    ``div`` for an average, plus one float32 rounding of the division."""
    x = np.stack([t.double().numpy() for t in inputs])
    exact = x.sum(axis=0) / div
    m = np.abs(x).max(axis=0)
    starts = np.arange(0, m.size, nvals)
    chunk_m = np.repeat(np.maximum.reduceat(m, starts), nvals)[: m.size]
    bound = error_bound(chunk_m, len(inputs)) / div
    if div > 1:
        bound = bound + 2.0**-24 * (np.abs(exact) + bound)
    bound = bound + float(np.finfo(np.float32).smallest_subnormal)
    return float(np.max(np.abs(result.double().numpy() - exact) / bound))


def checks(out: dict, rank: int, size: int) -> None:
    world = dist.group.WORLD
    assert isinstance(world, SwitchMLProcessGroup), type(world)
    nvals = wire.values_per_packet(world.context.options.packet_size)
    out.update(
        backend=dist.get_backend(),
        session_id=world.session_id,
        packet_size=world.context.options.packet_size,
        window=world.context.options.window,
    )

    # int32: exact (wrapping) sums, odd lengths
    ints = {}
    for n in LENGTHS:
        t = _ints(rank, n, 1)
        dist.all_reduce(t)
        expect = sum(_ints(r, n, 1).to(torch.int64) for r in range(size))
        expect = ((expect + 2**31) % 2**32 - 2**31).to(torch.int32)
        ints[n] = {"exact": bool(torch.equal(t, expect)), "digest": _digest(t)}
    out["int32"] = ints

    # float32 SUM and AVG within the bound; the replicas get the same bytes
    floats = {}
    for n in LENGTHS:
        for op, div in ((dist.ReduceOp.SUM, 1), (dist.ReduceOp.AVG, size)):
            t = _floats(rank, n, 2)
            dist.all_reduce(t, op=op)
            inputs = [_floats(r, n, 2) for r in range(size)]
            floats[f"{n}/{div}"] = {
                "excess": _float_excess(t, inputs, nvals, div),
                "digest": _digest(t),
            }
    out["float32"] = floats

    # float16 and bfloat16: 16-bit values from their own memory (docs/protocol.md
    # §4.2), bit for bit the numpy twin's result, SUM and AVG
    nvals16 = wire.values16_per_packet(world.context.options.packet_size)
    direct16 = {}
    for dtype in (torch.float16, torch.bfloat16):
        calls16 = world.switchml_stats()["values16"]
        inputs = [_floats(r, 30011, 4).clamp(-6e4, 6e4).to(dtype) for r in range(size)]
        t = inputs[rank].clone()
        dist.all_reduce(t)
        if dtype == torch.float16:
            want = simulate_allreduce16([x.numpy() for x in inputs], nvals16)
            got = t.numpy()
        else:
            patterns = [x.view(torch.int16).numpy().view(np.uint16) for x in inputs]
            want = simulate_allreduce16(patterns, nvals16, bfloat16=True)
            got = t.view(torch.int16).numpy().view(np.uint16)
        avg = inputs[rank].clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        direct16[str(dtype).removeprefix("torch.")] = {
            "dtype": str(t.dtype),
            "twin": bool(np.array_equal(got.view(np.uint16), want.view(np.uint16))),
            "avg": bool(torch.equal(avg, (t / size).to(dtype))),
            "values16_calls": world.switchml_stats()["values16"] - calls16,
            "digest": _digest(t),
        }
    out["direct16"] = direct16

    # float64: as float32, back in its own type
    staged = {}
    for dtype in (torch.float64,):
        t = (torch.arange(1001, dtype=torch.float32) * (rank + 1) / 64).to(dtype)
        dist.all_reduce(t)
        exact = torch.arange(1001, dtype=torch.float64) * sum(range(1, size + 1)) / 64
        rel = float(((t.double() - exact).abs() / exact.abs().clamp(min=1)).max())
        staged[str(dtype).removeprefix("torch.")] = {"dtype": str(t.dtype), "rel": rel}
    # a non-contiguous int32 view is staged too, and lands back in place
    m = _ints(rank, 6 * 5, 3).reshape(6, 5).t()
    dist.all_reduce(m)
    full = sum(_ints(r, 30, 3).to(torch.int64) for r in range(size))
    full = ((full + 2**31) % 2**32 - 2**31).to(torch.int32).reshape(6, 5).t()
    staged["int32_transposed"] = {"exact": bool(torch.equal(m, full))}
    out["staged"] = staged

    # repeated calls: 30 in a row, each checked
    ok = True
    for i in range(30):
        t = torch.full((513,), rank + i, dtype=torch.int32)
        dist.all_reduce(t)
        ok &= bool((t == sum(r + i for r in range(size))).all())
    out["repeated_ok"] = ok

    # async_op: 12 calls in flight at once, waited for in reverse order; futures
    tensors = [torch.full((1000 + 37 * i,), float(rank + i)) for i in range(12)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    results = [w.get_future() for w in works]
    for w in reversed(works):
        w.wait()
    out["async"] = {
        "ok": all(
            bool((t == float(sum(r + i for r in range(size)))).all()) for i, t in enumerate(tensors)
        ),
        "completed": all(w.is_completed() for w in works),
        "future_is_tensor": all(f.value()[0] is t for f, t in zip(results, tensors)),
    }
    chained = (
        dist.all_reduce(torch.ones(10), async_op=True)
        .get_future()
        .then(lambda f: float(f.value()[0].sum()))
    )
    out["async"]["then"] = chained.wait()

    # delegated to gloo: what the switch cannot do
    before = world.switchml_stats()
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=1)
    gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.int64))
    mx = torch.tensor([float(rank)])
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    i64 = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(i64)
    dist.barrier()
    if rank == 0:
        dist.send(torch.tensor([42.0]), dst=1)
        p2p = 42.0
    elif rank == 1:
        r = torch.zeros(1)
        dist.recv(r, src=0)
        p2p = float(r[0])
    else:
        p2p = 42.0
    red = torch.full((4,), float(rank + 1))
    dist.reduce(red, dst=0)
    scattered = torch.zeros(2)
    dist.scatter(
        scattered, [torch.full((2,), 10.0 * k) for k in range(size)] if rank == 0 else None
    )
    rs = torch.zeros(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * size, dtype=torch.int32))
    # many small delegated calls in a row: torch's path for Python process groups
    # deadlocked with gloo's worker thread within a few hundred of these
    many = True
    for i in range(300):
        g3 = [torch.zeros(2, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(g3, torch.full((2,), rank + i, dtype=torch.int64))
        many &= all(int(g[0]) == k + i for k, g in enumerate(g3))
    after = world.switchml_stats()
    out["delegated"] = {
        "many_all_gathers": many,
        "reduce": float(red[0]) if rank == 0 else None,
        "scatter": scattered.tolist(),
        "reduce_scatter": rs.tolist(),
        "broadcast": b.tolist(),
        "all_gather": [g.tolist() for g in gathered],
        "max": float(mx[0]),
        "int64": int(i64[0]),
        "p2p": p2p,
        "switch_calls": after["calls"] - before["calls"],
        "delegated": after["delegated"] - before["delegated"],
    }

    # a sub-group (ranks 0 and 2) is a SwitchML job of its own, used between
    # calls of the world group
    sub = dist.new_group([0, 2], backend="switchml")
    if rank in (0, 2):
        assert isinstance(sub, SwitchMLProcessGroup), type(sub)
        t = torch.full((3001,), rank + 1, dtype=torch.int32)
        w1 = dist.all_reduce(t, group=sub, async_op=True)
        u = torch.full((301,), 1.5 * rank)
        dist.all_reduce(u)  # world, while the sub-group's call may still run
        w1.wait()
        out["subgroup"] = {
            "session_id": sub.session_id,
            "size": dist.get_world_size(sub),
            "ok": bool((t == 4).all()),
            "world_ok": bool((u == 1.5 * sum(range(size))).all()),
            "packets": sub.switchml_stats()["packets"],
        }
    else:
        u = torch.full((301,), 1.5 * rank)
        dist.all_reduce(u)
        out["subgroup"] = {"member": False, "world_ok": bool((u == 1.5 * sum(range(size))).all())}

    # DDP with no hook: identical replicas, gradients through the switch
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(40, 300), nn.Tanh(), nn.Linear(300, 300), nn.Tanh(), nn.Linear(300, 8)
    )
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)
    calls0 = world.switchml_stats()["calls"]
    g = torch.Generator().manual_seed(rank)
    flat, identical = _train(ddp, 4, g, size)
    out["ddp"] = {
        "identical": identical,
        "switch_calls": world.switchml_stats()["calls"] - calls0,
        "moved": float((flat - torch.cat([p.detach().reshape(-1) for p in _fresh()])).abs().max()),
    }

    # torch's own fp16_compress_hook, and hostlib.torch's twin of its bf16 one (DDP
    # refuses torch's by name without NCCL): their float16/bfloat16 buckets go
    # through the switch as 16-bit values
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooks = {}
    for name, hook in (
        ("fp16", default_hooks.fp16_compress_hook),
        ("fp16_hostlib", hostlib.torch.switchml_fp16_compress_hook),
        ("bf16", hostlib.torch.switchml_bf16_compress_hook),
    ):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(40, 300), nn.Tanh(), nn.Linear(300, 8))
        ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.1)
        ddp.register_comm_hook(world, hook)
        before = world.switchml_stats()
        _, identical = _train(ddp, 3, g, size)
        after = world.switchml_stats()
        hooks[name] = {
            "identical": identical,
            "switch_calls": after["calls"] - before["calls"],
            "values16_calls": after["values16"] - before["values16"],
        }
    out["hooks16"] = hooks

    # SWITCHML_VALUES16=1 (read when a group is made): float32 on the 16-bit wire too
    os.environ["SWITCHML_VALUES16"] = "1"
    g16 = dist.new_group(list(range(size)), backend="switchml")
    del os.environ["SWITCHML_VALUES16"]
    inputs = [_floats(r, 30011, 5) for r in range(size)]
    t = inputs[rank].clone()
    dist.all_reduce(t, group=g16)
    want = simulate_allreduce16([x.numpy() for x in inputs], nvals16)
    out["float32_values16"] = {
        "twin": bool(np.array_equal(t.numpy(), want)),
        "values16_calls": g16.switchml_stats()["values16"],
    }

    # the emulator's view: every call of the world group was aggregated there
    dist.barrier()
    if rank == 0:
        from swemu.observe.stats import fetch_stats

        snap = fetch_stats(os.environ["SWITCHML_CONTROL"])
        jobs = {j["session_id"]: j for j in snap["jobs"]}
        out["emulator"] = {
            "world_aggregated": jobs[world.session_id]["counters"]["aggregated"],
            "world_workers": len(jobs[world.session_id]["workers"]),
            "sub_aggregated": jobs[sub.session_id]["counters"]["aggregated"],
        }
    dist.barrier()
    out["stats"] = world.switchml_stats()


def elastic(out: dict, out_dir: Path, rank: int, size: int) -> None:
    """``--elastic`` (see the module docstring): the replicas' final parameters
    are compared across ranks; every gradient went through the switch."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    world = dist.group.WORLD
    joined = {"attempt": attempt, "rank": rank, "session_id": world.session_id}
    (out_dir / f"joined-{attempt}-{rank}.json").write_text(json.dumps(joined))
    net = _small_net()
    start = _flat(net)
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(ELASTIC_STEPS):
        if attempt == 0 and rank == 1 and step == ELASTIC_DIES_AT:
            os._exit(1)
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    flat = _flat(net)
    replicas = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(replicas, flat)
    out.update(
        joined,
        steps=ELASTIC_STEPS,
        identical=all(torch.equal(r, flat) for r in replicas),
        digest=_digest(flat),
        moved=float((flat - start).abs().max()),
        switch_calls=world.switchml_stats()["calls"],
    )


def _small_net() -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank
    return nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 4))


def _flat(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).clone()


def _train(ddp, steps: int, g: torch.Generator, size: int) -> tuple[torch.Tensor, bool]:
    """``steps`` SGD steps of ``ddp`` on random batches; its flat parameters after,
    and whether every rank holds the same (all_gather through gloo)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(steps):
        x, y = torch.randn(16, 40, generator=g), torch.randint(0, 8, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])
    replicas = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(replicas, flat)
    return flat, all(torch.equal(r, flat) for r in replicas)


def _fresh():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(40, 300), nn.Tanh(), nn.Linear(300, 300), nn.Tanh(), nn.Linear(300, 8)
    ).parameters()


def main() -> int:
    out_dir = Path(sys.argv[1])
    # a hang ends with every thread's stack on stderr, well before the test's timeout
    faulthandler.dump_traceback_later(float(os.environ.get("HANG_DUMP_AFTER", "150")), exit=True)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    dist.init_process_group("switchml")
    rank, size = dist.get_rank(), dist.get_world_size()
    out: dict = {"rank": rank, "world_size": size, "init_s": time.monotonic() - t0}
    if "--elastic" in sys.argv:
        elastic(out, out_dir, rank, size)
    elif "--init-only" not in sys.argv:
        checks(out, rank, size)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    out["total_s"] = time.monotonic() - t0
    (out_dir / f"rank{rank}.json").write_text(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
