"""``python -m bench precision``: what each 16-bit way of summing gradients gets wrong.

The 16-bit format of docs/protocol.md §4.2 against the ways a ring sums in 16 bits,
on the same synthetic gradients, in numpy (no network: the numbers are those the
methods produce, :mod:`swemu.protocol.worker.quant`'s twins for SwitchML's):

- ``switchml-16``: the 16-bit wire, result in float32 (a float32 tensor that opted
  in), and ``switchml-16/fp16``: float16 tensors in and out (what a float16 gradient
  bucket gets);
- ``switchml-32``: the 32-bit format of §4 (float32 block floating point);
- ``fp16-ring``: torch's ``fp16_compress_hook`` on a ring: each rank's bucket cast
  to float16 and divided by W, the W parts summed one after the other in float16
  (a reduce-scatter's order), the average cast back;
- ``bf16-ring``: the same with bfloat16 (``bf16_compress_hook``);
- ``fp32-ring``: plain float32 sums in ring order (gloo's).

Per (data, W): the RMS error of the sum relative to the RMS of the exact sum, the
largest error relative to the largest |exact sum|, and the fraction of nonzero
exact sums that came back as 0 (flushed). Data: Gaussian gradients at two
scales (1e-3, and 1e-6, where float16 runs out of range), and heavy-tailed ones
(Student t, 3 degrees of freedom, a few large values per chunk).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from swemu.protocol import wire
from swemu.protocol.worker import quant

METHODS = ("switchml-16", "switchml-16/fp16", "switchml-32", "fp16-ring", "bf16-ring", "fp32-ring")
DATA = ("normal 1e-3", "student-t 1e-3", "normal 1e-6")


def gradients(kind: str, w: int, n: int, seed: int) -> list[np.ndarray]:
    """W float32 arrays of ``n`` synthetic gradient values."""
    rng = np.random.default_rng(seed)
    shape, _, scale = kind.partition(" ")
    out = []
    for _ in range(w):
        x = rng.standard_t(3, n) if shape == "student-t" else rng.standard_normal(n)
        out.append((x * float(scale)).astype(np.float32))
    return out


def ring(xs: list[np.ndarray], kind: str) -> np.ndarray:
    """The sum a ring of 16-bit (``fp16``/``bf16``) or float32 (``fp32``) parts
    computes: cast (and, for the hooks, divide by W), add one rank after the other
    rounding each partial sum to the type, then times W back to a sum."""
    w = len(xs)
    if kind == "fp32":
        total = xs[0].copy()
        for x in xs[1:]:
            total = (total + x).astype(np.float32)
        return total.astype(np.float64)

    def rnd(v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, np.float32)
        if kind == "fp16":
            with np.errstate(over="ignore"):
                return v.astype(np.float16).astype(np.float32)
        return quant.bfloat16_values(quant.bfloat16_bits(v))

    parts = [rnd(rnd(x) / np.float32(w)) for x in xs]
    total = parts[0]
    for p in parts[1:]:
        total = rnd(total + p)
    return total.astype(np.float64) * w


def summed(method: str, xs: list[np.ndarray], nvals16: int, nvals32: int) -> np.ndarray:
    """What ``method`` returns as the sum of ``xs``, in float64."""
    if method == "switchml-16":
        return quant.simulate_allreduce16(xs, nvals16, "float32").astype(np.float64)
    if method == "switchml-16/fp16":
        with np.errstate(over="ignore", under="ignore"):
            halves = [x.astype(np.float16) for x in xs]
        return quant.simulate_allreduce16(halves, nvals16).astype(np.float64)
    if method == "switchml-32":
        return quant.simulate_allreduce(xs, nvals32).astype(np.float64)
    return ring(xs, method.removesuffix("-ring"))


def measure(
    workers: list[int], n: int = 1 << 16, size_code: int = 6, seed: int = 0
) -> dict[str, Any]:
    """Every (data, W, method): errors against the exact float64 sum."""
    rows = []
    for kind in DATA:
        for w in workers:
            xs = gradients(kind, w, n, seed)
            exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
            rms = float(np.sqrt(np.mean(exact**2)))
            top = float(np.abs(exact).max())
            for method in METHODS:
                got = summed(
                    method,
                    xs,
                    wire.values16_per_packet(size_code),
                    wire.values_per_packet(size_code),
                )
                err = np.abs(got - exact)
                finite = np.isfinite(got)
                rows.append(
                    {
                        "data": kind,
                        "workers": w,
                        "method": method,
                        "rms_rel": float(np.sqrt(np.mean(err[finite] ** 2)) / rms),
                        "max_rel": float(err[finite].max() / top),
                        "flushed": float(np.mean((got == 0) & (exact != 0))),
                        "nonfinite": int(np.count_nonzero(~finite)),
                    }
                )
    return {"n": n, "size_code": size_code, "seed": seed, "rows": rows}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"{data['n']} values per worker, chunks of size code {data['size_code']} "
        f"({wire.values16_per_packet(data['size_code'])} values at 16 bits, "
        f"{wire.values_per_packet(data['size_code'])} at 32), seed {data['seed']}",
        "",
        "| data | W | method | RMS error / RMS sum | max error / max sum | flushed to 0 |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['data']} | {r['workers']} | {r['method']} | {r['rms_rel']:.1e} "
            f"| {r['max_rel']:.1e} | {r['flushed']:.1%} |"
        )
    return "\n".join(lines)
