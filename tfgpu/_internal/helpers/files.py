"""Run-directory files that never lose what an earlier run wrote: appended to, rotated to the
first free `NAME.N.SUFFIX` or refused, never truncated (docs/guarantees.md). No TensorFlow."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.checks import check_dir, invalid_value
from tfgpu._internal.helpers.warn import one_line, warn_at_user_code

EARLIER_SESSIONS = "earlier_sessions"


def free_name(path: Path) -> Path:
    """The first `STEM.N.SUFFIX` beside `path` (N = 1, 2, ...) that does not exist."""
    candidates = (path.with_name(f"{path.stem}.{n}{path.suffix}") for n in itertools.count(1))
    return next(c for c in candidates if not c.exists())


def rotate(path: Path) -> Path | None:
    """Moves an existing `path` aside to `free_name(path)`; returns where it went (or None)."""
    if not path.exists():
        return None
    target = free_name(path)
    os.replace(path, target)
    return target


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Writes `text` (or bytes) to `path` through a temporary file and a rename (atomic)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:  # whatever stopped it, Ctrl-C included: no temporary file is left
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_result(
    log_dir: Path,
    who: str,
    record: dict[str, Any],
    json_name: str,
    plot: Any = None,
    png_name: str = "",
) -> None:
    """Writes `record` as `json_name` into `log_dir`, then `plot(path)` (if any) draws `png_name`
    (older ones rotated aside); a failure is a warning naming `who`: the result returns anyway."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / json_name
        rotate(path)
        write_text_atomic(path, json.dumps(record, indent=2))
    except OSError as e:
        warn_at_user_code(f"{who}: {json_name} not written to {log_dir}: {one_line(e)}")
        return
    if plot is None:
        return
    try:
        png = log_dir / png_name
        rotate(png)
        plot(png)
    except Exception as e:  # the plot is a side feature: the JSON is written, the result returned
        warn_at_user_code(f"{who}: {png_name} not written to {log_dir}: {one_line(e)}")


def read_json_object(path: Path) -> dict[str, Any]:
    """Reads a JSON object from `path`: OSError if unreadable, ValueError naming the file if
    it is not UTF-8 JSON, not an object, or beyond what Python reads (an integer of more than
    4,300 digits, arrays nested thousands deep)."""
    raw = path.read_bytes()
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def add_session(path: Path, info: dict[str, Any]) -> None:
    """Writes `info` as the newest session of the record at `path` (`run.json`), the earlier ones
    under `"earlier_sessions"`; a file that is not a JSON object is rotated aside first."""
    earlier: list[Any] = []
    if path.exists():
        try:
            previous = read_json_object(path)
        except (OSError, ValueError):
            rotate(path)
        else:
            earlier = [*(previous.pop(EARLIER_SESSIONS, None) or []), previous]
    record = {**info, EARLIER_SESSIONS: earlier} if earlier else dict(info)
    write_text_atomic(path, json.dumps(record, indent=2, default=str) + "\n")


def _can_continue(path: Path, header: bytes) -> bool:
    """Whether the CSV at `path` can be appended to: empty, or same header and last row complete.
    Reads bytes, so a damaged (binary) file is a "no", never an exception but `OSError`."""
    with open(path, "rb") as f:
        first = f.readline()
        if not first:
            return True
        if first != header:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def open_csv(path: Path, header: str) -> tuple[Any, Path | None]:
    """Opens `path` to append (`header`, newline included, written if new), after moving aside a
    file it cannot continue; returns it and where that file went."""
    rotated = rotate(path) if path.exists() and not _can_continue(path, header.encode()) else None
    with contextlib.ExitStack() as on_error:
        f = on_error.enter_context(open(path, "a", encoding="utf-8"))
        if f.tell() == 0:
            f.write(header)
            f.flush()
        on_error.pop_all()  # written: the caller closes it
    return f, rotated


class RunCsv:
    """A run directory's CSV file that a side feature appends rows to while training runs
    (`timeline.csv`, `steps.csv`), flushed at each write. Opened as `open_csv` opens it
    (`rotated`: where an old file it could not continue went); OSError or ValueError there.

    Once open, `write` never raises. A write that fails (a full disk) closes it, logged once
    (`who`: the writer, `name`: the file, `kept`: what becomes of the rows). A file removed
    under it (its run directory deleted mid-fit) is started again at its path with `restart()`
    first (the rows the writer still holds; it may write what else the directory lost),
    logged once; if that fails, as a failed write.
    """

    def __init__(
        self,
        path: Path,
        header: str,
        *,
        log: logging.Logger,
        who: str,
        name: str,
        kept: str,
        restart: Callable[[], str] | None = None,
    ):
        self.path, self.header, self.log = path, header, log
        self.who, self.name, self.kept, self.restart = who, name, kept, restart
        self.file: Any
        self.file, self.rotated = open_csv(path, header)
        self._restarted = False

    def write(self, text: str) -> None:
        """Appends `text` (whole rows) and flushes; never raises (see the class)."""
        if self.file is None:
            return
        try:
            if self._removed():
                self._start_again()
            self.file.write(text)
            self.file.flush()
        except (OSError, ValueError) as e:
            self.log.warning("%s: writing %s failed (%s); %s.", self.who, self.name, e, self.kept)
            self.close()

    def close(self) -> None:
        """Closes the file (idempotent); nothing is written after."""
        if self.file is not None:
            with contextlib.suppress(OSError, ValueError):
                self.file.close()
            self.file = None

    def _removed(self) -> bool:
        """Whether the path no longer names the open file (removed, or replaced)."""
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(self.file.fileno())
        return (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino)

    def _start_again(self) -> None:
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file, _ = open_csv(self.path, self.header)
        earlier = self.restart() if self.restart is not None else ""
        self.file.write(earlier)
        if not self._restarted:
            self._restarted = True
            rows = earlier.count("\n")
            kept = (
                f"with the {rows} row(s) this run still held"
                if self.restart is not None
                else "the rows written before went with it"
            )
            self.log.warning(
                "%s: %s was removed during the run (its run directory deleted?); it is started "
                "again there, %s. (Logged once.)",
                self.who,
                self.path,
                kept,
            )


def writable_dir(log_dir: Any, argument: str = "log_dir") -> Path:
    """Checks a run directory, creates it if needed and proves it writable (else ValueError)."""
    path = check_dir(argument, log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".tfgpu-write-test-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise invalid_value(
            argument,
            str(log_dir),
            f"a directory this process can create and write to "
            f"({type(e).__name__}: {e.strerror or e})",
        ) from e
    return path


def new_run_dir(name: str) -> Path:
    """`runs/<name>-<YYYYmmdd-HHMMSS>` in the working directory, or `...-2`, `-3`, ... when
    that exists already (two runs in one second): a default run directory never reuses one."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path
