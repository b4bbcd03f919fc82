"""What each knob gives on the demo's CPU workload: the naive side against tfgpu variants.

The demo's CPU sizes (`tfgpu.demo._plan.choose_sizes(quick=False, num_gpus=0)`): 8192
generated 128x128 JPEGs, decoded and resized to 36, cropped to 32, the reference CNN, global
batch 64. Every variant trains its own copy of the model (same seed) on its own dataset; each
round fits one epoch of every variant, in rotating order, and takes its steady-state examples/s
(the epoch's steps after the first execution, as `StepTimer` counts them). The table gives each
variant's median examples/s and its ratio to the naive side, with the interval of the per-round
ratios (`tfgpu._internal.measure.rules.Gain`).

Command: `.venv/bin/python benchmarks/tune_demo_knobs.py [--rounds 5] [--only NAME,...]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import tensorflow as tf

import tfgpu.data
from tfgpu._internal.measure.rules import Gain
from tfgpu.demo._plan import SEED, choose_sizes
from tfgpu.demo._workload import (
    augment_fn,
    build_data,
    build_model,
    decode_fn,
    learning_rate,
)


class _Clock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter())


def batch_augment(image_size: int):
    """The demo's augmentation on a whole batch: a random crop and brightness per image."""

    def augment(images, labels):
        n = tf.shape(images)[0]
        side = tf.shape(images)[1]
        span = side - image_size + 1
        y0 = tf.random.uniform((n,), 0, span, dtype=tf.int32)
        x0 = tf.random.uniform((n,), 0, span, dtype=tf.int32)
        rows = y0[:, None] + tf.range(image_size)[None, :]
        cols = x0[:, None] + tf.range(image_size)[None, :]
        images = tf.gather(images, rows, axis=1, batch_dims=1)
        images = tf.gather(images, cols, axis=2, batch_dims=1)
        delta = tf.random.uniform((n, 1, 1, 1), -0.1, 0.1)
        return images + delta, labels

    return augment


def vectorized(augment):
    """A per-example augment run over a batch by `tf.vectorized_map` (what tune could do)."""

    def run(images, labels):
        out = tf.vectorized_map(lambda e: augment(*e), (images, labels))
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="")
    args = parser.parse_args()

    sizes = choose_sizes(quick=False, num_gpus=0)
    data = build_data(None, sizes)
    batch = sizes.per_replica_batch
    steps_per_epoch = sizes.num_train // batch
    decode, augment = decode_fn(sizes.resize_to), augment_fn(sizes.image_size)

    def naive_data():
        def decode_and_augment(jpeg, label):
            return augment(*decode(jpeg, label))

        return (
            tf.data.Dataset.from_tensor_slices((data.train_x, data.train_y))
            .shuffle(sizes.num_train, seed=SEED)
            .map(decode_and_augment)
            .batch(batch)
        )

    def tfgpu_data(**kw):
        options = {"map_fn": decode, "augment_fn": augment, "seed": SEED}
        options.update(kw)
        return tfgpu.data.pipeline((data.train_x, data.train_y), batch_size=batch, **options)

    def model(spe=1, jit="auto", policy="float32"):
        keras.mixed_precision.set_global_policy(policy)
        keras.utils.set_random_seed(SEED)
        m = build_model(sizes, data.num_classes)
        keras.mixed_precision.set_global_policy("float32")
        m.compile(
            keras.optimizers.Adam(learning_rate(steps_per_epoch * 50)),
            "sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=spe,
            jit_compile=jit,
        )
        return m

    vec = batch_augment(sizes.image_size)
    variants = {
        "naive": lambda: (model(), naive_data()),
        "tfgpu (demo today)": lambda: (model(), tfgpu_data()),
        "+ spe 8": lambda: (model(8), tfgpu_data()),
        "+ spe 32": lambda: (model(32), tfgpu_data()),
        "+ jit": lambda: (model(1, True), tfgpu_data()),
        "+ spe 32 + jit": lambda: (model(32, True), tfgpu_data()),
        "+ batch aug": lambda: (model(), tfgpu_data(augment_fn=None, batch_augment_fn=vec)),
        "+ vmap aug": lambda: (
            model(),
            tfgpu_data(augment_fn=None, batch_augment_fn=vectorized(augment)),
        ),
        "+ nondeterministic": lambda: (model(), tfgpu_data(deterministic=False)),
        "+ pool 2": lambda: (model(), tfgpu_data(private_threadpool_size=2)),
        "+ drop_remainder": lambda: (model(), tfgpu_data(drop_remainder=True)),
        "+ bf16": lambda: (model(policy="mixed_bfloat16"), tfgpu_data()),
        "+ spe 32 + bf16": lambda: (model(32, policy="mixed_bfloat16"), tfgpu_data()),
        "+ spe 32 + bf16 + pool 1": lambda: (
            model(32, policy="mixed_bfloat16"),
            tfgpu_data(private_threadpool_size=1),
        ),
        "+ spe 32 + bf16 + batch aug": lambda: (
            model(32, policy="mixed_bfloat16"),
            tfgpu_data(augment_fn=None, batch_augment_fn=vec),
        ),
    }
    if args.only:
        keep = {"naive", *args.only.split(",")}
        variants = {k: v for k, v in variants.items() if k in keep}
    built = {name: make() for name, make in variants.items()}

    def epoch(name: str) -> float:
        m, ds = built[name]
        clock = _Clock()
        m.fit(ds, epochs=1, verbose=0, callbacks=[clock])
        spe = int(m.steps_per_execution)
        calls = len(clock.times) - 1
        return calls * spe * batch / (clock.times[-1] - clock.times[0])

    start = time.perf_counter()
    for name in built:  # warm-up: tracing, compiling, filling the caches
        epoch(name)
    print(f"warm-up {time.perf_counter() - start:.0f} s", flush=True)
    rates: dict[str, list[float]] = {name: [] for name in built}
    names = list(built)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            rates[name].append(epoch(name))
        print(f"round {r + 1}: {time.perf_counter() - start:.0f} s", flush=True)

    naive = rates["naive"]
    print(f"\n{'variant':30s} {'examples/s':>11s} {'vs naive':>9s}  interval")
    for name, values in rates.items():
        # Gain.of() takes (base seconds, variant seconds): seconds per example here.
        rounds = [(1 / a, 1 / b) for a, b in zip(naive, values, strict=True)]
        g = Gain.of(rounds)
        med = sorted(values)[len(values) // 2]
        print(f"{name:30s} {med:11.0f} {g.value:8.2f}x  [{g.low:.2f}-{g.high:.2f}]")


if __name__ == "__main__":
    main()
