"""One rank of tests/test_tensorflow.py, started by ``switchml run --workers 3 --
python tests/tensorflow_worker.py OUT``: every check of hostlib.tensorflow in one
launch (TensorFlow's import dominates the time). Writes ``OUT/rank{R}.json``;
the test reads and compares them. Rank 0 also trains the single-process
references (plain Keras, no hostlib) after the distributed part.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import hostlib.tensorflow as hvd
from hostlib.quant import error_bound, error_bound16, simulate_allreduce16
from swemu.protocol import wire

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])
W = int(os.environ["WORLD_SIZE"])
B = 8  # samples per rank and step
STEPS = 4  # steps per epoch
EPOCHS = 2
LR = 0.1
report: dict = {"rank": RANK}


def digest(a) -> str:
    a = np.asarray(a)
    return hashlib.sha256(a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()).hexdigest()


def blob(arrays) -> list[str]:
    """float32 arrays, exactly (base64 of their bytes)."""
    return [base64.b64encode(np.asarray(a, np.float32).tobytes()).decode() for a in arrays]


# -- before init: a clear error --------------------------------------------------
try:
    hvd.rank()
except ValueError as exc:  # NotInitializedError is one, as Horovod raises
    report["before_init"] = {"type": type(exc).__name__, "message": str(exc)}
report["initialized_before"] = hvd.is_initialized()

hvd.init()
hvd.init()  # idempotent
report.update(
    initialized=hvd.is_initialized(),
    size=hvd.size(),
    hvd_rank=hvd.rank(),
    local_rank=hvd.local_rank(),
    local_size=hvd.local_size(),
)


# count the switch calls (each fused call is one), by wrapping the job's runner
job = hvd.ops._job
switch_calls: list[int] = []
switch_dtypes: list[str] = []
_run = job.run


def counting_run(fn, *args):
    if fn == job.ctx.allreduce:
        switch_calls.append(args[0].size)
        switch_dtypes.append(args[0].dtype.name)
    return _run(fn, *args)


job.run = counting_run


def calls_since(mark: int) -> int:
    return len(switch_calls) - mark


# -- allreduce --------------------------------------------------------------------
def inputs(r: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank r's float32 and int32 inputs (any rank can make every rank's)."""
    rng = np.random.default_rng(7)
    mags = np.float32(10.0) ** rng.integers(-3, 3, 5000)
    floats = (rng.standard_normal(5000) * mags).astype(np.float32) * np.float32(r + 1)
    ints = (np.arange(1000, dtype=np.int64) * 7919 % 100003 - 50000).astype(np.int32) * (r + 1)
    ints[:2] = [np.iinfo(np.int32).max, np.iinfo(np.int32).min]  # their sums wrap
    return floats, ints


mine, ints = inputs(RANK)
exact = sum(inputs(r)[0].astype(np.float64) for r in range(W))
exact_int = sum(inputs(r)[1].astype(np.int64) for r in range(W))
M = max(np.abs(inputs(r)[0]).max() for r in range(W))  # the largest |x| of any rank
bound = error_bound(M, W)  # docs/protocol.md §4, per element of the sum
f_sum = hvd.allreduce(tf.constant(mine), op=hvd.Sum).numpy()
f_avg = hvd.allreduce(tf.constant(mine)).numpy()  # Average is the default
report["float32"] = {
    "sum_dtype": str(f_sum.dtype),
    "sum_excess": float(np.abs(f_sum - exact).max() / bound),
    # AVG: the sum's bound over W, plus one float32 rounding of the quotient
    "avg_excess": float(
        np.abs(f_avg - exact / W).max() / (bound / W + 2.0**-24 * np.abs(exact / W).max())
    ),
    "sum_digest": digest(f_sum),
}


@tf.function
def sum_in_function(x):
    return hvd.allreduce(x, op=hvd.Sum)


report["float32"]["function_digest"] = digest(sum_in_function(tf.constant(mine)).numpy())

