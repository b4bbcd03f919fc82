"""`tfgpu.tune` on code shaped like the public Keras examples, as a user runs it: what it keeps
run after run, whether the next `fit` shows the speedup it claims, and that it completes.

Each case builds a model and data as its Keras example does; `tune` gets the model (or, with
`--factory`, the function that builds it) and the data as the example's `fit` takes them
(arrays with their `batch_size` and `validation_split`). Then the claim is checked as a user
would apply it (docs/tuning.md, "Use it"): a fresh model built the same way (under
`tfgpu.strategy()` where that was kept, under the kept precision policy), `result.apply`,
`fit(result.dataset, validation_data=result.validation_data)`, against the example's own
`fit`, 3 epochs each, alternating, 3 pairs; examples/s over epochs 2-3 (epoch 1 traces), the
median ratio ("next fit"). A `fit` that raises is reported as "crashed".

1. dense: 32 features -> Dense(64) -> Dense(10), a tfgpu pipeline of batch 64 (host-bound);
2. cnn: generated 96x96 JPEGs decoded to 40 (`map_fn`, cached), per-example augmentation, a
   3-block CNN, batch 64;
3. text: strings vectorized per batch (`batch_map_fn`), Embedding + pooling, batch 128;
4. mnist: the Keras MNIST convnet on a user's `from_tensor_slices().shuffle().batch(128)`;
5. images: the Keras image-folder example's shape: `image_dataset_from_directory` over
   generated JPEGs (192 images, batch 128), augmentation layers in the model;
6. guide: the Keras multi-GPU guide: a 784-256-256-10 MLP under `MirroredStrategy()` (one
   replica on one device), arrays through `from_tensor_slices().shuffle().batch(32)` with a
   partial last batch: the crash case of issue 34 (a static batch shape kept on a dataset
   that `tf.distribute` distributes again);
7. xla: an image-folder convnet compiled with `jit_compile=True`, augmentation in the
   dataset (as the Keras example does it): XLA makes each step several times slower on a CPU
   (the XLA-undo case);
8. timeseries: the Keras FordA classifier's shape: a Conv1D net over 500-step series given
   as arrays, `fit(x, y, batch_size=32, validation_split=0.2)`.

Command: `.venv/bin/python benchmarks/tune_models.py [--budget 90] [--runs 3] [--factory]
[--only dense,cnn,text,mnist,images,guide,xla,timeseries]`
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras
import numpy as np
import tensorflow as tf

import tfgpu
import tfgpu.data
from tfgpu.demo._synthetic import make_jpegs


class Case:
    """A Keras example's shape: `make()` builds and compiles the model (`model(strategy)`
    calls it in `strategy`'s scope, the example's own where it opens one), `data` is what its
    `fit` takes (a dataset, or arrays with `fit_kwargs`)."""

    def __init__(self, make, data, fit_kwargs=None, strategy=None):
        self.make, self.data, self.strategy = make, data, strategy
        self.fit_kwargs = fit_kwargs or {}

    def model(self, strategy=None):
        with (strategy or self.strategy or tf.distribute.get_strategy()).scope():
            return self.make()


def dense_case():
    rng = np.random.default_rng(0)
    x = rng.random((16384, 32), dtype=np.float32)
    y = (x[:, :10].argmax(axis=1)).astype(np.int32)

    def make():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile("adam", "sparse_categorical_crossentropy")
        return model

    return Case(make, tfgpu.data.pipeline((x, y), batch_size=64))


def cnn_case():
    jpegs, labels = make_jpegs(4096, num_classes=10, size=96, seed=0)

    def decode(jpeg, label):
        image = tf.io.decode_jpeg(jpeg, channels=3)
        return tf.image.resize(image, (40, 40)) / 255.0, label

    def augment(image, label):
        image = tf.image.random_flip_up_down(image)
        return tf.image.random_brightness(image, 0.1), label

    def make():
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
    return Case(make, data)


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

    def make():
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

    return Case(make, tfgpu.data.pipeline((texts, labels), batch_size=128, batch_map_fn=to_ids))


def mnist_case():
    rng = np.random.default_rng(0)
    x = rng.random((6000, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 6000)

    def make():
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
    return Case(make, data)


def _image_folder(count, size, classes=2):
    root = tempfile.mkdtemp(prefix="tune_images_")
    jpegs, labels = make_jpegs(count, num_classes=classes, size=size, seed=0)
    for i, (jpeg, label) in enumerate(zip(jpegs, labels, strict=True)):
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{i}.jpg"), "wb") as f:
            f.write(jpeg)
    return root


def images_case():
    root = _image_folder(192, 120)
    data = keras.utils.image_dataset_from_directory(
        root, image_size=(96, 96), batch_size=128, seed=1337, verbose=False
    ).prefetch(tf.data.AUTOTUNE)

    def make():
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
        model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))
        return model

    return Case(make, data)


def guide_case():
    rng = np.random.default_rng(0)
    x = rng.random((12816, 784), dtype=np.float32)  # a quarter of MNIST, and 16 more
    y = rng.integers(0, 10, 12816)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = tf.distribute.MirroredStrategy()

    def make():
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

    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(12816).batch(32)
    return Case(make, data, strategy=strategy)


def xla_case():
    root = _image_folder(256, 100)
    data = keras.utils.image_dataset_from_directory(
        root, image_size=(90, 90), batch_size=32, seed=1337, verbose=False
    )
    augmentation = keras.Sequential([keras.layers.RandomFlip("horizontal")])
    data = data.map(lambda x, y: (augmentation(x), y)).prefetch(tf.data.AUTOTUNE)

    def make():
        inputs = keras.Input((90, 90, 3))
        x = keras.layers.Rescaling(1.0 / 255)(inputs)
        for width in (32, 64, 128):
            x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(1)(x)
        model = keras.Model(inputs, outputs)
        model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
        return model

    return Case(make, data)


def timeseries_case():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3601, 500, 1)).astype(np.float32)
    y = rng.integers(0, 2, 3601)

    def make():
        inputs = keras.Input((500, 1))
        h = inputs
        for _ in range(3):
            h = keras.layers.Conv1D(64, 3, padding="same")(h)
            h = keras.layers.BatchNormalization()(h)
            h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling1D()(h)
        outputs = keras.layers.Dense(2, activation="softmax")(h)
        model = keras.Model(inputs, outputs)
        model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    return Case(make, (x, y), {"batch_size": 32, "validation_split": 0.2})


CASES = {
    "dense": dense_case,
    "cnn": cnn_case,
    "text": text_case,
    "mnist": mnist_case,
    "images": images_case,
    "guide": guide_case,
    "xla": xla_case,
    "timeseries": timeseries_case,
}


class _EpochClock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.spans: list[float] = []
        self.steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.spans.append(time.perf_counter() - self.begin)


def examples_per_s(model, examples: int, *args, **kwargs) -> float:
    """Examples/s of `model.fit(*args, **kwargs)` over epochs 2-3 of 3 (epoch 1 traces)."""
    clock = _EpochClock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(*args, epochs=3, verbose=0, callbacks=[clock], **kwargs)
    return 2 * examples / sum(clock.spans[1:])


def _examples(data) -> int:
    return sum(int(tf.shape(tf.nest.flatten(b)[0])[0]) for b in data)


def next_fit_ratio(case: Case, result) -> float:
    """Tuned over baseline examples/s of the example's own `fit`, the median of 3 pairs;
    raises what the tuned `fit` raises."""
    policy = result.settings.get("precision")
    saved = keras.mixed_precision.global_policy()
    strategy = tfgpu.strategy() if "strategy" in result.settings else None
    if policy:
        keras.mixed_precision.set_global_policy(policy)
    try:
        tuned = result.apply(case.model(strategy))
    finally:
        keras.mixed_precision.set_global_policy(saved)
    if isinstance(case.data, tuple):  # arrays: fit(x, y, batch_size=, validation_split=)
        x, y = case.data
        split = case.fit_kwargs.get("validation_split") or 0.0
        examples = int(len(x) * (1 - split))
        base_args, base_kwargs = (x, y), dict(case.fit_kwargs)
    else:
        examples = _examples(case.data)
        base_args, base_kwargs = (case.data,), {}
    tuned_examples = _examples(result.dataset)
    tuned_kwargs = {"validation_data": result.validation_data}
    ratios = []
    for _ in range(3):
        base = examples_per_s(case.model(), examples, *base_args, **base_kwargs)
        fast = examples_per_s(tuned, tuned_examples, result.dataset, **tuned_kwargs)
        ratios.append(fast / base)
    return float(np.median(ratios))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=90.0, help="time_budget_s per run")
    parser.add_argument("--runs", type=int, default=1, help="tune runs per model")
    parser.add_argument("--factory", action="store_true", help="pass the model's factory")
    parser.add_argument("--only", default=",".join(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        case = CASES[name]()
        for run in range(1, args.runs + 1):
            model = case.model if args.factory else case.model()
            start = time.perf_counter()
            result = tfgpu.tune(
                model, case.data, time_budget_s=args.budget, verbose=2, **case.fit_kwargs
            )
            seconds = time.perf_counter() - start
            print(f"\n== {name} run {run} ==\n{result}\n", flush=True)
            kept = ", ".join(f"{k}={v!r}" for k, v in result.settings.items()) or "nothing"
            borderline = ", ".join(t.name for t in result.trials if t.status == "borderline")
            try:
                fit = f"x{next_fit_ratio(case, result):.2f}"
                ratio = f"{float(fit[1:]) / result.speedup.value:.2f}"
            except Exception as e:  # the tuned fit raised: the case this benchmark watches
                fit, ratio = f"crashed: {type(e).__name__}", "-"
            verified = "" if result.verified else " (not verified)"
            rows.append(
                f"| {name} | {run} | {result.speedup.text()}{verified} | {fit} | {ratio} "
                f"| {kept} | {borderline or '-'} | {seconds:.0f} s |"
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
