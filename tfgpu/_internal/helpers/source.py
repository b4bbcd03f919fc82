"""Places and edits in a user's Python source, read with `ast` (pure: text in, text out): the
call that starts on a line, the statement that last bound a name before it, a keyword added
to a call, a line inserted at the top of a script, and the unified diff of an edit. `tfgpu
tune SCRIPT.py` and `tfgpu run` point into the user's script with them (docs/tuning.md)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Place:
    """A line of the user's code: its file (as the traceback names it) and line (1-based)."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def read(self) -> str | None:
        """The file's text, or None when it cannot be read."""
        try:
            return Path(self.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None


# What each kind of place is, in words: where each kind of change goes.
_PLACE_WORDS = {
    "compile": "the model's compile call",
    "data": "where {name} is built",
    "fit": "the fit call",
    "policy": "after the script imports Keras, before it builds a model",
    "top": "the top of the script, before it imports TensorFlow",
}
PLACE_NOT_FOUND = "place not found"


def where_text(kind: str, place: Place | None, data_name: str = "") -> str:
    """A place in words: "train.py:44 (where train_ds is built)", or `PLACE_NOT_FOUND` with
    what was looked for (`kind`: compile, data, fit, policy or top)."""
    words = _PLACE_WORDS[kind]
    if kind == "data":
        words = words.format(name=data_name) if data_name else "the fit call, where its data is"
    if place is None:
        return f"{PLACE_NOT_FOUND} ({words})"
    return f"{place} ({words})"


@dataclasses.dataclass(frozen=True)
class Span:
    """A statement or expression in the source: its first and last lines (1-based), its
    column (0-based) and its text."""

    line: int
    end_line: int
    column: int
    text: str


def parse(source: str) -> ast.Module | None:
    """The module's tree, or None when the source does not parse."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):  # not Python, or a null byte
        return None


def _span(source: str, node: ast.AST) -> Span:
    end = getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]
    text = ast.get_source_segment(source, node) or ""
    return Span(node.lineno, end, node.col_offset, text)  # type: ignore[attr-defined]


def _method_calls(tree: ast.AST, method: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
    ]


def method_call(tree: ast.AST, line: int, method: str) -> ast.Call | None:
    """The call `<something>.method(...)` that a frame on `line` runs: the innermost one
    whose lines hold `line`, one starting on it first."""
    found = [c for c in _method_calls(tree, method) if c.lineno <= line <= (c.end_lineno or line)]
    if not found:
        return None
    return min(found, key=lambda c: (c.lineno != line, (c.end_lineno or c.lineno) - c.lineno))


def call_argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The argument at `position` or passed as `keyword=` (None when absent or unpacked)."""
    if any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return None
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _binds(target: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _scope_statements(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The statements of the innermost function holding `line` (the module's otherwise), with
    those of its compound statements (if, with, for, try), not of nested functions."""
    scope: ast.AST = tree
    for node in ast.walk(tree):
        holds = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        )
        if holds and (scope is tree or node.lineno >= scope.lineno):  # type: ignore[attr-defined]
            scope = node
    out: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            out.append(stmt)
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, field, []) or [])
            for handler in getattr(stmt, "handlers", []) or []:
                visit(handler.body)

    visit(scope.body)  # type: ignore[attr-defined]
    return out


def last_binding(source: str, tree: ast.Module, name: str, line: int) -> Span | None:
    """The statement that last bound `name` (an assignment, `for`, `with ... as`) before
    `line`, in the scope that holds `line`; None when none does."""
    best: ast.stmt | None = None
    for stmt in _scope_statements(tree, line):
        if (stmt.end_lineno or stmt.lineno) >= line:
            continue
        targets: list[ast.AST] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [stmt.target]
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
        if any(_binds(t, name) for t in targets) and (best is None or stmt.lineno > best.lineno):
            best = stmt
    return None if best is None else _span(source, best)


def with_keyword(source: str, call: ast.Call, keyword: str, value: str) -> str | None:
    """`source` with `keyword=value` set in `call` (added, or its value replaced); None when
    the edit is not unambiguous (a `**kwargs` in the call, or a result that does not parse
    to the same call with that keyword)."""
    if any(k.arg is None for k in call.keywords) or call.end_lineno is None:
        return None
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for text in lines:
        offsets.append(offsets[-1] + len(text))

    def at(line: int, col: int) -> int:  # ast columns count UTF-8 bytes
        text = lines[line - 1].encode()[:col].decode("utf-8", "replace")
        return offsets[line - 1] + len(text)

    existing = next((k for k in call.keywords if k.arg == keyword), None)
    if existing is not None:
        v = existing.value
        if v.end_lineno is None or v.end_col_offset is None:
            return None
        start, end = at(v.lineno, v.col_offset), at(v.end_lineno, v.end_col_offset)
        new = source[:start] + value + source[end:]
    else:
        close = at(call.end_lineno, call.end_col_offset or 0) - 1  # the `)`
        if source[close] != ")":
            return None
        stripped = source[:close].rstrip()
        gap = source[len(stripped) : close]  # a new line and the indent of `)`, or ""
        setting = f"{keyword}={value}"
        if stripped.endswith("("):
            middle = setting
        elif stripped.endswith(",") and call.lineno != call.end_lineno:
            last = (call.keywords or call.args)[-1]  # one argument a line: one more
            middle = f"\n{' ' * last.col_offset}{setting},"
        else:
            middle = f"{'' if stripped.endswith(',') else ','} {setting}"
        new = stripped + middle + gap + source[close:]
    return new if _has_keyword(new, call.lineno, keyword, value) else None


def _has_keyword(source: str, line: int, keyword: str, value: str) -> bool:
    tree = parse(source)
    if tree is None:
        return False
    calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and c.lineno == line]
    return any(
        k.arg == keyword and ast.get_source_segment(source, k.value) == value
        for c in calls
        for k in c.keywords
    )


def top_line(tree: ast.Module) -> int:
    """The line before which a script's own first statement runs: after its docstring and its
    `from __future__` imports (1-based; a line past the end for an empty script)."""
    line = 1
    for stmt in tree.body:
        docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring and line == 1 and stmt is tree.body[0]) and not future:
            break
        line = (stmt.end_lineno or stmt.lineno) + 1
    return line


def inserted(source: str, before_line: int, text: str, indent: str = "") -> str:
    """`source` with the lines of `text` inserted before `before_line` (1-based), indented."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    new = [f"{indent}{t}\n" for t in text.splitlines()]
    at = max(0, min(before_line - 1, len(lines)))
    return "".join(lines[:at] + new + lines[at:])


def unified_diff(path: str, old: str, new: str) -> str:
    """The unified diff from `old` to `new`, both named `path` (a/ and b/), as `git apply`
    and `patch -p1` read it; "" when they are the same."""
    diff = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff)
