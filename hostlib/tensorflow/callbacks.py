"""Keras callbacks of Horovod's API: ``hvd.callbacks.BroadcastGlobalVariablesCallback``
and ``hvd.callbacks.MetricAverageCallback``.

Both also turn XLA off for the model they are given (``jit_compile=False``, the
train function made again): Keras 3 compiles a model with XLA when asked
(``jit_compile=True``) and by default on a machine with a GPU, and XLA cannot run
the switch calls (``tf.numpy_function``) that
:func:`hostlib.tensorflow.DistributedOptimizer` adds to the train step.
"""

from __future__ import annotations

import logging
import numbers
from typing import Any

import keras
import numpy as np

from .ops import Average, broadcast_variables, grouped_allreduce

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback"]

log = logging.getLogger("hostlib.tensorflow")


def _without_xla(model: Any) -> None:
    """Make ``model`` train without XLA (its train function is traced again)."""
    if getattr(model, "jit_compile", False):
        log.info("hostlib.tensorflow: jit_compile=False (XLA cannot run SwitchML's calls)")
        model.jit_compile = False
        model.make_train_function(force=True)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, give every rank ``root_rank``'s model and
    optimizer variables, bit for bit, in one switch call, so that all replicas
    start equal. (Horovod broadcasts after the first batch, because TF1 built
    optimizers lazily; Keras 3 builds them before training starts, so the first
    step already runs on equal replicas.) Done once, on the first ``fit``."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        _without_xla(self.model)
        if self.broadcast_done:
            return
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            known = {id(v) for v in variables}
            variables += [v for v in optimizer.variables if id(v) not in known]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replace the numbers in the logs (loss, metrics,
    validation metrics) by their average over all ranks, in one switch call.
    List it before the callbacks that read the logs (ReduceLROnPlateau,
    checkpointing); the History that ``fit`` returns sees the averages."""

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        _without_xla(self.model)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, numbers.Real | np.ndarray))
        if not keys:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], np.float64)
        (mean,) = grouped_allreduce([values], op=Average)
        for k, v in zip(keys, np.asarray(mean).tolist()):
            logs[k] = v
