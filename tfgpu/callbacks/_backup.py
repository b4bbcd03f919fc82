"""`BackupAndRestore`'s backup file and saved state (docs/distributed.md); `CountingDataset`."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard, cast

import keras
import numpy as np

from tfgpu._internal.adapters import keras_internals
from tfgpu._internal.helpers.checks import is_int, is_number

_FORMAT = 1
FILE = "backup.npz"
PREV = "backup.prev.npz"
META = "__meta__"


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
    """Opens `path` for writing, making its directories again if a peer removed `backup_dir`."""
    for _ in range(attempts - 1):
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            return open(path, "wb")
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")  # the last attempt raises


def delete_backups(canonical: Path, own: Path | None, is_chief: bool) -> None:
    """Removes this worker's directory (the chief: the canonical files and a killed save's
    temporary ones), then `canonical` if empty; tolerates what peers removed meanwhile."""
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)
    if is_chief:
        try:
            names = os.listdir(canonical)
        except (FileNotFoundError, NotADirectoryError):  # gone already (a peer removed it)
            names = []
        for name in names:
            if name in (FILE, PREV) or name.startswith((f".{FILE}.tmp-", f".{PREV}.tmp-")):
                with contextlib.suppress(FileNotFoundError):
                    (canonical / name).unlink()
    with contextlib.suppress(OSError):
        canonical.rmdir()  # only if empty: other workers may still be cleaning up


def write_atomic(directory: Path, arrays: dict[str, np.ndarray], keep_previous: bool) -> Path:
    """Writes `arrays` to a flushed temporary file renamed over `directory/backup.npz`; with
    `keep_previous` the old one first becomes `backup.prev.npz`: one complete backup always.
    A save that fails (a full disk) leaves no temporary file and raises an OSError naming the
    backup; the one before it is intact."""
    target = directory / FILE
    tmp = directory / f".{FILE}.tmp-{os.getpid()}"
    prev_tmp = directory / f".{PREV}.tmp-{os.getpid()}"
    try:
        with _create(tmp) as f:
            np.savez(f, allow_pickle=True, **arrays)  # numpy's default, named for the stubs
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and target.exists():
            prev_tmp.unlink(missing_ok=True)
            try:
                os.link(target, prev_tmp)
            except OSError:
                shutil.copyfile(target, prev_tmp)
            _replace(prev_tmp, directory / PREV)
        _replace(tmp, target)
    except BaseException as e:  # whatever stopped it, Ctrl-C included: no temporary file left
        for left in (tmp, prev_tmp):
            with contextlib.suppress(OSError):
                left.unlink()
        if not isinstance(e, OSError):
            raise
        raise OSError(
            e.errno,
            f"{e.strerror or e}: BackupAndRestore could not save the backup {str(target)!r} "
            "(the previous backup, if any, is intact and training can resume from it; "
            "nothing of the failed save is left)",
        ) from e
    _fsync_dir(directory)
    return target


class Unusable(Exception):
    """A backup file that cannot be resumed from; `str()` says why (no path)."""


def read_backup(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads one backup file; raises `Unusable` saying why if it is unreadable or torn."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise Unusable("it is a single NumPy array, not a backup archive")
            arrays = {k: data[k] for k in data.files}
    except Unusable:
        raise
    except Exception as e:  # damage raises anything (EOFError, BadZipFile, zlib.error...): alike
        raise Unusable(f"it cannot be read as a backup archive ({type(e).__name__}: {e})") from None
    if META not in arrays:
        raise Unusable(f"it has no {META!r} record (not a tfgpu backup, or a torn one)")
    try:
        meta = json.loads(str(arrays.pop(META)))
    except (TypeError, ValueError) as e:
        raise Unusable(f"its {META!r} record is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise Unusable(f"unknown backup format {found!r} (expected {_FORMAT})")
    problem = _malformed(meta, arrays)
    if problem:
        raise Unusable(problem)
    return meta, arrays


def _is_count(value: Any) -> bool:
    return is_int(value) and value >= 0


def _is_list(value: Any, length: int) -> TypeGuard[list[Any]]:
    return isinstance(value, list) and len(value) == length


def _malformed(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str | None:
    """What is missing or inconsistent in a backup's record and arrays, or None if complete."""
    for key, default in (("epoch", None), ("step", None), ("position", None), ("iterators", 0)):
        if not _is_count(meta.get(key, default)):
            return f"its record has {key}={meta.get(key)!r}, expected an int >= 0"
    paths = meta.get("paths")
    if not isinstance(paths, dict):
        return "its record lists no variables"
    for group in ("model", "optimizer", "metrics"):
        saved = paths.get(group)
        if not isinstance(saved, list):
            return f"its record lists no {group} variables"
        for i, entry in enumerate(saved):
            if not (
                _is_list(entry, 2)
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
        _is_list(numpy_rng, 4)
        and isinstance(numpy_rng[0], str)
        and all(map(is_number, numpy_rng[1:]))
    ):
        return "its NumPy random state is malformed"
    if not (
        _is_list(python_rng, 3)
        and is_int(python_rng[0])
        and _is_list(python_rng[1], len(random.getstate()[1]))
        and all(map(is_int, python_rng[1]))
    ):
        return "its Python random state is malformed"
    if not isinstance(meta.get("logs", {}), dict):
        return "its record of the last batch logs is malformed"
    return None


