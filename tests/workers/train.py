"""A tiny, deterministic training job for the distributed and resume tests.

Run as a program (one process of a run; a multi-worker run gets `TF_CONFIG`) or import
`train()` to run the same job in the test process. The final weights, the optimizer's
step count and the per-epoch losses go to `--out` (an .npz file).

    python tests/workers/train.py --out w.npz --strategy multi_worker --backup DIR \
        --save-freq 3 --kill-at 1:4
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EXAMPLES = 64
FEATURES = 4


def make_data():
    rng = np.random.RandomState(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 2)) + 0.1 * rng.normal(size=(EXAMPLES, 2))).astype(
        "float32"
    )
    return x, y


def make_dataset(
    global_batch,
    examples=EXAMPLES,
    drop_remainder=False,
    shuffle=False,
    reshuffle=False,
    repeat=False,
):
    x, y = make_data()
    if reshuffle:  # a new order every epoch, seeded: resumable exactly by BackupAndRestore
        import tfgpu.data

        return tfgpu.data.pipeline(
            (x[:examples], y[:examples]), batch_size=global_batch, seed=0, repeat=repeat
        )
    ds = tf.data.Dataset.from_tensor_slices((x[:examples], y[:examples]))
    if shuffle:  # same order every epoch and in every process: resumable exactly
        ds = ds.shuffle(examples, seed=7, reshuffle_each_iteration=False)
    ds = ds.batch(global_batch, drop_remainder=drop_remainder)
    options = tf.data.Options()  # in-memory data: shard by example
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def make_model(dropout=0.0, optimizer="sgd"):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=3))
    layers.append(keras.layers.Dense(2))
    model = keras.Sequential(layers)
    opt = (
        keras.optimizers.SGD(0.05, momentum=0.9)
        if optimizer == "sgd"
        else keras.optimizers.Adam(0.01)
    )
    return model, opt


class KillAt(keras.callbacks.Callback):
    """SIGKILLs this process at the end of batch `step` of `epoch` (after the backup saved)."""

    def __init__(self, epoch, step):
        super().__init__()
        self.epoch, self.step, self._current = epoch, step, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self._current, batch) == (self.epoch, self.step):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def kill_during_save(n):
    """SIGKILLs this process inside the n-th backup save, after the temporary file is written."""
    from tfgpu.callbacks import _backup

    calls = {"n": 0}
    original = _backup._replace

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        original(src, dst)

    _backup._replace = replace


def train(
    strategy=None,
    *,
    epochs=3,
    global_batch=8,
    examples=EXAMPLES,
    drop_remainder=False,
    shuffle=False,
    reshuffle=False,
    repeat=False,
    steps_per_epoch=None,
    dropout=0.0,
    optimizer="sgd",
    steps_per_execution=1,
    backup=None,
    save_freq="epoch",
    callbacks=(),
):
    """Builds and fits the job; returns (model, history)."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model, opt = make_model(dropout, optimizer)
        model.compile(opt, "mse", steps_per_execution=steps_per_execution)
    cbs = list(callbacks)
    if backup:
        from tfgpu.callbacks import BackupAndRestore

        cbs.insert(0, BackupAndRestore(backup, save_freq=save_freq))
    ds = make_dataset(global_batch, examples, drop_remainder, shuffle, reshuffle, repeat)
    history = model.fit(
        ds, epochs=epochs, verbose=0, callbacks=cbs, shuffle=False, steps_per_epoch=steps_per_epoch
    )
    return model, history


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--strategy", default="default")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--reshuffle", action="store_true", help="seeded, new order every epoch")
    p.add_argument("--repeat", action="store_true", help="repeat the data, with --steps-per-epoch")
    p.add_argument("--steps-per-epoch", type=int, default=None)
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--backup")
    p.add_argument("--save-freq", default="epoch")
    p.add_argument("--kill-at", help="EPOCH:BATCH, SIGKILL after that batch")
    p.add_argument("--kill-worker", type=int, default=None, help="only this task index dies")
    p.add_argument("--kill-during-save", type=int, default=0)
    p.add_argument("--no-compat", action="store_true", help="plain Keras, no tfgpu correction")
    args = p.parse_args(argv)

    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    if args.strategy == "multi_worker" and args.no_compat:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation="RING"
            )
        )
    elif args.strategy == "default":
        strategy = None
    else:
        import tfgpu

        strategy = tfgpu.strategy(args.strategy)
    callbacks = []
    if args.kill_at and (args.kill_worker is None or args.kill_worker == task):
        epoch, step = map(int, args.kill_at.split(":"))
        callbacks.append(KillAt(epoch, step))
    if args.kill_during_save:
        kill_during_save(args.kill_during_save)
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    try:
        model, history = train(
            strategy,
            epochs=args.epochs,
            global_batch=args.global_batch,
            shuffle=args.shuffle,
            reshuffle=args.reshuffle,
            repeat=args.repeat,
            steps_per_epoch=args.steps_per_epoch,
            dropout=args.dropout,
            steps_per_execution=args.steps_per_execution,
            backup=args.backup,
            save_freq=save_freq,
            callbacks=callbacks,
        )
    except Exception as e:
        print(f"TRAINING FAILED: {type(e).__name__}: {e}", flush=True)
        return 3
    np.savez(
        args.out,
        *model.get_weights(),
        iterations=int(model.optimizer.iterations.numpy()),
        loss=np.asarray(history.history.get("loss", []), dtype="float64"),
    )
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