i_sum = hvd.allreduce(tf.constant(ints), op=hvd.Sum).numpy()
i_avg = hvd.allreduce(tf.constant(ints[2:]), op=hvd.Average).numpy()
report["int32"] = {
    # int64 -> int32 keeps the low 32 bits: the wrap of the switch's registers
    "sum_exact": bool(
        i_sum.dtype == np.int32 and np.array_equal(i_sum, exact_int.astype(np.int32))
    ),
    # Average of integers truncates toward zero
    "avg_exact": bool(
        i_avg.dtype == np.int32
        and np.array_equal(i_avg, np.trunc(exact_int[2:] / W).astype(np.int32))
    ),
    "digest": digest(i_sum),
}

# float16 goes as 16-bit values (docs/protocol.md §4.2), float64 as float32, each
# back in its own type; one grouped call of three types: a switch call per wire type
half = tf.constant(mine[:100], tf.float16)
double = tf.constant(mine[:100].astype(np.float64))
mark = len(switch_calls)
g = hvd.grouped_allreduce([half, tf.constant(ints[2:50]), double], op=hvd.Sum)
grouped_calls = calls_since(mark)
halves = [inputs(r)[0][:100].astype(np.float16) for r in range(W)]
exact16 = sum(h.astype(np.float64) for h in halves)
M16 = max(float(np.abs(h.astype(np.float64)).max()) for h in halves)
report["grouped"] = {
    "dtypes": [t.dtype.name for t in g],
    "switch_calls": grouped_calls,  # float32 (the float64), float16, int32
    "switch_dtypes": sorted(switch_dtypes[mark:]),
    "int32_exact": bool(np.array_equal(g[1].numpy(), exact_int[2:50].astype(np.int32))),
    # float16: the 16-bit format's bound for a float16 result
    "float16_excess": float(
        np.abs(g[0].numpy() - exact16).max() / error_bound16(M16, W, "float16")
    ),
    "float64_excess": float(np.abs(g[2].numpy() - exact[:100]).max() / bound),
}

# Horovod's compression=hvd.Compression.fp16: float32 tensors rounded to float16,
# summed as 16-bit values (the numpy twin's result, bit for bit), back to float32;
# and a bfloat16 tensor, as 16-bit values too
nvals16 = wire.values16_per_packet(job.ctx.options.packet_size)
mark = len(switch_calls)
c16 = hvd.allreduce(tf.constant(mine), op=hvd.Sum, compression=hvd.Compression.fp16)
twin16 = simulate_allreduce16([inputs(r)[0].astype(np.float16) for r in range(W)], nvals16)
bf = hvd.allreduce(tf.constant(mine, tf.bfloat16), op=hvd.Sum).numpy()
bf_inputs = [tf.constant(inputs(r)[0], tf.bfloat16).numpy().view(np.uint16) for r in range(W)]
twin_bf = simulate_allreduce16(bf_inputs, nvals16, bfloat16=True)
report["compression_fp16"] = {
    "dtype": c16.dtype.name,
    "twin": bool(np.array_equal(c16.numpy(), twin16.astype(np.float32))),
    "switch_dtypes": switch_dtypes[mark:],
    "bfloat16_dtype": str(bf.dtype),
    "bfloat16_twin": bool(np.array_equal(bf.view(np.uint16), twin_bf)),
}
try:
    hvd.allreduce(tf.constant([1, 2], tf.int64))
except TypeError as exc:
    report["int64_error"] = str(exc)

# -- broadcast: bit exact, any dtype ------------------------------------------------
odd = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, RANK], np.float32)
variables = [
    tf.Variable(odd),
    tf.Variable(np.arange(3, dtype=np.float16) + RANK),  # 6 bytes: not a whole word
    tf.Variable(np.array([2**40 + RANK, -RANK], np.int64)),
    tf.Variable(np.array([RANK % 2 == 0, True, False])),
    tf.Variable(np.full((2, 3), RANK, np.float64) / 3),
]
mark = len(switch_calls)
hvd.broadcast_variables(variables, root_rank=1)
report["broadcast_variables_calls"] = calls_since(mark)
report["broadcast_variables"] = [digest(v.numpy()) for v in variables]
report["broadcast_variables_root"] = [
    digest(a)
    for a in (
        np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 1], np.float32),
        np.arange(3, dtype=np.float16) + 1,
        np.array([2**40 + 1, -1], np.int64),
        np.array([False, True, False]),
        np.full((2, 3), 1, np.float64) / 3,
    )
]
b_eager = hvd.broadcast(tf.constant(odd), root_rank=2).numpy()
b_graph = tf.function(lambda t: hvd.broadcast(t, root_rank=2))(tf.constant(odd)).numpy()
report["broadcast"] = [digest(b_eager), digest(b_graph)]
report["broadcast_root"] = digest(np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 2], np.float32))

