"""Learnable synthetic image data, stored as encoded JPEGs, for the demo, examples and benchmarks.

Each class is one orientation of a stripe pattern (`num_classes` orientations spread evenly
over 180 degrees, 18 degrees apart for ten classes). Everything else varies from image to
image and says nothing about the class: the stripes' frequency, phase and contrast, the
tint, and strong pixel noise; the orientation itself wobbles a little. So a small CNN has to
learn oriented filters that see through the noise: its accuracy climbs over several epochs
instead of jumping to 100% at once, and still ends far above chance (about 0.85 on the test
images after the demo's 8 CPU epochs). The input pipeline does real work: decoding JPEG bytes,
resizing, cropping, colour jitter. Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np

# Standard deviation of an image's orientation around its class's (radians; classes are
# pi / num_classes apart, 0.31 rad for ten: neighbours rarely overlap).
ANGLE_NOISE = 0.07
# Standard deviation of the Gaussian noise added to each pixel (images span 0..1).
PIXEL_NOISE = 0.42
# Amplitude of the stripes, drawn per image (0.5 +- amplitude before tint and noise).
AMPLITUDE = (0.12, 0.4)
# Spatial frequency of the stripes, cycles per image side, drawn per image.
FREQUENCY = (2.0, 5.0)


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
