"""Overhead of GPUMonitor + StepTimer: the same `fit` with and without them, alternating.

Usage (from the repository root):

    .venv/bin/python benchmarks/monitor_overhead.py                 # default interval 0.2 s
    .venv/bin/python benchmarks/monitor_overhead.py --rounds 8 --interval 0.05

One process, one compiled model; each round runs both variants in ABBA order (so drift in
machine load falls on both equally) and the script prints the median of the per-round
ratios `time(with callbacks) / time(without)`. The goal is <= 1.01 at the default interval.

Where NVML is unavailable (no NVIDIA driver), the scripted fake from `tests/fake_pynvml.py`
stands in with two GPUs so the NVML code path is still paid for; `--no-fake` samples the
host only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _use_fake_nvml_if_needed(no_fake: bool) -> str:
    from tfgpu.monitor.nvml import inventory

    inv = inventory()
    if inv.available:
        return f"real NVML, {len(inv.gpus)} GPU(s)"
    if no_fake:
        return "no NVML: host metrics only"
    from tests import fake_pynvml

    sys.modules["pynvml"] = fake_pynvml.make()
    return "fake NVML (tests/fake_pynvml.py), 2 GPUs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--examples", type=int, default=65536)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-fake", action="store_true")
    args = parser.parse_args(argv)

    nvml_mode = _use_fake_nvml_if_needed(args.no_fake)
    import keras
    import numpy as np

    from tfgpu.callbacks import GPUMonitor, StepTimer

    rng = np.random.default_rng(0)
    x = rng.random((args.examples, 128), dtype="float32")
    y = rng.integers(0, 10, args.examples)
    model = keras.Sequential(
        [
            keras.Input((128,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    run_dir = tempfile.mkdtemp(prefix="tfgpu-overhead-")

    def fit(with_callbacks: bool) -> tuple[float, float]:
        """Returns (wall seconds, process CPU seconds: all threads, the sampler's included)."""
        callbacks = []
        if with_callbacks:
            callbacks = [
                GPUMonitor(run_dir, interval=args.interval),
                StepTimer(log_dir=run_dir),
            ]
        start, cpu_start = time.perf_counter(), time.process_time()
        model.fit(
            x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0, callbacks=callbacks
        )
        return time.perf_counter() - start, time.process_time() - cpu_start

    fit(True)  # warm-up: tracing, first-call costs of both variants
    fit(False)
    base, monitored, ratios, cpu_ratios, walls = [], [], [], [], {False: [], True: []}
    for r in range(args.rounds):
        order = (False, True, True, False) if r % 2 == 0 else (True, False, False, True)
        times: dict[bool, list[float]] = {False: [], True: []}
        cpus: dict[bool, list[float]] = {False: [], True: []}
        for variant in order:
            wall, cpu = fit(variant)
            times[variant].append(wall)
            cpus[variant].append(cpu)
            walls[variant].append(wall)
        without, with_ = sum(times[False]), sum(times[True])
        base.append(without / 2)
        monitored.append(with_ / 2)
        ratios.append(with_ / without)
        cpu_ratios.append(sum(cpus[True]) / sum(cpus[False]))
        print(
            f"round {r + 1}: without {without / 2:.3f} s, with {with_ / 2:.3f} s, "
            f"wall ratio {with_ / without:.4f}, CPU-time ratio {cpu_ratios[-1]:.4f}"
        )
    # The sampler's own cost, measured directly: the share of one core (and of the GIL)
    # its thread takes, an upper bound on what it can steal from a CPU-bound training loop.
    from tfgpu.monitor import Sampler

    sampler = Sampler(interval=3600).start()
    t0, n = time.perf_counter(), 200
    for _ in range(n):
        sampler._sample()
    per_sample = (time.perf_counter() - t0) / n
    sampler.stop()
    print(
        f"one sample: {per_sample * 1e3:.3f} ms = {100 * per_sample / args.interval:.3f}% "
        f"of a core at interval {args.interval} s"
    )
    # The callbacks' per-step cost, measured directly: their batch hooks, called as Keras does.
    gpu_monitor = GPUMonitor(run_dir, interval=3600)
    timer = StepTimer(batch_size=64, log_dir=run_dir)  # with its steps.csv writes
    n = 20000
    timer.set_params({"steps": n})
    gpu_monitor.on_train_begin()
    timer.on_train_begin()
    gpu_monitor.on_epoch_begin(0)
    timer.on_epoch_begin(0)
    t0 = time.perf_counter()
    for i in range(n):
        gpu_monitor.on_train_batch_begin(i)
        timer.on_train_batch_begin(i)
        timer.on_train_batch_end(i)
    per_step_hooks = (time.perf_counter() - t0) / n
    timer.on_epoch_end(0, {})
    gpu_monitor.on_epoch_end(0, {})
    timer.on_train_end()
    gpu_monitor.on_train_end()
    steps = args.epochs * -(-args.examples // args.batch_size)
    step_time = statistics.median(base) / steps
    estimate = per_step_hooks / step_time + per_sample / args.interval
    print(
        f"batch hooks: {per_step_hooks * 1e6:.1f} us per step; this fit's step: "
        f"{step_time * 1e3:.3f} ms -> estimated overhead {100 * estimate:.2f}% "
        f"(hooks / step time + sample time / interval)"
    )
    print(f"nvml: {nvml_mode}; interval {args.interval} s; {steps} steps per fit")
    print(
        f"median fit time without: {statistics.median(base):.3f} s, with: {statistics.median(monitored):.3f} s"
    )
    print(f"overhead ratio (median of per-round ratios): {statistics.median(ratios):.4f}")
    print(f"ratio spread: min {min(ratios):.4f}, max {max(ratios):.4f}")
    print(
        f"best-of ratio (fastest fit with / fastest without): {min(walls[True]) / min(walls[False]):.4f}"
    )
    print(
        f"CPU-time ratio (process CPU with / without, median of rounds): "
        f"{statistics.median(cpu_ratios):.4f} [{min(cpu_ratios):.4f} .. {max(cpu_ratios):.4f}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
