"""Where each setting `tfgpu tune SCRIPT.py` kept goes in the user's script: the file and
line, the code, and one unified diff where the edit is unambiguous (docs/tuning.md, "Zero
changes to your script"). Pure: places and source texts in, lines and a diff out."""

from __future__ import annotations

import ast
import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers import source as src
from tfgpu._internal.helpers.source import Place, where_text
from tfgpu._internal.measure import rules


@dataclasses.dataclass(frozen=True)
class Places:
    """Where the script's first `fit` (`fit`), the model's `compile` (`compile`) and the data
    passed to it (`data`, named `data_name`) are; the script itself."""

    script: str
    fit: Place | None = None
    compile: Place | None = None
    data: Place | None = None
    data_name: str = ""

    @classmethod
    def from_dict(cls, script: str, d: Mapping[str, Any]) -> Places:
        """From a child's report (`FitCall.places()`: `{"fit": [file, line], ...}`)."""

        def place(key: str) -> Place | None:
            value = d.get(key)
            return Place(str(value[0]), int(value[1])) if value else None

        name = str(d.get("data_name", ""))
        return cls(script, place("fit"), place("compile"), place("data"), name)


def _kind(change: Mapping[str, Any]) -> str:
    keys = set(change)
    if keys <= set(rules.COMPILE_KEYS):
        return "compile"
    if "precision" in keys:
        return "policy"
    if all(k.isupper() for k in keys):
        return "top"
    if keys <= {"batch_size"}:
        return "fit"
    return "data"


def _policy_place(tree: ast.Module) -> tuple[int, str]:
    """(the line before which the policy line goes, the name Keras goes by there): after the
    script's top-level import that binds `keras` (else `tf`, as `tf.keras`), else at its top
    ("": an `import keras` goes with it)."""
    found: dict[str, tuple[int, str]] = {}
    for stmt in tree.body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        after = (stmt.end_lineno or stmt.lineno) + 1
        for alias in stmt.names:
            bound = alias.asname or alias.name.split(".")[0]
            module = stmt.module if isinstance(stmt, ast.ImportFrom) else None
            full = f"{module}.{alias.name}" if module else alias.name
            if full in ("keras", "tensorflow.keras") and bound == "keras":
                found.setdefault("keras", (after, "keras"))
            elif full == "tensorflow" and isinstance(stmt, ast.Import):
                found.setdefault("tf", (after, f"{bound}.keras"))
    return found.get("keras") or found.get("tf") or (src.top_line(tree), "")


@dataclasses.dataclass
class _Edit:
    """One edit of a file: applied bottom-up (`line` orders them), `apply(text)` -> new text."""

    file: str
    line: int
    apply: Callable[[str], str | None]


