"""Block floating point of docs/protocol.md §4 in plain numpy, for users.

The rules live with the worker's protocol (:mod:`swemu.protocol.worker.quant`,
which both sides share); this module keeps the host library's documented names:
``hostlib.quant.error_bound`` bounds what a float32 allreduce returns, and
``hostlib.quant.simulate_allreduce`` predicts it.
"""

from __future__ import annotations

from swemu.protocol.worker.quant import (
    INT32_MAX,
    chunk_exponents,
    dequantize,
    error_bound,
    quantize,
    scale,
    simulate_allreduce,
)

__all__ = [
    "INT32_MAX",
    "chunk_exponents",
    "dequantize",
    "error_bound",
    "quantize",
    "scale",
    "simulate_allreduce",
]
