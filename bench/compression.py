"""``python -m bench compression``: in-network aggregation against gradient compression.

The SwitchML paper sets its switch beside the other way to send fewer bytes: compress
the gradients. This benchmark trains the same model with DDP, the same seeds, data,
batch, learning rate and step count, six ways, interleaved (the order rotates from
repetition to repetition):

- ``switchml``: the ``switchml`` torch.distributed backend (``import hostlib.torch``),
  no hook: every bucket is one allreduce through the emulator;
- ``switchml16``: the same with ``SWITCHML_VALUES16=1``: the float32 buckets go as
  16-bit values (docs/protocol.md §4.2), no cast on the worker;
- ``switchml-fp16``: the ``switchml`` backend with torch's ``fp16_compress_hook``:
  float16 buckets, 16-bit values through the switch (fp16's recipe, SwitchML's sum);
- ``gloo``: plain DDP on gloo (a ring allreduce of float32 buckets);
- ``fp16``: gloo with torch's ``fp16_compress_hook`` (buckets cast to float16);
- ``bf16``: gloo with torch's ``bf16_compress_hook`` recipe (buckets cast to
  bfloat16; ``hostlib.torch.switchml_bf16_compress_hook``, the same code under a name
  DDP accepts on CPU);
- ``powersgd``: gloo with torch's PowerSGD hook, rank ``POWERSGD_RANK``, plain
  allreduce for the first ``POWERSGD_START`` steps (its warm-up), error feedback;
- ``topk``: :func:`topk_hook`, the ``TOPK_RATIO`` largest magnitudes of each bucket
  plus the residual of earlier steps (error feedback), an allgather of
  (int32 index, float32 value) pairs;
- ``qsgd``: :func:`qsgd_hook`, stochastic quantization to ``QSGD_LEVELS`` levels of
  each ``QSGD_BUCKET`` values' L2 norm, one int8 per value plus a float32 norm
  per bucket, an allgather of those bytes (no error feedback: QSGD is unbiased).

Where: the emulated rack of :mod:`swemu.rack` (network namespaces, tbf-shaped links;
needs root) at each of ``rates`` Gbit/s, and ``lo``: every process on loopback,
no shaping (the CPU is the only limit). Per run, over the steps from
``TIMED_FROM`` on (before it DDP builds its buckets and PowerSGD warms up):

- the median step (a step's time is its slowest rank's) and samples/s;
- the bytes one worker sends per step, counted from what the method sends: the
  ring allreduce of B bytes sends 2(W−1)/W · B per worker, an allgather of B
  bytes per worker (W−1) · B (gloo's ring), SwitchML one packet of
  ``packet_len`` bytes (UDP payload) per slot, retransmissions included. The
  allreduces of fp16 and PowerSGD and the allgathers of top-k and QSGD are
  counted where the hooks call ``torch.distributed``; plain DDP's (C++) from its
  bucket bytes. What a worker receives equals what it sends for all six. On the
  rack the worker's veth transmit counter (``/proc/net/dev``: every header,
  ACK and retransmission) is beside it;
- the seconds the top-k and QSGD hooks spend compressing and decoding;
- the final loss (the mean of the last ``SMOOTH`` steps' global-batch losses)
  and the held-out accuracy at the fixed step count.

The rack is :mod:`swemu.rack`, imported once as ``rack_lib``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import swemu.rack as rack_lib

from . import training

METHODS = (
    "switchml",
    "switchml16",
    "switchml-fp16",
    "gloo",
    "fp16",
    "bf16",
    "powersgd",
    "topk",
    "qsgd",
)
#: the methods through the switch (the switchml backend)
SWITCHML_METHODS = ("switchml", "switchml16", "switchml-fp16")
TOPK_RATIO = 0.01  # of each bucket's values, as in the paper's Top-k configuration
QSGD_LEVELS = 127  # magnitude levels: sign and level fit one int8 (8-bit QSGD)
QSGD_BUCKET = 512  # values per norm (QSGD's bucketing: the variance grows with it)
POWERSGD_RANK = 4
POWERSGD_START = 10  # plain allreduce before this step (PowerSGD's warm-up)
TIMED_FROM = 10  # first timed step: DDP's buckets are built, PowerSGD compresses
SMOOTH = training.SMOOTH
MASTER_PORT = 29700
LOOPBACK = "lo"


# ------------------------------------------------------------------ compressors
def topk_compress(x: Any, k: int) -> tuple[Any, Any]:
    """The ``k`` entries of the 1-D float tensor ``x`` largest in magnitude:
    (int32 indices, their float32 values), in no particular order."""
    import torch

    if x.dim() != 1:
        raise ValueError("topk_compress takes a 1-D tensor")
    if not 0 < k <= x.numel():
        raise ValueError(f"k must be in 1..{x.numel()}, not {k}")
    idx = torch.topk(x.abs(), k, sorted=False).indices
    return idx.to(torch.int32), x[idx]


def topk_decompress(indices: Any, values: Any, n: int) -> Any:
    """The dense length-``n`` tensor with ``values`` at ``indices``, zeros elsewhere."""
    import torch

    out = torch.zeros(n, dtype=values.dtype)
    out.index_add_(0, indices.long(), values)
    return out


class ErrorFeedback:
    """The residual of Top-k (error feedback): what a step did not send is added
    to the next step's gradient, so every gradient entry is sent eventually.
    One residual per key (a DDP bucket's index)."""

    def __init__(self) -> None:
        self.residual: dict[int, Any] = {}

    def compress(self, key: int, grad: Any, k: int) -> tuple[Any, Any]:
        """Top-k of grad + residual; the residual keeps the rest (the sent
        entries become zero)."""
        import torch

        acc = self.residual.get(key)
        if acc is None:
            acc = self.residual[key] = torch.zeros_like(grad)
        acc.add_(grad)
        idx, vals = topk_compress(acc, k)
        acc[idx.long()] = 0.0  # vals is a copy (advanced indexing)
        return idx, vals


def qsgd_compress(
    x: Any, uniform: Any, levels: int = QSGD_LEVELS, bucket: int = QSGD_BUCKET
) -> tuple[Any, Any]:
    """QSGD: each value of ``x`` (1-D float32) as sign · ξ / ``levels`` of the L2
    norm of its bucket of ``bucket`` values, ξ ∈ {0 … levels} rounded up with
    probability equal to the remainder (``uniform``: one U[0, 1) draw per value),
    so that the decoded value is ``x`` in expectation. Returns (int8 sign · ξ,
    float32 norm per bucket)."""
    import torch

    if x.dim() != 1 or uniform.shape != x.shape:
        raise ValueError("qsgd_compress takes a 1-D tensor and one uniform draw per value")
    if not 1 <= levels <= 127:
        raise ValueError(f"levels must be in 1..127 (one int8 per value), not {levels}")
    n = x.numel()
    nb = math.ceil(n / bucket)
    pad = nb * bucket - n
    xb = torch.nn.functional.pad(x, (0, pad)).view(nb, bucket)
    ub = torch.nn.functional.pad(uniform, (0, pad)).view(nb, bucket)
    norms = torch.linalg.vector_norm(xb, dim=1)
    scale = torch.where(norms > 0, levels / norms, torch.zeros_like(norms))
    r = xb.abs() * scale[:, None]
    low = r.floor()
    q = (low + (ub < r - low).to(r.dtype)).clamp_(max=levels)  # r ≤ levels but for rounding
    q = (q * xb.sign()).to(torch.int8)
    return q.view(-1)[:n], norms


def qsgd_decompress(
    q: Any, norms: Any, levels: int = QSGD_LEVELS, bucket: int = QSGD_BUCKET
) -> Any:
    """The float32 values that :func:`qsgd_compress`'s (``q``, ``norms``) stand for."""
    import torch

    n = q.numel()
    nb = norms.numel()
    qb = torch.nn.functional.pad(q.to(torch.float32), (0, nb * bucket - n)).view(nb, bucket)
    return (qb * (norms / levels)[:, None]).view(-1)[:n]


# ------------------------------------------------------------------ comm hooks
@dataclass
class HookState:
    """What :func:`topk_hook` and :func:`qsgd_hook` keep between calls: the
    group, Top-k's residuals, QSGD's random stream, and the seconds spent
    compressing and decoding (main thread and gloo's callback thread)."""

    group: Any
    ratio: float = TOPK_RATIO
    levels: int = QSGD_LEVELS
    bucket: int = QSGD_BUCKET
    seed: int = 0
    codec_s: float = 0.0

    def __post_init__(self) -> None:
        import torch

        self.feedback = ErrorFeedback()
        self.generator = torch.Generator().manual_seed(self.seed)


def _allgather(state: HookState, packed: Any, decode: Callable[[list[Any]], Any]) -> Any:
    """Allgather ``packed`` (the same size on every rank) over the state's group;
    a future of ``decode(the W tensors)``."""
    import torch.distributed as dist

    w = state.group.size()
    gathered = [packed.new_empty(packed.shape) for _ in range(w)]
    fut = dist.all_gather(gathered, packed, group=state.group, async_op=True).get_future()

    def done(_: Any) -> Any:
        t0 = time.perf_counter()
        out = decode(gathered)
        state.codec_s += time.perf_counter() - t0
        return out

    return fut.then(done)


def topk_hook(state: HookState, bucket: Any) -> Any:
    """DDP comm hook: Top-k with error feedback, an allgather of every rank's
    k (index, value) pairs (one int32 tensor of 2k), the mean of their sum."""
    import torch

    t0 = time.perf_counter()
    grad = bucket.buffer()
    n = grad.numel()
    k = max(1, math.ceil(state.ratio * n))
    idx, vals = state.feedback.compress(bucket.index(), grad, k)
    packed = torch.cat([idx, vals.view(torch.int32)])
    state.codec_s += time.perf_counter() - t0
    w = state.group.size()

    def decode(parts: list[Any]) -> Any:
        grad.zero_()
        for p in parts:
            grad.index_add_(0, p[:k].long(), p[k:].view(torch.float32))
        return grad.div_(w)

    return _allgather(state, packed, decode)


def qsgd_hook(state: HookState, bucket: Any) -> Any:
    """DDP comm hook: QSGD, an allgather of every rank's float32 norms and int8
    levels (one uint8 tensor), the mean of the decoded gradients."""
    import torch

    t0 = time.perf_counter()
    grad = bucket.buffer()
    n = grad.numel()
    uniform = torch.rand(n, generator=state.generator)
    q, norms = qsgd_compress(grad, uniform, state.levels, state.bucket)
    packed = torch.cat([norms.view(torch.uint8), q.view(torch.uint8)])  # norms aligned
    head = 4 * norms.numel()
    state.codec_s += time.perf_counter() - t0
    w = state.group.size()

    def decode(parts: list[Any]) -> Any:
        grad.zero_()
        for p in parts:
            grad.add_(
                qsgd_decompress(
                    p[head:].view(torch.int8),
                    p[:head].view(torch.float32),
                    state.levels,
                    state.bucket,
                )
            )
        return grad.div_(w)

    return _allgather(state, packed, decode)


def ring_allreduce_bytes(nbytes: int, w: int) -> float:
    """Bytes one worker sends in a ring allreduce of ``nbytes``: 2(W−1)/W · nbytes."""
    return 2 * (w - 1) / w * nbytes


def ring_allgather_bytes(nbytes: int, w: int) -> int:
    """Bytes one worker sends in a ring allgather of ``nbytes`` per worker: (W−1) · nbytes."""
    return (w - 1) * nbytes


class Traffic:
    """Counts what a process sends through ``torch.distributed.all_reduce`` and
    ``all_gather`` (by the ring's formulas) while :meth:`install` ed: the calls
    of torch's and our comm hooks. Plain DDP's allreduces run in C++ and are
    not seen here."""

    def __init__(self, w: int) -> None:
        self.w = w
        self.sent = 0.0
        self.calls = 0

    def install(self) -> None:
        import torch.distributed as dist

        all_reduce, all_gather = dist.all_reduce, dist.all_gather

        def counted_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.sent += ring_allreduce_bytes(tensor.numel() * tensor.element_size(), self.w)
            return all_reduce(tensor, *args, **kwargs)

        def counted_all_gather(out: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.sent += ring_allgather_bytes(tensor.numel() * tensor.element_size(), self.w)
            return all_gather(out, tensor, *args, **kwargs)

        dist.all_reduce, dist.all_gather = counted_all_reduce, counted_all_gather


# ------------------------------------------------------------------- models
@dataclass(frozen=True)
class Model:
    """An MLP of ``layers`` linear layers ``hidden`` wide, trained with ``batch``
    samples per rank; written ``HIDDENxLAYERS@BATCH`` (e.g. ``2048x3@16``)."""

    hidden: int
    layers: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> Model:
        try:
            shape, _, batch = text.partition("@")
            hidden, layers = shape.lower().split("x")
            m = cls(int(hidden), int(layers), int(batch or 16))
        except ValueError:
            raise ValueError(
                f"a model is HIDDENxLAYERS@BATCH (e.g. 2048x3@16), not {text!r}"
            ) from None
        if m.hidden < 1 or m.layers < 2 or m.batch < 1:
            raise ValueError(f"model {text!r}: hidden ≥ 1, layers ≥ 2, batch ≥ 1")
        return m

    @property
    def name(self) -> str:
        return f"{self.hidden}x{self.layers}@{self.batch}"

    @property
    def params(self) -> int:
        d, h, c = training.DIM, self.hidden, training.CLASSES
        return d * h + h + (self.layers - 2) * (h * h + h) + h * c + c


#: a communication-heavy model (bench/TRAINING.md's: 19 MB of gradients, 16 samples per
#: rank) and a compute-heavy one (2.6 MB of gradients, 512 samples per rank)
DEFAULT_MODELS = ("2048x3@16", "512x4@512")


# ------------------------------------------------------------------ the driver
def run(
    sites: Sequence[float | str],
    models: Sequence[Model],
    *,
    workers: int = 4,
    methods: Sequence[str] = METHODS,
    steps: int = 30,
    reps: int = 1,
    lr: float = 0.05,
    bucket_mb: float = 25.0,
    timed_from: int = TIMED_FROM,
    powersgd_start: int = POWERSGD_START,
    emulator_nice: int = -10,
    partial: Path | None = None,
    log: Callable[[str], None] = print,
    vary_seed: bool = False,
) -> dict[str, Any]:
    """Every (site, model, repetition, method), interleaved; ``sites`` are link
    rates in Gbit/s (the emulated rack) and ``"lo"`` (loopback). With
    ``vary_seed`` repetition r starts from seed r (weights and data order), so
    that the spread of a method's final loss over repetitions is its run-to-run
    noise; otherwise every repetition has seed 0. Returns the configuration,
    every run's row and the summary."""
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; known: {', '.join(METHODS)}")
    if steps < timed_from + SMOOTH:
        raise ValueError(f"--steps must be at least {timed_from + SMOOTH}")
    if "powersgd" in methods and not 1 < powersgd_start <= timed_from:
        raise ValueError("PowerSGD's warm-up must end by the first timed step (and be > 1)")
    if workers < 2:
        raise ValueError("--workers must be at least 2")
    config = {
        "workers": workers,
        "sites": list(sites),
        "models": [m.name for m in models],
        "methods": list(methods),
        "steps": steps,
        "timed_from": timed_from,
        "reps": reps,
        "lr": lr,
        "bucket_mb": bucket_mb,
        "topk_ratio": TOPK_RATIO,
        "qsgd_levels": QSGD_LEVELS,
        "qsgd_bucket": QSGD_BUCKET,
        "powersgd_rank": POWERSGD_RANK,
        "powersgd_start": powersgd_start,
        "emulator_nice": emulator_nice,
        "mtu": 9000,
        "vary_seed": vary_seed,
    }
    code = rack_lib.code_state()
    results: list[dict[str, Any]] = []
    launch = 0

    def one_site(site: float | str, start: Callable[[int, dict, Path], list[dict]]) -> None:
        nonlocal launch
        for model in models:
            for rep in range(reps):
                shift = rep % len(methods)
                for method in [*methods[shift:], *methods[:shift]]:
                    launch += 1
                    args = {
                        "method": method,
                        "steps": steps,
                        "hidden": model.hidden,
                        "layers": model.layers,
                        "batch": model.batch,
                        "lr": lr,
                        "bucket_mb": bucket_mb,
                        "timed_from": timed_from,
                        "powersgd_start": powersgd_start,
                        "seed": rep if vary_seed else 0,
                    }
                    ranks = start(launch, args, Path(tmp) / f"run{launch}")
                    row = _row(ranks, method, site, model, workers, rep, timed_from)
                    log(
                        f"{site} W={workers} {model.name} rep {rep} {method:8s}: "
                        f"{row['median_step_s'] * 1e3:.0f} ms/step, "
                        f"{row['sent_bytes_per_step'] / 1e6:.2f} MB sent/step"
                        + (
                            f" ({row['wire_tx_bytes_per_step'] / 1e6:.2f} on the wire)"
                            if row.get("wire_tx_bytes_per_step") is not None
                            else ""
                        )
                        + f", codec {row['codec_s_per_step'] * 1e3:.0f} ms, "
                        f"loss {row['final_loss']:.3f}, acc {row['accuracy']:.3f}, "
                        f"busy {row['machine_busy']:.0%}"
                    )
                    results.append(row)
                    if partial is not None:
                        partial.parent.mkdir(parents=True, exist_ok=True)
                        partial.write_text(
                            json.dumps({"config": config, "code": code, "results": results})
                        )

    base_env = {"SWITCHML_BUFFER_WARNING": "0", "OMP_NUM_THREADS": "1"}
    with rack_lib.signals_as_exceptions(), tempfile.TemporaryDirectory(prefix="compress-") as tmp:
        if LOOPBACK in sites:
            from swemu.launch import EmulatorProcess

            with EmulatorProcess() as emu:
                _renice(emu.proc.pid, emulator_nice, log)
                env = {
                    **base_env,
                    "SWITCHML_CONTROL": emu.control,
                    "SWITCHML_SWITCH": emu.switch,
                    "BENCH_EMULATOR_PID": str(emu.proc.pid),
                }
                one_site(
                    LOOPBACK,
                    lambda n, args, out: _launch_local(workers, env, args, out),
                )
        rates = [s for s in sites if s != LOOPBACK]
        if rates:
            with rack_lib.Rack(workers) as rack:
                emu, _ = rack_lib.start_emulator(rack, Path(tmp), nice=emulator_nice)
                env = {
                    **base_env,
                    "WORLD_SIZE": str(workers),
                    "MASTER_ADDR": rack.worker_ip(0),
                    "SWITCHML_CONTROL": f"{rack.switch_ip}:{rack_lib.SWITCH_CONTROL_PORT}",
                    "SWITCHML_SWITCH": f"{rack.switch_ip}:{rack_lib.SWITCH_UDP_PORT}",
                    "BENCH_EMULATOR_PID": str(emu.pid),
                }
                for rate in rates:
                    rack.shape(rack_lib.Shaping(float(rate)))
                    one_site(
                        float(rate),
                        lambda n, args, out: training.launch_ranks(
                            rack,
                            workers,
                            {**env, "MASTER_PORT": str(MASTER_PORT + n % 1000)},
                            args,
                            out,
                            module="bench.compression",
                        ),
                    )
                emu.terminate()
    return {
        "config": config,
        "code": code,
        "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "results": results,
        "summary": summarize(results),
    }


def _renice(pid: int, nice: int, log: Callable[[str], None]) -> None:
    """Every thread of ``pid`` at niceness ``nice`` (as the rack's ``nice -n``)."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
    except OSError as exc:  # not root: the emulator stays at the workers' niceness
        log(f"emulator niceness unchanged ({exc})")


def _launch_local(w: int, env: dict[str, str], args: dict[str, Any], out: Path) -> list[dict]:
    """The W ranks of one run as local processes (loopback), their JSON."""
    from swemu.launch import CHILD_CWD, child_env, spawn, torchrun_envs, wait_all

    out.mkdir()
    procs = []
    for r, launcher in enumerate(torchrun_envs(w)):
        argv = [sys.executable, "-m", "bench.compression", json.dumps(args), str(out / f"{r}.json")]
        with open(out / f"{r}.log", "wb") as f:
            procs.append(
                spawn(
                    argv,
                    env=child_env(**{**launcher, **env}),
                    stdin=subprocess.DEVNULL,
                    cwd=CHILD_CWD,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                )
            )
    return training.rank_reports(wait_all(procs, 1800), out)


def _row(
    ranks: list[dict[str, Any]],
    method: str,
    site: float | str,
    model: Model,
    w: int,
    rep: int,
    timed_from: int,
) -> dict[str, Any]:
    """One run's figures from its ranks' reports."""
    steps = [max(v) for v in zip(*(r["step_s"] for r in ranks))]
    med = statistics.median(steps[timed_from:])
    losses = [statistics.fmean(v) for v in zip(*(r["loss"] for r in ranks))]
    wall = max(r["window_s"] for r in ranks)
    compute = max(r["compute_s"] for r in ranks)
    tx = [r["wire_tx_bytes_per_step"] for r in ranks]
    r0 = ranks[0]
    return {
        "method": method,
        "site": site,
        "model": model.name,
        "workers": w,
        "rep": rep,
        "params": r0["params"],
        "grad_bytes": 4 * r0["params"],
        "median_step_s": med,
        "step_s": steps,
        "samples_per_s": model.batch * w / med,
        "compute_s": compute,
        "comm_share": max(0.0, 1 - compute / med),
        "sent_bytes_per_step": statistics.fmean(r["sent_bytes_per_step"] for r in ranks),
        "wire_tx_bytes_per_step": None if None in tx else statistics.fmean(tx),
        "codec_s_per_step": max(r["codec_s_per_step"] for r in ranks),
        "loss": losses,
        "final_loss": statistics.fmean(losses[-SMOOTH:]),
        "accuracy": r0["accuracy"],
        "machine_busy": r0["machine_busy"],
        "emulator_cores": r0["emulator_cpu_s"] / wall,
        "worker_cores": sum(r["cpu_s"] for r in ranks) / wall,
        **({"switch": r0["switch"]} if "switch" in r0 else {}),
    }


SUMMARY_KEYS = (
    "median_step_s",
    "samples_per_s",
    "compute_s",
    "comm_share",
    "sent_bytes_per_step",
    "wire_tx_bytes_per_step",
    "codec_s_per_step",
    "final_loss",
    "accuracy",
    "machine_busy",
    "worker_cores",
    "emulator_cores",
)


def _site_key(site: float | str) -> tuple[int, float]:
    return (0, 0.0) if site == LOOPBACK else (1, float(site))


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (site, model, method): medians over the repetitions, and the step
    speedup and byte reduction against plain gloo at the same site and model."""
    out = []
    points = sorted({(r["site"], r["model"]) for r in rows}, key=lambda p: (_site_key(p[0]), p[1]))
    for site, model in points:
        here = [r for r in rows if r["site"] == site and r["model"] == model]
        by_method: dict[str, dict[str, Any]] = {}
        for method in METHODS:
            mine = [r for r in here if r["method"] == method]
            if not mine:
                continue
            s: dict[str, Any] = {"site": site, "model": model, "method": method}
            for k in SUMMARY_KEYS:
                vals = [r[k] for r in mine if r.get(k) is not None]
                s[k] = statistics.median(vals) if vals else None
            s.update(reps=len(mine), params=mine[0]["params"], workers=mine[0]["workers"])
            # per repetition, in order (with --vary-seed: per seed)
            s["final_loss_all"] = [r["final_loss"] for r in sorted(mine, key=lambda r: r["rep"])]
            s["median_step_s_all"] = [
                r["median_step_s"] for r in sorted(mine, key=lambda r: r["rep"])
            ]
            by_method[method] = s
        gloo, fp16 = by_method.get("gloo"), by_method.get("fp16")
        for s in by_method.values():
            if gloo:
                s["speedup_vs_gloo"] = gloo["median_step_s"] / s["median_step_s"]
                s["bytes_vs_gloo"] = s["sent_bytes_per_step"] / gloo["sent_bytes_per_step"]
                s["loss_minus_gloo"] = s["final_loss"] - gloo["final_loss"]
            if fp16:
                s["speedup_vs_fp16"] = fp16["median_step_s"] / s["median_step_s"]
            out.append(s)
    return out


# ----------------------------------------------------------------- outputs
def _site_name(site: float | str) -> str:
    return "loopback" if site == LOOPBACK else f"{float(site):g} Gbit/s"


def _f(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "–" if v is None else format(v * scale, spec)


def markdown(data: dict[str, Any]) -> str:
    """The table of bench/COMPRESSION.md: one line per (site, model, method)."""
    c = data["config"]
    lines = [
        f"DDP training, W = {c['workers']}, {c['steps']} steps (timed from step "
        f"{c['timed_from']}), {c['reps']} rep(s); top-k {c['topk_ratio']:.0%} with error "
        f"feedback, QSGD {c['qsgd_levels']} levels per {c['qsgd_bucket']} values, PowerSGD "
        f"rank {c['powersgd_rank']} from step {c['powersgd_start']}",
        "",
        "| site | model (params) | method | step ms | speedup vs gloo | vs fp16 | compute ms "
        "| MB sent / step / worker (counted) | MB on the wire (veth tx) | bytes vs gloo "
        "| codec ms / step | final loss | accuracy |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in data["summary"]:
        lines.append(
            f"| {_site_name(s['site'])} | {s['model']} ({s['params'] / 1e6:.2f} M) "
            f"| {s['method']} | {_f(s['median_step_s'], '.0f', 1e3)} "
            f"| {_f(s.get('speedup_vs_gloo'), '.2f')}× | {_f(s.get('speedup_vs_fp16'), '.2f')}× "
            f"| {_f(s['compute_s'], '.0f', 1e3)} "
            f"| {_f(s['sent_bytes_per_step'], '.3f', 1e-6)} "
            f"| {_f(s['wire_tx_bytes_per_step'], '.3f', 1e-6)} "
            f"| {_f(s.get('bytes_vs_gloo'), '.3f')} "
            f"| {_f(s['codec_s_per_step'], '.0f', 1e3)} | {_f(s['final_loss'], '.4f')} "
            f"| {_f(s['accuracy'], '.3f')} |"
        )
    return "\n".join(lines)


def merge(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One document from several runs' (e.g. one per site, each under the
    measurement lock): their rows together, summarized again."""
    if not docs:
        raise ValueError("nothing to merge")
    rows = [r for d in docs for r in d["results"]]
    config = dict(docs[0]["config"])
    config["sites"] = [s for d in docs for s in d["config"]["sites"]]
    reps = sorted({d["config"]["reps"] for d in docs})
    config["reps"] = reps[0] if len(reps) == 1 else f"{reps[0]}–{reps[-1]}"
    return {
        "config": config,
        "runs": [{k: d[k] for k in ("config", "code", "machine") if k in d} for d in docs],
        "results": rows,
        "summary": summarize(rows),
    }


def write_outputs(
    data: dict[str, Any], out: Path, *, name: str = "compression", plot: bool = True
) -> list[Path]:
    """``name``.json and ``name``.md, then (``plot``, matplotlib there) ``name``.png."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(data, indent=1))
    paths[1].write_text(markdown(data) + "\n")
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return paths
        paths.append(out / f"{name}.png")
        plot_methods(data, paths[-1])
    return paths


def plot_methods(data: dict[str, Any], path: Path) -> None:
    """Per (site, model): each method's step time, bytes sent per step (log
    scale) and final loss, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = data["summary"]
    groups = sorted(
        {(s["site"], s["model"]) for s in summary}, key=lambda p: (_site_key(p[0]), p[1])
    )
    methods = [m for m in METHODS if any(s["method"] == m for s in summary)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        for ax, key, scale in (
            (axes[0], "median_step_s", 1e3),
            (axes[1], "sent_bytes_per_step", 1e-6),
            (axes[2], "loss_minus_gloo", 1.0),
        ):
            vals = []
            for g in groups:
                s = next(
                    (s for s in summary if (s["site"], s["model"]) == g and s["method"] == method),
                    None,
                )
                vals.append(s[key] * scale if s and s.get(key) is not None else 0.0)
            ax.bar(
                [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))],
                vals,
                width,
                label=method,
                color=f"C{j}",
            )
    labels = [f"{_site_name(site)}\n{model}" for site, model in groups]
    for ax, title in zip(
        axes,
        (
            "median step (ms)",
            "MB sent per step per worker (log)",
            "final loss − gloo's (> 0: worse)",
        ),
    ):
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(title)
    axes[1].set_yscale("log")
    axes[2].axhline(0.0, color="grey", lw=0.5)
    axes[0].legend(fontsize=7)
    c = data["config"]
    fig.suptitle(
        f"SwitchML vs gradient compression, DDP, W = {c['workers']}, {c['steps']} steps "
        "(medians over repetitions)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------- worker
def _tx_bytes(iface: str | None) -> int | None:
    """Bytes ``iface`` transmitted (``/proc/net/dev`` of this network namespace);
    None for loopback or no interface (shared by every process on the host)."""
    if not iface or iface == "lo":
        return None
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == iface:
                return int(fields.split()[8])
    return None


def _worker(argv: list[str]) -> None:
    """One rank: ``python -m bench.compression CONFIG_JSON OUT``."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    cfg = json.loads(argv[0])
    out = Path(argv[1])
    method, steps, batch = cfg["method"], cfg["steps"], cfg["batch"]
    timed_from = cfg["timed_from"]
    torch.set_num_threads(1)
    seed = cfg.get("seed", 0)
    import hostlib.torch  # registers the backend; bf16's hook

    if method == "switchml16":
        os.environ["SWITCHML_VALUES16"] = "1"  # read when the group is made
    dist.init_process_group("switchml" if method in SWITCHML_METHODS else "gloo")
    rank, w = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    ddp = nn.parallel.DistributedDataParallel(
        training.build_model(cfg["hidden"], cfg["layers"], seed),
        bucket_cap_mb=cfg["bucket_mb"],
        gradient_as_bucket_view=True,
    )
    traffic = Traffic(w)
    traffic.install()
    hook_state: HookState | None = None
    if method in ("fp16", "switchml-fp16"):
        ddp.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    elif method == "bf16":
        ddp.register_comm_hook(pg, hostlib.torch.switchml_bf16_compress_hook)
    elif method == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=pg,
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=cfg["powersgd_start"],
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif method in ("topk", "qsgd"):
        hook_state = HookState(pg, seed=1000 + rank)
        hook = topk_hook if method == "topk" else qsgd_hook
        # DDP checks the annotations as objects; this module's are strings (lazy torch)
        hook.__annotations__["bucket"] = dist.GradBucket
        hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
        ddp.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=0.9)
    x, y = training.task_data(steps * batch * w, seed=1 + 100 * seed)
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    params = sum(p.numel() for p in ddp.parameters())
    step_s, losses = [], []
    for s in range(steps):
        if s == timed_from:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            mach0 = training.machine_and_emulator()
            sent0, tx0 = traffic.sent, _tx_bytes(iface)
            codec0 = hook_state.codec_s if hook_state else 0.0
            if hasattr(pg, "reset_stats"):
                pg.reset_stats()
        lo = (s * w + rank) * batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[lo : lo + batch]), y[lo : lo + batch])
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item())
    timed = steps - timed_from
    cpu_s, window_s = time.process_time() - cpu0, time.perf_counter() - wall0
    mach1 = training.machine_and_emulator()
    tx1 = _tx_bytes(iface)
    report: dict[str, Any] = {}
    if method in SWITCHML_METHODS:
        from swemu.protocol import wire

        stats = pg.switchml_stats()
        report["switch"] = stats
        size = wire.packet_len(pg.context.options.packet_size)
        sent = (stats["packets"] + stats["retransmissions"]) * size / timed
    elif method == "gloo":  # DDP's own allreduce of every gradient (C++: not in traffic)
        sent = ring_allreduce_bytes(4 * params, w)
    else:
        sent = (traffic.sent - sent0) / timed
    tx, ty = training.task_data(2000, seed=2)
    with torch.no_grad():
        accuracy = float((ddp.module(tx).argmax(dim=1) == ty).float().mean())
    dist.barrier()
    compute = training.compute_seconds(ddp, opt, x, y, batch, reps=5)
    out.write_text(
        json.dumps(
            {
                **report,
                "step_s": step_s,
                "loss": losses,
                "compute_s": compute,
                "accuracy": accuracy,
                "params": params,
                "sent_bytes_per_step": sent,
                "wire_tx_bytes_per_step": None
                if tx0 is None or tx1 is None
                else (tx1 - tx0) / timed,
                "codec_s_per_step": ((hook_state.codec_s - codec0) / timed) if hook_state else 0.0,
                "cpu_s": cpu_s,
                "window_s": window_s,
                "machine_busy": min(1.0, (mach1[0] - mach0[0]) / max(mach1[1] - mach0[1], 1e-9)),
                "emulator_cpu_s": mach1[2] - mach0[2],
            }
        )
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1:])
