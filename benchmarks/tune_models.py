"""`tfgpu.tune` on three models of different shapes: baseline vs tuned examples/s, tuning time.

1. tiny dense: 32 features -> Dense(64) -> Dense(10), batch 64 (host overhead dominates);
2. small CNN on JPEG images: generated 96x96 JPEGs decoded and resized to 40 (`map_fn`,
   cached by the pipeline), a random flip and brightness per example (`augment_fn`), a
   3-block CNN, batch 64;
3. text: generated sentences (strings), `TextVectorization` on each batch (`batch_map_fn`),
   Embedding -> GlobalAveragePooling -> Dense, batch 128.

Each model is given to `tune` as a factory (so the precision candidate can run) with its
`tfgpu.data.pipeline` dataset; `tune` measures the baseline itself, in the same process,
interleaved with each candidate. The table gives its verified baseline and tuned examples/s,
the speedup interval, what it kept and how long it took.

Command: `.venv/bin/python benchmarks/tune_models.py [--budget 60] [--only dense,cnn,text]`
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf

import tfgpu
import tfgpu.data
from tfgpu.demo._synthetic import make_jpegs


def dense_case():
    rng = np.random.default_rng(0)
    x = rng.random((16384, 32), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)

    def build():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile("adam", "sparse_categorical_crossentropy")
        return model

    return build, tfgpu.data.pipeline((x, y), batch_size=64)


def cnn_case():
    jpegs, labels = make_jpegs(4096, num_classes=10, size=96, seed=0)

    def decode(jpeg, label):
        image = tf.io.decode_jpeg(jpeg, channels=3)
        return tf.image.resize(image, (40, 40)) / 255.0, label

    def augment(image, label):
        image = tf.image.random_flip_up_down(image)
        return tf.image.random_brightness(image, 0.1), label

    def build():
        inputs = keras.Input((40, 40, 3))
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(10, activation="softmax", dtype="float32")(x)
        model = keras.Model(inputs, outputs)
        model.compile("adam", "sparse_categorical_crossentropy")
        return model

    data = tfgpu.data.pipeline(
        (jpegs, labels), batch_size=64, map_fn=decode, augment_fn=augment, seed=0
    )
    return build, data


def text_case():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(2000)]
    labels = rng.integers(0, 2, 16384).astype(np.int32)
    sentences = []
    for label in labels:
        words = rng.choice(vocab, size=rng.integers(10, 40))
        cue = "good" if label else "bad"
        sentences.append(" ".join([*words[:5], cue, *words[5:]]))
    texts = np.array(sentences)
    vectorize = keras.layers.TextVectorization(max_tokens=2048, output_sequence_length=48)
    vectorize.adapt(texts[:2000])

    def to_ids(text, label):
        return vectorize(text), label

    def build():
        model = keras.Sequential(
            [
                keras.Input((48,), dtype="int64"),
                keras.layers.Embedding(2048, 32),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(1, activation="sigmoid", dtype="float32"),
            ]
        )
        model.compile("adam", "binary_crossentropy")
        return model

    return build, tfgpu.data.pipeline((texts, labels), batch_size=128, batch_map_fn=to_ids)


CASES = {"dense": dense_case, "cnn": cnn_case, "text": text_case}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0, help="time_budget_s per model")
    parser.add_argument("--only", default=",".join(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        build, data = CASES[name]()
        start = time.perf_counter()
        result = tfgpu.tune(build, data, time_budget_s=args.budget, verbose=2)
        seconds = time.perf_counter() - start
        print(f"\n== {name} ==\n{result}\n", flush=True)
        kept = ", ".join(f"{k}={v!r}" for k, v in result.settings.items()) or "nothing"
        rows.append(
            f"| {name} | {result.baseline_examples_per_s:,.0f} | "
            f"{result.tuned_examples_per_s:,.0f} | x{result.speedup:.2f} "
            f"({result.speedup_low:.2f}-{result.speedup_high:.2f}) | {kept} | {seconds:.0f} s |"
        )
    print(
        "| model | baseline examples/s | tuned examples/s | verified speedup | kept | tuning time |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
