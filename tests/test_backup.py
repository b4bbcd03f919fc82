"""`tfgpu.callbacks.BackupAndRestore`: a run interrupted anywhere resumes to the same weights.

In-process tests interrupt `fit` by raising from a callback; the SIGKILL tests kill a real
training process (also in the middle of writing a backup) and start it again.
"""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.workers.cluster import REPO, TRAIN
from tests.workers.train import train
from tfgpu.callbacks import BackupAndRestore


class Interrupt(Exception):
    pass


class StopAt(keras.callbacks.Callback):
    """Raises `Interrupt` at the end of batch `step` of `epoch` (after the backup saved)."""

    def __init__(self, epoch, step):
        super().__init__()
        self.at, self.epoch = (epoch, step), 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise Interrupt


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def interrupted_then_resumed(backup, stop_at, **kwargs):
    with pytest.raises(Interrupt):
        train(backup=backup, callbacks=[StopAt(*stop_at)], **kwargs)
    return train(backup=backup, **kwargs)


def test_arguments_are_validated_like_keras():
    with pytest.raises(ValueError, match="Received: backup_dir=''"):
        BackupAndRestore("")
    with pytest.raises(ValueError, match="Received: save_freq='batch'"):
        BackupAndRestore("/tmp/x", save_freq="batch")
    with pytest.raises(ValueError, match="Received: save_freq=0"):
        BackupAndRestore("/tmp/x", save_freq=0)
    with pytest.raises(TypeError, match="delete_checkpoint=1"):
        BackupAndRestore("/tmp/x", delete_checkpoint=1)
    assert BackupAndRestore("/tmp/x", save_freq=False).save_freq is False


@pytest.mark.parametrize(
    "save_freq, stop_at, kwargs",
    [
        ("epoch", (1, 7), {}),  # epoch boundary
        (3, (1, 4), {}),  # mid-epoch: resumes at batch 3 of epoch 1, skips 0..2
        (2, (2, 5), {"steps_per_execution": 2, "dropout": 0.3, "optimizer": "adam"}),
        (5, (0, 6), {"shuffle": True}),  # fixed-seed shuffle, same order every epoch
        # Seeded shuffles with a new order every epoch (tfgpu.data.pipeline(..., seed=0)).
        (3, (1, 4), {"reshuffle": True}),
        ("epoch", (2, 1), {"reshuffle": True}),
        # One iterator over a repeated dataset for all epochs, reshuffled at each pass.
        (3, (1, 4), {"reshuffle": True, "repeat": True, "steps_per_epoch": 8}),
        ("epoch", (1, 4), {"reshuffle": True, "repeat": True, "steps_per_epoch": 8}),
    ],
    ids=[
        "epoch",
        "step",
        "spe2-dropout-adam",
        "shuffled",
        "reshuffled-step",
        "reshuffled-epoch",
        "repeat-step",
        "repeat-epoch",
    ],
)
def test_resume_equals_uninterrupted(tmp_path, save_freq, stop_at, kwargs):
    reference, ref_history = train(**kwargs)
    model, history = interrupted_then_resumed(
        str(tmp_path / "b"), stop_at, save_freq=save_freq, **kwargs
    )
    assert int(model.optimizer.iterations.numpy()) == 24  # no batch trained twice
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6
    # The resumed epoch's loss averages all its batches, restored ones included.
    np.testing.assert_allclose(
        history.history["loss"], ref_history.history["loss"][stop_at[0] :], rtol=1e-5
    )
    assert not (tmp_path / "b").exists()  # delete_checkpoint=True cleans up at the end


def test_resume_under_mirrored_strategy(tmp_path):
    def strategy():
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    reference, _ = train(strategy())
    with pytest.raises(Interrupt):
        train(strategy(), backup=str(tmp_path), save_freq=2, callbacks=[StopAt(1, 5)])
    model, _ = train(strategy(), backup=str(tmp_path), save_freq=2)
    assert int(model.optimizer.iterations.numpy()) == 24
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6


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


def test_iterators_made_to_advance_the_shuffle_read_nothing():
    from tfgpu._backup import _CountingDataset

    reads = []

    def record(x):
        reads.append(int(x))
        return x

    def shuffled():
        return (
            tf.data.Dataset.range(32)
            .map(lambda x: tf.py_function(record, [x], tf.int64))
            .shuffle(32, seed=5, reshuffle_each_iteration=True)
            .batch(32)
            .prefetch(2)
        )

    ds = shuffled()
    orders = [next(iter(ds)).numpy().tolist() for _ in range(3)]
    assert orders[0] != orders[1] != orders[2]  # the k-th iterator gets the k-th order
    reads.clear()

    fresh = shuffled()
    counting = _CountingDataset(fresh)
    counting.skip_to(2)
    iterator = iter(counting)
    assert reads == []  # two iterators made and dropped, the new one not read yet
    assert counting.created == 3 and counting.index_of(iterator) == 2
    assert next(iterator).numpy().tolist() == orders[2]
    assert counting.element_spec == fresh.element_spec  # the rest is the dataset's


