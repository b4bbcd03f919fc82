"""The file cache: its argument checked, a dataset cached, leftovers of a killed pass removed."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tensorflow as tf

from tfgpu._internal.helpers.checks import invalid_type, invalid_value
from tfgpu._internal.helpers.warn import warn_at_user_code


def check_cache(cache: Any) -> tuple[Any, str | None]:
    """Checks `cache`; returns it (a file prefix user-expanded) and the prefix's directory."""
    expected = "'auto', True or 'memory' (in memory), a file path prefix (on disk), or False"
    if cache is None or isinstance(cache, bool) or cache in ("auto", "memory"):
        return cache, None
    if not isinstance(cache, (str, os.PathLike)) or isinstance(os.fspath(cache), bytes):
        raise invalid_type("cache", cache, expected)
    text = os.fspath(cache)
    if not text.strip():
        raise invalid_value("cache", cache, expected)
    prefix = os.path.expanduser(text)

    def refused(expected: str, received: str) -> ValueError:
        return invalid_value("cache", cache, expected, received=f"cache={text!r}, {received}")

    if prefix.endswith(os.sep) or os.path.isdir(prefix):
        example = os.path.join(prefix, "train-cache")
        raise refused(
            f"a file path prefix inside a directory, e.g. {example!r} (TensorFlow writes "
            "PREFIX.index and PREFIX.data-*)",
            "which is a directory",
        )
    directory = os.path.dirname(os.path.abspath(prefix))
    for parent in (directory, *(str(p) for p in Path(directory).parents)):
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise refused("a path prefix in a directory", f"which is under the file {parent!r}")
    if not os.path.isdir(directory):
        raise refused(
            "a path prefix in an existing directory",
            f"but the directory {directory} does not exist",
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise refused(
            "a path prefix in a directory this process can write to",
            f"but the directory {directory} is not writable",
        )
    return prefix, directory


def cached(ds: tf.data.Dataset, cache: str | None) -> tf.data.Dataset:
    """`ds` cached as the plan says: not at all (None), in memory, or at a file prefix."""
    if cache == "memory":
        return ds.cache()
    if cache:
        _remove_interrupted_cache(cache)
        return ds.cache(cache)
    return ds


# File cache prefixes this process has built pipelines on: their leftovers may belong to an
# iterator still alive here, so they are not removed.
_FILE_CACHES_IN_USE: set[str] = set()


def _interrupted_cache_files(prefix: str) -> list[str]:
    """Leftovers of a file cache whose first pass was killed ([] when complete): tf.data writes
    `*.tempstate*` files under `<prefix>_<n>.lockfile` and makes `<prefix>.index` only at the
    end of a full pass; a leftover lockfile fails the next run with `AlreadyExistsError`."""
    if os.path.exists(f"{prefix}.index"):
        return []
    directory, base = os.path.split(prefix)
    leftover = re.compile(
        rf"^{re.escape(base)}"
        r"(?:_\d+\.lockfile|(?:_\d+)?\.(?:index|data-\d+-of-\d+)\.tempstate\d*)$"
    )
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if leftover.match(n))


def _remove_interrupted_cache(prefix: str) -> None:
    """Removes the lockfile and temporary files an interrupted cache write left, with a warning."""
    key = os.path.abspath(prefix)
    in_use = key in _FILE_CACHES_IN_USE
    _FILE_CACHES_IN_USE.add(key)
    stale = _interrupted_cache_files(prefix)
    if not stale or in_use:
        return
    failed = []
    for path in stale:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            failed.append(f"{path} ({e.strerror})")
    message = (
        f"tfgpu.data.pipeline: the file cache at {prefix!r} has no completed "
        f"{os.path.basename(prefix)}.index, so an earlier first pass was interrupted; removed "
        f"its leftovers: {', '.join(os.path.basename(p) for p in stale)}. The cache is written "
        "again on the next full pass."
    )
    if failed:
        message += f" Could not remove: {', '.join(failed)}."
    warn_at_user_code(message)
