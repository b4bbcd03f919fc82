"""float32 vs mixed_float16 vs mixed_bfloat16 training step time on this CPU, alternating."""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np


def build(policy):
    keras.mixed_precision.set_global_policy(policy)
    inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, activation="relu")(inp)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    out = keras.layers.Dense(10, dtype="float32")(x)
    m = keras.Model(inp, out)
    m.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return m


rng = np.random.default_rng(0)
x = rng.random((64, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, 64)
models = {p: build(p) for p in ("float32", "mixed_float16", "mixed_bfloat16")}
for m in models.values():
    for _ in range(3):
        m.train_on_batch(x, y)
times = {p: [] for p in models}
for _round in range(5):
    for p, m in models.items():
        t = time.perf_counter()
        for _ in range(10):
            m.train_on_batch(x, y)
        times[p].append((time.perf_counter() - t) / 10)
base = statistics.median(times["float32"])
for p, ts in times.items():
    print(
        f"{p:15s} median step {statistics.median(ts) * 1000:7.1f} ms  ratio vs float32 {statistics.median(ts) / base:5.2f}x"
    )