def test_resume_warns_once_when_the_dataset_cannot_be_found(tmp_path, monkeypatch):
    from tfgpu import _backup

    reference, _ = train(reshuffle=True)
    with pytest.raises(Interrupt):
        train(backup=str(tmp_path), save_freq=3, reshuffle=True, callbacks=[StopAt(1, 4)])
    monkeypatch.setattr(_backup, "_fit_epoch_iterator", lambda model: None)
    with pytest.warns(
        UserWarning, match="reshuffled each epoch resumes with the shuffle order"
    ) as w:
        model, _ = train(backup=str(tmp_path), save_freq=3, reshuffle=True)
    assert len([x for x in w if "BackupAndRestore" in str(x.message)]) == 1
    assert int(model.optimizer.iterations.numpy()) == 24  # training goes on, just not exact
    assert max_diff(model.get_weights(), reference.get_weights()) > 1e-4


def test_double_checkpoint_falls_back_to_the_previous_backup(tmp_path):
    reference, _ = train()
    with pytest.raises(Interrupt):
        train(backup=str(tmp_path), save_freq=2, callbacks=[StopAt(1, 3)])
    # A disk error tore the only backup: say so rather than silently starting over.
    (tmp_path / "backup.npz").write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(OSError, match="No readable backup"):
        train(backup=str(tmp_path), save_freq=2)

    assert not (tmp_path / "backup.prev.npz").exists()

    # With double_checkpoint=True the older copy is used.
    def run(stop=None):
        cb = BackupAndRestore(str(tmp_path / "dd"), save_freq=2, double_checkpoint=True)
        callbacks = [cb] + ([StopAt(*stop)] if stop else [])
        return train(callbacks=callbacks)

    with pytest.raises(Interrupt):
        run(stop=(1, 3))
    assert (tmp_path / "dd" / "backup.prev.npz").exists()
    (tmp_path / "dd" / "backup.npz").write_bytes(b"torn")
    model, _ = run()
    assert int(model.optimizer.iterations.numpy()) == 24
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6


def test_backup_of_another_model_is_refused(tmp_path):
    with pytest.raises(Interrupt):
        train(backup=str(tmp_path), save_freq=2, callbacks=[StopAt(0, 1)])
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    other.compile("sgd", "mse")
    x = np.zeros((8, 4), "float32")
    with pytest.raises(ValueError, match=r"different model or optimizer.*shape"):
        other.fit(x, np.zeros((8, 2)), callbacks=[BackupAndRestore(str(tmp_path))], verbose=0)


# --------------------------------------------------------------------------- workers racing


def test_end_of_fit_cleanup_tolerates_a_peer_removing_the_directory(tmp_path, monkeypatch):
    """Multi-worker: the other worker removes `backup_dir` while the chief is cleaning it.

    The chief deletes the canonical files, then lists `backup_dir` for temporary files a
    killed save left; a worker that finishes at that moment removes the now empty directory.
    Listing it used to raise FileNotFoundError and fail the chief's `fit` at its very end.
    """
    from tfgpu import _backup

    canonical = tmp_path / "backup"
    canonical.mkdir()
    for name in ("backup.npz", ".backup.npz.tmp-123", ".backup.prev.npz.tmp-9"):
        (canonical / name).write_bytes(b"x")
    real_scandir = os.scandir

    def scandir_as_the_peer_finishes(path="."):
        if os.fspath(path) == os.fspath(canonical) and canonical.exists():
            for child in canonical.iterdir():
                child.unlink()
            canonical.rmdir()  # the peer: "empty now, remove it"
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir_as_the_peer_finishes)
    _backup._delete_backups(canonical, None, is_chief=True)
    assert not canonical.exists()
    _backup._delete_backups(canonical, canonical / ".worker-1", is_chief=False)  # gone: fine


def test_cleanup_leaves_a_peer_s_directory_and_removes_leftovers(tmp_path):
    from tfgpu import _backup

    canonical = tmp_path / "backup"
    (canonical / ".worker-1").mkdir(parents=True)
    (canonical / ".worker-1" / "backup.npz").write_bytes(b"x")
    for name in ("backup.npz", "backup.prev.npz", ".backup.npz.tmp-123", "notes.txt"):
        (canonical / name).write_bytes(b"x")
    _backup._delete_backups(canonical, None, is_chief=True)
    assert sorted(p.name for p in canonical.iterdir()) == [".worker-1", "notes.txt"]
    _backup._delete_backups(canonical, canonical / ".worker-1", is_chief=False)
    assert sorted(p.name for p in canonical.iterdir()) == ["notes.txt"]  # not ours: kept


def test_save_recreates_a_directory_a_peer_removed_meanwhile(tmp_path, monkeypatch):
    """A worker's first save creates `backup_dir/.worker-k`; the chief may remove the (then
    empty) `backup_dir` between that worker's `mkdir` and its `open`."""
    import builtins

    from tfgpu import _backup

    own = tmp_path / "backup" / ".worker-1"
    calls = []

    def open_after_the_peer_removed_it(path, mode="r", *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            own.rmdir()
            own.parent.rmdir()
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(_backup, "open", open_after_the_peer_removed_it, raising=False)
    target = _backup._write_atomic(own, {"a": np.arange(3)}, keep_previous=False)
    assert len(calls) == 2
    np.testing.assert_array_equal(np.load(target)["a"], np.arange(3))


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
