"""The processes tfgpu runs in and starts: TensorFlow's C++ start-up log held back, Python children
run whole, children that never outlive their parent (docs/guarantees.md). No TensorFlow."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

# What TensorFlow's C++ writes at every start: absl's preamble, INFO lines and the errors of a
# machine without a usable driver (`tfgpu env` explains them); warnings and other errors pass.
_STARTUP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|I\d{4} [\d:.]+\s+\d+ \S+:\d+\] "
    r"|E\d{4} [\d:.]+\s+\d+ \S+:\d+\] (failed call to cuInit|Unable to register cu\w+ factory)"
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate)"
)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_WATCH_INTERVAL_S = 1.0  # how often a child without Linux's parent-death signal checks


@contextlib.contextmanager
def startup_log_held_back(enabled: bool = True) -> Iterator[None]:
    """Holds back TensorFlow's C++ start-up lines written to fd 2 inside the block: the others
    go to the real stderr, in order, when it ends. Does nothing when `enabled` is False."""
    saved = None
    if enabled:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no real fd 2 (embedded)
            sys.stderr.flush()
            saved = os.dup(2)
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        try:
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines(True) if not _STARTUP_NOISE.match(line)]
            if kept:
                os.write(2, "".join(kept).encode())


def run_python(
    args: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float | None,
    on_line: Callable[[str], object] | None = None,
) -> tuple[int | None, str, str]:
    """Runs `python ARGS` with `env` (this `tfgpu` first on PYTHONPATH) and no stdin; returns (its
    exit status, None past `timeout_s`; its stdout; its stderr), both kept in anonymous temporary
    files, each stdout line also handed to `on_line` as it comes. Its process group is killed
    whole when it returns, times out or an exception stops the wait (Ctrl-C, SIGTERM as
    `SystemExit`). Its code calls `die_with_parent(this pid)` first thing (a SIGKILLed parent)."""
    root = str(Path(__file__).resolve().parents[3])  # the directory holding `tfgpu/`
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out if on_line is None else subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # its own process group: ended whole, below
        )
        lines: queue.Queue[bytes] = queue.Queue()
        if on_line is not None:  # a thread reads the pipe, so that the wait keeps its deadline
            threading.Thread(target=_read, args=(proc.stdout, lines), daemon=True).start()
        status: int | None
        try:
            while on_line is not None and (line := lines.get(timeout=_left(deadline))):
                out.write(line)
                on_line(line.decode("utf-8", "replace"))
            status = proc.wait(_left(deadline))
        except (subprocess.TimeoutExpired, queue.Empty):
            status = None
        finally:  # the group whole: what the child started goes too
            if os.name == "posix":
                with contextlib.suppress(ProcessLookupError, PermissionError):  # none left
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        return status, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace")


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _read(pipe: IO[bytes], lines: queue.Queue[bytes]) -> None:
    with pipe:
        for line in pipe:
            lines.put(line)
    lines.put(b"")  # the end: a line is never empty


def death(status: int) -> str:
    """How a child ended by its `returncode`: "exited with status 3", "was killed by SIGKILL"."""
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def die_with_parent(parent_pid: int) -> None:
    """Ends this process when its parent `parent_pid` ends, however: Linux's parent-death SIGKILL,
    else a thread checks every second; a parent gone already ends it at once. Not on Windows."""
    if os.name != "posix":
        return
    if not _parent_death_signal():
        threading.Thread(
            target=_watch, args=(parent_pid,), name="tfgpu-parent-watch", daemon=True
        ).start()
    if os.getppid() != parent_pid:  # it died before the signal was set: adopted already
        os._exit(1)


def _parent_death_signal() -> bool:
    """Asks Linux for SIGKILL when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    except (OSError, AttributeError):  # no C library with `prctl` (a static or exotic build)
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_WATCH_INTERVAL_S)
    os._exit(1)


# The signals that `signals_exit`'s handlers got inside the block, for `raise_if_signalled`.
_received: list[int] = []


@contextlib.contextmanager
def signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `SystemExit(128 + signal)` inside the block, so that cleanup
    runs (their default ends the process at once); Ctrl-C raises `KeyboardInterrupt` as
    Python's own handler does (where that handler is set: not where SIGINT is ignored). The
    handlers are restored after it. Only in the main thread (elsewhere Python cannot set
    handlers: the block runs as it is). Each signal is also recorded for
    `raise_if_signalled`: code that swallows the exception where the handler raised it (a
    Python call made from C++ that clears the error) cannot make the signal lost."""

    def stop(signum: int, frame: object) -> None:
        _received.append(signum)
        raise _exception(signum)

    previous = {}
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
                if sig is not None:
                    previous[sig] = signal.signal(sig, stop)
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                previous[signal.SIGINT] = signal.signal(signal.SIGINT, stop)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _received.clear()


def signals_received() -> int:
    """How many signals `signals_exit`'s handlers got so far (0 outside its block)."""
    return len(_received)


def raise_if_signalled(since: int = 0) -> None:
    """Raises again what `signals_exit`'s handler raised for the last signal it got, if it got
    more than `since` (a `signals_received()` read before): Ctrl-C `KeyboardInterrupt`, others
    `SystemExit(128 + signal)`. For a loop that must end though the handler's exception was
    swallowed (a `fit` still training)."""
    if len(_received) > since:
        raise _exception(_received[-1])


def _exception(signum: int) -> BaseException:
    """What `signals_exit` raises for `signum`: Ctrl-C `KeyboardInterrupt`, as Python's own
    handler; others `SystemExit(128 + signal)`, the status a shell gives a process they end."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)