def variable_groups(model) -> dict[str, list]:
    optimizer = getattr(model, "optimizer", None)
    return {
        "model": list(model.variables),
        "optimizer": list(optimizer.variables) if optimizer is not None else [],
        "metrics": list(model.metrics_variables),
    }


def _to_numpy(variable) -> np.ndarray:
    """A variable's value as a NumPy array (through `tf.Variable.numpy()` where there is one:
    NumPy 2's `np.array(tf_variable)` warns that TensorFlow's `__array__` lacks `copy=`)."""
    value = getattr(variable, "value", variable)
    if hasattr(value, "numpy"):
        return np.asarray(value.numpy())
    return np.asarray(keras.ops.convert_to_numpy(variable))


def collect_state(model) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads every piece of training state into NumPy arrays plus a JSON-able description."""
    groups = variable_groups(model)
    arrays = {f"{g}/{i:05d}": _to_numpy(v) for g, vs in groups.items() for i, v in enumerate(vs)}
    paths = {group: [[v.path, list(v.shape)] for v in vs] for group, vs in groups.items()}
    seed = keras_internals.global_seed_generator()
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


def mismatch(group: str, saved: list, variables: list) -> str | None:
    if len(saved) != len(variables):
        return f"{len(saved)} {group} variables in the backup, {len(variables)} in this model"
    for i, ((path, shape), v) in enumerate(zip(saved, variables)):
        if list(shape) != list(v.shape):
            return (
                f"{group} variable {i} is {path!r} with shape {tuple(shape)} in the backup, "
                f"{v.path!r} with shape {tuple(v.shape)} here"
            )
    return None


def assign(variables: list, arrays: dict[str, np.ndarray], group: str) -> None:
    for i, v in enumerate(variables):
        v.assign(arrays[f"{group}/{i:05d}"])


def assign_metrics(variables: list, saved: list, arrays: dict[str, np.ndarray]) -> None:
    """Restores metric accumulators by position, or by path for those built so far (without a
    strategy, compiled metrics are built at the first step: the others restart from zero)."""
    if mismatch("metrics", saved, variables) is None:
        assign(variables, arrays, "metrics")
        return
    by_path: dict[str, int] = {}
    for i, (path, _) in enumerate(saved):
        by_path[path] = -1 if path in by_path else i
    for v in variables:
        i = by_path.get(v.path, -1)
        if i >= 0 and list(saved[i][1]) == list(v.shape):
            v.assign(arrays[f"metrics/{i:05d}"])


def restore_rng(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    if "rng/keras_global" in arrays:
        keras_internals.global_seed_generator(create=True).state.assign(arrays["rng/keras_global"])
    name, pos, has_gauss, cached = meta["numpy_rng"]
    np.random.set_state((name, arrays["rng/numpy_keys"], pos, has_gauss, cached))
    version, internal, gauss = meta["python_rng"]
    random.setstate((version, tuple(internal), gauss))


def pythonify(logs: dict | None) -> dict[str, float]:
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(np.asarray(keras.ops.convert_to_numpy(v)))
        except (TypeError, ValueError):
            continue
    return out


def worker_role(strategy) -> tuple[bool, str | None]:
    """(is_chief, name of this worker's private directory or None) for `strategy`."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    ):
        resolver = strategy.cluster_resolver
        name = f".{resolver.task_type}-{resolver.task_id}"
        return bool(strategy.extended.should_checkpoint), name
    return True, None


class CountingDataset:
    """Stands in for the dataset Keras's `fit` iterates and counts the iterators made from it
    (a reshuffled dataset gives the k-th the k-th order); after `skip_to(n)` the next one is
    the n-th, the missing ones made and dropped. Everything else goes to the dataset."""

    def __init__(self, dataset):
        self._dataset = dataset
        self.created = 0
        self._skip_to = 0
        self._made: list[tuple[Callable[[], Any], int]] = []

    def skip_to(self, n: int) -> None:
        self._skip_to = max(0, int(n))

    def index_of(self, iterator) -> int | None:
        """The creation index of `iterator` (0 for the first made here), or None if unknown."""
        return next((index for ref, index in self._made if ref() is iterator), None)

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
