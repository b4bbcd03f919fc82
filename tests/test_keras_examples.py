"""The five keras.io examples of docs/from_keras.md, as published (tests/keras_examples/), run
unchanged under `tfgpu run`: the script's own output and exit status intact, every fit recorded,
the report written and the longest fit diagnosed.

Only their data is smaller, and offline (tests/keras_examples/offline/ says how): a small
`mnist.npz` and IMDB archive in a temporary KERAS_HOME cache where `keras.utils.get_file` finds
them, a folder of JPEGs, TFRecord files of JPEGs behind the example's `gs://` path, random
Xception weights. `KERAS_MAX_EPOCHS=1`, Keras's own debugging variable, caps every `fit` at one
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
GCS = "kds-b38ce1b823c3ae623f5691483dbaa0f0363f04b0d6a90b63cf69946e"


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
    """The IMDB archive (the example's `get_file` finds it) and its tree where the example
    reads it: `datasets/aclImdb`, where Keras before 3.7 extracted it (Keras 3.15 extracts
    into `aclImdb_v1_extracted/`, which the example does not read)."""
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
    for name, data in files.items():
        (datasets / name).parent.mkdir(parents=True, exist_ok=True)
        (datasets / name).write_bytes(data)


def _pet_images(root: Path) -> None:
    rng = np.random.default_rng(2)
    for label in ("Cat", "Dog"):
        folder = root / "PetImages" / label
        folder.mkdir(parents=True)
        for i in range(6):  # the previews show 9 of the first batch
            name = "6779.jpg" if (label, i) == ("Cat", 0) else f"{i}.jpg"
            (folder / name).write_bytes(_jpeg(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)))
    (root / "PetImages" / "Dog" / "broken.jpg").write_bytes(b"\x89PNG not a JPEG")


def _melanoma(gcs: Path) -> None:
    """Ten training files of three records each (the example's first batch shows 25), one
    test file; smooth 1024x1024 JPEGs (small files)."""
    import tensorflow as tf

    folder = gcs / GCS / "tfrecords"
    folder.mkdir(parents=True)
    ramp = np.linspace(0, 255, 1024, dtype=np.float32)
    image = _jpeg(np.stack([np.add.outer(ramp, ramp) / 2] * 3, -1).astype(np.uint8))

    def example(target: int | None) -> bytes:
        feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))}
        if target is not None:
            feature["target"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[target]))
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    for name, n, labeled in [(f"train{k:02d}-3.tfrec", 3, True) for k in range(10)] + [
        ("test00-3.tfrec", 3, False)
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
    _intact(proc, "Deleted 1 images.", "This image is ", "% cat and ")
    assert (tmp_path / "save_at_1.keras").exists()  # its own ModelCheckpoint, untouched
    _recorded(log, 1)


@pytest.mark.slow
def test_mnist_convnet(tmp_path):
    _mnist(tmp_path / "keras" / "datasets" / "mnist.npz", 640, 64)
    proc, log = _run("mnist_convnet.py", tmp_path, tmp_path / "keras")
    _intact(proc, "x_train shape: (640, 28, 28, 1)", "640 train samples", "Test accuracy:")
    assert "5/5" in proc.stdout  # 576 examples after validation_split=0.1, at 128
    _recorded(log, 1)


@pytest.mark.slow
def test_text_classification_from_scratch(tmp_path):
    _imdb(tmp_path / "keras" / "datasets")
    proc, log = _run("text_classification_from_scratch.py", tmp_path, tmp_path / "keras")
    _intact(proc, "Number of batches in raw_train_ds: 2", "Number of batches in raw_test_ds: 2")
    _recorded(log, 1)


@pytest.mark.slow
def test_tfrecord_a_keras_2_example_fails_as_under_python(tmp_path):
    """Published for Keras 2: Keras 3 refuses its `compile(metrics=AUC(...))` (a list is
    expected), before any `fit`. `tfgpu run` ends the same way, and says that no fit ran."""
    _melanoma(tmp_path / "gcs")
    _xception_weights(tmp_path / "keras" / "models")
    proc, log = _run("tfrecord.py", tmp_path, tmp_path / "keras", gcs=tmp_path / "gcs")
    assert proc.returncode == 1, proc.stderr[-6000:]
    assert "Train TFRecord Files: 9\nValidation TFRecord Files: 1\n" in proc.stdout
    traceback = proc.stderr.split("Traceback (most recent call last):\n")[-1]
    assert traceback.startswith(f'  File "{EXAMPLES / "tfrecord.py"}", line ')
    assert "ValueError: Expected `metrics` argument to be a list, tuple, or dict." in traceback
    assert "tfgpu" not in traceback.split("tfgpu run:")[0]  # the script's frames, Keras's
    assert "tfrecord.py raised ValueError (exit status 1) after no fit" in proc.stderr
    assert (log / "summary.md").exists() and not list(log.glob("fit-*"))


@pytest.mark.slow
def test_distributed_training_with_tensorflow(tmp_path):
    # The guide keeps the last 10,000 training examples for validation.
    _mnist(tmp_path / "keras" / "datasets" / "mnist.npz", 10_256, 64)
    proc, log = _run("distributed_training_with_tensorflow.py", tmp_path, tmp_path / "keras")
    _intact(proc, "Number of devices: 1", "Creating a new model", "Restoring from ./ckpt/ckpt-1")
    _recorded(log, 3)
    # Each fit of the guide with its call in the script (run_training's twice).
    script = EXAMPLES / "distributed_training_with_tensorflow.py"
    summary = (log / "summary.md").read_text()
    for k, line in ((1, 66), (2, 105), (3, 105)):
        assert f"\n  fit {k} ({script}:{line}): 1 epoch(s) in " in summary, summary
