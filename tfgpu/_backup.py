"""`BackupAndRestore`: exact resume after a kill, at epoch or step granularity, multi-worker safe.

Public as `tfgpu.callbacks.BackupAndRestore`. What it fixes in `keras.callbacks.BackupAndRestore`
(Keras 3.15):

- With `save_freq=<int>` Keras restores mid-epoch weights and then re-runs the whole epoch, so
  batches are trained on twice. Here the resumed epoch skips the batches already consumed
  (they are drawn from the input and dropped, not trained on), so a run killed at any point
  ends with the weights of an uninterrupted run.
- Keras writes the weights file and the metadata file in place; a kill mid-save leaves them
  torn or out of step. Here one file holds everything and appears by atomic rename.
- Under `MultiWorkerMirroredStrategy` all workers write the same path (`FileExistsError`,
  HDF5 lock errors). Here every worker reads the state (reads may be collectives), the
  chief writes the canonical copy, and each other worker writes its own copy under
  `<backup_dir>/.worker-<k>/`, used only where the chief's copy is not visible.

What a backup holds (`<backup_dir>/backup.npz`): every model variable (weights, non-trainable
state, and the layers' RNG seed-generator states), the optimizer variables (iteration count,
slots, loss scale), the metric accumulators, Keras's global seed generator, Python's and
NumPy's global RNG, and the position: epoch, batches done in that epoch, batches drawn from
the input iterator, how many iterators of the training dataset `fit` had made before the one
to resume from (a dataset reshuffled each epoch gives the k-th iterator the k-th order), and
the last batch logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import sys
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import keras
import numpy as np

from tfgpu._checks import (
    check_bool,
    check_dir,
    check_int,
    invalid_value,
    is_int,
    is_number,
)
from tfgpu._files import rotate

_LOG = logging.getLogger("tfgpu")

_FORMAT = 1
_FILE = "backup.npz"
_PREV = "backup.prev.npz"
_META = "__meta__"


# --------------------------------------------------------------------------- file helpers


def _replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """`os.replace`, kept as one function so tests can interrupt a save between its steps."""
    os.replace(src, dst)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create(path: Path, attempts: int = 5):
    """Opens `path` for writing, creating its directories; tolerates a peer removing them.

    Under multi-worker the shared `backup_dir` is removed by whichever worker cleans up last
    (`os.rmdir`, only when empty), so between creating it and creating a file in it, a
    directory may vanish: create it again rather than fail.
    """
    for attempt in range(attempts):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return open(path, "wb")
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _names(directory: Path) -> list[str]:
    """The entries of `directory`; none if it does not exist (or a peer just removed it)."""
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _delete_backups(canonical: Path, own: Path | None, is_chief: bool) -> None:
    """Removes this worker's backups at the end of `fit`, then `canonical` if it is empty.

    Workers finish at different moments and clean up concurrently: a worker removes its own
    directory, the chief removes the canonical files and any temporary file a killed save
    left, and whoever finds `canonical` empty removes it. Every step tolerates a path that
    a peer removed in the meantime.
    """
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)
    if is_chief:
        for name in _names(canonical):
            if name in (_FILE, _PREV) or name.startswith((f".{_FILE}.tmp-", f".{_PREV}.tmp-")):
                with contextlib.suppress(FileNotFoundError):
                    (canonical / name).unlink()
    with contextlib.suppress(OSError):
        canonical.rmdir()  # only if empty: other workers may still be cleaning up


def _write_atomic(directory: Path, arrays: dict[str, np.ndarray], keep_previous: bool) -> Path:
    """Writes `arrays` to `directory/backup.npz` so that a reader never sees a partial file.

    The data goes to a temporary file in the same directory, is flushed to disk, and is then
    renamed over the old backup (an atomic step on POSIX and Windows). With `keep_previous`,
    the old backup is first hard-linked (or copied) to `backup.prev.npz`, so at every instant
    at least one complete backup exists.
    """
    target = directory / _FILE
    tmp = directory / f".{_FILE}.tmp-{os.getpid()}"
    f = _create(tmp)
    with f:
        np.savez(f, allow_pickle=True, **arrays)  # numpy's default, named for the stubs
        f.flush()
        os.fsync(f.fileno())
    if keep_previous and target.exists():
        prev_tmp = directory / f".{_PREV}.tmp-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            prev_tmp.unlink()
        try:
            os.link(target, prev_tmp)
        except OSError:
            shutil.copyfile(target, prev_tmp)
        _replace(prev_tmp, directory / _PREV)
    _replace(tmp, target)
    _fsync_dir(directory)
    return target


class _Unusable(Exception):
    """A backup file that cannot be resumed from; `str()` says why (no path)."""


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads one backup file; raises `_Unusable` saying why if it is unreadable or torn.

    A damaged file fails in many ways (an empty file is an `EOFError`, a torn zip a
    `BadZipFile`, a flipped byte a `zlib.error`, garbage a pickle `ValueError`...): every
    one of them means the same thing here, so every one becomes `_Unusable`.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise _Unusable("it is a single NumPy array, not a backup archive")
            arrays = {k: data[k] for k in data.files}
    except _Unusable:
        raise
    except Exception as e:  # see the docstring: all damage looks alike
        raise _Unusable(
            f"it cannot be read as a backup archive ({type(e).__name__}: {e})"
        ) from None
    if _META not in arrays:
        raise _Unusable(f"it has no {_META!r} record (not a tfgpu backup, or a torn one)")
    try:
        meta = json.loads(str(arrays.pop(_META)))
    except (TypeError, ValueError) as e:
        raise _Unusable(f"its {_META!r} record is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise _Unusable(f"unknown backup format {found!r} (expected {_FORMAT})")
    problem = _malformed(meta, arrays)
    if problem:
        raise _Unusable(problem)
    return meta, arrays


def _is_count(value: Any) -> bool:
    return is_int(value) and value >= 0


def _malformed(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str | None:
    """What is missing or inconsistent in a backup's record and arrays, or None if complete."""
    for key in ("epoch", "step", "position"):
        if not _is_count(meta.get(key)):
            return f"its record has {key}={meta.get(key)!r}, expected an int >= 0"
    if not _is_count(meta.get("iterators", 0)):
        return f"its record has iterators={meta.get('iterators')!r}, expected an int >= 0"
    paths = meta.get("paths")
    if not isinstance(paths, dict):
        return "its record lists no variables"
    for group in ("model", "optimizer", "metrics"):
        saved = paths.get(group)
        if not isinstance(saved, list):
            return f"its record lists no {group} variables"
        for i, entry in enumerate(saved):
            if not (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], list)
                and all(_is_count(d) for d in entry[1])
            ):
                return f"its record of {group} variable {i} is malformed: {entry!r}"
            array = arrays.get(f"{group}/{i:05d}")
            if array is None:
                return f"{group} variable {i} ({entry[0]!r}) is missing"
            if list(array.shape) != list(entry[1]) or array.dtype.kind not in "biuf":
                return (
                    f"{group} variable {i} ({entry[0]!r}) holds a {array.dtype} array of "
                    f"shape {array.shape}, its record says shape {tuple(entry[1])}"
                )
    keys = arrays.get("rng/numpy_keys")
    numpy_rng, python_rng = meta.get("numpy_rng"), meta.get("python_rng")
    if keys is None or keys.shape != (624,) or keys.dtype.kind not in "iu":
        return "its NumPy random state is missing or malformed"
    if not (
        isinstance(numpy_rng, list)
        and len(numpy_rng) == 4
        and isinstance(numpy_rng[0], str)
        and all(is_number(x) for x in numpy_rng[1:])
    ):
        return "its NumPy random state is malformed"
    if not (
        isinstance(python_rng, list)
        and len(python_rng) == 3
        and is_int(python_rng[0])
        and isinstance(python_rng[1], list)
        and len(python_rng[1]) == len(random.getstate()[1])
        and all(is_int(x) for x in python_rng[1])
    ):
        return "its Python random state is malformed"
    if not isinstance(meta.get("logs", {}), dict):
        return "its record of the last batch logs is malformed"
    return None


