"""Mixed precision: which policy on which GPU, the float32 output layer, and loss scaling.

Run: `python examples/mixed_precision.py` (any machine; on the CPU it shows the mechanics,
but float16 math is not faster there, which is why `tfgpu.configure()` keeps float32).

What changes on which GPU (`tfgpu.configure(precision="auto")` decides from the compute
capability of every GPU it uses):

| GPU (compute capability)           | policy           | loss scaling |
| ---------------------------------- | ---------------- | ------------ |
| no GPU, or before Volta (< 7.0)    | float32          | no           |
| V100, T4, RTX 20xx (7.x)           | mixed_float16    | yes, dynamic |
| A100, RTX 30xx/40xx, H100 (>= 8.0) | mixed_bfloat16   | not needed   |

Under a mixed policy layers compute in 16 bits and keep float32 variables. The output
(softmax and the loss) must stay float32: give the last layer `dtype="float32"`.
float16 has a narrow range, so Keras wraps the optimizer in a `LossScaleOptimizer` that
multiplies the loss before the backward pass and skips steps whose gradients overflow;
bfloat16 has float32's range and needs none.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
QUICK = os.environ.get("TFGPU_QUICK") == "1"  # the test suite runs every example quickly

import keras
import numpy as np

import tfgpu
from tfgpu.precision import choose_policy

# 1. The decision, for GPUs this machine may not have (a pure function: no GPU needed).
for name, cc in [("Tesla P100", (6, 0)), ("Tesla T4", (7, 5)), ("A100", (8, 0)), ("H100", (9, 0))]:
    choice = choose_policy([cc])
    print(f"{name:<11} cc {cc[0]}.{cc[1]}: {choice.policy:<15} ({choice.reason})")

# 2. The decision for this machine, applied before any model exists.
config = tfgpu.configure(precision="auto", seed=0)
print(config)

# 3. The mechanics: on a GPU keep what configure() chose; on the CPU force mixed_float16
#    only to show what happens (it is slower there).
policy = config.precision if config.gpus else "mixed_float16"
keras.mixed_precision.set_global_policy(policy)
print(f"\nglobal policy: {policy}")


def build(float32_output: bool) -> keras.Model:
    inputs = keras.Input((32,))
    x = keras.layers.Dense(64, activation="relu")(inputs)  # multiples of 8: tensor cores
    x = keras.layers.Dense(8)(x)
    dtype = "float32" if float32_output else None
    outputs = keras.layers.Activation("softmax", dtype=dtype, name="probs")(x)
    return keras.Model(inputs, outputs)


model = build(float32_output=True)
for layer in model.layers[1:]:
    print(
        f"  {layer.name:<8} computes in {layer.compute_dtype:<8} variables in "
        f"{layer.variable_dtype}"
    )

rng = np.random.default_rng(0)
x = rng.normal(size=(256 if QUICK else 4096, 32)).astype("float32")
y = np.argmax(x[:, :8], axis=1)  # learnable: the largest of the first 8 features
model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
print(f"optimizer: {type(model.optimizer).__name__}")  # LossScaleOptimizer under float16
history = model.fit(x, y, batch_size=64, epochs=2 if QUICK else 10, verbose=2)
if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
    scale = float(np.asarray(model.optimizer.dynamic_scale))
    print(f"dynamic loss scale now {scale:g} (halves on every overflow, grows when stable)")

# 4. The lint: a model whose softmax computes in 16 bits is flagged by tfgpu.diagnose().
if policy != "float32":
    bad = build(float32_output=False)
    bad.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    diagnosis = tfgpu.diagnose(
        bad, (x, y), batch_size=64, steps=3, warmup=1, check_xla=False, monitor=False
    )
    finding = diagnosis.finding("mixed_precision_output")
    print(f"\ndiagnose() on a model with a {bad.layers[-1].compute_dtype} output:")
    print(f"  {finding.title}\n  -> {finding.recommendation}")