# -- training ------------------------------------------------------------------------
data = np.random.default_rng(11)
X = data.standard_normal((STEPS * W * B, 8)).astype(np.float32)
Y = (np.sin(X @ data.standard_normal((8, 1))) + 0.1 * data.standard_normal((len(X), 1))).astype(
    np.float32
)
# rank r's share of every global batch of W·B samples
shard = np.concatenate([k * W * B + RANK * B + np.arange(B) for k in range(STEPS)])


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
    )


# model.fit with DistributedOptimizer and the callbacks; every rank starts from
# other weights, so only the broadcast makes the replicas equal
model = make_model(100 + RANK)
initial = model.get_weights()
# jit_compile=True: the callbacks must turn XLA off, or fit fails
model.compile(
    optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse", jit_compile=True
)
mark = len(switch_calls)
history = model.fit(
    X[shard],
    Y[shard],
    batch_size=B,
    epochs=EPOCHS,
    shuffle=False,
    verbose=0,
    callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ],
)
fit_weights = model.get_weights()
report["fit"] = {
    "jit_compile": bool(model.jit_compile),
    "optimizer": type(model.optimizer).__name__,
    "loss": [float(v) for v in history.history["loss"]],
    "weights": blob(fit_weights),
    "digest": digest(np.concatenate([w.reshape(-1) for w in fit_weights])),
    "iterations": int(model.optimizer.iterations.numpy()),
    "switch_calls": calls_since(mark),
}

# a custom loop: DistributedGradientTape inside a tf.function, replicas made equal
# by broadcast_variables (root 1)
loop_model = make_model(200 + RANK)
loop_opt = keras.optimizers.SGD(LR)
hvd.broadcast_variables(loop_model.variables, root_rank=1)
loop_initial = loop_model.get_weights()


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, loop_model(x, training=True))
        loss = tf.reduce_mean(loss)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, loop_model.trainable_variables)
    loop_opt.apply_gradients(zip(grads, loop_model.trainable_variables))
    return loss


mark = len(switch_calls)
for k in range(STEPS):
    rows = shard[k * B : (k + 1) * B]
    train_step(tf.constant(X[rows]), tf.constant(Y[rows]))
loop_weights = loop_model.get_weights()
report["tape"] = {
    "weights": blob(loop_weights),
    "digest": digest(np.concatenate([w.reshape(-1) for w in loop_weights])),
    "switch_calls": calls_since(mark),
}

hvd.shutdown()
report["initialized_after_shutdown"] = hvd.is_initialized()

# -- rank 0: the single-process references (plain Keras, no hostlib) -------------------
if RANK == 0:

    def fit_alone(x, y, batch: int) -> tuple[list, list]:
        ref = make_model(100)
        ref.set_weights(initial)
        # no XLA, as the distributed model (the callbacks turn it off)
        ref.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", jit_compile=False)
        h = ref.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False, verbose=0)
        return ref.get_weights(), [float(v) for v in h.history["loss"]]

    ref_w, ref_loss = fit_alone(X, Y, W * B)  # the concatenated batches
    alone_w, _ = fit_alone(X[shard], Y[shard], B)  # rank 0's own batches only
    report["reference"] = {"weights": blob(ref_w), "loss": ref_loss, "alone": blob(alone_w)}

    ref_loop = make_model(0)
    ref_loop.set_weights(loop_initial)
    ref_opt = keras.optimizers.SGD(LR)
    for k in range(STEPS):
        rows = slice(k * W * B, (k + 1) * W * B)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.mean_squared_error(Y[rows], ref_loop(X[rows])))
        grads = tape.gradient(loss, ref_loop.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref_loop.trainable_variables))
    report["reference"]["tape"] = blob(ref_loop.get_weights())

(OUT / f"rank{RANK}.json").write_text(json.dumps(report))
