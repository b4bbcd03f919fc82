"""Warnings that reach the user, however Python runs their code (no TensorFlow, no Keras).

`warn_at_user_code` issues a warning at the innermost frame of the user's code (outside
tfgpu, Keras, TensorFlow and the standard library's plumbing), so it reads as being about
the user's line (`model.fit(...)`), not a line inside tfgpu. It works for every kind of
`__main__`: a script file, `python -c`, a script on standard input (`python - <<EOF`), an
IPython or Jupyter cell, and `exec` of a string without a file. With `once=`, a warning about
a fact of the machine (NVML missing) is shown once per process, not once per `fit`.

The user's warning filters apply as usual: `ignore` hides it, `error` raises it (there, as
Python's own `warnings.warn` would).
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
from types import FrameType

_log = logging.getLogger("tfgpu")

# Top-level packages whose frames are never "the user's code".
LIBRARIES = frozenset(
    {"tfgpu", "keras", "tensorflow", "tf_keras", "absl", "contextlib", "threading", "importlib"}
)

_shown: set[str] = set()
_lock = threading.Lock()


def user_frame(start: FrameType | None = None) -> FrameType | None:
    """The innermost frame, from `start` outwards, whose module is not a library's.

    Args:
        start: frame or None, where to begin. Defaults to `None`: the caller's caller.

    Returns:
        The frame, or None when every frame on the stack belongs to a library.
    """
    frame: FrameType | None = sys._getframe(2) if start is None else start
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if not isinstance(module, str) or module.split(".")[0] not in LIBRARIES:
            return frame
        frame = frame.f_back
    return None


def warn_at_user_code(
    message: str, category: type[Warning] = UserWarning, *, once: str | None = None
) -> None:
    """Issues a warning attributed to the user's line; never fails for lack of a source.

    Python's `warnings.warn_explicit(..., module_globals=...)` asks the module's loader for
    its source, and the loader of a `__main__` read from stdin or `-c` raises (`'__main__' is
    not a built-in module`). This passes the file name and line only: the line is shown
    where `linecache` has it (files, IPython cells) and left out elsewhere.

    Args:
        message: str, the warning text.
        category: Warning subclass. Defaults to `UserWarning`.
        once: str or None, a key: a warning with a key already used in this process is not
            issued again (e.g. `"nvml-missing"`). Defaults to `None`: Python's usual rule
            (once per call site under the default filter).

    Raises:
        Warning: the warning itself, when the user's filters turn it into an error.
    """
    if once is not None:
        with _lock:
            if once in _shown:
                return
            _shown.add(once)
    frame = user_frame(sys._getframe(1))
    try:
        if frame is None:
            warnings.warn(message, category, stacklevel=2)
            return
        module_globals = frame.f_globals
        module = module_globals.get("__name__")
        registry = module_globals.get("__warningregistry__")
        if not isinstance(registry, dict):
            registry = {}
            try:
                module_globals["__warningregistry__"] = registry
            except TypeError:  # pragma: no cover (read-only globals)
                pass
        warnings.warn_explicit(
            message,
            category,
            frame.f_code.co_filename,
            frame.f_lineno,
            module=module if isinstance(module, str) else None,
            registry=registry,
        )
    except Warning:
        raise  # the user's filters made it an error
    except Exception as e:  # a broken showwarning, a closed stderr: a warning never kills
        _log.warning("%s (could not be issued as a warning: %r)", message, e)
    finally:
        del frame


def forget(key: str | None = None) -> None:
    """Lets the warning keyed `key` (every keyed warning, for None) be issued again.

    For tests, which check each warning in isolation.
    """
    with _lock:
        if key is None:
            _shown.clear()
        else:
            _shown.discard(key)


_NOISE_LINES = ("Traceback", "File ", "Detected at node", "Node:", "[[", "{{", "During handling")


def one_line(error: BaseException, limit: int = 200) -> str:
    """An exception as one line: its type and the first meaningful line of its message. Pure.

    For notes and warnings that must never carry a traceback (a failed probe, a failed trace).

    TensorFlow's messages start with "Graph execution error:" and a traceback of where the
    node was defined; those lines are skipped for the first one that says what failed.
    """
    text = str(error)
    lines = [line for line in text.splitlines() if line.strip()]
    meaningful = [
        line.strip()
        for line in lines
        if not line[:1].isspace()
        and not line.strip().startswith(_NOISE_LINES)
        and line.strip() not in ("Graph execution error:",)
    ]
    first = meaningful[0] if meaningful else (lines[0].strip() if lines else "")
    out = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return out if len(out) <= limit else out[: limit - 3].rstrip() + "..."
