"""Warnings attributed to the user's line (`model.fit(...)`), not tfgpu's, whatever `__main__` is
(a file, `-c`, stdin, a notebook cell); with `once=`, once per process. No TensorFlow."""

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


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame from `frame` outwards whose module is not a library's, or None."""
    while frame is not None:
        module = frame.f_globals.get("__name__")
        if not isinstance(module, str) or module.split(".")[0] not in LIBRARIES:
            return frame
        frame = frame.f_back
    return None


def warn_at_user_code(
    message: str, category: type[Warning] = UserWarning, *, once: str | None = None
) -> None:
    """Issues a warning attributed to the user's line (`once`, a key: once per process), without
    `module_globals`: the loader of a `__main__` from stdin or `-c` raises when asked its source."""
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
            registry = module_globals["__warningregistry__"] = {}
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
    """Lets the warning keyed `key` (every keyed one, for None) be issued again (for tests)."""
    with _lock:
        if key is None:
            _shown.clear()
        else:
            _shown.discard(key)


# The starts of the lines of a TensorFlow error that say where, not what.
_NOISE = ("Traceback", "File ", "Detected at node", "Node:", "[[", "{{", "During handling",
          "<stack traces unavailable>")  # fmt: skip


def one_line(error: BaseException, limit: int = 200) -> str:
    """An exception as one line: its type, the first line of its message that says what failed
    (not TensorFlow's "Graph execution error:" or a traceback's) and the graph node it names."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    nodes = [line.split("Detected at node ", 1)[1] for line in lines if "Detected at node " in line]
    node = nodes[0].split(" defined at")[0].strip("'\" ") if nodes else ""
    unindented = [line.strip() for line in lines if not line[:1].isspace()]
    said = [s for s in unindented if s != "Graph execution error:" and not s.startswith(_NOISE)]
    first = said[0] if said else (lines[0].strip() if lines else "")
    out = f"{type(error).__name__}: {first}" if first else type(error).__name__
    if node and node not in out:
        out += f" (node {node})"
    return out if len(out) <= limit else out[: limit - 3].rstrip() + "..."
