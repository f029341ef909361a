"""The collectives of :mod:`hostlib.tensorflow`: the job, allreduce, broadcast,
the distributed tape and optimizer (the package docstring says how they map
onto the switch)."""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from .. import Context, from_env
from ..errors import SwitchMLError

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

#: reduce operations, named as Horovod names them
Average = "Average"
Sum = "Sum"
_OPS = (Average, Sum)
#: AutoGraph leaves these as they are: their Python control flow is over static
#: facts (dtypes, the list of tensors), never over tensor values
_not_autograph = tf.autograph.experimental.do_not_convert
#: floating types the switch reduces
_FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
#: the type of the switch call each tensor type joins: float64 goes as float32,
#: float16 and bfloat16 as themselves (16-bit values, docs/protocol.md §4.2)
_WIRE = {tf.float64: tf.float32, tf.float32: tf.float32, tf.float16: tf.float16}
_WIRE.update({tf.bfloat16: tf.bfloat16, tf.int32: tf.int32})


class NotInitializedError(SwitchMLError, ValueError):
    """A collective or a query (``rank()``, ``size()``, ...) before :func:`init`.
    A ``ValueError`` too, as Horovod raises."""


class _Job:
    """The joined SwitchML job: its context, owned by one thread that makes every
    switch call in submission order; after a failed call every later one fails
    (the ranks may disagree on where the failed call stopped)."""

    def __init__(self, ctx: Context, environ: dict[str, str]) -> None:
        self.ctx = ctx
        self.rank = ctx.rank
        self.size = ctx.world_size
        self.local_rank = int(environ.get("LOCAL_RANK", self.rank))
        self.local_size = int(environ.get("LOCAL_WORLD_SIZE", self.size))
        self.cross_rank = int(environ.get("GROUP_RANK", self.rank // max(self.local_size, 1)))
        self.cross_size = max(1, self.size // max(self.local_size, 1))
        self._failed: BaseException | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # a daemon thread: still there when the atexit handler (shutdown) runs
        self._thread = threading.Thread(target=self._serve, name="switchml-tf", daemon=True)
        self._thread.start()
        try:
            self.run(ctx.open)
        except BaseException:
            self.close()
            raise

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the job's thread and return its result."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((fn, args, fut))
        return fut.result()

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, fut = item
            if self._failed is not None and fn is not self.ctx.close:
                fut.set_exception(
                    SwitchMLError(f"an earlier SwitchML call of this job failed: {self._failed}")
                )
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, never lost
                self._failed = exc
                fut.set_exception(exc)

    def close(self) -> None:
        """Leave the job (after the calls already submitted) and end the thread."""
        try:
            self.run(self.ctx.close)
        finally:
            self._queue.put(None)
            self._thread.join(timeout=30)


_job: _Job | None = None
_lock = threading.Lock()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the SwitchML job described by the environment: what ``switchml run``
    sets (RANK, WORLD_SIZE, SWITCHML_SESSION_ID, SWITCHML_CONTROL, ...), or
    torchrun-style RANK / WORLD_SIZE / SWITCHML_CONTROL. Returns once every rank
    has joined. Calling it again does nothing. MPI communicators and process sets
    are Horovod features this module does not have (passing one raises)."""
    global _job
    if comm is not None or process_sets is not None:
        raise NotImplementedError(
            "hostlib.tensorflow has one job of all ranks: no comm, no process sets"
        )
    with _lock:
        if _job is not None:
            return
        _job = _Job(from_env(), dict(os.environ))


def shutdown() -> None:
    """Leave the job (the last rank to leave frees it on the switch); called at
    interpreter exit too. Collectives after it raise :class:`NotInitializedError`."""
    global _job
    with _lock:
        job, _job = _job, None
    if job is not None:
        job.close()


atexit.register(shutdown)


def is_initialized() -> bool:
    """Whether :func:`init` was called (and not :func:`shutdown`)."""
    return _job is not None


def _require() -> _Job:
    job = _job
    if job is None:
        raise NotInitializedError(
            "hostlib.tensorflow has not been initialized: call hvd.init() first "
            "(under `switchml run --workers N -- python ...`)"
        )
    return job


def rank() -> int:
    """This process's rank in the job, 0 … size() − 1."""
    return _require().rank


def size() -> int:
    """The number of ranks of the job."""
    return _require().size


def local_rank() -> int:
    """The rank among the processes of this host (LOCAL_RANK; else the rank)."""
    return _require().local_rank


def local_size() -> int:
    """The processes of the job on this host (LOCAL_WORLD_SIZE; else the size)."""
    return _require().local_size


def cross_rank() -> int:
    """The index of this host among the job's hosts (GROUP_RANK)."""
    return _require().cross_rank


def cross_size() -> int:
    """The number of hosts of the job (size() // local_size())."""
    return _require().cross_size


# --------------------------------------------------------------- compression


class _NoneCompressor:
    """Gradients travel as they are (float32 on the wire)."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class _FP16Compressor:
    """Rounds floating tensors to float16 before the allreduce (as Horovod's fp16
    compression does): the switch then carries them as 16-bit values
    (docs/protocol.md §4.2), half the bytes of float32 both ways."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """Horovod's ``hvd.Compression.none`` and ``hvd.Compression.fp16``."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


# ------------------------------------------------------------- the switch side


def _scaled(x: np.ndarray, factor: float) -> np.ndarray:
    """``x · factor`` in ``x``'s floating type (computed in float32, rounded once)."""
    return (x.astype(np.float32) * np.float32(factor)).astype(x.dtype)


def _sum_on_switch(
    flat: np.ndarray, average: bool, prescale: float, postscale: float
) -> np.ndarray:
    """One switch allreduce of a flat float32, float16, bfloat16 or int32 array (a
    new array; the 16-bit types as 16-bit values). The job is looked up when the
    call runs, not when a ``tf.function`` was traced, so that a traced function
    run after ``shutdown()`` fails with a clear error."""
    job = _require()
    x = np.ascontiguousarray(flat)
    if x.size == 0:
        return x.copy()
    floating = x.dtype != np.int32
    if floating and prescale != 1.0:
        x = _scaled(x, prescale)
    total = job.run(job.ctx.allreduce, x)
    if floating:
        if average and job.size > 1:
            total = _scaled(total, 1.0 / job.size)
        if postscale != 1.0:
            total = _scaled(total, postscale)
        return total
    if average and job.size > 1:
        # int32 sums are exact in float64: truncate toward zero, as an integer division
        total = np.trunc(total / job.size).astype(np.int32)
    return total


def _broadcast_bytes(arrays: Sequence[np.ndarray], root_rank: int) -> list[np.ndarray]:
    """The root's ``arrays``, bit for bit, on every rank: the root sends their
    bytes as int32 words, the others zeros, and the switch's sum is the root's."""
    job = _require()
    arrays = [np.asarray(a, order="C") for a in arrays]  # 0-d stays 0-d
    nbytes = [a.nbytes for a in arrays]
    total = sum(nbytes)
    words = np.zeros(-(-total // 4), np.int32)
    if job.rank == root_rank:
        raw = words.view(np.uint8)
        offset = 0
        for a, n in zip(arrays, nbytes):
            raw[offset : offset + n] = a.reshape(-1).view(np.uint8)
            offset += n
    if words.size:
        words = job.run(job.ctx.allreduce, words)
    raw = words.view(np.uint8)
    out, offset = [], 0
    for a, n in zip(arrays, nbytes):
        out.append(raw[offset : offset + n].copy().view(a.dtype).reshape(a.shape))
        offset += n
    return out


# ------------------------------------------------------------ the TF side


def _in_xla() -> bool:
    """Whether the function being traced will be compiled by XLA (which cannot
    run a ``numpy_function``)."""
    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # a TensorFlow without it: leave it to XLA's own error
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _check_graph(what: str) -> None:
    if _in_xla():
        raise RuntimeError(
            f"hostlib.tensorflow.{what} cannot run inside an XLA-compiled function: "
            "compile the Keras model with jit_compile=False (the callbacks of "
            "hostlib.tensorflow.callbacks do it for you), or drop jit_compile=True"
        )


def _op_of(op: str | None, average: bool | None) -> str:
    if op is not None and average is not None:
        raise ValueError("give op or the deprecated average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op not in _OPS:
        raise ValueError(
            f"SwitchML sums: op must be hvd.Average or hvd.Sum, got {op!r} "
            "(Min, Max, Product and Adasum are not supported)"
        )
    return op


@_not_autograph
def _grouped(
    tensors: Sequence[Any],
    op: str,
    *,
    compression: Any = Compression.none,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> list[tf.Tensor]:
    """Allreduce ``tensors`` with one switch call per wire type (float32, float16,
    bfloat16, int32)."""
    _require()  # fail now, not when the graph runs
    _check_graph("allreduce")
    # IndexedSlices (an embedding's sparse gradient) become dense tensors here
    dense = [tf.convert_to_tensor(t) for t in tensors]
    packed = [compression.compress(t) for t in dense]
    values = [p[0] for p in packed]
    for t in values:
        if t.dtype not in _FLOATS and t.dtype != tf.int32:
            raise TypeError(
                f"SwitchML allreduces floating tensors (float16, bfloat16, float32, "
                f"float64) and int32, got {t.dtype.name}"
            )
    average = op == Average
    results: list[tf.Tensor | None] = [None] * len(values)
    for wire in (tf.float32, tf.float16, tf.bfloat16, tf.int32):
        idx = [i for i, t in enumerate(values) if _WIRE[t.dtype] == wire]
        if not idx:
            continue
        parts = [tf.reshape(tf.cast(values[i], wire), [-1]) for i in idx]
        flat = tf.concat(parts, 0) if len(parts) > 1 else parts[0]

        def reduce(x: np.ndarray, _average: bool = average) -> np.ndarray:
            return _sum_on_switch(x, _average, prescale_factor, postscale_factor)

        summed = tf.numpy_function(reduce, [flat], wire, stateful=True, name=name)
        summed = tf.ensure_shape(summed, flat.shape)
        if all(p.shape.is_fully_defined() for p in parts):
            sizes: Any = [int(p.shape[0]) for p in parts]
        else:
            sizes = tf.stack([tf.size(p) for p in parts])
        pieces = tf.split(summed, sizes) if len(parts) > 1 else [summed]
        for i, piece in zip(idx, pieces):
            results[i] = tf.cast(tf.reshape(piece, tf.shape(values[i])), values[i].dtype)
    return [compression.decompress(r, p[1]) for r, p in zip(results, packed)]


@_not_autograph
def allreduce(
    tensor: Any,
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: str | None = None,
) -> tf.Tensor:
    """The sum (``op=hvd.Sum``) or average (``hvd.Average``, the default) of
    ``tensor`` over all ranks. Every rank must make the same calls with tensors
    of the same shape and dtype, in the same order. float32 and float64 are reduced
    as float32 (block floating point, docs/protocol.md §4), float16 and bfloat16 as
    16-bit values (§4.2; ``compression=hvd.Compression.fp16`` sends float32 ones
    that way too); int32 exactly. NaN or Inf in a floating tensor raises on the rank that has it
    (the others then fail after SWITCHML_NO_PROGRESS seconds). ``device_*`` are
    accepted and ignored (CPU only); ``IndexedSlices`` are reduced dense."""
    return _grouped(
        [tensor],
        _op_of(op, average),
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )[0]


@_not_autograph
def grouped_allreduce(
    tensors: Sequence[Any],
    average: bool | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: str | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[tf.Tensor]:
    """:func:`allreduce` of every tensor of ``tensors``, fused: one switch call per
    wire type (float32 and float64; float16; bfloat16; int32)."""
    return _grouped(
        list(tensors),
        _op_of(op, average),
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )


@_not_autograph
def _broadcast_tensors(tensors: Sequence[tf.Tensor], root_rank: int) -> list[tf.Tensor]:
    job = _require()
    _check_graph("broadcast")
    if not 0 <= root_rank < job.size:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job of {job.size}")
    for t in tensors:
        if t.dtype in (tf.string, tf.resource, tf.variant):
            raise TypeError(f"broadcast of {t.dtype.name} tensors is not supported")
    if not tensors:
        return []

    def bcast(*arrays: np.ndarray) -> list[np.ndarray]:
        return _broadcast_bytes(arrays, root_rank)

    out = tf.numpy_function(bcast, list(tensors), [t.dtype for t in tensors], stateful=True)
    if not isinstance(out, list | tuple):  # one output comes back alone
        out = [out]
    return [tf.ensure_shape(o, t.shape) for o, t in zip(out, tensors)]


@_not_autograph
def broadcast(tensor: Any, root_rank: int, name: str | None = None) -> tf.Tensor:
    """``root_rank``'s ``tensor`` on every rank, bit for bit (any numeric or bool
    dtype; every rank passes a tensor of the same shape and dtype)."""
    return _broadcast_tensors([tf.convert_to_tensor(tensor)], root_rank)[0]


@_not_autograph
def broadcast_variables(variables: Sequence[Any], root_rank: int) -> None:
    """Assign ``root_rank``'s values to ``variables`` on every rank, bit for bit,
    in one switch call (tf.Variable or Keras variables, any dtype but string)."""
    variables = list(variables)
    values = [tf.convert_to_tensor(v) for v in variables]
    for v, new in zip(variables, _broadcast_tensors(values, root_rank)):
        v.assign(new)


def barrier() -> None:
    """Wait until every rank has called it (an allreduce of one int32)."""
    job = _require()
    job.run(job.ctx.allreduce, np.zeros(1, np.int32))


# ------------------------------------------------------- gradients: tape, optimizer


@_not_autograph
def _reduce_gradients(
    grads: Sequence[Any], op: str, compression: Any, predivide: float
) -> list[Any]:
    """Allreduce the gradients that are not None, fused; the Nones stay None."""
    present = [i for i, g in enumerate(grads) if g is not None]
    out = list(grads)
    if not present:
        return out
    if predivide != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=hvd.Average")
    prescale = 1.0 / predivide
    reduced = _grouped(
        [grads[i] for i in present],
        op,
        compression=compression,
        prescale_factor=prescale,
        postscale_factor=predivide,
    )
    for i, r in zip(present, reduced):
        out[i] = r
    return out


def _unsupported(**given: Any) -> None:
    for key, value in given.items():
        if value:
            raise NotImplementedError(f"hostlib.tensorflow does not support {key}={value!r}")


class _DistributedTapeMixin:
    """Overrides ``gradient`` of a ``tf.GradientTape`` (see DistributedGradientTape)."""

    _switchml: tuple[str, Any, float]

    @_not_autograph
    def gradient(
        self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any
    ) -> Any:
        grads = super().gradient(target, sources, output_gradients, **kwargs)  # type: ignore[misc]
        op, compression, predivide = self._switchml
        flat = tf.nest.flatten(grads, expand_composites=False)
        return tf.nest.pack_sequence_as(grads, _reduce_gradients(flat, op, compression, predivide))


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: str = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
) -> tf.GradientTape:
    """``gradtape`` whose ``gradient()`` returns the gradients averaged (or summed)
    over all ranks, in one fused switch call. Use after the ``with`` block, as in
    Horovod: ``tape = hvd.DistributedGradientTape(tape)``. The result is still a
    ``tf.GradientTape`` of the same class, sharing the recorded operations."""
    _unsupported(num_groups=num_groups, groups=groups, process_set=process_set)
    op = _op_of(op, None)
    base = type(gradtape)
    cls = type(base.__name__, (_DistributedTapeMixin, base), {"__module__": base.__module__})
    tape = object.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._switchml = (op, compression, float(gradient_predivide_factor))
    return tape


def DistributedOptimizer(
    optimizer: Any,
    name: str | None = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: str = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
) -> Any:
    """A copy of the Keras optimizer ``optimizer`` (same class, same config) that
    averages (or sums) the gradients over all ranks before applying them, in one
    fused switch call per step: ``model.compile(optimizer=hvd.DistributedOptimizer(
    opt))`` and ``model.fit`` as usual; a custom loop's ``apply_gradients`` or
    ``apply`` work too. Keras 3 optimizers only (``keras.optimizers.Optimizer``);
    saved with a model it is the plain optimizer it wraps."""
    import keras

    _unsupported(num_groups=num_groups, groups=groups, process_set=process_set)
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step other than 1 is not supported")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras 3 optimizer (keras.optimizers.Optimizer), "
            f"got {type(optimizer).__name__}; in a custom loop use DistributedGradientTape"
        )
    op = _op_of(op, None)
    settings = (op, compression, float(gradient_predivide_factor))
    base = type(optimizer)

    @_not_autograph
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        reduced = _reduce_gradients(list(grads), *settings)
        return super(cls, self).apply(reduced, trainable_variables)

    cls = type(
        base.__name__,
        (base,),
        {"apply": apply, "__module__": base.__module__, "__qualname__": base.__qualname__},
    )
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)
