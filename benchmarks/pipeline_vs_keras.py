"""A Keras example's own input chain vs `tfgpu.data.pipeline` in its place, training a model.

The Keras "TFRecord files" example (melanoma) reads TFRecord files of JPEGs with
`TFRecordDataset(filenames)` (order ignored), `map(parse, AUTOTUNE)`, `shuffle(2048)`,
`prefetch(AUTOTUNE)` and `batch(64)`; issue 27 swapped that chain for
`tfgpu.data.pipeline(files, batch_size=64, map_fn=parse)` and measured it slower on a 2-core
host. Here the files are made in a temp dir (JPEGs of gradients and noise), and the "model" is
a small CNN trained on the same CPU, so input and model compete for the cores; or, with
`--step-ms`, a stand-in for a GPU that is busy that long per batch while the host only waits.

Each round runs one epoch of each chain (a new iterator each, as `fit` does), alternating
which goes first, after one untimed warm-up epoch each; one model serves both. Printed:
examples/s of each per round, and tfgpu / user as median [min .. max] over the rounds.

Run: `.venv/bin/python benchmarks/pipeline_vs_keras.py` (about 2 minutes on 2 cores); with
`--step-ms 90` for the stand-in GPU, `--size 384` for JPEGs that cost more to decode (all are
resized to 128 px). `--tfgpu-arg KEY=VALUE` passes a keyword to `pipeline` (repeatable):
`shuffle_buffer=10000` is the default before issue 27 (a buffer of the whole epoch),
`private_threadpool_size=2` a GPU host's default on a CPU-only one.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras
import numpy as np
import tensorflow as tf

import tfgpu.data

AUTOTUNE = tf.data.AUTOTUNE
SIZE = 128  # the model's input: every JPEG is resized to it, as in the example


def write_records(directory: str, files: int, per_file: int, size: int) -> list[str]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    paths = []
    for shard in range(files):
        path = os.path.join(directory, f"train{shard:02d}.tfrec")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(per_file):
                image = 127 + 80 * np.sin(rng.uniform(0.02, 0.1) * (xx + yy) + rng.uniform(0, 6))
                image = image[..., None] + rng.normal(0, 20, (size, size, 3))
                jpeg = tf.io.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8)).numpy()
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "target": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(rng.integers(0, 2))])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def parse_and_decode_jpeg_and_resize(record):
    features = tf.io.parse_single_example(
        record,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "target": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    image = tf.io.decode_jpeg(features["image"], channels=3)
    image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, (SIZE, SIZE))
    return image, tf.cast(features["target"], tf.float32)


def user_chain(files, parse, batch):
    """The Keras example's `load_dataset` + `get_dataset`, as written there."""
    ignore_order = tf.data.Options()
    ignore_order.experimental_deterministic = False
    ds = tf.data.TFRecordDataset(files).with_options(ignore_order)
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE)
    return ds.shuffle(2048).prefetch(buffer_size=AUTOTUNE).batch(batch)


def make_model() -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile("adam", "binary_crossentropy")
    return model


def _device_epoch(ds: tf.data.Dataset, step_s: float) -> None:
    """One epoch fed to a stand-in GPU: busy `step_s` per batch, the host's CPU idle."""
    for _ in ds:
        time.sleep(step_s)


def _keyword(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--per-file", type=int, default=600)
    parser.add_argument("--size", type=int, default=SIZE, help="of the JPEGs (decode cost)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=None, help="a stand-in GPU step")
    parser.add_argument("--tfgpu-arg", action="append", default=[], type=_keyword)
    args = parser.parse_args()

    examples = args.files * args.per_file
    with tempfile.TemporaryDirectory() as directory:
        files = write_records(directory, args.files, args.per_file, args.size)
        parse = parse_and_decode_jpeg_and_resize
        chains = {
            "user": user_chain(files, parse, args.batch),
            "tfgpu": tfgpu.data.pipeline(
                files, batch_size=args.batch, map_fn=parse, **dict(args.tfgpu_arg)
            ),
        }
        if args.step_ms is None:
            model = make_model()
            epoch = functools.partial(model.fit, epochs=1, verbose=0)
        else:
            epoch = functools.partial(_device_epoch, step_s=args.step_ms / 1000)
        for ds in chains.values():
            epoch(ds)  # traces the step, warms up the files
        rates: dict[str, list[float]] = {name: [] for name in chains}
        for r in range(args.rounds):
            for name in list(chains)[r % 2 :] + list(chains)[: r % 2]:
                start = time.perf_counter()
                epoch(chains[name])
                rates[name].append(examples / (time.perf_counter() - start))
            print(f"  round {r}: " + "  ".join(f"{n} {rates[n][-1]:6.0f}" for n in chains))

    ratios = [t / u for t, u in zip(rates["tfgpu"], rates["user"], strict=True)]
    extra = "".join(f", {k}={v!r}" for k, v in args.tfgpu_arg)
    model = "a small CNN" if args.step_ms is None else f"a stand-in GPU ({args.step_ms} ms/batch)"
    print(
        f"{args.files} files x {args.per_file} JPEGs {args.size}px, batch {args.batch}, {model}, "
        f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}{extra}"
    )
    for name in chains:
        print(f"  {name:6s} {statistics.median(rates[name]):7.0f} examples/s (median)")
    print(
        f"  tfgpu / user = {statistics.median(ratios):.2f} [{min(ratios):.2f} .. {max(ratios):.2f}]"
    )


if __name__ == "__main__":
    main()
