"""One trainer of a multi-worker run that reads its data from a tf.data service.

Run as a program with `TF_CONFIG` (`tests/workers/cluster.py` starts two of them): it builds
`tfgpu.strategy("multi_worker")`, reads `tfgpu.data.pipeline(..., service=ADDRESS,
service_job_name=NAME)` and fits `tests/workers/train.py`'s model. The weights, the
optimizer's step count, the per-epoch losses and the ids of the examples this trainer read
go to `--out` (an .npz file), with the ids of the examples this trainer trained on, step
by step.

Each example's id is its first feature times `EXAMPLES` (exact in float32: `EXAMPLES` is a
power of two). A `Recorder` layer at the model's input records them (a `tf.py_function`,
in training only): what this trainer trained on, whichever service worker made it.

    TF_CONFIG=... python tests/workers/service_train.py --out w0.npz \
        --service grpc://127.0.0.1:5050 --job-name run-1 --epochs 2
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.workers import train  # noqa: E402
from tests.workers.train import FEATURES  # noqa: E402

EXAMPLES = 256  # a power of two: id / EXAMPLES is exact in float32


def make_data(examples: int = EXAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """Features whose first column is the example's id / EXAMPLES, and a regression target."""
    rng = np.random.RandomState(0)
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    x[:, 0] = np.arange(examples, dtype="float32") / EXAMPLES
    y = (x @ rng.normal(size=(FEATURES, 2))).astype("float32")
    return x, y


class Recorder(keras.layers.Layer):
    """Passes its input on; in training, appends the ids of each step's batch to `steps`.

    It sits in the model, so it sees exactly what this trainer trains on, step by step (an
    empty list for a step where this trainer had no data left), and nothing that was read
    but not trained on (Keras reads one batch to build the model under a strategy).
    """

    def __init__(self, steps: list[list[int]], **kwargs):
        super().__init__(**kwargs)
        self._append = steps.append  # not the list: Keras would track a copy of it

    def _record(self, first: tf.Tensor) -> tf.Tensor:
        self._append(np.rint(first.numpy() * EXAMPLES).astype(int).tolist())
        return tf.constant(0, tf.int64)

    def call(self, x, training=None):
        if not training:
            return x
        done = tf.py_function(self._record, [x[:, 0]], tf.int64)
        with tf.control_dependencies([done]):
            return tf.identity(x)


def make_model(steps: list[list[int]]) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """`tests/workers/train.py`'s model (same seed) behind a `Recorder`."""
    inner, opt = train.make_model()
    model = keras.Sequential([keras.Input((FEATURES,)), Recorder(steps), *inner.layers])
    return model, opt


class EpochEnds(keras.callbacks.Callback):
    """How many steps had been recorded when each epoch ended."""

    def __init__(self, steps: list[list[int]]):
        super().__init__()
        self.steps, self.ends = steps, []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append(len(self.steps))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--service", required=True, help="the dispatcher, grpc://host:port")
    p.add_argument("--job-name", default=None, help="service_job_name (none: not passed)")
    p.add_argument("--examples", type=int, default=EXAMPLES)
    p.add_argument("--per-replica-batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeat", action="store_true", help="repeat the data, with --steps-per-epoch")
    p.add_argument("--steps-per-epoch", type=int, default=None)
    args = p.parse_args(argv)

    import tfgpu

    steps: list[list[int]] = []
    ends = EpochEnds(steps)
    try:
        strategy = tfgpu.strategy("multi_worker")
        train = tfgpu.data.pipeline(
            make_data(args.examples),
            per_replica_batch_size=args.per_replica_batch,
            strategy=strategy,
            repeat=args.repeat,
            seed=0,
            service=args.service,
            service_job_name=args.job_name,
        )
        with strategy.scope():
            model, opt = make_model(steps)
            model.compile(opt, "mse")
        history = model.fit(
            train,
            epochs=args.epochs,
            steps_per_epoch=args.steps_per_epoch,
            verbose=0,
            callbacks=[ends],
        )
    except Exception as e:
        print(f"TRAINING FAILED: {type(e).__name__}: {e}", flush=True)
        return 3
    np.savez(
        args.out,
        *model.get_weights(),
        iterations=int(model.optimizer.iterations.numpy()),
        loss=np.asarray(history.history.get("loss", []), dtype="float64"),
        ids=np.asarray([i for step in steps for i in step], dtype="int64"),
        step_sizes=np.asarray([len(step) for step in steps], dtype="int64"),
        epoch_ends=np.asarray(ends.ends, dtype="int64"),
    )
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
