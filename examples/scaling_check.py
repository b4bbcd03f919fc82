"""Does a second GPU help this model? `tfgpu.scaling()` on 1, 2, 4 replicas, weak and strong.

Run: `python examples/scaling_check.py`. A small CNN on CIFAR-shaped images (32x32x3, 10
classes) trains on every replica count of this machine; each step is split into compute,
all-reduce and input, each point gets its reason and fix, and a cost model predicts more
replicas. Without GPUs the replicas are 4 logical CPU devices, which share the cores: that
checks the mechanics, not a speedup (the table says so). The guide: docs/scaling.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
QUICK = os.environ.get("TFGPU_QUICK") == "1"  # the test suite runs every example quickly

import keras
import numpy as np
import tensorflow as tf

import tfgpu

if tf.config.list_physical_devices("GPU"):  # lists devices without initializing them
    tfgpu.configure()
else:
    tfgpu.configure(cpu_devices=4)  # before anything else touches TensorFlow
    print("No GPU here: the replicas are 4 logical CPU devices (the mechanics, not a speedup).")


def build_model() -> keras.Model:
    """Called once per replica count and mode, inside that strategy's scope."""
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax", dtype="float32"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


rng = np.random.default_rng(0)
n = 512 if QUICK else 8192
x = rng.random((n, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, n).astype(np.int32)
train = tfgpu.data.pipeline((x, y), batch_size=64, seed=0)  # 64 examples per replica

result = tfgpu.scaling(
    build_model,
    train,
    replicas=[2] if QUICK else None,  # None: 1, 2, 4, ... up to this machine's devices
    time_budget_s=10 if QUICK else 60,
    log_dir="runs/scaling_check",
    verbose=0 if QUICK else "auto",
)
print(result)
print(f"\nworst point: {result.headline()}")
print(
    "written: runs/scaling_check/scaling.json and scaling.png (`tfgpu report runs/scaling_check`)"
)
