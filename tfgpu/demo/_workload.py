"""What both sides train on: the data (JPEG bytes), the decode and augment functions, the
reference model, its learning-rate schedule, and the recipe read back after training."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

from tfgpu._internal.helpers.checks import invalid_value
from tfgpu.demo._plan import LEARNING_RATE, NUM_CLASSES, SEED, Sizes
from tfgpu.demo._results import Recipe

# (image, label) -> (image, label), traced by tf.data
MapFn = Callable[[Any, Any], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class Data:
    """The demo's examples: training JPEGs and labels (arrays), the test set (a batched,
    cached `tf.data.Dataset` of center crops), and where they came from."""

    train_x: Any  # object array of JPEG bytes
    train_y: Any  # int32 labels
    test: Any  # tf.data.Dataset
    num_classes: int
    source: str  # as printed and stored in demo.json


def build_data(dataset: str | None, sizes: Sizes) -> Data:
    """Makes the synthetic data (or reads `dataset` from TFDS) and splits it."""
    from tfgpu.demo._synthetic import make_jpegs

    total = sizes.num_train + sizes.num_test
    if dataset is None:
        jpegs, labels = make_jpegs(
            total, num_classes=NUM_CLASSES, size=sizes.stored_size, seed=SEED
        )
        num_classes, source = NUM_CLASSES, "synthetic stripes (tfgpu.demo._synthetic)"
    else:
        jpegs, labels, num_classes = tfds_jpegs(dataset, total, sizes.stored_size)
        source = f"TensorFlow Datasets {dataset!r}"
    return Data(
        train_x=jpegs[: sizes.num_train],
        train_y=labels[: sizes.num_train],
        test=_test_dataset(jpegs[sizes.num_train :], labels[sizes.num_train :], sizes),
        num_classes=num_classes,
        source=source,
    )


def tfds_jpegs(
    name: str, num_examples: int, stored_size: int, *, data_dir: str | None = None
) -> tuple[Any, Any, int]:
    """(JPEG bytes, int32 labels, number of classes) of `num_examples` images of a TFDS
    dataset, resized to `stored_size`. Raises as `tfgpu.data.load_tfds`, and `ValueError`
    for a dataset without image and class label, or too few examples."""
    import numpy as np
    import tensorflow as tf

    import tfgpu.data

    ds, info = tfgpu.data.load_tfds(
        name, "train", data_dir=data_dir, shuffle_files=False, with_info=True
    )
    keys = info.supervised_keys
    label_feature = info.features[keys[1]] if keys else None
    num_classes = getattr(label_feature, "num_classes", None)
    if not keys or not num_classes:
        raise invalid_value(
            "dataset",
            name,
            "an image classification dataset such as 'cifar10' or 'mnist'",
            received=f"dataset={name!r}, which does not define (image, label) supervised keys "
            "with a class label",
        )

    def encode(image, label):
        image = tf.image.resize(image, (stored_size, stored_size))
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        return tf.io.encode_jpeg(image, quality=90), tf.cast(label, tf.int32)

    jpegs, labels = [], []
    for jpeg, label in ds.take(num_examples).map(encode, num_parallel_calls=tf.data.AUTOTUNE):
        jpegs.append(jpeg.numpy())
        labels.append(int(label))
    if len(labels) < num_examples:
        raise invalid_value(
            "dataset",
            name,
            f"at least {num_examples}",
            received=f"dataset={name!r} with {len(labels)} training examples",
        )
    return np.array(jpegs, dtype=object), np.array(labels, dtype=np.int32), int(num_classes)


def decode_fn(resize_to: int) -> MapFn:
    """JPEG bytes -> float image in [0, 1], resized to `resize_to` square."""
    import tensorflow as tf

    def decode(jpeg, label):
        image = tf.io.decode_jpeg(jpeg, channels=3)
        image = tf.image.resize(image, (resize_to, resize_to)) / 255.0
        return image, label

    return decode


def augment_fn(image_size: int) -> MapFn:
    """A random `image_size` square crop and a random brightness change, per image; on one
    example or a whole batch (each image its own), so `tfgpu.tune` can try it after the
    batching (`batch_augment_fn`)."""
    import tensorflow as tf

    # No flips: a mirrored stripe pattern is another class's orientation.
    def augment(image, label):
        batched = image.shape.rank == 4
        images = image if batched else image[tf.newaxis]
        n = tf.shape(images)[0]
        span = tf.shape(images)[1] - image_size + 1
        offsets = tf.random.uniform((2, n), 0, span, dtype=tf.int32)
        window = tf.range(image_size)[tf.newaxis, :]
        images = tf.gather(images, offsets[0][:, tf.newaxis] + window, axis=1, batch_dims=1)
        images = tf.gather(images, offsets[1][:, tf.newaxis] + window, axis=2, batch_dims=1)
        images = images + tf.random.uniform((n, 1, 1, 1), -0.1, 0.1)
        return (images if batched else images[0]), label

    return augment


def _test_dataset(jpegs: Any, labels: Any, sizes: Sizes) -> Any:
    import tensorflow as tf

    decode = decode_fn(sizes.resize_to)
    size = sizes.image_size
    offset = (sizes.resize_to - size) // 2

    def center(jpeg, label):
        image, label = decode(jpeg, label)
        return tf.image.crop_to_bounding_box(image, offset, offset, size, size), label

    ds = tf.data.Dataset.from_tensor_slices((jpegs, labels))
    return ds.map(center, num_parallel_calls=tf.data.AUTOTUNE).batch(256).cache()


def build_model(sizes: Sizes, num_classes: int) -> Any:
    """The reference CNN: three conv blocks, global pooling, a float32 softmax output."""
    import keras

    w = sizes.width
    inputs = keras.Input((sizes.image_size, sizes.image_size, 3), name="image")
    x = keras.layers.Conv2D(w, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(2 * w, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(4 * w, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    # The output stays float32 under mixed precision (softmax and loss need the range).
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probs")(x)
    return keras.Model(inputs, outputs, name="reference_cnn")


def learning_rate(total_steps: int) -> Any:
    """The learning-rate schedule of both sides: cosine decay from 2e-3 to 0 over the run."""
    import keras

    # Annealed to zero, both sides end at their converged accuracy (docs/demo.md).
    return keras.optimizers.schedules.CosineDecay(LEARNING_RATE, decay_steps=total_steps)


def weights_digest(model: Any) -> str:
    """SHA-256 of the model's weights (float32 bytes, in order)."""
    import numpy as np

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
    return digest.hexdigest()


def read_recipe(model: Any, *, global_batch: int, initial_digest: str) -> Recipe:
    """How a side trained, read from the model after `fit`."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # loss scaling
    schedule = getattr(optimizer, "_learning_rate", None)
    if schedule is not None and hasattr(schedule, "get_config"):
        config = {k: v for k, v in schedule.get_config().items() if k != "name"}
    else:
        config = {"value": float(optimizer.learning_rate.numpy())}
    return Recipe(
        global_batch=int(global_batch),
        steps_trained=int(optimizer.iterations.numpy()),
        learning_rate=config,
        initial_weights_sha256=initial_digest,
    )
