"""Input pipelines side by side: naive vs hand-tuned vs `tfgpu.data.pipeline`, in one process.

Workload: JPEGs made in-process (see `_images.py`), decoded and resized (deterministic), then
randomly cropped, flipped and colour-jittered (random). Three measurements, each repeated with
the variants alternating, medians printed with ratios:

1. Pipeline alone (`tfgpu.data.benchmark`, steady state after one warm-up epoch): naive
   (sequential map, no prefetch), hand-tuned "parallel map + prefetch", hand-tuned
   "decode -> cache -> augment", and `tfgpu.data.pipeline` with its defaults.
2. Feed ratio: a stand-in for the GPU that is busy for `--step-ms` per batch without using the
   CPU (a sleep). Throughput fed by a pipeline, divided by the throughput on the same batches
   already in memory (the limit, where the device never waits). Each epoch starts a new
   iterator, as Keras `fit` does. Goal for tfgpu: >= 0.95.
3. A small CNN trained for real on the CPU, fed by the naive and the tfgpu pipeline (for
   information: here model and pipeline compete for the same cores).

Run: `.venv/bin/python benchmarks/data_pipeline.py` (a few minutes on 2 cores), `--sections 1`
for the pipeline-alone comparison only, or `--quick` for a few-second smoke run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tensorflow as tf
from _images import augment, decode_resize, decode_resize_augment, make_jpegs

import tfgpu.data

AUTOTUNE = tf.data.AUTOTUNE


def naive(jpegs, labels, size, batch):
    ds = tf.data.Dataset.from_tensor_slices((jpegs, labels)).shuffle(len(labels))
    ds = ds.map(decode_resize_augment(size)).batch(batch)
    # Truly sequential: without this, tf.data's default rewrites parallelize the map and
    # inject a prefetch, and "naive" would not be naive.
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)


def parallel_prefetch(jpegs, labels, size, batch):
    ds = tf.data.Dataset.from_tensor_slices((jpegs, labels)).shuffle(len(labels))
    ds = ds.map(decode_resize_augment(size), num_parallel_calls=AUTOTUNE)
    return ds.batch(batch).prefetch(AUTOTUNE)


def decode_cache_augment(jpegs, labels, size, batch):
    ds = tf.data.Dataset.from_tensor_slices((jpegs, labels))
    ds = ds.map(decode_resize(size), num_parallel_calls=AUTOTUNE).cache().shuffle(len(labels))
    ds = ds.map(augment(size), num_parallel_calls=AUTOTUNE)
    return ds.batch(batch).prefetch(AUTOTUNE)


def tfgpu_pipeline(jpegs, labels, size, batch):
    return tfgpu.data.pipeline(
        (jpegs, labels), batch_size=batch, map_fn=decode_resize(size), augment_fn=augment(size)
    )


VARIANTS = {
    "naive": naive,
    "parallel+prefetch": parallel_prefetch,
    "decode-cache-augment": decode_cache_augment,
    "tfgpu": tfgpu_pipeline,
}


def _rotate(names, r):
    return names[r % len(names) :] + names[: r % len(names)]


HAND_TUNED = ("parallel+prefetch", "decode-cache-augment")


def _spread(values):
    return f"{statistics.median(values):.3f} [{min(values):.3f} .. {max(values):.3f}]"


def pipeline_alone(data, args, epoch_batches):
    """Examples/s of each pipeline alone, and CPU time per example.

    Each repeat builds every variant afresh and runs one warm-up epoch of each (filling the
    caches), then times `--alone-epochs` rounds; a round times one epoch of every variant, in
    rotating order, each from a new iterator that is then torn down (as Keras `fit` runs
    each epoch; both are timed). Within a repeat, a variant's rate is its median over the
    rounds, and ratios are medians of the per-round ratios, so a burst of load from other
    processes hits both sides of a ratio alike. CPU time per example (process CPU over the same epochs) measures the work done,
    which such load disturbs much less than wall time.
    """
    names = list(VARIANTS)
    rates = {name: [] for name in names}  # one value per repeat
    cpu = {name: [] for name in names}
    ratios = {name: [] for name in names}  # vs naive, one per repeat
    vs_best = {name: [] for name in HAND_TUNED}  # tfgpu / hand-tuned, one per repeat
    for r in range(args.repeats):
        datasets = {name: VARIANTS[name](*data, args.size, args.batch) for name in names}
        for name in _rotate(names, r):
            tfgpu.data.benchmark(datasets[name], steps=epoch_batches, warmup=0)
        epoch_rates = {name: [] for name in names}
        epoch_cpu = {name: [] for name in names}
        for i in range(args.alone_epochs):
            for name in _rotate(names, r + i):
                start, cpu_start = time.perf_counter(), time.process_time()
                # One epoch; timed from outside so that creating the iterator and tearing it
                # down count too, as they do for every epoch of Keras `fit`.
                result = tfgpu.data.benchmark(datasets[name], steps=epoch_batches, warmup=0)
                seconds = time.perf_counter() - start
                epoch_cpu[name].append(
                    (time.process_time() - cpu_start) * 1e6 / result.num_examples
                )
                epoch_rates[name].append(result.num_examples / seconds)
        for name in names:
            rates[name].append(statistics.median(epoch_rates[name]))
            cpu[name].append(statistics.median(epoch_cpu[name]))
            ratios[name].append(
                statistics.median(a / b for a, b in zip(epoch_rates[name], epoch_rates["naive"]))
            )
        for name in HAND_TUNED:
            vs_best[name].append(
                statistics.median(a / b for a, b in zip(epoch_rates["tfgpu"], epoch_rates[name]))
            )
    print(
        f"\n[1] pipeline alone ({args.repeats} repeats x {args.alone_epochs} alternating epochs "
        "after a warm-up epoch; median [min .. max] over the repeats)"
    )
    print(f"  {'':22s} {'examples/s':>10s}   {'vs naive':26s} CPU ms per 1000 examples")
    for name in names:
        print(
            f"  {name:22s} {statistics.median(rates[name]):10.0f}   "
            f"x{_spread(ratios[name]):25s} {statistics.median(cpu[name]):6.1f}"
        )
    print(
        f"  tfgpu/naive = {statistics.median(ratios['tfgpu']):.2f}   "
        f"(naive {statistics.median(rates['naive']):.0f} examples/s)"
    )
    best = max(HAND_TUNED, key=lambda name: statistics.median(rates[name]))
    cpu_vs_best = [b / t for t, b in zip(cpu["tfgpu"], cpu[best])]
    goal = statistics.median(vs_best[best])
    print(
        f"  tfgpu/best hand-tuned ({best}) = {_spread(vs_best[best])} in examples/s, "
        f"{_spread(cpu_vs_best)} in examples per CPU second"
    )
    print(f"  goal tfgpu/best >= 0.97: {'met' if goal >= 0.97 else 'NOT met'} ({goal:.3f})")


def _run_fed(ds, epochs, step_s, restart):
    """Examples/s of a fake device step of `step_s` per batch, fed by `ds` for `epochs`.

    restart=True starts a new iterator every epoch (Keras `fit` without `steps_per_epoch`);
    restart=False keeps one iterator over a repeated dataset (`fit` with `steps_per_epoch`).
    """
    batches_per_epoch = sum(1 for _ in ds)  # warm-up epoch: fills caches, like a first epoch
    examples = 0
    if restart:
        start = time.perf_counter()
        for _ in range(epochs):
            for x, _ in ds:
                time.sleep(step_s)
                examples += int(x.shape[0])
    else:
        iterator = iter(ds.repeat())
        next(iterator)
        start = time.perf_counter()
        for _ in range(epochs * batches_per_epoch):
            x, _ = next(iterator)
            time.sleep(step_s)
            examples += int(x.shape[0])
    return examples / (time.perf_counter() - start)


def _run_list(batches, epochs, step_s):
    examples = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for x, _ in batches:
            time.sleep(step_s)
            examples += int(x.shape[0])
    return examples / (time.perf_counter() - start)


def feed_ratio(data, args):
    """Fed throughput / limit. The limit is the same batches already in memory, iterated as a
    `tf.data.Dataset` (so it pays the same per-batch iterator cost as any dataset Keras is
    given); the ratio against a plain Python list, which pays none, is printed beside."""
    step_s = args.step_ms / 1000
    batches = list(tfgpu_pipeline(*data, args.size, args.batch))  # the same batches, in memory
    in_memory = tf.data.Dataset.from_tensor_slices(tuple(tf.stack(part) for part in zip(*batches)))
    modes = {"one iterator": False, "new iterator per epoch": True}
    ratios = {(m, v): [] for m in modes for v in ("naive", "tfgpu")}
    list_ratios = {key: [] for key in ratios}
    for r in range(args.repeats):
        for mode, restart in modes.items():
            for name in _rotate(["naive", "tfgpu"], r):
                limit = _run_fed(in_memory, args.timed_epochs, step_s, restart)
                ds = VARIANTS[name](*data, args.size, args.batch)
                fed = _run_fed(ds, args.timed_epochs, step_s, restart)
                ratios[mode, name].append(fed / limit)
                list_limit = _run_list(batches, args.timed_epochs, step_s)
                list_ratios[mode, name].append(fed / list_limit)
    print(
        f"\n[2] feed ratio, fake device step {args.step_ms} ms/batch (sleep): throughput fed "
        f"by the pipeline / same batches in memory as a dataset (median of {args.repeats}; "
        f"{args.timed_epochs} epochs of {len(batches)} batches after a warm-up epoch)"
    )
    for (mode, name), values in ratios.items():
        spread = f"[{min(values):.3f} .. {max(values):.3f}]"
        print(
            f"  {mode:23s} feed ratio {name:6s} {statistics.median(values):.3f}  {spread}  "
            f"(vs a Python list: {statistics.median(list_ratios[mode, name]):.3f})"
        )
    goal = statistics.median(ratios["one iterator", "tfgpu"])
    print(f"  goal >= 0.95 (one iterator): {'met' if goal >= 0.95 else 'NOT met'} ({goal:.3f})")


class _EpochTimer(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def small_cnn(data, args):
    import keras

    rates = {"naive": [], "tfgpu": []}
    n = len(data[1]) // args.batch * args.batch
    for r in range(args.repeats):
        for name in _rotate(list(rates), r):
            keras.utils.set_random_seed(r)
            model = keras.Sequential(
                [
                    keras.Input((args.size, args.size, 3)),
                    keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
                    keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(10),
                ]
            )
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            timer = _EpochTimer()
            ds = VARIANTS[name](*data, args.size, args.batch)
            model.fit(ds, epochs=1 + args.timed_epochs, verbose=0, callbacks=[timer])
            rates[name].append(n / statistics.median(timer.times[1:]))
    print("\n[3] small CNN trained on the CPU, examples/s (epochs after the first; info only)")
    for name, values in rates.items():
        print(f"  {name:6s} {statistics.median(values):9.0f}")
    ratio = statistics.median(t / n for t, n in zip(rates["tfgpu"], rates["naive"]))
    print(f"  small CNN tfgpu/naive = {ratio:.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--images", type=int, default=1024, help="images per epoch")
    parser.add_argument("--size", type=int, default=64, help="training crop size")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=4.0, help="fake device step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timed-epochs", type=int, default=2, help="timed epochs in [2], [3]")
    parser.add_argument("--alone-epochs", type=int, default=12, help="timed rounds in [1]")
    parser.add_argument(
        "--sections", default="123", help="which measurements to run, e.g. 1 or 12 (default 123)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.size, args.batch, args.repeats, args.timed_epochs = 64, 32, 8, 1, 1
        args.alone_epochs = 1
    source_px = 3 * args.size  # photos are larger than the training crop
    data = make_jpegs(args.images, size=source_px, seed=0)
    epoch_batches = -(-args.images // args.batch)
    print(
        f"workload: {args.images} JPEGs of ~{source_px}px (mean "
        f"{sum(map(len, data[0])) / len(data[0]) / 1024:.1f} KiB), decode + resize, random "
        f"crop {args.size}, flip, colour jitter; batch {args.batch}; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} (other processes skew every figure)"
    )
    if "1" in args.sections:
        pipeline_alone(data, args, epoch_batches)
    if "2" in args.sections:
        feed_ratio(data, args)
    if "3" in args.sections:
        small_cnn(data, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
