"""tfgpu.data.load_tfds and TFDS sources, on datasets built here (never downloaded)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.conftest import prepare_tfds
from tfgpu import data as tfdata

NAME = "tfgpu_tiny_digits"


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory):
    """A tiny TFDS dataset prepared locally: 40 train / 10 test 8x8 images, label = id % 10."""
    data_dir = tmp_path_factory.mktemp("tfds")
    splits = {"train": range(40), "test": range(40, 50)}
    prepare_tfds(data_dir, NAME, side=8, classes=10, splits=splits, ids=True)
    return data_dir


def test_load_tfds_reads_a_prepared_dataset(tiny_tfds):
    ds, info = tfdata.load_tfds(NAME, "train", data_dir=tiny_tfds, with_info=True)
    assert info.splits["train"].num_examples == 40
    examples = list(ds)
    assert len(examples) == 40
    image, label = examples[0]  # supervised keys exist: (image, label) pairs by default
    assert label.dtype == tf.int64
    assert image.shape == (8, 8, 1) and image.dtype == tf.uint8
    pixels = sorted(int(img[0, 0, 0]) for img, _ in examples)
    assert pixels == list(range(40))
    feature_dicts = tfdata.load_tfds(NAME, "test", data_dir=tiny_tfds, as_supervised=False)
    assert sorted(int(e["id"]) for e in feature_dicts) == list(range(40, 50))
    sliced = tfdata.load_tfds(NAME, "train[:25%]", data_dir=tiny_tfds, shuffle_files=False)
    assert len(list(sliced)) == 10


def test_pipeline_from_a_tfds_name(tiny_tfds):
    def normalize(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    ds = tfdata.pipeline(NAME, batch_size=16, data_dir=tiny_tfds, map_fn=normalize)
    options = ds.options()
    assert options.experimental_distribute.auto_shard_policy == (
        tf.data.experimental.AutoShardPolicy.FILE
    )
    for _ in range(2):
        pixels = [round(float(v) * 255) for x, _ in ds for v in x[:, 0, 0, 0].numpy()]
        assert sorted(pixels) == list(range(40))
    test = tfdata.pipeline(NAME, batch_size=5, data_dir=tiny_tfds, split="test", shuffle=False)
    assert sum(int(y.shape[0]) for _, y in test) == 10


def test_absent_dataset_fails_fast_with_directions(tmp_path, tiny_tfds, monkeypatch):
    # Fast because nothing is fetched: the local check comes before any network access.
    import socket

    attempts = []

    def no_network(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for name in (NAME, "mnist"):  # ours, and a real registered one never downloaded here
        with pytest.raises(FileNotFoundError) as error:
            tfdata.load_tfds(name, "train", data_dir=tmp_path)
        assert attempts == []
        message = str(error.value)
        assert repr(name) in message and str(tmp_path) in message
        assert f"tfds build {name}" in message and "download=True" in message
    with pytest.raises(FileNotFoundError, match="not prepared"):
        tfdata.pipeline("mnist", batch_size=8, data_dir=tmp_path)


def test_load_tfds_bad_input(tiny_tfds):
    with pytest.raises(
        ValueError, match=r"name='tfgpu_tiny_digit'.*Did you mean: 'tfgpu_tiny_digits'"
    ):
        tfdata.load_tfds("tfgpu_tiny_digit", data_dir=tiny_tfds)
    with pytest.raises(ValueError, match=r"split='validation'.*\['test', 'train'\]"):
        tfdata.load_tfds(NAME, "validation", data_dir=tiny_tfds)
    with pytest.raises(TypeError, match="`name`"):
        tfdata.load_tfds(7)
    with pytest.raises(TypeError, match="`download`"):
        tfdata.load_tfds(NAME, data_dir=tiny_tfds, download="yes")


def test_tfds_sources_checked_before_reading(tiny_tfds, tmp_path):
    with pytest.raises(TypeError, match=r"`map_fn`.*\(image\).*2 positional"):
        tfdata.pipeline(NAME, batch_size=8, data_dir=tiny_tfds, map_fn=lambda image: image)
    with pytest.raises(ValueError, match=r"batch_size=64.*only 40 examples.*no batch"):
        tfdata.pipeline(NAME, batch_size=64, data_dir=tiny_tfds, drop_remainder=True)
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("")
    with pytest.raises(ValueError, match=r"`data_dir`.*is a file"):
        tfdata.load_tfds(NAME, data_dir=a_file)
    with pytest.raises(ValueError, match=r"`data_dir`.*under the file"):
        tfdata.pipeline(NAME, batch_size=8, data_dir=a_file / "tfds")
    # what load_tfds returns is examples (its chain ends in TFDS's interleave): batched once
    examples = tfdata.load_tfds(NAME, data_dir=tiny_tfds)
    batches = tfdata.pipeline(examples, batch_size=8)
    assert next(tuple(x.shape) for x, _ in batches) == (8, 8, 8, 1)
