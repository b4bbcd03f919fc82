"""tfgpu._internal.helpers.progress: the `verbose=` lines of long calls, on a scripted clock and a StringIO."""

from __future__ import annotations

import io
import re
import sys

import numpy as np
import pytest

from tfgpu._internal.helpers.progress import (
    Progress,
    check_verbose,
    format_seconds,
    resolve_verbose,
)

_ANSI = re.compile(r"\x1b\[|[\x00-\x08\x0b-\x1f]")  # escape sequences, \r, \b, ... (not \n)


class _Clock:
    """A scripted clock: `t` is what it reads."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_verbose_2_writes_one_plain_line_per_phase_with_the_time_left():
    clock, out = _Clock(), io.StringIO()
    progress = Progress(2, title="diagnose", budget_s=60.0, stream=out, clock=clock)
    clock.t += 19.4
    progress.phase("timing the real data (round 3)")
    clock.t += 100.0  # past the budget
    progress.phase("counting FLOPs")
    progress.done("bottleneck: input")
    progress.done("again")  # a second done writes nothing
    progress.phase("late")  # nor does a phase after it
    assert out.getvalue().splitlines() == [
        "diagnose: timing the real data (round 3) \u00b7 41 s left",
        "diagnose: counting FLOPs \u00b7 budget spent",
        "diagnose: done in 1 min 59 s \u00b7 bottleneck: input",
    ]
    assert not _ANSI.search(out.getvalue())


def test_without_a_budget_the_lines_say_the_time_so_far():
    clock, out = _Clock(), io.StringIO()
    progress = Progress(2, title="find_batch_size", stream=out, clock=clock)
    clock.t += 3.0
    progress.phase("trial 1: batch 8")
    progress.done()
    assert out.getvalue() == (
        "find_batch_size: trial 1: batch 8 \u00b7 3 s so far\nfind_batch_size: done in 3 s\n"
    )


def test_verbose_1_rewrites_one_line_in_place_and_ends_it():
    clock, out = _Clock(), io.StringIO()
    progress = Progress(1, title="tune", budget_s=60.0, stream=out, clock=clock)
    progress.phase("a long phase name")
    progress.phase("short")
    progress.done()
    text = out.getvalue()
    assert "\x1b" not in text and "\b" not in text  # no ANSI, no backspaces: a notebook shows it
    parts = text.split("\r")[1:]
    assert [p.rstrip(" \n") for p in parts] == [
        "tune: a long phase name \u00b7 1 min 00 s left",
        "tune: short \u00b7 1 min 00 s left",
        "tune: done in 0.0 s",
    ]
    assert len(parts[1]) == len(parts[0])  # the shorter line is padded over the longer one
    assert text.endswith("\n") and text.count("\n") == 1


def test_verbose_0_writes_nothing():
    out = io.StringIO()
    progress = Progress(0, title="diagnose", budget_s=60.0, stream=out, clock=_Clock())
    progress.phase("warming")
    progress.done("x")
    assert out.getvalue() == ""


def test_auto_is_1_on_a_terminal_and_2_on_a_file():
    assert Progress("auto", title="t", stream=_TTY()).verbose == 1
    assert Progress("auto", title="t", stream=io.StringIO()).verbose == 2
    assert resolve_verbose(0, _TTY()) == 0


def test_auto_is_1_in_an_ipython_kernel(monkeypatch):
    class Shell:
        kernel = object()

    class FakeIPython:
        @staticmethod
        def get_ipython():
            return Shell()

    monkeypatch.setitem(sys.modules, "IPython", FakeIPython)
    assert resolve_verbose("auto", io.StringIO()) == 1


def test_auto_is_2_when_keras_interactive_logging_is_off():
    import keras

    keras.config.disable_interactive_logging()
    try:
        assert resolve_verbose("auto", _TTY()) == 2  # one line per phase, as Keras logs
        assert resolve_verbose(1, _TTY()) == 1  # an explicit mode is kept
    finally:
        keras.config.enable_interactive_logging()
    assert resolve_verbose("auto", _TTY()) == 1


def test_the_default_stream_is_stdout(capsys):
    progress = Progress(2, title="diagnose", clock=_Clock())
    progress.phase("warming")
    assert capsys.readouterr().out == "diagnose: warming \u00b7 0.0 s so far\n"


def test_a_closed_or_ascii_stream_never_raises():
    closed = io.StringIO()
    closed.close()
    progress = Progress(2, title="diagnose", stream=closed, clock=_Clock())
    progress.phase("warming")
    progress.done()

    raw = io.BytesIO()
    ascii_stream = io.TextIOWrapper(raw, encoding="ascii")
    progress = Progress(2, title="diagnose", budget_s=10.0, stream=ascii_stream, clock=_Clock())
    progress.phase("warming")
    assert raw.getvalue() == b"diagnose: warming - 10 s left\n"


def test_a_broken_clock_never_raises():
    def clock():
        raise RuntimeError("no clock")

    out = io.StringIO()
    progress = Progress(2, title="diagnose", budget_s=10.0, stream=out, clock=clock)
    progress.phase("warming")
    assert out.getvalue() == "diagnose: warming \u00b7 ? left\n"


def test_a_line_wider_than_the_terminal_is_cut(monkeypatch):
    import os

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((20, 10)))

    class Terminal(_TTY):
        def fileno(self) -> int:
            return 1

    out = Terminal()
    Progress(1, title="diagnose", stream=out, clock=_Clock()).phase("a" * 40)
    (line,) = out.getvalue().split("\r")[1:]
    assert len(line) == 19 and line.endswith("\u2026")


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (0, 0), (2, 2), (np.int64(1), 1)])
def test_check_verbose_accepts_what_keras_takes(value, expected):
    assert check_verbose(value) == expected
    assert type(check_verbose(value)) is type(expected)


@pytest.mark.parametrize(
    "value, error",
    [
        ("loud", ValueError),
        (3, ValueError),
        (-1, ValueError),
        (True, TypeError),
        (1.0, TypeError),
        (None, TypeError),
    ],
)
def test_check_verbose_refuses_the_rest_keras_style(value, error):
    with pytest.raises(error, match=r"argument `verbose`. Received: verbose=.* one of 'auto'"):
        check_verbose(value)
    with pytest.raises(error, match="`verbose`"):
        Progress(value, title="t")


@pytest.mark.parametrize(
    "seconds, text",
    [(0.42, "0.4 s"), (1.0, "1 s"), (41.4, "41 s"), (125, "2 min 05 s"), (3725, "1 h 02 min")],
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text
