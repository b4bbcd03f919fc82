"""`tfgpu.tune` on models of different shapes: what it keeps, run after run, and whether the
next `fit` shows the speedup it claims.

1. tiny dense: 32 features -> Dense(64) -> Dense(10), batch 64 (host overhead dominates);
2. small CNN on JPEG images: generated 96x96 JPEGs decoded and resized to 40 (`map_fn`,
   cached by the pipeline), a random flip and brightness per example (`augment_fn`), a
   3-block CNN, batch 64;
3. text: generated sentences (strings), `TextVectorization` on each batch (`batch_map_fn`),
   Embedding -> GlobalAveragePooling -> Dense, batch 128;
4. mnist: the Keras MNIST convnet on a user's own `tf.data` chain of arrays (batch 128);
5. images: the Keras image-folder example's shape: `image_dataset_from_directory` over
   generated JPEGs (192 images, batch 128: a partial last batch), augmentation layers in the
   model, `jit_compile=True` as Keras sets it on a machine with an accelerator;
6. guide: the Keras multi-GPU guide's shape: a 784-256-256-10 MLP built under
   `MirroredStrategy`, `from_tensor_slices(...).batch(32)` without a prefetch.

Each model is given to `tune` as a factory (so the precision candidate can run) with its
`tfgpu.data.pipeline` dataset; `tune` measures the baseline itself, in the same process,
interleaved with each candidate. The table gives its verified baseline and tuned examples/s,
the speedup interval, what it kept and how long it took. Then the claim is checked as a user
would: the baseline and the tuned model (fresh from the factory, the kept settings applied,
`result.dataset`) each `fit` for 3 epochs, alternating, 3 times; examples/s over epochs 2-3
(epoch 1 traces), the ratio of medians printed next to the claim. `--runs 3` repeats the whole
tune to show which settings come and go.

Command: `.venv/bin/python benchmarks/tune_models.py [--budget 60] [--runs 3]
[--only dense,cnn,text,mnist,images,guide]`
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


def mnist_case():
    rng = np.random.default_rng(0)
    x = rng.random((6000, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 6000)

    def build():
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(6000).batch(128)
    return build, data


def images_case():
    import tempfile

    root = tempfile.mkdtemp(prefix="tune_images_")
    jpegs, labels = make_jpegs(192, num_classes=2, size=120, seed=0)
    for i, (jpeg, label) in enumerate(zip(jpegs, labels, strict=True)):
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i}.jpg"), "wb") as f:
            f.write(jpeg)
    data = keras.utils.image_dataset_from_directory(
        root, image_size=(96, 96), batch_size=128, seed=1337
    ).prefetch(tf.data.AUTOTUNE)

    def build():
        inputs = keras.Input((96, 96, 3))
        x = keras.layers.RandomFlip("horizontal")(inputs)
        x = keras.layers.RandomRotation(0.1)(x)
        x = keras.layers.Rescaling(1.0 / 255)(x)
        for width in (32, 64, 128):
            x = keras.layers.SeparableConv2D(width, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(1)(x)
        model = keras.Model(inputs, outputs)
        model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
        return model

    return build, data


def guide_case():
    rng = np.random.default_rng(0)
    x = rng.random((12800, 784), dtype=np.float32)  # a quarter of MNIST: quicker epochs
    y = rng.integers(0, 10, 12800)
    strategy = tf.distribute.MirroredStrategy()

    def build():
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((784,)),
                    keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(
                keras.optimizers.Adam(),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[keras.metrics.SparseCategoricalAccuracy()],
            )
        return model

    return build, tf.data.Dataset.from_tensor_slices((x, y)).batch(32)


CASES = {
    "dense": dense_case,
    "cnn": cnn_case,
    "text": text_case,
    "mnist": mnist_case,
    "images": images_case,
    "guide": guide_case,
}


class _EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.spans: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.spans.append(time.perf_counter() - self.begin)


def examples_per_s(model, data, examples: int) -> float:
    """Examples/s of `model.fit` over epochs 2-3 of a 3-epoch fit (epoch 1 traces)."""
    clock = _EpochClock()
    model.fit(data, epochs=3, verbose=0, callbacks=[clock])
    return 2 * examples / sum(clock.spans[1:])


def next_fit_ratio(build, data, result) -> float:
    """Tuned over baseline examples/s of a user's `fit`, the median of 3 alternating pairs."""
    examples = sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in data)
    policy = result.settings.get("precision")
    saved = keras.mixed_precision.global_policy()
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    try:
        tuned = result.apply(build())
    finally:
        keras.mixed_precision.set_global_policy(saved)
    tuned_data = result.dataset
    tuned_examples = sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in tuned_data)
    ratios = []
    for _ in range(3):
        base = examples_per_s(build(), data, examples)
        ratios.append(examples_per_s(tuned, tuned_data, tuned_examples) / base)
    return float(np.median(ratios))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=60.0, help="time_budget_s per model")
    parser.add_argument("--runs", type=int, default=1, help="tune runs per model")
    parser.add_argument("--only", default=",".join(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        build, data = CASES[name]()
        for run in range(1, args.runs + 1):
            start = time.perf_counter()
            result = tfgpu.tune(build, data, time_budget_s=args.budget, verbose=2)
            seconds = time.perf_counter() - start
            print(f"\n== {name} run {run} ==\n{result}\n", flush=True)
            kept = ", ".join(f"{k}={v!r}" for k, v in result.settings.items()) or "nothing"
            borderline = ", ".join(t.name for t in result.trials if t.status == "borderline")
            fit = next_fit_ratio(build, data, result)
            rows.append(
                f"| {name} | {run} | {result.speedup.text()} | x{fit:.2f} | "
                f"{fit / result.speedup.value:.2f} | {kept} "
                f"| {borderline or '-'} | {seconds:.0f} s |"
            )
            print(rows[-1], flush=True)
    print(
        "| model | run | claimed speedup | next fit | fit / claim | kept | borderline "
        "| tuning time |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
