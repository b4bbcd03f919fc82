"""Every code block of `docs/from_keras.md` runs, on small stand-in data made here.

Each block runs in its own Python process (it calls `tfgpu.configure()` first, which must
come before TensorFlow starts), in a working directory holding what the block reads: a folder
of JPEGs, a folder of text files, TFRecord files of JPEGs. MNIST is replaced by random arrays
of its shape (the real one is a download). The only edits to a block: one epoch, no
pretrained weights (a download), a diagnosis budget of 10 s, and on a machine without GPUs
two logical CPU devices for the multi-GPU block.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO

PAGE = REPO / "docs" / "from_keras.md"
TIMEOUT = 600

# Replaces `keras.datasets.mnist.load_data` (a download) with arrays of its shapes and dtypes.
_MNIST_STAND_IN = """\
import keras as _keras, numpy as _np
_rng = _np.random.default_rng(0)
def _load_data():
    def part(n):
        return _rng.integers(0, 256, (n, 28, 28), dtype=_np.uint8), _rng.integers(0, 10, n).astype(_np.uint8)
    return part(1200), part(200)
_keras.datasets.mnist.load_data = _load_data
"""

_EDITS = [
    (re.compile(r"epochs=\d+"), "epochs=1"),
    (re.compile(r'weights="imagenet"'), "weights=None"),
    # The diagnosis is printed whatever its budget (60 s by default): 10 s of it here.
    (re.compile(r"tfgpu\.diagnose\((\w+), (\w+)\)"), r"tfgpu.diagnose(\1, \2, time_budget_s=10)"),
]
# No GPUs here: the multi-GPU block trains on two logical CPU devices with MirroredStrategy.
_MULTI_DEVICE_EDITS = [
    (re.compile(r"tfgpu\.configure\(\)"), "tfgpu.configure(cpu_devices=2)"),
    (re.compile(r"tfgpu\.strategy\(\)"), 'tfgpu.strategy("mirrored")'),
]


def _sections() -> dict[str, str]:
    """The page's code blocks, by the heading above each."""
    blocks: dict[str, str] = {}
    heading = ""
    text = PAGE.read_text()
    for match in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", text, re.M | re.S):
        if match.group(1):
            heading = match.group(1).strip()
        else:
            assert heading not in blocks, f"two code blocks under {heading!r}"
            blocks[heading] = match.group(2)
    return blocks


SECTIONS = _sections()


def _jpeg(rng: np.random.Generator, size: tuple[int, int]) -> bytes:
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    return tf.io.encode_jpeg(pixels).numpy()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A working directory with the files the blocks read."""
    root = tmp_path_factory.mktemp("from_keras")
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        folder = root / "data" / "images" / label
        folder.mkdir(parents=True)
        for i in range(20):
            (folder / f"{i}.jpg").write_bytes(_jpeg(rng, (80, 72)))
    words = ["good", "bad", "film", "plot", "actor", "great", "boring", "scene"]
    for label in ("pos", "neg"):
        folder = root / "data" / "aclImdb" / "train" / label
        folder.mkdir(parents=True)
        for i in range(40):
            text = " ".join(rng.choice(words, size=int(rng.integers(5, 40))))
            (folder / f"{i}_{label}.txt").write_text(f"<br />{text}.")
    records = root / "data" / "records"
    records.mkdir(parents=True)
    for shard in range(2):
        with tf.io.TFRecordWriter(str(records / f"train{shard}.tfrec")) as writer:
            for _ in range(48):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[_jpeg(rng, (96, 96))])
                            ),
                            "target": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[int(rng.integers(0, 2))])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    return root


def test_the_page_has_the_five_examples():
    assert len(SECTIONS) == 5, list(SECTIONS)
    for block in SECTIONS.values():
        assert "tfgpu.configure()" in block
        assert "tfgpu.data.pipeline(" in block


@pytest.mark.slow
@pytest.mark.parametrize("heading", list(SECTIONS))
def test_block_runs(heading, data_dir):
    code = SECTIONS[heading]
    edits = _EDITS + (_MULTI_DEVICE_EDITS if "MirroredStrategy" in heading else [])
    for pattern, replacement in edits:
        code = pattern.sub(replacement, code)
    if "mnist" in code:
        code = _MNIST_STAND_IN + code
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONWARNINGS": "default",
    }
    script = data_dir / "example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=data_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    if "TFRecord" not in heading:  # files do not say how many records they hold
        # Keras knows the step count (a dataset of known cardinality) and never runs dry.
        assert "Unknown" not in proc.stdout, out[-6000:]
        assert "ran out of data" not in out, out[-6000:]
    assert re.search(r"val_\w+: ", proc.stdout), out[-6000:]  # validation ran
    if "diagnose(" in code:
        assert "tfgpu diagnosis on" in proc.stdout, out[-6000:]
    if "MirroredStrategy" in heading:
        assert "Number of devices: 2" in proc.stdout, out[-6000:]
