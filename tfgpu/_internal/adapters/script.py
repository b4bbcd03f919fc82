"""A user's script run as `python SCRIPT.py ARGS` runs it, with its `fit` and `compile` calls
seen: the one interception `tfgpu run` and `tfgpu tune SCRIPT.py`'s child share
(docs/tuning.md, "Zero changes to your script").

`Interception(on_fit)` replaces `keras.Model.fit` by a function that takes exactly what
Keras's takes (bound with the original's `inspect.signature`, so it cannot drift) and hands
each top-level call to `on_fit` as a `FitCall`: the model, every argument, and where in the
user's code the `fit`, the model's last `compile` and the data passed to `fit` are (from the
call stack, then the source). Calls made while `on_fit` runs (tfgpu's own timed fits) go
straight to Keras."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import os
import runpy
import sys
import sysconfig
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import keras

from tfgpu._internal.helpers import source as src
from tfgpu._internal.helpers.source import Place

# Where tfgpu, Python and its packages live: a frame there is not the user's code.
_TFGPU = str(Path(__file__).resolve().parents[2]) + os.sep
_NOT_USER = (
    _TFGPU,
    *(
        str(Path(p).resolve()) + os.sep
        for p in {
            sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")
        }
        if p
    ),
)


def user_place(frame: Any = None) -> Place | None:
    """The innermost frame of the user's code from `frame` (default: the caller's) outward:
    not Python's, an installed package's (Keras, TensorFlow) or tfgpu's; None when none is."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        if _is_user(frame):
            return Place(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def _is_user(frame: Any) -> bool:
    name = frame.f_code.co_filename
    return not name.startswith("<") and not str(Path(name).resolve()).startswith(_NOT_USER)


@dataclasses.dataclass
class FitCall:
    """One `fit` of the script, as it was called.

    Attributes:
        index: int, 1 for the script's first `fit`, 2 for the next, ...
        model: the `keras.Model` whose `fit` was called.
        arguments: dict, every argument of Keras's `fit` by name (defaults filled in).
        place: `Place` of the `fit` call in the user's code, or None.
        compiled_at: `Place` of the model's last `compile` in the user's code, or None.
        data_at: `Place` of the statement that last built the data passed as `x` (the `fit`
            call itself when `x` is built in it), or None.
        data_name: str, the name the data goes by in the user's code ("" when it is built in
            the call).
    """

    index: int
    model: Any
    arguments: dict[str, Any]
    place: Place | None
    compiled_at: Place | None
    data_at: Place | None
    data_name: str
    original: Callable[..., Any]
    signature: inspect.Signature

    def places(self) -> dict[str, Any]:
        """Where the `fit`, the model's `compile` and the data are (`[file, line]` or None)
        and the data's name (`data_name`), as JSON."""
        places: dict[str, Any] = {
            "fit": self.place,
            "compile": self.compiled_at,
            "data": self.data_at,
        }
        out = {k: None if p is None else [p.file, p.line] for k, p in places.items()}
        return {**out, "data_name": self.data_name}

    def where(self, kind: str) -> str:
        """`kind`'s place in words (`"compile"`, `"data"`, `"fit"`), e.g. "train.py:57 (the
        model's compile call)"."""
        place = {"compile": self.compiled_at, "data": self.data_at, "fit": self.place}[kind]
        return src.where_text(kind, place, self.data_name)

    def run(self, **changes: Any) -> Any:
        """Keras's own `fit` with the call's arguments, `changes` replacing some; positional
        ones stay positional. Returns what `fit` returns (its `History`)."""
        bound = self.signature.bind_partial(self.model)
        bound.arguments.update({**self.arguments, **changes})
        return self.original(*bound.args, **bound.kwargs)

    def training_arrays(self) -> tuple[Any, int | None]:
        """The data this `fit` trains on, as `tfgpu.diagnose` and `tfgpu.tune` take it: a
        dataset as it is; arrays `(x, y[, sample_weight])` without the `validation_split`
        part, cut as Keras cuts it; and the batch of arrays (None for a dataset). A
        TypeError for data neither takes (a generator, a `PyDataset`)."""
        import tensorflow as tf

        x, y = self.arguments["x"], self.arguments["y"]
        if isinstance(x, tf.data.Dataset):
            return x, None
        if isinstance(x, keras.utils.PyDataset) or inspect.isgenerator(x) or x is None:
            raise TypeError(
                f"the data of this fit is a {type(x).__name__}: tfgpu measures a "
                "tf.data.Dataset or arrays"
            )
        sample_weight = self.arguments["sample_weight"]
        parts = (x,) if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)
        split = self.arguments["validation_split"]
        if split and self.arguments["validation_data"] is None:
            parts = training_part(parts, split)
        data = parts if len(parts) > 1 else parts[0]
        return data, int(self.arguments["batch_size"] or 32)


def training_part(arrays: Any, validation_split: float) -> Any:
    """`arrays` without their last `validation_split` share, as `fit(validation_split=)` cuts
    them (the first `floor(n * (1 - validation_split))` examples of each)."""
    import math

    leaves = [a for a in keras.tree.flatten(arrays) if a is not None]
    n = int(leaves[0].shape[0]) if leaves else 0
    split_at = math.floor(n * (1.0 - validation_split))
    return keras.tree.map_structure(lambda a: a[:split_at], arrays)


