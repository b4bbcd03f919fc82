"""`BackupAndRestore`: exact resume after a kill (docs/distributed.md, "Resuming exactly")."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np

from tfgpu._internal.adapters import keras_internals
from tfgpu._internal.helpers.checks import check_bool, check_dir, check_int, invalid_value
from tfgpu._internal.helpers.files import rotate, writable_dir
from tfgpu.callbacks import _backup

_LOG = logging.getLogger(__name__)


def _check_save_freq(save_freq: Any) -> str | int | bool:
    """`"epoch"`, an int >= 1 (NumPy ints too, returned as int) or False; else raises."""
    expected = "'epoch', an int >= 1 (batches between saves), or False (never save)"
    if isinstance(save_freq, str) and save_freq == "epoch":
        return save_freq
    if isinstance(save_freq, (bool, np.bool_)) and not save_freq:
        return False
    if isinstance(save_freq, (str, bool, np.bool_)):
        raise invalid_value("save_freq", save_freq, expected)
    return check_int("save_freq", save_freq, minimum=1, expected=expected)


# The users' datasets a `fit` with a BackupAndRestore iterated in this process (their first
# shuffle orders are spent): kept here, weakly, rather than written onto the user's dataset.
_ITERATED: weakref.WeakSet = weakref.WeakSet()


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the training state and resumes exactly where a killed run stopped.

    A drop-in replacement for `keras.callbacks.BackupAndRestore`: run the same `fit` again
    after a kill or a raise, and the weights end as an uninterrupted run's (a dataset
    reshuffled every epoch needs a seed). TensorFlow backend; no key in `logs`. The guide:
    docs/distributed.md, "Resuming exactly"; docs/guarantees.md, "Backups and resume".

    Args:
        backup_dir: str or path-like, a directory used only by this callback, created and
            checked writable now (with `save_freq=False`, only read).
        save_freq: `"epoch"`, int or False: save at every epoch end, every `save_freq`
            batches (best a multiple of `steps_per_execution`), or never. Defaults to `"epoch"`.
        double_checkpoint: bool, also keep the previous backup to fall back to. Defaults to False.
        delete_checkpoint: bool, delete the backups when `fit` completes. Defaults to True.

    Raises:
        TypeError: if an argument has the wrong type (`save_freq=2.5`, `backup_dir=123`).
        ValueError: for a `backup_dir` that cannot be used or `save_freq` out of range
            (`0`, `"batch"`); at the start of `fit`, for an unbuilt model, two
            BackupAndRestore callbacks, or no usable backup (each file named, with why).

    Example:

    >>> backup = tfgpu.callbacks.BackupAndRestore("runs/exp1/backup", save_freq=100)
    >>> model.fit(train, epochs=10, callbacks=[backup])  # rerun the script after a kill
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int | bool = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
    ) -> None:
        super().__init__()
        directory = check_dir("backup_dir", backup_dir)
        self.save_freq = _check_save_freq(save_freq)
        check_bool("double_checkpoint", double_checkpoint)
        check_bool("delete_checkpoint", delete_checkpoint)
        if self.save_freq is not False:  # not after an epoch of training, at the first save
            writable_dir(directory, "backup_dir")
        self.backup_dir = os.fspath(directory)
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self._epoch = 0
        self._steps_in_epoch = 0  # batches trained (or skipped) in the current epoch
        self._position = 0  # batches drawn from the current input iterator
        self._iterator = None
        self._shared_iterator: bool | None = None  # one iterator across epochs?
        self._since_save = 0
        self._last_logs: dict[str, float] = {}
        self._pending: dict[str, Any] | None = None  # a restore still to apply in fit
        self._original_train_function: Callable | None = None
        self._set_initial_epoch = self._last_call_skipped = False
        self._epoch_iterator = None  # Keras's EpochIterator of this fit, when found
        self._dataset: _backup.CountingDataset | None = None
        self._reused_source = None  # the user's tf.data dataset, if an earlier fit iterated it

    def _paths(self) -> tuple[Path, Path | None, bool]:
        is_chief, private = _backup.worker_role(self.model.distribute_strategy)
        canonical = Path(self.backup_dir)
        own = canonical / private if private else None
        return canonical, own, is_chief

    def _load(self) -> tuple[dict[str, Any], dict[str, np.ndarray], Path] | None:
        """The newest backup that reads completely and fits this model and optimizer, after
        moving unusable newer ones (that this worker writes) aside to `backup.N.npz` with a
        warning; if none is usable, raises naming every file and touches nothing."""
        canonical, own, _ = self._paths()
        names = [_backup.FILE, _backup.PREV] if self.double_checkpoint else [_backup.FILE]
        folders = [canonical] if own is None else [canonical, own]
        present = [f / name for f in folders for name in names if os.path.lexists(f / name)]
        if not present:
            return None
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            with model.distribute_strategy.scope():
                model.optimizer.build(model.trainable_variables)
        groups = _backup.variable_groups(model)
        problems: list[tuple[Path, str]] = []
        for path in present:
            try:
                meta, arrays = _backup.read_backup(path)
                for group in ("model", "optimizer"):
                    problem = _backup.mismatch(group, meta["paths"][group], groups[group])
                    if problem:
                        raise _backup.Unusable(
                            f"it was written by a different model or optimizer: {problem}"
                        )
            except _backup.Unusable as e:
                problems.append((path, str(e)))
                continue
            if problems:
                self._set_aside(problems, path)
            return meta, arrays, path
        raise ValueError(self._no_usable_backup(problems))

    def _set_aside(self, problems: list[tuple[Path, str]], used: Path) -> None:
        canonical, own, is_chief = self._paths()
        writable = canonical if is_chief else own
        notes = []
        for path, problem in problems:
            note = f"{path}: {problem}"
            if writable is not None and path.parent == writable:
                try:
                    moved = rotate(path)
                except OSError as e:
                    note += f" (could not move it aside: {e})"
                else:
                    note += f" (moved to {moved}, kept for inspection)"
            notes.append(note)
        warnings.warn(
            "tfgpu BackupAndRestore: cannot resume from " + "; ".join(notes) + f". Resuming "
            f"from the older backup {used} instead.",
            stacklevel=3,
        )

    def _no_usable_backup(self, problems: list[tuple[Path, str]]) -> str:
        canonical = Path(self.backup_dir)
        listed = "; ".join(f"{path}: {problem}" for path, problem in problems)
        hint = ""
        prev = canonical / _backup.PREV
        if not self.double_checkpoint and prev.exists():
            hint = (
                f" An older backup {prev} exists: pass `double_checkpoint=True` to resume from it."
            )
        return (
            f"Cannot resume from the backups in `backup_dir`={str(canonical)!r}: {listed}. "
            "Nothing was deleted." + hint + " Expected a complete backup written by this "
            "model and optimizer: to start training from the beginning, move the damaged "
            "file(s) away or delete them, or pass another `backup_dir` (a new model needs "
            "its own)."
        )

    def on_train_begin(self, logs=None):
        self._reset_run_state()
        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "tfgpu.callbacks.BackupAndRestore needs the TensorFlow backend. Received: "
                f"KERAS_BACKEND={keras.backend.backend()!r}. Expected 'tensorflow'."
            )
        model = self.model
        if not model.built:
            raise ValueError(
                "To use BackupAndRestore, the model must be built before `fit()`. Received: "
                f"an unbuilt model {model.name!r}. Expected a built model: give it an "
                "`keras.Input` or call it on a batch first."
            )
        check_dir("backup_dir", self.backup_dir)  # it may have become a file since
        keras_internals.clear_initial_epoch(model)
        self._count_iterators()
        self._wrap_train_function()
        loaded = self._load()
        position = [0, 0] if loaded is None else [loaded[0]["epoch"], loaded[0]["step"]]
        self._check_workers_agree(model.distribute_strategy, position)
        if loaded is None:
            return
        meta, arrays, path = loaded
        groups = _backup.variable_groups(model)
        for group in ("model", "optimizer"):
            _backup.assign(groups[group], arrays, group)
        _backup.restore_rng(meta, arrays)
        self._restore_shuffle_state(int(meta.get("iterators", 0)))
        self._epoch = meta["epoch"]
        self._shared_iterator = meta.get("shared_iterator")
        if meta["epoch"] > 0:
            # Keras's `fit` reads this once, right after `on_train_begin`; it is cleared at
            # the first `on_epoch_begin`, so a `fit` that raises later leaves nothing behind.
            keras_internals.set_initial_epoch(model, meta["epoch"])
            self._set_initial_epoch = True
        self._pending = {
            "skip_first": meta["position"] - meta["step"] if self._shared_iterator else 0,
            "skip_calls": meta["step"],
            "metrics": (meta["paths"]["metrics"], arrays) if meta["step"] else None,
            "logs": meta.get("logs", {}),
        }
        if not self._pending["skip_first"] and not meta["step"]:
            self._pending = None
        _LOG.info(
            "tfgpu BackupAndRestore: resumed from %s at epoch %d, batch %d",
            path,
            meta["epoch"],
            meta["step"],
        )

    def _count_iterators(self) -> None:
        """Puts a `CountingDataset` between this `fit` and its training dataset."""
        epoch_iterator = keras_internals.fit_epoch_iterator(self.model)
        dataset = keras_internals.distributed_dataset(epoch_iterator)
        if dataset is None:
            return
        if not isinstance(dataset, _backup.CountingDataset):
            dataset = _backup.CountingDataset(dataset)
            keras_internals.set_distributed_dataset(epoch_iterator, dataset)
        self._epoch_iterator, self._dataset = epoch_iterator, dataset
        # The user's tf.data dataset: an earlier `fit` here may have spent its first orders.
        source: Any = keras_internals.source_dataset(epoch_iterator)
        if hasattr(source, "_as_serialized_graph"):
            self._reused_source = source if source in _ITERATED else None
            with contextlib.suppress(TypeError):  # not weak-referenceable: never reused
                _ITERATED.add(source)

    def _restore_shuffle_state(self, iterators: int) -> None:
        from tfgpu._internal.adapters.datasets import reshuffles  # imports TensorFlow

        if self._reused_source is not None and reshuffles(self._reused_source):
            warnings.warn(
                "tfgpu BackupAndRestore: this `fit` resumes on a dataset object that an "
                "earlier `fit` in this process already iterated, and it is reshuffled each "
                "epoch: it cannot give again the shuffle orders the interrupted run would "
                "have used, so the final weights differ slightly from an uninterrupted run. "
                "To resume exactly, build the dataset again before retrying `fit` (as a "
                "restarted script does).",
                stacklevel=2,
            )
        if self._dataset is not None:
            self._dataset.skip_to(iterators)
        elif iterators > 0:
            warnings.warn(
                "tfgpu BackupAndRestore: cannot find the dataset this `fit` iterates (Keras "
                f"{keras.__version__} keeps it elsewhere), so a dataset reshuffled each epoch "
                "resumes with the shuffle order of a new run's first epoch, not the order the "
                "interrupted run would have used; the final weights then differ slightly from "
                "an uninterrupted run.",
                stacklevel=2,
            )

    def _iterators_before(self, iterator) -> int:
        """How many iterators had been made before `iterator` (the next one if None)."""
        dataset = self._dataset
        if dataset is None:
            return 0
        index = dataset.index_of(iterator) if iterator is not None else None
        return dataset.created if index is None else index

    def _next_epoch_iterator(self):
        """The iterator Keras will use for the next epoch if already made (with `steps_per_epoch`
        only: one across epochs, or the next made at the epoch's end), else None."""
        epoch_iterator = self._epoch_iterator
        if epoch_iterator is None or not keras_internals.steps_per_epoch(epoch_iterator):
            return None
        return keras_internals.current_iterator(epoch_iterator)

    def _check_workers_agree(self, strategy, position: list[int]) -> None:
        """Multi-worker: every worker must resume at the same (epoch, batch), else stop."""
        canonical, own, _ = self._paths()
        if own is None:
            return
        import tensorflow as tf

        value = tf.constant([float(position[0]), float(position[1])])
        values = strategy.run(lambda: tf.stack([value, value * value]))
        mean = strategy.reduce("MEAN", values, axis=None).numpy()
        variance = mean[1] - mean[0] ** 2
        if np.any(np.abs(variance) > 1e-6):
            raise RuntimeError(
                f"Workers found different backups in {canonical}: this worker is at "
                f"epoch {position[0]}, batch {position[1]}, the mean over workers is epoch "
                f"{mean[0][0]:g}, batch {mean[0][1]:g}. Expected every worker to see the "
                "chief's backup: put `backup_dir` on a filesystem shared by all workers."
            )

    def on_epoch_begin(self, epoch, logs=None):
        if self._set_initial_epoch:
            keras_internals.clear_initial_epoch(self.model)
            self._set_initial_epoch = False
        self._epoch = epoch
        self._steps_in_epoch = 0
        pending = self._pending
        if pending and pending["metrics"] is not None:
            variables = _backup.variable_groups(self.model)["metrics"]
            _backup.assign_metrics(variables, *pending["metrics"])  # the saved paths, arrays
            pending["metrics"] = None

    def _wrap_train_function(self) -> None:
        """Puts the skip of already-trained batches in front of Keras's `train_function`. The
        wrapper a `fit` that raised left on the model is replaced here, and steps aside by
        itself in a later `fit` that is not its own."""
        model = self.model
        current = keras_internals.train_function(model)
        if current is None:
            return
        owner = keras_internals.wrapper_owner(current)
        if (
            owner is not None
            and owner is not self
            and self._epoch_iterator is not None
            and owner._epoch_iterator is self._epoch_iterator
        ):
            raise ValueError(
                "Invalid callbacks: two tfgpu BackupAndRestore callbacks in one `fit`, with "
                f"backup_dir={owner.backup_dir!r} and backup_dir={self.backup_dir!r}. "
                "Expected at most one."
            )
        original = keras_internals.keras_train_function(current)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)

        def train_function(iterator):
            if iterator is not self._iterator:
                if (
                    self._epoch_iterator is not None
                    and keras_internals.fit_epoch_iterator(model) is not self._epoch_iterator
                ):
                    # Left on the model by a `fit` that raised; this `fit` is not ours.
                    if model.train_function is train_function:
                        model.train_function = original
                    return original(iterator)
                if self._iterator is not None and self._shared_iterator is None:
                    self._shared_iterator = False
                self._iterator = iterator
                self._position = 0
            elif self._steps_in_epoch == 0 and self._shared_iterator is None:
                self._shared_iterator = True
            pending = self._pending
            self._last_call_skipped = False
            if pending is not None:
                for _ in range(pending["skip_first"]):
                    next(iterator)
                self._position += pending["skip_first"]
                pending["skip_first"] = 0
                if pending["skip_calls"] > 0:
                    for _ in range(spe):
                        next(iterator)
                    pending["skip_calls"] -= spe
                    self._position += spe
                    if pending["skip_calls"] <= 0:
                        self._pending = None
                    self._last_call_skipped = True
                    return dict(pending["logs"])
                self._pending = None
            result = original(iterator)
            self._position += spe
            return result

        self._original_train_function = original
        keras_internals.install_train_function(model, train_function, owner=self, original=original)

    def on_train_batch_end(self, batch, logs=None):
        done = batch + 1
        if self._last_call_skipped:  # a batch trained before the kill: nothing new to save
            self._steps_in_epoch = done
            return
        self._since_save += done - self._steps_in_epoch
        self._steps_in_epoch = done
        self._last_logs = _backup.pythonify(logs)
        every = self.save_freq
        if isinstance(every, int) and not isinstance(every, bool) and self._since_save >= every:
            self._save(self._epoch, done, self._position, self._iterators_before(self._iterator))

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq != "epoch":
            return
        upcoming = self._next_epoch_iterator()
        if upcoming is not None and upcoming is self._iterator:
            self._shared_iterator = True  # known now, not only at the next epoch's first step
        if self._shared_iterator:
            position, iterators = self._position, self._iterators_before(self._iterator)
        else:
            position, iterators = 0, self._iterators_before(upcoming)
        self._save(epoch + 1, 0, position, iterators)

    def _save(self, epoch: int, step: int, position: int, iterators: int) -> None:
        self._since_save = 0
        meta, arrays = _backup.collect_state(self.model)
        meta.update(
            epoch=epoch,
            step=step,
            position=position,
            shared_iterator=self._shared_iterator,
            iterators=iterators,
            logs=self._last_logs,
        )
        arrays[_backup.META] = np.asarray(json.dumps(meta))
        canonical, own, is_chief = self._paths()
        directory = canonical if is_chief else own
        if directory is None:  # _backup.worker_role names a private directory for every non-chief
            raise AssertionError("tfgpu BackupAndRestore: a non-chief worker has no directory")
        _backup.write_atomic(directory, arrays, self.double_checkpoint)

    def on_train_end(self, logs=None):
        if self._original_train_function is not None:
            keras_internals.restore_train_function(self.model, self, self._original_train_function)
            self._original_train_function = None
        if self._set_initial_epoch:
            keras_internals.clear_initial_epoch(self.model)
            self._set_initial_epoch = False
        if self._epoch_iterator is not None and self._dataset is not None:
            keras_internals.set_distributed_dataset(self._epoch_iterator, self._dataset._dataset)
        self._epoch_iterator = self._dataset = None
        if self.delete_checkpoint:
            _backup.delete_backups(*self._paths())
