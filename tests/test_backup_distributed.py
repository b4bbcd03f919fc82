"""`tfgpu.callbacks.BackupAndRestore` across replicas and processes: resumes to the same weights.

Runs on two logical CPU devices under `MirroredStrategy`, and a real training process killed
with SIGKILL (also in the middle of writing a backup) and started again. Split from
`tests/test_backup.py` so that `--dist loadfile` can give these slower tests to the other
xdist worker.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.test_backup import Interrupt, StopAt, max_diff
from tests.workers.cluster import REPO, TRAIN
from tests.workers.train import train

# --------------------------------------------------------------------------- MirroredStrategy


@pytest.mark.slow
def test_resume_under_mirrored_strategy(tmp_path):
    def strategy():
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    reference, _ = train(strategy())
    with pytest.raises(Interrupt):
        train(strategy(), backup=str(tmp_path), save_freq=2, callbacks=[StopAt(1, 5)])
    model, _ = train(strategy(), backup=str(tmp_path), save_freq=2)
    assert int(model.optimizer.iterations.numpy()) == 24
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6


@pytest.mark.slow
def test_reshuffled_resume_under_mirrored_strategy(tmp_path):
    # Under a strategy Keras reads one batch (one iterator) to build the model before the
    # callbacks start: the count of iterators must still line up.
    def strategy():
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    reference, _ = train(strategy(), reshuffle=True)
    with pytest.raises(Interrupt):
        train(
            strategy(), backup=str(tmp_path), save_freq=3, reshuffle=True, callbacks=[StopAt(1, 4)]
        )
    model, _ = train(strategy(), backup=str(tmp_path), save_freq=3, reshuffle=True)
    assert int(model.optimizer.iterations.numpy()) == 24
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6


# --------------------------------------------------------------------------- real SIGKILL


def run_train(*args, check_killed=False):
    result = subprocess.run(
        [sys.executable, str(TRAIN), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if check_killed:
        assert result.returncode == -9, result.stdout + result.stderr[-3000:]
    else:
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "save_freq, kill",
    [
        ("epoch", ["--kill-at", "2:0"]),  # dies just after the epoch-1 backup
        ("3", ["--kill-at", "1:4"]),  # dies mid-epoch, one batch after a backup
        ("2", ["--kill-during-save", "5"]),  # dies inside a save, before its rename
    ],
    ids=["epoch", "step", "mid-save"],
)
def test_sigkill_then_restart_ends_with_uninterrupted_weights(tmp_path, save_freq, kill):
    reference, _ = train(dropout=0.3)
    backup, out = tmp_path / "backup", tmp_path / "w.npz"
    common = ["--out", str(out), "--backup", str(backup), "--save-freq", save_freq]
    run_train(*common, "--dropout", "0.3", *kill, check_killed=True)
    assert (backup / "backup.npz").exists()
    if "--kill-during-save" in kill:
        assert list(backup.glob(".backup.npz.tmp-*"))  # the torn write never became the backup
    run_train(*common, "--dropout", "0.3")
    result = np.load(out)
    assert int(result["iterations"]) == 24
    weights = [result[f"arr_{i}"] for i in range(len(reference.get_weights()))]
    assert max_diff(weights, reference.get_weights()) < 1e-6
    assert not backup.exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_mid_epoch_with_a_reshuffling_pipeline_resumes_exactly(tmp_path):
    """tfgpu.data.pipeline(..., seed=0) gives every epoch a new order; killed in epoch 1."""
    reference, _ = train(reshuffle=True)
    backup, out = tmp_path / "backup", tmp_path / "w.npz"
    common = ["--out", str(out), "--backup", str(backup), "--save-freq", "3", "--reshuffle"]
    run_train(*common, "--kill-at", "1:4", check_killed=True)
    assert (backup / "backup.npz").exists()
    run_train(*common)
    result = np.load(out)
    assert int(result["iterations"]) == 24
    weights = [result[f"arr_{i}"] for i in range(len(reference.get_weights()))]
    assert max_diff(weights, reference.get_weights()) < 1e-6
    assert not backup.exists()
