"""Find the largest batch that fits in GPU memory, and the fastest one.

Run: `python examples/batch_size_finder.py`. `tfgpu.find_batch_size` doubles the batch
until a trial runs out of memory (a real `ResourceExhaustedError`) or passes 90% of the
GPU's memory, then bisects; every trial runs real training steps and is timed. Weights,
optimizer state, metrics and compile settings are restored afterwards. `in_subprocess=True` runs the trials in a fresh
process, so this one keeps no memory from the failed trials.

On the CPU there is no memory capacity to measure, so only `max_batch_size` stops the
search, and "fastest" is about throughput alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
QUICK = os.environ.get("TFGPU_QUICK") == "1"  # the test suite runs every example quickly

import keras
import numpy as np

import tfgpu

config = tfgpu.configure()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 32, 32, 3)).astype("float32")
y = rng.integers(0, 10, size=512).astype("int32")

model = keras.Sequential(
    [
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax", dtype="float32"),
    ]
)
model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")

# The model and the data come first; every other argument is keyword-only.
result = tfgpu.find_batch_size(
    model,
    (x, y),
    start=8,
    max_batch_size=32 if QUICK else (4096 if config.gpus else 256),
    steps=1 if QUICK else 3,
    # The batch per update the recipe was tuned for: if it does not fit, accumulate gradients.
    target_batch_size=1024,
)
print(result)

# Use it: the fastest batch, or the accumulation plan to reach the recipe's global batch.
batch = result.fastest  # global, as fit takes it
print(f"\ntraining with batch_size={batch}")
model.fit(x, y, batch_size=batch, epochs=1, verbose=2)
if result.gradient_accumulation_steps:
    print(
        "to train with the recipe's batch of 1024 per update: keras.optimizers.Adam(..., "
        f"gradient_accumulation_steps={result.gradient_accumulation_steps}) and batch_size="
        f"{result.accumulation_batch_size}"
    )