def edits_for(
    kept: Sequence[tuple[dict[str, Any], str]],
    places: Places,
    sources: Mapping[str, str],
) -> tuple[list[str], str]:
    """(the lines to change, each with its place; the unified diff of all unambiguous edits)
    for the kept settings (`change`, the line `tune` gives). `sources`: each file's text
    (a file missing there: place found, no diff). Pure."""
    compile_change: dict[str, Any] = {}
    env: dict[str, str] = {}
    lines: list[str] = []
    edits: list[_Edit] = []
    script_text = sources.get(places.script)
    script_tree = src.parse(script_text) if script_text is not None else None
    for change, line in kept:
        kind = _kind(change)
        if kind == "compile":
            compile_change.update(change)
        elif kind == "top":
            env.update({k: str(v) for k, v in change.items()})
        elif kind == "policy":
            policy = change["precision"]
            if script_tree is None:
                lines.append(f"{where_text('policy', None)}: set the policy {policy!r}")
                continue
            at, keras_name = _policy_place(script_tree)
            code = f"{keras_name or 'keras'}.mixed_precision.set_global_policy({policy!r})"
            text = code if keras_name else f"import keras\n{code}"
            lines.append(f"{where_text('policy', Place(places.script, at))}: {code}")
            edits.append(_Edit(places.script, at, _insert(at, text)))
        else:
            place = getattr(places, kind)
            lines.append(f"{where_text(kind, place, places.data_name)}: {line}")
            edit = _data_edit(change, place, places.data_name, sources)
            if edit is not None:
                edits.append(edit)
    if compile_change:
        args = ", ".join(f"{k}={v!r}" for k, v in compile_change.items())
        lines.insert(0, f"{where_text('compile', places.compile)}: model.compile(..., {args})")
        if places.compile is not None:
            at = places.compile.line
            edits.append(_Edit(places.compile.file, at, _keywords(at, compile_change)))
    if env:
        exports = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
        place = None if script_tree is None else Place(places.script, src.top_line(script_tree))
        assign = "; ".join(f"os.environ[{k!r}] = {v!r}" for k, v in env.items())
        lines.append(f"in the shell that starts the script: {exports}")
        lines.append(f"or {where_text('top', place)}: import os; {assign}")
        if place is not None:
            text = "import os\n" + "\n".join(f"os.environ[{k!r}] = {v!r}" for k, v in env.items())
            edits.append(_Edit(places.script, place.line, _insert(place.line, text)))
    return lines, _diff(edits, sources, Path(places.script).parent)


def _insert(before: int, text: str) -> Callable[[str], str | None]:
    return lambda source: src.inserted(source, before, text)


def _keywords(line: int, change: Mapping[str, Any]) -> Callable[[str], str | None]:
    def apply(source: str) -> str | None:
        for key, value in change.items():
            tree = src.parse(source)
            call = src.method_call(tree, line, "compile") if tree is not None else None
            new = src.with_keyword(source, call, key, repr(value)) if call is not None else None
            if new is None:
                return None
            source = new
        return source

    return apply


def _data_edit(
    change: Mapping[str, Any], place: Place | None, name: str, sources: Mapping[str, str]
) -> _Edit | None:
    """A `prefetch` after the statement that built the data (where the edit is one line and
    `tf` is the script's name for TensorFlow); None for the others (the line says them)."""
    if set(change) != {"prefetch"} or place is None or not name:
        return None
    text = sources.get(place.file)
    tree = src.parse(text) if text is not None else None
    if text is None or tree is None or not _binds_tf(tree):
        return None
    statement = next(
        (s for s in ast.walk(tree) if isinstance(s, ast.stmt) and s.lineno == place.line), None
    )
    if statement is None:
        return None
    indent = " " * statement.col_offset
    after = (statement.end_lineno or statement.lineno) + 1
    code = f"{name} = {name}.prefetch(tf.data.AUTOTUNE)"
    return _Edit(place.file, after, lambda source: src.inserted(source, after, code, indent))


def _binds_tf(tree: ast.Module) -> bool:
    return any(
        isinstance(s, ast.Import)
        and any(a.name == "tensorflow" and (a.asname or "tensorflow") == "tf" for a in s.names)
        for s in tree.body
    )


def _diff(edits: list[_Edit], sources: Mapping[str, str], root: Path) -> str:
    """The unified diff of every file's edits, applied from the bottom up, each file named
    from `root` (the script's directory: `patch -p1` runs there); a file whose edit is not
    unambiguous is left out whole."""
    out = []
    for file in sorted({e.file for e in edits}):
        old = sources.get(file)
        if old is None:
            continue
        new: str | None = old
        for edit in sorted((e for e in edits if e.file == file), key=lambda e: -e.line):
            new = edit.apply(new) if new is not None else None
        if new is not None and src.parse(new) is not None:
            try:
                shown = str(Path(file).resolve().relative_to(root.resolve()))
            except ValueError:  # outside the script's directory: its full path
                shown = file
            out.append(src.unified_diff(shown, old, new))
    return "".join(out)
