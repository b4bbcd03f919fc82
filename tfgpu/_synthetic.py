"""Learnable synthetic image data, stored as encoded JPEGs, for the demo, examples and benchmarks.

Each class is a distinct pattern (orientation and frequency of stripes, and a tint) drawn with
noise, so a small CNN learns it in a few epochs, while the input pipeline still does real work:
decoding JPEG bytes, resizing, cropping, flipping, colour jitter. Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np


def make_images(
    num_examples: int, *, num_classes: int = 10, size: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Draws `num_examples` uint8 RGB images of shape (size, size, 3) and int32 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=num_examples).astype(np.int32)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angles = np.linspace(0, np.pi, num_classes, endpoint=False)
    freqs = 2.0 + 2.0 * (np.arange(num_classes) % 3)
    tints = rng.uniform(0.3, 1.0, size=(num_classes, 3)).astype(np.float32)
    images = np.empty((num_examples, size, size, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        phase = rng.uniform(0, 2 * np.pi)
        a = angles[label] + rng.normal(0, 0.08)
        wave = np.sin(2 * np.pi * freqs[label] * (xx * np.cos(a) + yy * np.sin(a)) + phase)
        img = (0.5 + 0.4 * wave)[..., None] * tints[label]
        img = img + rng.normal(0, 0.08, size=img.shape)
        images[i] = np.clip(img * 255, 0, 255).astype(np.uint8)
    return images, labels


def make_jpegs(
    num_examples: int, *, num_classes: int = 10, size: int = 64, seed: int = 0, quality: int = 90
) -> tuple[np.ndarray, np.ndarray]:
    """Like `make_images`, but returns the images JPEG-encoded: an object array of bytes."""
    import tensorflow as tf

    images, labels = make_images(num_examples, num_classes=num_classes, size=size, seed=seed)
    encoded = np.array(
        [tf.io.encode_jpeg(img, quality=quality).numpy() for img in images], dtype=object
    )
    return encoded, labels
