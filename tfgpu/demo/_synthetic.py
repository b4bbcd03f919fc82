"""The demo's learnable synthetic images, made offline and stored as JPEG bytes: each class
one stripe orientation, everything else noise (why: `docs/demo.md`, "Data and sizes")."""

from __future__ import annotations

import numpy as np

# Standard deviations of an image's orientation around its class's (radians; classes are
# pi / num_classes apart, 0.31 rad for ten: neighbours rarely overlap) and of each pixel's
# Gaussian noise (images span 0..1).
ANGLE_NOISE = 0.07
PIXEL_NOISE = 0.42
AMPLITUDE = (0.12, 0.4)  # of the stripes, per image: 0.5 +- amplitude before tint and noise
FREQUENCY = (2.0, 5.0)  # of the stripes, per image: cycles per image side


def class_angles(num_classes: int) -> np.ndarray:
    """The stripe orientation of each class, in radians in [0, pi)."""
    return np.linspace(0, np.pi, num_classes, endpoint=False)


def make_images(
    num_examples: int, *, num_classes: int = 10, size: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Draws `num_examples` uint8 RGB images of shape (size, size, 3) and int32 labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=num_examples).astype(np.int32)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angles = class_angles(num_classes)
    images = np.empty((num_examples, size, size, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        a = angles[label] + rng.normal(0, ANGLE_NOISE)
        freq = rng.uniform(*FREQUENCY)
        phase = rng.uniform(0, 2 * np.pi)
        amplitude = rng.uniform(*AMPLITUDE)
        tint = rng.uniform(0.3, 1.0, size=3).astype(np.float32)
        wave = np.sin(2 * np.pi * freq * (xx * np.cos(a) + yy * np.sin(a)) + phase)
        img = (0.5 + amplitude * wave)[..., None] * tint
        img = img + rng.normal(0, PIXEL_NOISE, size=img.shape)
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
