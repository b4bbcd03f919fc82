"""`tfgpu.scaling` on 4 logical CPU devices, two model shapes: do the step's parts add up to
the step, and how far is the cost model's prediction for 4 replicas from the measurement?

1. compute-heavy: 1024 features -> Dense(1024) -> Dense(1024) -> Dense(10), 128 examples per
   replica (8 MiB of gradients, about 10 ms of compute per step on one replica);
2. gradient-heavy: 2048 features -> Dense(4096) -> Dense(1), 2 examples per replica (32 MiB of
   gradients, almost no compute): the all-reduce holds the step.

For each shape and run: the result's table; per point of 2 and 4 replicas, the step's parts
over the step, `(compute + all-reduce + update + wait) / step` ("parts") and with `other` added
("with other": 1.00 unless the parts exceed the step, since `other` is what is left); and
`result.prediction_errors` (predicted / measured step - 1 for the counts beyond the two the
model is calibrated on). The issue's targets: parts within 15% of the step, the prediction
for 4 replicas within 25% of the measurement.

Logical CPU devices share the host's cores: more replicas add no compute. These figures
check the mechanics (the split, the calibration), not a GPU's speedup.

Command: `.venv/bin/python benchmarks/scaling.py [--budget 120] [--runs 1]
[--only compute,gradients]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tfgpu

tfgpu.configure(cpu_devices=4)  # before anything else touches TensorFlow

import keras  # noqa: E402
import numpy as np  # noqa: E402

PARTS_TARGET, PREDICTION_TARGET = 0.15, 0.25


def compute_case():
    rng = np.random.default_rng(0)
    x = rng.random((4096, 1024), dtype=np.float32)
    y = rng.integers(0, 10, 4096).astype(np.int32)

    def build():
        model = keras.Sequential(
            [
                keras.Input((1024,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile("sgd", "sparse_categorical_crossentropy")
        return model

    return build, (x, y), 128


def gradients_case():
    rng = np.random.default_rng(0)
    x = rng.random((256, 2048), dtype=np.float32)
    y = np.ones((256, 1), np.float32)

    def build():
        model = keras.Sequential(
            [keras.Input((2048,)), keras.layers.Dense(4096), keras.layers.Dense(1)]
        )
        model.compile("sgd", "mse")
        return model

    return build, (x, y), 2


CASES = {"compute": compute_case, "gradients": gradients_case}


def ratios(p) -> tuple[float, float] | None:
    """(compute + all-reduce + update + wait) / step, and the same with `other`; None when a
    part is missing."""
    parts = (p.compute_s, p.all_reduce_s, p.update_s, p.input_wait_s, p.other_s)
    if not p.step_s or any(v is None for v in parts):
        return None
    busy = p.compute_s + p.all_reduce_s + p.update_s + p.input_wait_s
    return busy / p.step_s, (busy + p.other_s) / p.step_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=120.0, help="time_budget_s per shape")
    parser.add_argument("--runs", type=int, default=1, help="scaling runs per shape")
    parser.add_argument("--only", default=",".join(CASES))
    args = parser.parse_args()
    rows, misses = [], []
    for name in args.only.split(","):
        build, data, batch = CASES[name]()
        for run in range(1, args.runs + 1):
            start = time.perf_counter()
            result = tfgpu.scaling(build, data, batch_size=batch, time_budget_s=args.budget)
            seconds = time.perf_counter() - start
            print(f"\n== {name} run {run} ({seconds:.0f} s) ==\n{result}\n", flush=True)
            for p in result.points:
                if p.replicas < 2:
                    continue
                r = ratios(p)
                if r is None:
                    print(f"  {p.replicas} {p.mode}: parts missing ({p.reason})")
                    continue
                ok = abs(r[0] - 1.0) <= PARTS_TARGET
                misses += [] if ok else [f"{name} run {run}, {p.replicas} {p.mode}: parts"]
                rows.append(
                    f"| {name} | {run} | {p.replicas} {p.mode} | {p.step_s * 1e3:.1f} "
                    f"| {r[0]:.2f} | {r[1]:.2f} | {'yes' if ok else 'no'} |"
                )
            for key, error in result.prediction_errors.items():
                ok = abs(error) <= PREDICTION_TARGET
                misses += [] if ok else [f"{name} run {run}, {key}: prediction"]
                print(
                    f"  prediction error {key}: {error:+.0%} ({'within' if ok else 'beyond'} 25%)"
                )
                rows.append(
                    f"| {name} | {run} | {key} predicted | | error {error:+.0%} | | "
                    f"{'yes' if ok else 'no'} |"
                )
    print("\n| shape | run | point | step ms | parts / step | with other | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\ntargets missed: {', '.join(misses) if misses else 'none'}")


if __name__ == "__main__":
    main()