class Interception:
    """While entered, `keras.Model.fit` hands each top-level call to `on_fit(call)` (whose
    return value the script's `fit` returns) and the user's `compile` calls are noted by
    where they are; both are put back on exit."""

    def __init__(self, on_fit: Callable[[FitCall], Any]):
        self.on_fit = on_fit
        self.fits = 0
        self._compiles: list[tuple[weakref.ref[Any], Place | None]] = []
        self._local = threading.local()
        self._saved: dict[str, Any] = {}

    def _inside(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def _handling(self) -> Iterator[None]:
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def __enter__(self) -> Interception:
        # Replaced where Keras defines them: Keras tells a custom `compile` from its own by
        # `cls.compile != Trainer.compile` (`compile_from_config`, which `load_model` runs).
        owners = {name: _owner(name) for name in ("fit", "compile")}
        original_fit, original_compile = (vars(owners[n])[n] for n in ("fit", "compile"))
        self._saved = {name: (owner, vars(owner)[name]) for name, owner in owners.items()}
        fit_signature = inspect.signature(original_fit)
        compile_signature = inspect.signature(original_compile)

        @functools.wraps(original_fit)
        def fit(*args: Any, **kwargs: Any) -> Any:
            if self._inside():
                return original_fit(*args, **kwargs)
            bound = fit_signature.bind(*args, **kwargs)  # Python's TypeError, as Keras's own
            bound.apply_defaults()
            model = bound.arguments.pop("self")
            place = user_place(sys._getframe(1))
            self.fits += 1
            call = FitCall(
                self.fits,
                model,
                dict(bound.arguments),
                place,
                self.compiled_at(model),
                *data_place(place),
                original_fit,
                fit_signature,
            )
            with self._handling():
                return self.on_fit(call)

        @functools.wraps(original_compile)
        def compile(*args: Any, **kwargs: Any) -> Any:
            if not self._inside():
                bound = compile_signature.bind(*args, **kwargs)
                model = bound.arguments["self"]
                # The user's own call only (not `load_model`'s, say: its line is no compile).
                caller = sys._getframe(1)
                place = Place(caller.f_code.co_filename, caller.f_lineno)
                self._compiles.append((weakref.ref(model), place if _is_user(caller) else None))
            return original_compile(*args, **kwargs)

        setattr(owners["fit"], "fit", fit)  # noqa: B010 (the owner is found at run time)
        setattr(owners["compile"], "compile", compile)  # noqa: B010
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, (owner, original) in self._saved.items():
            setattr(owner, name, original)

    def compiled_at(self, model: Any) -> Place | None:
        """Where the user's code last compiled `model` (None: not seen)."""
        for ref, place in reversed(self._compiles):
            if ref() is model:
                return place
        return None


def _owner(name: str) -> type:
    """The class of `keras.Model`'s ancestry that defines `name`."""
    return next(c for c in keras.Model.__mro__ if name in vars(c))


def data_place(place: Place | None) -> tuple[Place | None, str]:
    """(where the data passed to the `fit` at `place` was last built, its name): the
    statement that last bound the name passed as `x` before the call, in the call's scope;
    the call itself when `x` is built in the call; (None, "") when the source is unreadable."""
    text = place.read() if place is not None else None
    tree = src.parse(text) if text is not None else None
    if place is None or text is None or tree is None:
        return None, ""
    call = src.method_call(tree, place.line, "fit")
    x = src.call_argument(call, 0, "x") if call is not None else None
    if x is None or not isinstance(x, ast.Name):
        return place, ""
    binding = src.last_binding(text, tree, x.id, call.lineno if call is not None else place.line)
    if binding is None:  # a global of another module, or an argument of the function
        return place, x.id
    return Place(place.file, binding.line), x.id


def run_as_main(script: Path, args: Sequence[str]) -> None:
    """Runs `script` as `python SCRIPT ARGS` would in this process: `sys.argv`, its directory
    first on `sys.path`, `__name__ == "__main__"`; the working directory, stdin, stdout and
    stderr as they are. What the script raises (`SystemExit` too) propagates; `sys.argv` and
    `sys.path` are put back."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def exit_status(error: BaseException | None) -> int:
    """The exit status `python SCRIPT.py` has after its script raised `error` (None: ended):
    0; `sys.exit(n)`'s n (None: 0; another object: 1, as Python prints it); 130 for Ctrl-C
    (a shell's status for SIGINT, which Python ends with); 1 for any other exception."""
    if error is None:
        return 0
    if isinstance(error, SystemExit):
        code = error.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 1


def _runner_frame(filename: str) -> bool:
    """Whether a frame is tfgpu's or runpy's (a script that does not compile has no frame of
    its own: Python shows its SyntaxError alone)."""
    if filename in ("<frozen runpy>", runpy.__file__):
        return True
    return str(Path(filename).resolve()).startswith(_TFGPU)


def print_error(error: BaseException, script: Path) -> None:
    """Writes what Python writes on stderr when `error` ends `script`: the traceback from the
    script's own frame on, without tfgpu's frames or runpy's, or `sys.exit`'s message."""
    if isinstance(error, SystemExit):
        if error.code is not None and not isinstance(error.code, int):
            print(error.code, file=sys.stderr)
        return
    tb = error.__traceback__
    name = str(Path(script).resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != name:
        tb = tb.tb_next
    if tb is None and not isinstance(error, SyntaxError):  # a script that does not compile
        tb = error.__traceback__  # has no frame: Python shows its SyntaxError alone
    shown = traceback.TracebackException(type(error), error, tb)
    seen: set[int] = set()
    todo = [shown]
    while todo:  # the chain too (`raise ... from ...`, an error while handling another)
        te = todo.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        frames = [f for f in te.stack if not _runner_frame(f.filename)]
        te.stack = traceback.StackSummary.from_list(frames)
        todo += [t for t in (te.__cause__, te.__context__) if t is not None]
    sys.stderr.write("".join(shown.format()))
    sys.stderr.flush()