# --------------------------------------------------------------------------- state


def _groups(model) -> dict[str, list]:
    optimizer = getattr(model, "optimizer", None)
    return {
        "model": list(model.variables),
        "optimizer": list(optimizer.variables) if optimizer is not None else [],
        "metrics": list(model.metrics_variables),
    }


def _keras_global_seed():
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


def _to_numpy(variable) -> np.ndarray:
    """A variable's value as a NumPy array (through `tf.Variable.numpy()` where there is one:
    NumPy 2's `np.array(tf_variable)` warns that TensorFlow's `__array__` lacks `copy=`)."""
    value = getattr(variable, "value", variable)
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(keras.ops.convert_to_numpy(variable))


def _collect_state(model) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads every piece of training state into NumPy arrays plus a JSON-able description."""
    arrays: dict[str, np.ndarray] = {}
    paths: dict[str, list] = {}
    for group, variables in _groups(model).items():
        paths[group] = []
        for i, v in enumerate(variables):
            arrays[f"{group}/{i:05d}"] = _to_numpy(v)
            paths[group].append([v.path, list(v.shape)])
    seed = _keras_global_seed()
    if seed is not None:
        arrays["rng/keras_global"] = _to_numpy(seed.state)
    # The global RandomState is always MT19937, whose legacy state is this tuple (numpy's
    # stubs type the no-argument call as the dict form, which is only for `legacy=False`).
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state(legacy=True))
    arrays["rng/numpy_keys"] = np.asarray(np_state[1])
    meta = {
        "format": _FORMAT,
        "paths": paths,
        "numpy_rng": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python_rng": random.getstate(),
    }
    return meta, arrays


def _mismatch(group: str, saved: list, variables: list) -> str | None:
    if len(saved) != len(variables):
        return f"{len(saved)} {group} variables in the backup, {len(variables)} in this model"
    for i, ((path, shape), v) in enumerate(zip(saved, variables)):
        if list(shape) != list(v.shape):
            return (
                f"{group} variable {i} is {path!r} with shape {tuple(shape)} in the backup, "
                f"{v.path!r} with shape {tuple(v.shape)} here"
            )
    return None


def _assign(variables: list, arrays: dict[str, np.ndarray], group: str) -> None:
    for i, v in enumerate(variables):
        v.assign(arrays[f"{group}/{i:05d}"])


def _assign_metrics(variables: list, saved: list, arrays: dict[str, np.ndarray]) -> None:
    """Restores metric accumulators by position, or by path for those built so far.

    Compiled metrics other than the loss are built on the first traced step when there is
    no strategy, so at the start of a resumed epoch some may not exist yet; those restart
    from zero and only the epoch's metric logs (never the weights) differ.
    """
    if _mismatch("metrics", saved, variables) is None:
        _assign(variables, arrays, "metrics")
        return
    by_path: dict[str, int] = {}
    for i, (path, _) in enumerate(saved):
        by_path[path] = -1 if path in by_path else i
    for v in variables:
        i = by_path.get(v.path, -1)
        if i >= 0 and list(saved[i][1]) == list(v.shape):
            v.assign(arrays[f"metrics/{i:05d}"])


def _restore_rng(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    if "rng/keras_global" in arrays:
        from keras.src.random.seed_generator import global_seed_generator

        global_seed_generator().state.assign(arrays["rng/keras_global"])
    name, pos, has_gauss, cached = meta["numpy_rng"]
    np.random.set_state((name, arrays["rng/numpy_keys"], pos, has_gauss, cached))
    version, internal, gauss = meta["python_rng"]
    random.setstate((version, tuple(internal), gauss))


def _pythonify(logs: dict | None) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(np.asarray(keras.ops.convert_to_numpy(v)))
        except (TypeError, ValueError):
            continue
    return out


def _worker_role(strategy) -> tuple[bool, str | None]:
    """(is_chief, name of this worker's private directory or None) for `strategy`."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    ):
        resolver = strategy.cluster_resolver
        name = f".{resolver.task_type}-{resolver.task_id}"
        return bool(strategy.extended.should_checkpoint), name
    return True, None


# --------------------------------------------------------------------------- shuffle orders


class _CountingDataset:
    """Stands in for the dataset Keras's `fit` iterates: counts the iterators made from it.

    A `tf.data` shuffle with `reshuffle_each_iteration=True` draws the seeds of each new
    iterator from a seed generator owned by the dataset, so in one process the k-th iterator
    gets the k-th order. Counting lets a backup record which iterator an epoch read; on
    resume, `skip_to(n)` makes the next iterator the n-th by first creating (and dropping)
    the missing ones. Creating an iterator advances the seed generator without reading any
    element (no shuffle buffer fill, no map call), so this costs milliseconds per epoch.
    Everything else is forwarded to the wrapped dataset.
    """

    def __init__(self, dataset):
        self._dataset = dataset
        self.created = 0
        self._skip_to = 0
        self._made: list[tuple[Callable[[], Any], int]] = []

    def skip_to(self, n: int) -> None:
        self._skip_to = max(0, int(n))

    def index_of(self, iterator) -> int | None:
        """The creation index of `iterator` (0 for the first made here), or None if unknown."""
        for ref, index in self._made:
            if ref() is iterator:
                return index
        return None

    def __iter__(self):
        while self.created < self._skip_to:
            iter(self._dataset)  # advances the shuffle seed generators, reads nothing
            self.created += 1
        iterator = iter(self._dataset)
        try:
            ref = weakref.ref(iterator)
        except TypeError:
            ref = lambda: iterator  # noqa: E731 - kept alive until dropped from the list
        self._made = [(r, i) for r, i in self._made[-3:] if r() is not None]
        self._made.append((ref, self.created))
        self.created += 1
        return iterator

    def __getattr__(self, name):
        return getattr(self._dataset, name)


def _reshuffles(dataset) -> bool:
    """Whether a tf.data `dataset` has a shuffle with `reshuffle_each_iteration=True`."""
    from tensorflow.core.framework import graph_pb2

    try:
        graph = graph_pb2.GraphDef()
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception:  # not a plain tf.data graph (e.g. a stateful source): cannot tell
        return False
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return any("Shuffle" in n.op and n.attr["reshuffle_each_iteration"].b for n in nodes)


def _unwrapped(train_function):
    """Keras's own `train_function` under any BackupAndRestore wrappers left on it."""
    while getattr(train_function, "_tfgpu_original", None) is not None:
        train_function = train_function._tfgpu_original
    return train_function


def _fit_epoch_iterator(model):
    """The `EpochIterator` of the `model.fit` call running now (Keras 3 TF trainer), or None.

    Keras gives callbacks no handle on the data `fit` iterates; its TensorFlow trainer keeps
    it in the local `epoch_iterator` of `fit`, whose `_distributed_dataset` is what each
    epoch's iterator is made from. Found by walking up the call stack from the callback
    hook to that `fit` frame; anything unexpected returns None (the caller then warns).
    """
    try:
        from keras.src.backend.tensorflow.trainer import TFEpochIterator
    except ImportError:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            found = frame.f_locals.get("epoch_iterator")
            if isinstance(found, TFEpochIterator) and hasattr(found, "_distributed_dataset"):
                return found
            return None
        frame = frame.f_back
    return None


def _check_save_freq(save_freq: Any) -> str | int | bool:
    """`"epoch"`, an int >= 1 (NumPy ints too, returned as int) or False; else raises."""
    expected = "'epoch', an int >= 1 (batches between saves), or False (never save)"
    if isinstance(save_freq, str):
        if save_freq == "epoch":
            return save_freq
        raise invalid_value("save_freq", save_freq, expected)
    if isinstance(save_freq, (bool, np.bool_)):
        if not save_freq:
            return False
        raise invalid_value("save_freq", save_freq, expected)
    return check_int("save_freq", save_freq, minimum=1, expected=expected)


def _clear_leftover_initial_epoch(model) -> None:
    """Undoes the `model._initial_epoch` a BackupAndRestore set, if it is still there.

    Keras's `fit` starts at `model._initial_epoch` when set (that is how a restore skips
    the finished epochs). A `fit` that raised before this callback cleared it would make
    every later `fit` of the model skip those epochs too.
    """
    ours = getattr(model, "_tfgpu_initial_epoch", None)
    if ours is not None:
        if getattr(model, "_initial_epoch", None) == ours:
            model._initial_epoch = None
        model._tfgpu_initial_epoch = None


# --------------------------------------------------------------------------- the callback


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the training state and resumes exactly where a killed run stopped.

    A drop-in replacement for `keras.callbacks.BackupAndRestore` with the same arguments.
    Add it to `model.fit(callbacks=[...])`; when a run dies (SIGKILL, preemption, a lost
    worker) start the same script again and `fit` continues from the last backup: the
    model, optimizer, metric and RNG state are restored, the epoch resumes where it was,
    and the batches that epoch had already trained on are drawn from the input and skipped.
    The result equals an uninterrupted run up to float rounding, provided the input
    yields the same batches in the same order for a given epoch.

    Datasets reshuffled every epoch (`tfgpu.data.pipeline(..., seed=S)`,
    `ds.shuffle(n, seed=S, reshuffle_each_iteration=True)`) resume exactly too, including
    `steps_per_epoch` over a `.repeat()`ed dataset: such a dataset gives the k-th iterator
    made from it the k-th order, so on resume the callback first makes (and drops, reading
    nothing) as many iterators of the training dataset as the killed run had made.
    **A seed is required for this**: an unseeded shuffle draws new orders in every process
    (unless a global seed was set with `keras.utils.set_random_seed` before the dataset was
    built), and a parallel map with `deterministic=False` (`tfgpu.data.pipeline`'s default
    on one worker) may swap neighbouring examples; the resumed run then trains on other
    orders than the uninterrupted one would have: correct training, not the same weights.
    See `docs/distributed.md`. Where this Keras
    keeps the training data where tfgpu cannot find it, the callback warns once on resume
    and resumes with the new process's orders.

    Writes are atomic (temporary file, then rename), so a kill during a save leaves the
    previous backup intact. A backup that cannot be resumed from (empty, torn, not a tfgpu
    backup, written by another model) is never deleted: with `double_checkpoint=True` the
    callback warns, moves it to `backup.N.npz` and resumes from the previous backup;
    otherwise `fit` stops before training with an error naming the file and what to do.
    A `fit` that raised can simply be called again, in the same process, with this or a new
    BackupAndRestore: it resumes from the last backup exactly as after a kill (a dataset
    reshuffled each epoch must be built again for that, as a restarted script does; the
    callback warns when it is not). Under `MultiWorkerMirroredStrategy` the chief writes
    `backup_dir`, other workers write `backup_dir/.worker-<k>/`; all workers must see the
    chief's copy (a shared filesystem) or each resumes from its own copy, and they check
    that they resume at the same step. Needs the TensorFlow backend. Logs nothing.

    Args:
        backup_dir: str or path-like, a directory used only by this callback (`~` is
            expanded; created on the first save).
        save_freq: `"epoch"`, int or False. `"epoch"` saves at the end of every epoch; an
            int >= 1 (NumPy ints too) saves every `save_freq` batches (a multiple of
            `steps_per_execution` is best: saves happen between executions); False never
            saves (restore only). Defaults to `"epoch"`.
        double_checkpoint: bool, also keep the previous backup (`backup.prev.npz`) and fall
            back to it if the newest cannot be used. Defaults to False.
        delete_checkpoint: bool, delete the backups when `fit` completes. Defaults to True.

    Raises:
        TypeError: if an argument has the wrong type (`save_freq=2.5`, `backup_dir=123`).
        ValueError: if `backup_dir` is empty, is a file or is under a file, or `save_freq`
            is out of range or unknown (`0`, `"batch"`); at the start of `fit`, if the
            model is unbuilt, two BackupAndRestore callbacks are given, or no backup in
            `backup_dir` can be resumed from (the message names each file and why).

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
    ):
        super().__init__()
        directory = check_dir("backup_dir", backup_dir)
        self.save_freq = _check_save_freq(save_freq)
        check_bool("double_checkpoint", double_checkpoint)
        check_bool("delete_checkpoint", delete_checkpoint)
        self.backup_dir = os.fspath(cast(Path, directory))
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self._reset_run_state()

    # ---------------------------------------------------------------- bookkeeping

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
        self._set_initial_epoch = False
        self._last_call_skipped = False
        self._epoch_iterator = None  # Keras's EpochIterator of this fit, when found
        self._dataset: _CountingDataset | None = None
        self._source = None  # the user's tf.data dataset, when found
        self._source_reused = False  # did an earlier fit with this callback iterate it?

    def _paths(self) -> tuple[Path, Path | None, bool]:
        is_chief, private = _worker_role(self.model.distribute_strategy)
        canonical = Path(self.backup_dir)
        own = canonical / private if private else None
        return canonical, own, is_chief

    # ---------------------------------------------------------------- restore

    def _candidates(self) -> list[Path]:
        canonical, own, _ = self._paths()
        out = [canonical / _FILE]
        if self.double_checkpoint:
            out.append(canonical / _PREV)
        if own is not None:
            out += [own / _FILE] + ([own / _PREV] if self.double_checkpoint else [])
        return out

    def _load(self) -> tuple[dict[str, Any], dict[str, np.ndarray], Path] | None:
        """The newest usable backup, after moving aside (never deleting) damaged newer ones.

        A candidate is usable when it reads completely and matches this model and optimizer.
        Unusable ones before the one resumed from are reported in a warning and, where this
        worker writes, moved to `backup.N.npz` so that later saves and the end-of-fit cleanup
        leave them alone. If no candidate is usable, raises with every file and its problem,
        and touches nothing.
        """
        present = [p for p in self._candidates() if os.path.lexists(p)]
        if not present:
            return None
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            with model.distribute_strategy.scope():
                model.optimizer.build(model.trainable_variables)
        groups = _groups(model)
        problems: list[tuple[Path, str]] = []
        for path in present:
            try:
                meta, arrays = _read(path)
                for group in ("model", "optimizer"):
                    problem = _mismatch(group, meta["paths"][group], groups[group])
                    if problem:
                        raise _Unusable(
                            f"it was written by a different model or optimizer: {problem}"
                        )
            except _Unusable as e:
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
        prev = canonical / _PREV
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
        _clear_leftover_initial_epoch(model)
        self._count_iterators()
        self._wrap_train_function()
        loaded = self._load()
        strategy = model.distribute_strategy
        position = [0, 0] if loaded is None else [loaded[0]["epoch"], loaded[0]["step"]]
        self._check_workers_agree(strategy, position)
        if loaded is None:
            return
        meta, arrays, path = loaded
        groups = _groups(model)
        _assign(groups["model"], arrays, "model")
        _assign(groups["optimizer"], arrays, "optimizer")
        _restore_rng(meta, arrays)
        self._restore_shuffle_state(int(meta.get("iterators", 0)))
        self._epoch = meta["epoch"]
        self._shared_iterator = meta.get("shared_iterator")
        if meta["epoch"] > 0:
            # Keras's `fit` reads this once, right after `on_train_begin`; it is cleared at
            # the first `on_epoch_begin`, so a `fit` that raises later leaves nothing behind.
            model._initial_epoch = meta["epoch"]
            model._tfgpu_initial_epoch = meta["epoch"]
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
        """Puts a `_CountingDataset` between this `fit` and its training dataset."""
        epoch_iterator = _fit_epoch_iterator(self.model)
        if epoch_iterator is None:
            return
        dataset = epoch_iterator._distributed_dataset
        if not isinstance(dataset, _CountingDataset):
            dataset = _CountingDataset(dataset)
            epoch_iterator._distributed_dataset = dataset
        self._epoch_iterator, self._dataset = epoch_iterator, dataset
        # The user's tf.data dataset: one that an earlier `fit` in this process iterated
        # has already given out its first shuffle orders (see _restore_shuffle_state).
        source: Any = getattr(getattr(epoch_iterator, "data_adapter", None), "_dataset", None)
        if hasattr(source, "_as_serialized_graph"):
            self._source_reused = bool(getattr(source, "_tfgpu_fitted", False))
            with contextlib.suppress(AttributeError):
                source._tfgpu_fitted = True
            self._source = source

    def _restore_shuffle_state(self, iterators: int) -> None:
        if self._source_reused and _reshuffles(self._source):
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
        """The iterator Keras will use for the next epoch if it is already made, else None.

        With `steps_per_epoch`, Keras keeps one iterator across epochs (or, over a finite
        dataset, makes the next one at the end of the epoch and uses it); without, every
        epoch starts with a new one.
        """
        epoch_iterator = self._epoch_iterator
        if epoch_iterator is None or not getattr(epoch_iterator, "steps_per_epoch", None):
            return None
        return getattr(epoch_iterator, "_current_iterator", None)

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
            _clear_leftover_initial_epoch(self.model)
            self._set_initial_epoch = False
        self._epoch = epoch
        self._steps_in_epoch = 0
        pending = self._pending
        if pending and pending["metrics"] is not None:
            saved_paths, arrays = pending["metrics"]
            _assign_metrics(_groups(self.model)["metrics"], saved_paths, arrays)
            pending["metrics"] = None

    # ---------------------------------------------------------------- the skip

    def _wrap_train_function(self) -> None:
        """Puts the skip of already-trained batches in front of Keras's `train_function`.

        A `fit` that raised never reaches `on_train_end`, so its wrapper is still on the
        model: it is taken off here (whichever BackupAndRestore made it) before wrapping
        again, and it steps aside by itself in a later `fit` that is not its own.
        """
        model = self.model
        current = model.train_function
        if current is None:
            return
        owner = getattr(current, "_tfgpu_backup", None)
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
        original = _unwrapped(current)
        spe = int(getattr(model, "steps_per_execution", 1) or 1)

        def train_function(iterator):
            if iterator is not self._iterator:
                if (
                    self._epoch_iterator is not None
                    and _fit_epoch_iterator(model) is not self._epoch_iterator
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

        train_function._tfgpu_backup = self  # type: ignore[attr-defined]  # marks our wrapper
        train_function._tfgpu_original = original  # type: ignore[attr-defined]
        self._original_train_function = original
        model.train_function = train_function

    # ---------------------------------------------------------------- save

    def on_train_batch_end(self, batch, logs=None):
        done = batch + 1
        if self._last_call_skipped:  # a batch trained before the kill: nothing new to save
            self._steps_in_epoch = done
            return
        self._since_save += done - self._steps_in_epoch
        self._steps_in_epoch = done
        self._last_logs = _pythonify(logs)
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
        meta, arrays = _collect_state(self.model)
        meta.update(
            epoch=epoch,
            step=step,
            position=position,
            shared_iterator=self._shared_iterator,
            iterators=iterators,
            logs=self._last_logs,
        )
        arrays[_META] = np.asarray(json.dumps(meta))
        canonical, own, is_chief = self._paths()
        directory = canonical if is_chief else own
        if directory is None:  # _worker_role names a private directory for every non-chief
            raise AssertionError("tfgpu BackupAndRestore: a non-chief worker has no directory")
        _write_atomic(directory, arrays, self.double_checkpoint)

    def on_train_end(self, logs=None):
        if self._original_train_function is not None:
            if getattr(self.model.train_function, "_tfgpu_backup", None) is self:
                self.model.train_function = self._original_train_function
            self._original_train_function = None
        if self._set_initial_epoch:
            _clear_leftover_initial_epoch(self.model)
            self._set_initial_epoch = False
        if self._epoch_iterator is not None and self._dataset is not None:
            self._epoch_iterator._distributed_dataset = self._dataset._dataset
        self._epoch_iterator = self._dataset = None
        if not self.delete_checkpoint:
            return
        _delete_backups(*self._paths())
