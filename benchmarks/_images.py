"""A realistic image workload for the input-pipeline benchmarks, made in-process.

Encoded JPEGs (natural-ish content: gradients, blobs, noise, so the codec does real work),
decoded and resized once (deterministic: cacheable), then randomly cropped, flipped and
colour-jittered (random: every epoch).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def make_jpegs(
    n: int, size: int = 96, seed: int = 0, num_classes: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(jpegs, labels)`: `n` JPEG-encoded RGB images of about `size` x `size` pixels.

    Sizes vary by up to 25% so decode-then-resize is needed, as with real photos.
    """
    rng = np.random.default_rng(seed)
    jpegs = []
    for _ in range(n):
        h, w = (int(size * rng.uniform(1.0, 1.25)) for _ in range(2))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        image = np.empty((h, w, 3), np.float32)
        for c in range(3):
            fx, fy, phase = rng.uniform(0.01, 0.1), rng.uniform(0.01, 0.1), rng.uniform(0, 6)
            image[..., c] = 127 + 80 * np.sin(fx * xx + fy * yy + phase)
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(size / 8, size / 3)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
        image += rng.normal(0, 12, image.shape)
        pixels = np.clip(image, 0, 255).astype(np.uint8)
        jpegs.append(tf.io.encode_jpeg(pixels, quality=90).numpy())
    labels = rng.integers(0, num_classes, n).astype(np.int64)
    return np.array(jpegs, dtype=object), labels


def decode_resize(size: int):
    """The deterministic part: JPEG bytes -> float32 image of `size` x `size` (+ margin)."""
    margin = size + size // 8

    def fn(jpeg, label):
        image = tf.io.decode_jpeg(jpeg, channels=3)
        image = tf.image.resize(image, (margin, margin))
        return tf.cast(image, tf.uint8), label

    return fn


def augment(size: int):
    """The random part: crop, flip, brightness/contrast/saturation jitter; float32 in [0, 1]."""

    def fn(image, label):
        image = tf.image.random_crop(image, (size, size, 3))
        image = tf.image.random_flip_left_right(image)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.random_brightness(image, 0.2)
        image = tf.image.random_contrast(image, 0.8, 1.2)
        image = tf.image.random_saturation(image, 0.8, 1.2)
        return tf.clip_by_value(image, 0.0, 1.0), label

    return fn


def decode_resize_augment(size: int):
    """Everything per example in one function, as a naive pipeline does it."""
    first, second = decode_resize(size), augment(size)

    def fn(jpeg, label):
        return second(*first(jpeg, label))

    return fn
