"""Five user scripts (tests/keras_examples/), written for these tests in the shape of the
keras.io examples of docs/from_keras.md (the same kinds of data loading and Keras calls, our own
code), run as they are under `tfgpu run`: the script's own output and exit status intact, every
fit recorded, the report written and the longest fit diagnosed.

Their data is small and offline (tests/keras_examples/offline/ says how): a small `mnist.npz`
and IMDB archive in a temporary KERAS_HOME cache where `keras.utils.get_file` finds them, a
folder of JPEGs, TFRecord files of JPEGs behind the script's `gs://` path, random Xception
weights. `KERAS_MAX_EPOCHS=1`, Keras's own debugging variable, caps every `fit` at one
epoch. Each example runs in its own process (`tfgpu run` is a command line)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

EXAMPLES = REPO / "tests" / "keras_examples"
OFFLINE = EXAMPLES / "offline"
TIMEOUT = 600
BUCKET = "tfgpu-example-lesions/shards"  # tfrecord.py's gs:// path


def _jpeg(pixels: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_jpeg(pixels).numpy()


def _mnist(path: Path, train: int, test: int) -> None:
    rng = np.random.default_rng(0)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(
            0, 10, n, dtype=np.uint8
        )

    (x_train, y_train), (x_test, y_test) = part(train), part(test)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def _imdb(datasets: Path) -> None:
    """The IMDB archive where the script's `get_file` finds it (and extracts it)."""
    rng = np.random.default_rng(1)
    words = ["good", "bad", "film", "plot", "actor", "great", "boring", "scene"]
    files = {}
    for part, labels in (("train", ("pos", "neg", "unsup")), ("test", ("pos", "neg"))):
        for label in labels:
            for i in range(24):
                text = " ".join(rng.choice(words, size=int(rng.integers(5, 40))))
                files[f"aclImdb/{part}/{label}/{i}_{label}.txt"] = f"<br />{text}.".encode()
    datasets.mkdir(parents=True, exist_ok=True)
    with tarfile.open(datasets / "aclImdb_v1.tar.gz", "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _pet_images(root: Path) -> None:
    rng = np.random.default_rng(2)
    for label in ("Cat", "Dog"):
        folder = root / "PetImages" / label
        folder.mkdir(parents=True)
        for i in range(6):
            name = "6779.jpg" if (label, i) == ("Cat", 0) else f"{i}.jpg"
            (folder / name).write_bytes(_jpeg(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)))
    (root / "PetImages" / "Dog" / "broken.jpg").write_bytes(b"\x89PNG not a JPEG")


def _lesions(gcs: Path) -> None:
    """Ten labelled shards of three records each, one unlabelled; smooth 512x512 JPEGs (small
    files)."""
    import tensorflow as tf

    folder = gcs / BUCKET
    folder.mkdir(parents=True)
    ramp = np.linspace(0, 255, 512, dtype=np.float32)
    image = _jpeg(np.stack([np.add.outer(ramp, ramp) / 2] * 3, -1).astype(np.uint8))

    def example(target: int | None) -> bytes:
        feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))}
        if target is not None:
            feature["target"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[target]))
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    for name, n, labeled in [(f"train-{k:02d}.tfrec", 3, True) for k in range(10)] + [
        ("test-00.tfrec", 3, False)
    ]:
        with tf.io.TFRecordWriter(str(folder / name)) as writer:
            for i in range(n):
                writer.write(example(i % 2 if labeled else None))


def _xception_weights(models: Path) -> None:
    """Random weights in the file `keras.applications.Xception(weights="imagenet")` reads."""
    import h5py
    import keras
    from keras.src.legacy.saving import legacy_h5_format

    models.mkdir(parents=True, exist_ok=True)
    base = keras.applications.Xception(include_top=False, weights=None)
    with h5py.File(models / "xception_weights_tf_dim_ordering_tf_kernels_notop.h5", "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, base)


def _run(example: str, cwd: Path, keras_home: Path, *extra: str, gcs: Path | None = None):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(OFFLINE), str(REPO)]),
        "KERAS_HOME": str(keras_home),
        "KERAS_MAX_EPOCHS": "1",
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if gcs is not None:
        env["TFGPU_OFFLINE_GCS"] = str(gcs)
    log = cwd / "run"
    command = [sys.executable, "-m", "tfgpu", "run", "--log-dir", str(log),
               "--diagnose-budget-s", "8", *extra, str(EXAMPLES / example)]  # fmt: skip
    proc = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    return proc, log


