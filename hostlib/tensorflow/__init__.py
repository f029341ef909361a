"""TensorFlow and Keras with Horovod's API, reduced by a SwitchML switch.

A Horovod script changes its import and nothing else::

    import hostlib.tensorflow as hvd      # was: import horovod.tensorflow.keras as hvd

    hvd.init()                            # RANK, WORLD_SIZE, SWITCHML_* from `switchml run`
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

and runs with ``switchml run --workers N -- python train.py`` (docs/tensorflow.md).

How it maps onto the switch. The job is one :class:`hostlib.Context`, joined by
:func:`init` from the environment (:func:`hostlib.from_env`) and driven by one
background thread that makes the switch calls in the order they were submitted.
Every collective is a SwitchML sum:

- ``allreduce``: float32 through the switch's block floating point
  (docs/protocol.md §4); float16 and bfloat16 as 16-bit values (§4.2: half the
  bytes, both ways, from the tensors' own type), so Horovod's
  ``compression=hvd.Compression.fp16`` halves what goes over the wire; float64
  travels as float32 and comes back as float64; int32 is exact (sums wrap as the
  switch's registers do).
  ``Average`` divides the sum by the job's size (integers: truncated toward zero).
- The tensors of one call (``grouped_allreduce``, a tape's or an optimizer's
  gradients, ``broadcast_variables``) are flattened and concatenated into one
  switch call per wire type (float32, float16, bfloat16, int32), then split again.
- ``broadcast``: the root sends the raw bytes of its tensors as int32 words, every
  other rank zeros; the sum is the root's bytes, bit for bit, whatever the dtype.

Each collective is a stateful ``tf.numpy_function``, so the same call works
eagerly and inside a ``tf.function``: TensorFlow runs a function's stateful ops in
program order, which keeps the calls in the same order on every rank, as SwitchML
needs. XLA cannot compile such a call: the callbacks of
:mod:`hostlib.tensorflow.callbacks` switch a Keras model to ``jit_compile=False``,
and a collective traced under XLA fails at once with a message saying so.

May import: hostlib, swemu.protocol, tensorflow and keras. This package is the
only part of hostlib that imports TensorFlow; ``import hostlib`` never does.
"""

try:
    import tensorflow  # noqa: F401
except ImportError as exc:
    raise ImportError(
        'hostlib.tensorflow needs TensorFlow: pip install "switchml-emu[tensorflow]"'
    ) from exc

from . import callbacks
from .ops import (
    Average,
    Compression,
    DistributedGradientTape,
    DistributedOptimizer,
    NotInitializedError,
    Sum,
    allreduce,
    barrier,
    broadcast,
    broadcast_variables,
    cross_rank,
    cross_size,
    grouped_allreduce,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

__all__ = [
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "NotInitializedError",
    "Sum",
    "allreduce",
    "barrier",
    "broadcast",
    "broadcast_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "grouped_allreduce",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]
