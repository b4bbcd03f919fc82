"""Data parallelism on one machine: `MirroredStrategy` over all GPUs.

Run: `python examples/multi_gpu.py`. Each replica (one per GPU) gets `per_replica` examples
of every global batch, computes its gradients, and an all-reduce (NCCL on GPUs) sums them,
so every replica applies the same update. Without GPUs this runs on 2 logical CPU devices
and says so: that shows the mechanics and the numerics, not speed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
QUICK = os.environ.get("TFGPU_QUICK") == "1"  # the test suite runs every example quickly

import keras
import numpy as np
import tensorflow as tf

import tfgpu

gpus = tf.config.list_physical_devices("GPU")  # lists devices without initializing them
if gpus:
    config = tfgpu.configure()
    print(f"{len(gpus)} GPU(s): MirroredStrategy over all of them")
else:
    config = tfgpu.configure(cpu_devices=2)  # before anything else touches TensorFlow
    print("No GPU here: MirroredStrategy runs on 2 logical CPU devices instead.")

strategy = tfgpu.strategy("mirrored")
per_replica = 32
global_batch = tfgpu.global_batch_size(per_replica, strategy)
learning_rate = tfgpu.scale_learning_rate(1e-3, strategy, rule="sqrt")  # Adam: sqrt rule
print(
    f"{strategy.num_replicas_in_sync} replicas on {list(strategy.extended.worker_devices)}; "
    f"global batch {global_batch} ({per_replica} per replica), learning rate {learning_rate:g}"
)

rng = np.random.default_rng(0)
n = 1024 if QUICK else 16384
x = rng.normal(size=(n, 16, 16, 3)).astype("float32")
y = (x[..., 0].mean(axis=(1, 2)) > x[..., 1].mean(axis=(1, 2))).astype("int32")  # learnable

# The pipeline knows the strategy: global batches, drop_remainder (equal shards), sharding.
train = tfgpu.data.pipeline((x, y), batch_size=global_batch, strategy=strategy, seed=0)

with strategy.scope():  # variables are mirrored on every replica
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        keras.optimizers.Adam(learning_rate),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )

history = model.fit(
    train,
    epochs=2 if QUICK else 5,
    verbose=2,
    callbacks=[tfgpu.callbacks.StepTimer(log_dir="runs/multi_gpu")],
)
print(f"final accuracy {history.history['accuracy'][-1]:.3f} with {global_batch} per step")
