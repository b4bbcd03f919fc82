"""`tfgpu.diagnose()` on what Keras users have: an image folder read by
`keras.utils.image_dataset_from_directory` (a partial last batch), real runs, tiny sizes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu


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
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile="auto"
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
    diagnosis = tfgpu.diagnose(model, ds, steps=5, warmup=2, time_budget_s=30.0)
    m = diagnosis.measurements
    assert m["wall_s"] <= 30.0 + 5.0  # one fit's last step and the FLOP count may pass it
    assert diagnosis.bottleneck in ("input", "host_overhead", "compute", "inconclusive")
    assert diagnosis.input_bound in ("high", "moderate", "no", "inconclusive")
    assert 3 <= len(m["rounds"]) <= 12 or any("time budget" in n for n in diagnosis.notes)
    text = str(diagnosis)
    # A Keras loader is not a tfgpu pipeline: no advice in the pipeline's own arguments
    # unless the input is one; every note is one line.
    assert all("\n" not in n for n in diagnosis.notes)
    assert "input pipeline alone:" in text and "examples/s" in text
    if diagnosis.input_bound in ("high", "moderate"):
        # The wait is then explained by the pipeline's own time per batch.
        wait = diagnosis.step_time_s - diagnosis.compute_step_time_s
        assert wait <= 2 * diagnosis.input_batch_time_s + 1e-3 + 0.5 * wait
    if diagnosis.flops_per_step:  # counted with the batch's own shapes
        assert diagnosis.flops_per_step > 0