def _recorded(log: Path, fits: int) -> None:
    """Each fit's records (complete CSV rows) and report; the diagnosis of one of them."""
    for k in range(1, fits + 1):
        fit = log / f"fit-{k}"
        with open(fit / "steps.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows and all(float(r["step_time_s"]) > 0 for r in rows), fit
        assert (fit / "timeline.csv").stat().st_size > 0
        assert (fit / "report.md").read_text().startswith("# tfgpu run report:")
    assert not (log / f"fit-{fits + 1}").exists()
    diagnoses = list(log.glob("fit-*/diagnosis.json"))
    assert len(diagnoses) == 1
    assert json.loads(diagnoses[0].read_text())["bottleneck"]
    assert "## Diagnosis" in (diagnoses[0].parent / "report.md").read_text()
    summary = (log / "summary.md").read_text()
    assert "diagnosis of fit " in summary and "bottleneck " in summary


def _intact(proc: subprocess.CompletedProcess, *lines: str) -> None:
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    for line in lines:
        assert line in proc.stdout, proc.stdout[-3000:]
    assert "tfgpu run:" not in proc.stdout  # tfgpu's own lines go to stderr
    for key in ("examples_per_s", "host_cpu_pct_mean", "step_time_median_s"):
        assert key not in proc.stdout  # the progress bar shows the script's own logs only


@pytest.mark.slow
def test_image_classification_from_scratch(tmp_path):
    _pet_images(tmp_path)
    proc, log = _run("image_classification_from_scratch.py", tmp_path, tmp_path / "keras")
    _intact(
        proc,
        "removed 1 file(s) that are not JPEGs: broken.jpg",
        "classes: ['Cat', 'Dog']",
        "PetImages/Cat/6779.jpg: Cat with probability ",
    )
    assert not (tmp_path / "PetImages" / "Dog" / "broken.jpg").exists()
    assert (tmp_path / "save_at_1.keras").exists()  # its own ModelCheckpoint, untouched
    assert (tmp_path / "pets.png").exists()  # plot_model, through the pydot stand-in
    _recorded(log, 1)


@pytest.mark.slow
def test_mnist_convnet(tmp_path):
    _mnist(tmp_path / "keras" / "datasets" / "mnist.npz", 640, 64)
    proc, log = _run("mnist_convnet.py", tmp_path, tmp_path / "keras")
    _intact(
        proc, "training images: 640, each (28, 28, 1)", "test images: 64", "held-out digits: loss "
    )
    assert "5/5" in proc.stdout  # 576 examples after validation_split=0.1, at 128
    _recorded(log, 1)


@pytest.mark.slow
def test_text_classification_from_scratch(tmp_path):
    _imdb(tmp_path / "keras" / "datasets")
    proc, log = _run("text_classification_from_scratch.py", tmp_path, tmp_path / "keras")
    # 48 labelled training reviews (unsup/ left out): 36 to train, 12 to validate; 48 to test.
    _intact(
        proc,
        "train: 2 batches of up to 32 reviews",
        "validation: 1 batches of up to 32 reviews",
        "test: 2 batches of up to 32 reviews",
        "test reviews: accuracy ",
        " positive: Dull, and far too long.",
    )
    _recorded(log, 1)


@pytest.mark.slow
def test_tfrecord_a_script_that_fails_before_its_fit(tmp_path):
    """The script passes `lr=` to a Keras optimizer (a Keras 2 habit Keras 3 refuses) before
    any `fit`. `tfgpu run` ends the same way as Python, with the script's traceback and exit
    status, and says that no fit ran."""
    _lesions(tmp_path / "gcs")
    _xception_weights(tmp_path / "keras" / "models")
    proc, log = _run("tfrecord.py", tmp_path, tmp_path / "keras", gcs=tmp_path / "gcs")
    assert proc.returncode == 1, proc.stderr[-6000:]
    assert "shards: 9 to train, 1 to validate, 1 to score\n" in proc.stdout
    assert (tmp_path / "lesions.png").exists()  # it read the shards before it failed
    traceback = proc.stderr.split("Traceback (most recent call last):\n")[-1]
    assert traceback.startswith(f'  File "{EXAMPLES / "tfrecord.py"}", line ')
    assert "ValueError: Argument(s) not recognized: {'lr': " in traceback
    assert "tfgpu" not in traceback.split("tfgpu run:")[0]  # the script's frames, Keras's
    assert "tfrecord.py raised ValueError (exit status 1) after no fit" in proc.stderr
    assert (log / "summary.md").exists() and not list(log.glob("fit-*"))


@pytest.mark.slow
def test_distributed_training_with_tensorflow(tmp_path):
    # 2,000 examples in batches of 64: a partial last batch of 16.
    _mnist(tmp_path / "keras" / "datasets" / "mnist.npz", 2_000, 64)
    script = EXAMPLES / "distributed_training_with_tensorflow.py"
    proc, log = _run(script.name, tmp_path, tmp_path / "keras")
    _intact(
        proc,
        "MirroredStrategy over 1 replica(s)",
        "2000 training examples in batches of 64",
        "learning rate after epoch 1: 0.05000",
        "restoring checkpoints/epoch-01.keras",
        "restored model: test accuracy ",
    )
    assert len((tmp_path / "history.csv").read_text().splitlines()) == 3  # its CSVLogger: 2 fits
    _recorded(log, 2)
    # Each fit with its call line in the script: the fresh model's, then the restored one's.
    calls = [n for n, text in enumerate(script.read_text().splitlines(), 1) if ".fit(" in text]
    summary = (log / "summary.md").read_text()
    assert len(calls) == 2
    for k, line in enumerate(calls, 1):
        assert f"\n  fit {k} ({script}:{line}): 1 epoch(s) in " in summary, summary
