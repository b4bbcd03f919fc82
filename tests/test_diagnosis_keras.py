"""`tfgpu.diagnose()` on what Keras users have: an image folder read by
`keras.utils.image_dataset_from_directory` (a partial last batch), real runs, tiny sizes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu._internal.measure.rules import MAX_ROUNDS


def _image_folder(root, per_class: int = 20):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
            tf.io.write_file(str(root / name / f"{i}.jpg"), tf.io.encode_jpeg(image))
    return root


def _convnet():
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )
    # Without XLA: on CPUs, its compile of each batch shape (16, then 8) is most of the time
    # these tests would take, and XLA's own checks have scripted tests (tests/test_diagnosis.py).
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False
    )
    return model


@pytest.mark.slow
def test_an_image_folder_with_a_partial_last_batch_gets_a_verdict_within_its_budget(tmp_path):
    # 40 images in batches of 16: the last batch holds 8, so the batch shape is (None, ...).
    ds = keras.utils.image_dataset_from_directory(
        _image_folder(tmp_path / "images"), image_size=(32, 32), batch_size=16, verbose=False
    )
    model = _convnet()
    model.fit(ds, epochs=1, verbose=0, shuffle=False)
    diagnosis = tfgpu.diagnose(model, ds, steps=5, warmup=2, time_budget_s=15.0)
    m = diagnosis.measurements
    # Within its budget: the budget was the one given, and a run it cut says so (how long
    # it took in seconds is the machine's load, not a property to assert; nor is the
    # verdict, which only the scripted tests of tests/test_diagnosis.py assert).
    assert m["time_budget_s"] == 15.0 and diagnosis.time_s > 0
    assert diagnosis.bottleneck in ("input", "host_overhead", "compute", "inconclusive")
    assert diagnosis.input_bound in ("high", "moderate", "no", "inconclusive")
    assert 3 <= len(m["rounds"]) <= MAX_ROUNDS or any("time budget" in n for n in diagnosis.notes)
    text = str(diagnosis)
    # A Keras loader is not a tfgpu pipeline: no advice in the pipeline's own arguments
    # unless the input is one; every note is one line.
    assert all("\n" not in n for n in diagnosis.notes)
    assert "input pipeline alone:" in text and "examples/s" in text
    assert diagnosis.input_batch_time_s > 0 and diagnosis.step_time_s > 0
    if diagnosis.flops_per_step:  # counted with the batch's own shapes
        assert diagnosis.flops_per_step > 0


@pytest.mark.slow
def test_a_partial_batch_first_gives_the_full_batch_and_the_examples_are_kept(tmp_path):
    # Issue 27: 192 images in batches of 128 (128, then 64), the 64 first, as a shuffle of
    # the batches after the loader (`ds.shuffle(1000)` on a loader's dataset) can order them.
    ds = keras.utils.image_dataset_from_directory(
        _image_folder(tmp_path / "images", per_class=96),
        image_size=(32, 32),
        batch_size=128,
        shuffle=False,
        verbose=False,
    )
    ds = ds.repeat(2).skip(1).take(2)
    assert [int(x.shape[0]) for x, _ in ds] == [64, 128]
    model = _convnet()
    diagnosis = tfgpu.diagnose(model, ds, steps=5, warmup=2, check_xla=False, time_budget_s=20.0)
    assert diagnosis.batch_size == 128
    # Whatever this machine measures: dropping the remainder (a third of the images) is never
    # advised; where a partial batch is named, so is what dropping it would cost.
    text = str(diagnosis)
    assert "batch with `drop_remainder=True`" not in text
    if "drop_remainder" in text:
        assert "it would drop the last 64 of the 192 examples of each epoch (33%)" in text
