"""A training program for tests/test_restart.py, run as each rank by
``switchml run --workers W --switch S --control C -- python restart_training.py OUT MODE``.

MODE ``torch``: a small MLP under DistributedDataParallel with the ``switchml``
backend (float32 gradients through the switch). MODE ``numpy``: the same kind of
model by hand, its gradients summed with ``hostlib.from_env().allreduce``. Every
input is seeded by rank and step, so two runs compute the same thing: with the
same quantized sums they end with the same parameters, bit for bit. Each step
writes ``OUT/step.<rank>`` (the test kills the switch at a step it chooses) and
rank r writes its final parameters to ``OUT/params.<r>``.
"""

import os
import sys
import time
from pathlib import Path

import numpy as np

STEPS = 30
FEATURES, HIDDEN, CLASSES, BATCH = 64, 256, 10, 32


def data(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH)
    return x, y


def progress(out: Path, rank: int, step: int) -> None:
    tmp = out / f".step.{rank}"
    tmp.write_text(str(step))
    os.replace(tmp, out / f"step.{rank}")
    time.sleep(0.05)  # a step of real training takes a while


def run_torch(out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import hostlib.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("switchml")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = data(rank, step)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
        progress(out, rank, step)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    (out / f"params.{rank}").write_bytes(params.tobytes())
    dist.destroy_process_group()


def run_numpy(out: Path) -> None:
    import hostlib

    ctx = hostlib.from_env()
    rank, world = ctx.rank, ctx.world_size
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((FEATURES, HIDDEN)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, CLASSES)) * 0.1).astype(np.float32)
    with ctx:
        for step in range(STEPS):
            x, y = data(rank, step)
            h = np.maximum(x @ w1, 0)
            z = h @ w2
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            p[np.arange(BATCH), y] -= 1
            g2 = h.T @ p / BATCH
            g1 = x.T @ ((p @ w2.T) * (h > 0)) / BATCH
            grads = np.concatenate([g1.reshape(-1), g2.reshape(-1)]).astype(np.float32)
            total = ctx.allreduce(grads)
            w1 -= 0.1 * total[: w1.size].reshape(w1.shape) / world
            w2 -= 0.1 * total[w1.size :].reshape(w2.shape) / world
            progress(out, rank, step)
    (out / f"params.{rank}").write_bytes(np.concatenate([w1.ravel(), w2.ravel()]).tobytes())


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    (run_torch if mode == "torch" else run_numpy)(out)
