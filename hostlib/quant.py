"""Block floating point of docs/protocol.md §4 in plain numpy, for users.

The rules live with the worker's protocol (:mod:`swemu.protocol.worker.quant`,
which both sides share); this module keeps the host library's documented names:
``hostlib.quant.error_bound`` bounds what a float32 allreduce returns, and
``hostlib.quant.simulate_allreduce`` predicts it; ``error_bound16`` and
``simulate_allreduce16`` do the same for the 16-bit values of docs/protocol.md §4.2.
"""

from __future__ import annotations

from swemu.protocol.worker.quant import (
    INT32_MAX,
    bfloat16_bits,
    bfloat16_values,
    chunk_exponents,
    dequantize,
    dequantize16,
    error_bound,
    error_bound16,
    offset16,
    quantize,
    quantize16,
    scale,
    scale16,
    simulate_allreduce,
    simulate_allreduce16,
)

__all__ = [
    "INT32_MAX",
    "bfloat16_bits",
    "bfloat16_values",
    "chunk_exponents",
    "dequantize",
    "dequantize16",
    "error_bound",
    "error_bound16",
    "offset16",
    "quantize",
    "quantize16",
    "scale",
    "scale16",
    "simulate_allreduce",
    "simulate_allreduce16",
]
