"""Run-directory files that never lose what an earlier run wrote: appended to, rotated to the
first free `NAME.N.SUFFIX` or refused, never truncated; JSON replaced atomically (the promise:
docs/guarantees.md). `tfgpu.monitor` uses it: no TensorFlow, no Keras.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

EARLIER_SESSIONS = "earlier_sessions"


def free_name(path: Path) -> Path:
    """The first `STEM.N.SUFFIX` beside `path` (N = 1, 2, ...) that does not exist.

    Example:

    >>> free_name(Path("/nonexistent/timeline.csv"))
    PosixPath('/nonexistent/timeline.1.csv')
    """
    n = 1
    while True:
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
        if not candidate.exists():
            return candidate
        n += 1


def rotate(path: Path) -> Path | None:
    """Moves an existing `path` aside to `free_name(path)`; returns where it went (or None)."""
    if not path.exists():
        return None
    target = free_name(path)
    os.replace(path, target)
    return target


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Writes `text` (or bytes) to `path` through a temporary file and a rename (atomic on
    POSIX)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    replaced = False
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
        replaced = True
    finally:
        if not replaced:  # whatever stopped it, Ctrl-C included: no temporary file is left
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read_json_object(path: Path) -> dict[str, Any]:
    """Reads a JSON object from `path`: OSError if unreadable, ValueError naming the file if
    it is not UTF-8 JSON or not an object."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def add_session(path: Path, info: dict[str, Any]) -> None:
    """Writes `info` as the newest session of the record at `path` (e.g. `run.json`), the
    earlier ones kept under `"earlier_sessions"`; a file that is not a JSON object is rotated
    aside first."""
    earlier: list[Any] = []
    if path.exists():
        try:
            previous = read_json_object(path)
        except (OSError, ValueError):
            rotate(path)
        else:
            earlier = list(previous.pop(EARLIER_SESSIONS, None) or [])
            earlier.append(previous)
    record = dict(info)
    if earlier:
        record[EARLIER_SESSIONS] = earlier
    write_text_atomic(path, json.dumps(record, indent=2, default=str) + "\n")
