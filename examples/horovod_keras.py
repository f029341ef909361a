"""A Horovod-style Keras script, on SwitchML: only the import differs from Horovod's.

    switchml run --workers 2 -- python examples/horovod_keras.py
    switchml run --workers 4 -- python examples/horovod_keras.py --epochs 5

Every rank trains the same classifier (an MLP) on its own shard of a synthetic
data set (points in 16 dimensions, 4 classes, made from a fixed seed: no
download). As in Horovod's Keras examples, the learning rate scales with the
number of ranks, ``BroadcastGlobalVariablesCallback(0)`` gives every rank rank
0's initial weights, ``MetricAverageCallback`` averages the epoch's metrics over
the ranks, and only rank 0 prints. At the end every rank evaluates the held-out
set; rank 0 prints the accuracy and a digest of the weights, the same on every
rank (``--check`` compares every rank's weights with rank 0's and prints the
verdict, exiting 1 if any differ).
"""

import argparse
import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import hostlib.tensorflow as hvd  # Horovod: import horovod.tensorflow.keras as hvd

CENTRES = np.random.default_rng(0).standard_normal((4, 16)) * 0.6


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` noisy points in 16 dimensions around 4 class centres, with labels."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = CENTRES[y] + rng.standard_normal((n, 16))
    return x.astype(np.float32), y.astype(np.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="for one rank (scaled by the size)")
    p.add_argument("--check", action="store_true", help="assert the replicas are identical")
    args = p.parse_args()

    hvd.init()

    x, y = make_data(8192, seed=1)
    x_test, y_test = make_data(2048, seed=2)
    # this rank's shard
    x, y = x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()]

    keras.utils.set_random_seed(hvd.rank())  # other weights on each rank: the broadcast matters
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(4),
        ]
    )
    opt = keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        callbacks=callbacks,
        verbose=2 if hvd.rank() == 0 else 0,
    )

    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    digest = hashlib.sha256(flat.tobytes()).hexdigest()[:16]
    differ = 0
    if args.check:
        # rank 0's weights, bit for bit, against this rank's; then how many ranks differ
        theirs = hvd.broadcast(tf.constant(flat), root_rank=0).numpy()
        mine = tf.constant([int(theirs.tobytes() != flat.tobytes())], tf.int32)
        differ = int(hvd.allreduce(mine, op=hvd.Sum).numpy()[0])
    if hvd.rank() == 0:
        print(f"ranks {hvd.size()}: test accuracy {accuracy:.3f}, weights {digest}")
        if args.check:
            print(
                f"check passed: all {hvd.size()} ranks hold the same weights, bit for bit"
                if not differ
                else f"check FAILED: {differ} of {hvd.size()} ranks hold other weights than rank 0"
            )
    hvd.shutdown()
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
