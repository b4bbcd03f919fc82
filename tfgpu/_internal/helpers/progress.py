"""Progress lines of long calls (`verbose` as `fit`'s: docs/diagnosis.md, "Knobs"), each with the
call, the phase and the time left: ``diagnose: timing the real data · 41 s left``."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tfgpu._internal.helpers.checks import invalid_type, invalid_value, is_int

_VALID = "one of 'auto', 0 (silent), 1 (one line rewritten in place) or 2 (one line per phase)"

_DOT = "\u00b7"  # the separator between the phase and the time: "·"

# What asking a stream about itself raises: no such method (AttributeError), a closed or
# detached stream (ValueError), no file descriptor or no terminal (OSError).
_STREAM_ERRORS = (AttributeError, OSError, ValueError)


def check_verbose(verbose: Any) -> int | str:
    """Checks a `verbose` argument as Keras takes it: `"auto"`, 0, 1 or 2; returns it."""
    if isinstance(verbose, str):
        if verbose == "auto":
            return verbose
        raise invalid_value("verbose", verbose, _VALID)
    if not is_int(verbose):
        raise invalid_type("verbose", verbose, _VALID)
    if int(verbose) not in (0, 1, 2):
        raise invalid_value("verbose", verbose, _VALID)
    return int(verbose)


def in_ipython_kernel() -> bool:
    """Whether this code runs in an IPython kernel (Jupyter, Colab), whose stream is no TTY."""
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)  # None: not imported
    return get_ipython is not None and getattr(get_ipython(), "kernel", None) is not None


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except _STREAM_ERRORS:
        return False


def resolve_verbose(verbose: int | str, stream: Any = None) -> int:
    """The mode a checked `verbose` means for `stream` (`sys.stdout` when None): `"auto"` is 1
    on a terminal or in an IPython kernel, else 2 (also when Keras's interactive logging is off)."""
    if verbose != "auto":
        return int(verbose)
    keras = sys.modules.get("keras")
    try:
        interactive = keras is None or bool(keras.config.is_interactive_logging_enabled())
    except AttributeError:  # an odd Keras: keep the default
        interactive = True
    if not interactive:
        return 2
    return 1 if _is_tty(sys.stdout if stream is None else stream) or in_ipython_kernel() else 2


def format_seconds(seconds: float) -> str:
    """A duration as a person reads it: "0.4 s", "41 s", "2 min 05 s", "1 h 02 min"."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 0.95:
        return f"{seconds:.1f} s"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60:02d} s"
    return f"{total // 3600} h {total % 3600 // 60:02d} min"


class Progress:
    """A line per phase, then a summary (``diagnose: done in 19 s · bottleneck: input``), each with
    the time left of `budget_s` on `clock` (None: the time so far); `stream` None: `sys.stdout`."""

    def __init__(
        self,
        verbose: int | str,
        *,
        title: str,
        budget_s: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.verbose = resolve_verbose(check_verbose(verbose), stream)
        self.title = title
        self.budget_s = budget_s
        self._stream = stream
        self._clock = clock
        self._width = 0  # the length of the line now shown in place (verbose=1)
        self._done = False
        self._start = self._now()

    def _now(self) -> float:
        try:
            return float(self._clock())
        except (OSError, RuntimeError, TypeError, ValueError):  # a broken clock: no time
            return math.nan

    def elapsed(self) -> float:
        """Seconds since the progress started (on its clock)."""
        return self._now() - self._start

    def phase(self, text: str) -> None:
        """Shows a new phase: "timing the real data, round 3 of at most 12"."""
        if not self.verbose or self._done:
            return
        if self.budget_s is None:
            timing = f"{format_seconds(self.elapsed())} so far"
        else:
            left = self.budget_s - self.elapsed()
            timing = "budget spent" if left <= 0 else f"{format_seconds(left)} left"
        self._show(f"{self.title}: {text} {_DOT} {timing}", final=False)

    def done(self, text: str = "") -> None:
        """Ends the progress with one summary line ("done in 41 s · `text`"), once."""
        if self.verbose and not self._done:
            line = f"{self.title}: done in {format_seconds(self.elapsed())}"
            self._show(f"{line} {_DOT} {text}" if text else line, final=True)
        self._done = True

    def _show(self, line: str, *, final: bool) -> None:
        stream = sys.stdout if self._stream is None else self._stream
        if self.verbose == 1:
            columns = None  # a notebook wraps lines itself and redraws them whole
            if _is_tty(stream):
                with contextlib.suppress(*_STREAM_ERRORS):
                    columns = os.get_terminal_size(stream.fileno()).columns
            if columns and len(line) >= columns:  # a wrapped line cannot be rewritten
                line = line[: columns - 2] + "\u2026"
            text = "\r" + line.ljust(self._width) + ("\n" if final else "")
            self._width = len(line)
        else:
            text = line + "\n"
        _write(stream, text)


def _write(stream: Any, text: str) -> None:
    """Writes and flushes; a stream that cannot take the text is ignored (never raises)."""
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:  # a stream that takes ASCII only
            plain = text.replace(_DOT, "-").replace("\u2026", "...")
            stream.write(plain.encode("ascii", "replace").decode("ascii"))
        stream.flush()
    except Exception:  # the module's one catch-all: a closed, detached or broken stream, or
        pass  # any error of the user's own stream; progress is a side feature, never fatal
