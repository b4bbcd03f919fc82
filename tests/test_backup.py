"""`tfgpu.callbacks.BackupAndRestore`: a run interrupted anywhere resumes to the same weights.

The tests here interrupt `fit` by raising from a callback, in this process, on one device;
under `MirroredStrategy` and with a real training process killed by SIGKILL:
`tests/test_backup_distributed.py`.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.workers.train import make_dataset, make_model, train
from tfgpu._internal.adapters import keras_internals
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
    "kwargs, error, match",
    [
        ({"save_freq": 2.5}, TypeError, r"save_freq=2\.5 \(of type float\)"),
        ({"save_freq": 3.0}, TypeError, r"save_freq=3\.0"),
        ({"save_freq": "3"}, ValueError, r"save_freq='3'"),
        ({"save_freq": "Epoch"}, ValueError, r"save_freq='Epoch'"),
        ({"save_freq": -1}, ValueError, r"save_freq=-1.*an int >= 1"),
        ({"save_freq": np.int64(0)}, ValueError, r"save_freq=np\.int64\(0\)"),
        ({"save_freq": True}, ValueError, r"save_freq=True.*or False"),
        ({"save_freq": None}, TypeError, r"save_freq=None"),
        ({"save_freq": float("nan")}, TypeError, r"save_freq=nan"),
        ({"save_freq": [1]}, TypeError, r"save_freq=\[1\]"),
        ({"double_checkpoint": "yes"}, TypeError, r"double_checkpoint='yes'"),
        ({"double_checkpoint": None}, TypeError, r"double_checkpoint=None"),
        ({"double_checkpoint": np.bool_(True)}, TypeError, r"double_checkpoint="),
        ({"delete_checkpoint": 0}, TypeError, r"delete_checkpoint=0"),
    ],
)
def test_hostile_arguments_fail_at_construction(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        BackupAndRestore(str(tmp_path / "b"), **kwargs)
    assert not (tmp_path / "b").exists()


def test_save_freq_accepts_numpy_ints_as_ints(tmp_path):
    backup = BackupAndRestore(tmp_path / "b", save_freq=np.int32(3))
    assert backup.save_freq == 3 and type(backup.save_freq) is int
    assert BackupAndRestore(tmp_path / "b", save_freq="epoch").save_freq == "epoch"


def test_backup_dir_must_be_a_directory_path(tmp_path, monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    with pytest.raises(ValueError, match=r"backup_dir=.*notes\.txt.*is a file"):
        BackupAndRestore(str(a_file))
    with pytest.raises(ValueError, match=r"is under the file .*notes\.txt"):
        BackupAndRestore(a_file / "backup")
    for value in (123, None, b"/tmp/b", ["/tmp/b"]):
        with pytest.raises(TypeError, match="Invalid type for argument `backup_dir`"):
            BackupAndRestore(value)
    with pytest.raises(ValueError, match="backup_dir='  '"):
        BackupAndRestore("  ")
    assert a_file.read_text() == "kept"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert BackupAndRestore("~/runs/b").backup_dir == str(tmp_path / "runs" / "b")


@pytest.mark.parametrize("where", ["{dir}/b", "{dir}/b/c", "{dir}"])
@pytest.mark.parametrize("save_freq", ["epoch", 3])
def test_a_backup_dir_that_cannot_be_written_fails_at_construction(unwritable, where, save_freq):
    backup_dir = where.format(dir=unwritable)
    with pytest.raises(ValueError) as e:
        BackupAndRestore(backup_dir, save_freq=save_freq)
    message = str(e.value)
    assert message.startswith(
        f"Invalid value for argument `backup_dir`. Received: backup_dir={backup_dir!r}. "
        "Expected a directory this process can create and write to ("
    )
    assert "Error: " in message  # the reason: PermissionError, FileNotFoundError, ...


def test_a_restore_only_backup_dir_need_not_be_writable(unwritable):
    backup = BackupAndRestore(unwritable / "b", save_freq=False)  # only read: never written
    assert backup.backup_dir == str(unwritable / "b")


def test_a_backup_dir_is_created_when_the_callback_is_made(tmp_path):
    BackupAndRestore(tmp_path / "runs" / "b")
    assert (tmp_path / "runs" / "b").is_dir() and not any((tmp_path / "runs" / "b").iterdir())


def test_backup_dir_that_became_a_file_fails_before_training(tmp_path):
    backup = BackupAndRestore(tmp_path / "b")
    (tmp_path / "b").rmdir()  # made with the callback
    (tmp_path / "b").write_text("not a directory")
    model, opt = make_model()
    model.compile(opt, "mse")
    with pytest.raises(ValueError, match=r"backup_dir=.*is a file"):
        model.fit(make_dataset(8), epochs=1, verbose=0, shuffle=False, callbacks=[backup])
    assert int(model.optimizer.iterations.numpy()) == 0
    assert (tmp_path / "b").read_text() == "not a directory"


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
@pytest.mark.slow
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


def test_iterators_made_to_advance_the_shuffle_read_nothing():
    from tfgpu.callbacks._backup import CountingDataset

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
    counting = CountingDataset(fresh)
    counting.skip_to(2)
    iterator = iter(counting)
    assert reads == []  # two iterators made and dropped, the new one not read yet
    assert counting.created == 3 and counting.index_of(iterator) == 2
    assert next(iterator).numpy().tolist() == orders[2]
    assert counting.element_spec == fresh.element_spec  # the rest is the dataset's


@pytest.mark.slow
def test_resume_warns_once_when_the_dataset_cannot_be_found(tmp_path, monkeypatch):
    reference, _ = train(reshuffle=True)
    with pytest.raises(Interrupt):
        train(backup=str(tmp_path), save_freq=3, reshuffle=True, callbacks=[StopAt(1, 4)])
    monkeypatch.setattr(keras_internals, "distributed_dataset", lambda epoch_iterator: None)
    with pytest.warns(
        UserWarning, match="reshuffled each epoch resumes with the shuffle order"
    ) as w:
        model, _ = train(backup=str(tmp_path), save_freq=3, reshuffle=True)
    assert len([x for x in w if "BackupAndRestore" in str(x.message)]) == 1
    assert int(model.optimizer.iterations.numpy()) == 24  # training goes on, just not exact
    assert max_diff(model.get_weights(), reference.get_weights()) > 1e-4


def test_backup_of_another_model_is_refused(tmp_path):
    with pytest.raises(Interrupt):
        train(backup=str(tmp_path), save_freq=2, callbacks=[StopAt(0, 1)])
    before = (tmp_path / "backup.npz").read_bytes()
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    other.compile("sgd", "mse")
    x = np.zeros((8, 4), "float32")
    with pytest.raises(ValueError, match=r"backup\.npz: .*different model or optimizer.*shape"):
        other.fit(x, np.zeros((8, 2)), callbacks=[BackupAndRestore(str(tmp_path))], verbose=0)
    assert (tmp_path / "backup.npz").read_bytes() == before  # refused, not touched


# --------------------------------------------------------------------------- retry in-process


class FirstStep(keras.callbacks.Callback):
    """Records the optimizer's step count when the first epoch of `fit` begins (after any
    restore): the batches a `fit` trains are the final count minus this one."""

    def on_train_begin(self, logs=None):
        self.steps = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.steps is None:
            self.steps = int(self.model.optimizer.iterations.numpy())


def compiled_model():
    model, opt = make_model()
    model.compile(opt, "mse")
    return model


def fit(model, *callbacks, epochs=3):
    return model.fit(
        make_dataset(8), epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks)
    )


@pytest.mark.slow
@pytest.mark.parametrize("same_instance", [False, True], ids=["new-callback", "same-callback"])
def test_retry_after_a_failed_fit_resumes_exactly_in_the_same_process(
    tmp_path, same_instance, reference_weights
):
    model = compiled_model()
    backups = iter(
        [BackupAndRestore(tmp_path, save_freq=3)] * 4
        if same_instance
        else [BackupAndRestore(tmp_path, save_freq=3) for _ in range(4)]
    )
    first = FirstStep()
    with pytest.raises(Interrupt):  # saved after batch 3 of epoch 1 (step 12), dies at 13
        fit(model, next(backups), first, StopAt(1, 4))
    with pytest.raises(Interrupt):  # dies while skipping the batches already trained
        fit(model, next(backups), first, StopAt(1, 1))
    assert first.steps == 12
    with pytest.raises(Interrupt):  # saved after batch 6 of epoch 1 (step 15), dies at 17
        fit(model, next(backups), first, StopAt(2, 0))
    assert first.steps == 12
    history = fit(model, next(backups), first)
    assert first.steps == 15
    assert int(model.optimizer.iterations.numpy()) == 24  # 9 batches trained: none twice
    assert history.epoch == [1, 2]
    assert max_diff(model.get_weights(), reference_weights) < 1e-6
    assert not tmp_path.exists()


@pytest.mark.slow
def test_retry_with_a_reshuffled_dataset_is_exact_when_the_dataset_is_rebuilt(tmp_path):
    import warnings

    reference, _ = train(reshuffle=True)

    def fit_reshuffled(model, ds, *callbacks):
        backup = BackupAndRestore(tmp_path, save_freq=3)
        return model.fit(ds, epochs=3, verbose=0, shuffle=False, callbacks=[backup, *callbacks])

    model = compiled_model()
    with pytest.raises(Interrupt):
        fit_reshuffled(model, make_dataset(8, reshuffle=True), StopAt(1, 4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fit_reshuffled(model, make_dataset(8, reshuffle=True))  # rebuilt, as after a kill
    assert not [x for x in w if "BackupAndRestore" in str(x.message)]
    assert int(model.optimizer.iterations.numpy()) == 24
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6

    # The same dataset object again: its first orders are spent; say so, train on anyway.
    model, ds = compiled_model(), make_dataset(8, reshuffle=True)
    with pytest.raises(Interrupt):
        fit_reshuffled(model, ds, StopAt(1, 4))
    with pytest.warns(UserWarning, match="build the dataset again before retrying"):
        fit_reshuffled(model, ds)
    assert int(model.optimizer.iterations.numpy()) == 24
    assert not [k for k in vars(ds) if "tfgpu" in k]  # the user's dataset is left alone


@pytest.mark.slow
def test_a_failed_fit_leaves_no_skip_behind_for_later_fits(tmp_path):
    model = compiled_model()
    with pytest.raises(Interrupt):
        fit(model, BackupAndRestore(tmp_path, save_freq=3), StopAt(1, 4))
    with pytest.raises(Interrupt):  # resumed at epoch 1, dies with 3 batches still to skip
        fit(model, BackupAndRestore(tmp_path, save_freq=3), StopAt(1, 0))
    # A plain fit of the same model: all its epochs, every batch trained.
    before = int(model.optimizer.iterations.numpy())
    history = fit(model)
    assert history.epoch == [0, 1, 2]
    assert int(model.optimizer.iterations.numpy()) == before + 24
    assert (tmp_path / "backup.npz").exists()  # still there for a later resume


@pytest.mark.slow
@pytest.mark.parametrize("same_instance", [False, True], ids=["new-callback", "same-callback"])
def test_fits_in_a_row_train_like_one_longer_fit(tmp_path, same_instance):
    reference, _ = train(epochs=6)
    model = compiled_model()
    backup = BackupAndRestore(tmp_path, save_freq=2)
    fit(model, backup)
    fit(model, backup if same_instance else BackupAndRestore(tmp_path, save_freq=2))
    assert int(model.optimizer.iterations.numpy()) == 48
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6
    assert keras_internals.wrapper_owner(model.train_function) is None  # nothing left wrapped


def test_two_backup_callbacks_in_one_fit_are_refused(tmp_path):
    model = compiled_model()
    with pytest.raises(ValueError, match="two tfgpu BackupAndRestore callbacks in one `fit`"):
        fit(model, BackupAndRestore(tmp_path / "a"), BackupAndRestore(tmp_path / "b"))
    assert int(model.optimizer.iterations.numpy()) == 0


# --------------------------------------------------------------------------- damaged backups


@pytest.fixture(scope="module")
def reference_weights():
    return train()[0].get_weights()


@pytest.fixture(scope="module")
def other_model_backup(tmp_path_factory):
    """The bytes of a backup written by a model with other shapes."""
    directory = tmp_path_factory.mktemp("other")
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    other.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    x = np.zeros((8, 4), "float32")
    with pytest.raises(Interrupt):
        other.fit(
            x,
            np.zeros((8, 2), "float32"),
            verbose=0,
            callbacks=[BackupAndRestore(directory, save_freq=1), StopAt(0, 0)],
        )
    return (directory / "backup.npz").read_bytes()


def without_a_weight(valid: bytes) -> bytes:
    import io

    with np.load(io.BytesIO(valid)) as data:
        arrays = {k: data[k] for k in data.files if k != "model/00001"}
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


DAMAGES = {
    "empty": lambda valid, other: b"",
    "truncated": lambda valid, other: valid[: len(valid) // 2],
    "zip-header-only": lambda valid, other: b"PK\x03\x04 torn",
    "garbage": lambda valid, other: bytes(range(256)) * 8,
    "missing-weight": lambda valid, other: without_a_weight(valid),
    "npz-of-something-else": lambda valid, other: _npz(a=np.arange(3)),
    "other-model": lambda valid, other: other,
}
DAMAGE_MESSAGES = {
    "empty": "cannot be read as a backup archive",
    "truncated": "cannot be read as a backup archive",
    "zip-header-only": "cannot be read as a backup archive",
    "garbage": "cannot be read as a backup archive",
    "missing-weight": r"model variable 1 .* is missing",
    "npz-of-something-else": "has no '__meta__' record",
    "other-model": "different model or optimizer",
}


def _npz(**arrays) -> bytes:
    import io

    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def fit_with(directory, *callbacks, double_checkpoint=False):
    backup = BackupAndRestore(directory, save_freq=2, double_checkpoint=double_checkpoint)
    return train(callbacks=[backup, *callbacks])


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_backup_without_a_previous_one_is_named_and_kept(
    tmp_path, damage, other_model_backup
):
    with pytest.raises(Interrupt):
        fit_with(tmp_path, StopAt(1, 3))
    latest = tmp_path / "backup.npz"
    damaged = DAMAGES[damage](latest.read_bytes(), other_model_backup)
    latest.write_bytes(damaged)
    with pytest.raises(ValueError, match=DAMAGE_MESSAGES[damage]) as raised:
        fit_with(tmp_path)
    message = str(raised.value)
    assert str(latest) in message
    assert "move the damaged file(s) away or delete them, or pass another `backup_dir`" in message
    assert "Nothing was deleted" in message
    assert latest.read_bytes() == damaged  # never deleted, never rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.npz"]


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_double_checkpoint_falls_back_to_the_intact_previous_backup(
    tmp_path, damage, reference_weights, other_model_backup
):
    with pytest.raises(Interrupt):
        fit_with(tmp_path, StopAt(1, 3), double_checkpoint=True)
    latest = tmp_path / "backup.npz"
    assert (tmp_path / "backup.prev.npz").exists()
    damaged = DAMAGES[damage](latest.read_bytes(), other_model_backup)
    latest.write_bytes(damaged)
    with pytest.warns(UserWarning, match=r"cannot resume from .*backup\.npz: ") as w:
        model, _ = fit_with(tmp_path, double_checkpoint=True)
    message = str(next(x.message for x in w if "cannot resume" in str(x.message)))
    assert "moved to " + str(tmp_path / "backup.1.npz") in message
    assert "from the older backup " + str(tmp_path / "backup.prev.npz") in message
    assert int(model.optimizer.iterations.numpy()) == 24  # no batch trained twice
    assert max_diff(model.get_weights(), reference_weights) < 1e-6
    # The finished fit removed its own backups; the damaged one is kept for inspection.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup.1.npz"]
    assert (tmp_path / "backup.1.npz").read_bytes() == damaged


def test_both_backups_damaged_lists_both_and_touches_nothing(tmp_path):
    with pytest.raises(Interrupt):
        fit_with(tmp_path, StopAt(1, 3), double_checkpoint=True)
    (tmp_path / "backup.npz").write_bytes(b"")
    (tmp_path / "backup.prev.npz").write_bytes(b"PK")
    with pytest.raises(ValueError, match=r"backup\.npz: .*; .*backup\.prev\.npz: .*") as raised:
        fit_with(tmp_path, double_checkpoint=True)
    assert "Nothing was deleted" in str(raised.value)
    assert (tmp_path / "backup.npz").read_bytes() == b""
    assert (tmp_path / "backup.prev.npz").read_bytes() == b"PK"


@pytest.mark.slow
def test_damaged_backup_names_the_previous_one_when_double_checkpoint_is_off(tmp_path):
    with pytest.raises(Interrupt):
        fit_with(tmp_path, StopAt(1, 3), double_checkpoint=True)
    (tmp_path / "backup.npz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"pass `double_checkpoint=True` to resume from it"):
        fit_with(tmp_path)


# --------------------------------------------------------------------------- workers racing


def test_end_of_fit_cleanup_tolerates_a_peer_removing_the_directory(tmp_path, monkeypatch):
    """Multi-worker: the other worker removes `backup_dir` while the chief is cleaning it.

    The chief deletes the canonical files, then lists `backup_dir` for temporary files a
    killed save left; a worker that finishes at that moment removes the now empty directory.
    Listing it used to raise FileNotFoundError and fail the chief's `fit` at its very end.
    """
    from tfgpu.callbacks import _backup

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
    _backup.delete_backups(canonical, None, is_chief=True)
    assert not canonical.exists()
    _backup.delete_backups(canonical, canonical / ".worker-1", is_chief=False)  # gone: fine


def test_cleanup_leaves_a_peer_s_directory_and_removes_leftovers(tmp_path):
    from tfgpu.callbacks import _backup

    canonical = tmp_path / "backup"
    (canonical / ".worker-1").mkdir(parents=True)
    (canonical / ".worker-1" / "backup.npz").write_bytes(b"x")
    for name in ("backup.npz", "backup.prev.npz", ".backup.npz.tmp-123", "notes.txt"):
        (canonical / name).write_bytes(b"x")
    _backup.delete_backups(canonical, None, is_chief=True)
    assert sorted(p.name for p in canonical.iterdir()) == [".worker-1", "notes.txt"]
    _backup.delete_backups(canonical, canonical / ".worker-1", is_chief=False)
    assert sorted(p.name for p in canonical.iterdir()) == ["notes.txt"]  # not ours: kept


def test_save_recreates_a_directory_a_peer_removed_meanwhile(tmp_path, monkeypatch):
    """A worker's first save creates `backup_dir/.worker-k`; the chief may remove the (then
    empty) `backup_dir` between that worker's `mkdir` and its `open`."""
    import builtins

    from tfgpu.callbacks import _backup

    own = tmp_path / "backup" / ".worker-1"
    calls = []

    def open_after_the_peer_removed_it(path, mode="r", *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            own.rmdir()
            own.parent.rmdir()
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(_backup, "open", open_after_the_peer_removed_it, raising=False)
    target = _backup.write_atomic(own, {"a": np.arange(3)}, keep_previous=False)
    assert len(calls) == 2
    np.testing.assert_array_equal(np.load(target)["a"], np.arange(3))


@pytest.mark.parametrize("double_checkpoint", [False, True])
def test_a_backup_disk_that_fills_up_names_the_backup_and_leaves_no_temporary_file(
    tmp_path, monkeypatch, double_checkpoint
):
    """The disk fills after the first save: the error names the backup (it was a bare
    `OSError: [Errno 28]`), the failed save's `.backup.npz.tmp-PID` is gone from the full disk,
    and the previous backup resumes."""
    from tfgpu.callbacks import _backup

    real_savez, saves = np.savez, []

    def savez_until_full(file, *args, **kwargs):
        saves.append(1)
        if len(saves) >= 2:
            file.write(b"PK\x03\x04 half a backup")
            raise OSError(28, "No space left on device")
        return real_savez(file, *args, **kwargs)

    monkeypatch.setattr(_backup.np, "savez", savez_until_full)
    backup = tmp_path / "b"
    kwargs = {"double_checkpoint": double_checkpoint}
    with pytest.raises(
        OSError,
        match=r"No space left on device: BackupAndRestore could not save "
        rf"the backup '{backup / 'backup.npz'}' \(the previous backup",
    ):
        train(callbacks=[BackupAndRestore(backup, **kwargs)])
    assert sorted(p.name for p in backup.iterdir()) == ["backup.npz"]
    monkeypatch.setattr(_backup.np, "savez", real_savez)
    reference, _ = train()
    model, history = train(callbacks=[BackupAndRestore(backup, **kwargs)])
    assert len(history.history["loss"]) == 2  # epoch 0 was saved: it is not trained again
    assert max_diff(model.get_weights(), reference.get_weights()) < 1e-6
