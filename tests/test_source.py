"""Places and edits in a user's source (tfgpu/_internal/helpers/source.py): pure, text in and
text out; each edit checked by parsing its result."""

from __future__ import annotations

import ast
import textwrap

import pytest

from tfgpu._internal.helpers import source as src
from tfgpu._internal.helpers.source import Place, where_text


def _call(text: str, line: int, method: str = "compile") -> ast.Call:
    tree = src.parse(text)
    assert tree is not None
    call = src.method_call(tree, line, method)
    assert call is not None
    return call


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (
            'model.compile(optimizer="adam", loss="mse")\n',
            'model.compile(optimizer="adam", loss="mse", steps_per_execution=16)\n',
        ),
        ("model.compile()\n", "model.compile(steps_per_execution=16)\n"),
        (  # one argument a line, with a trailing comma: one more line like them
            'model.compile(\n    optimizer="adam",\n    loss="mse",\n)\n',
            'model.compile(\n    optimizer="adam",\n    loss="mse",\n    steps_per_execution=16,\n)\n',
        ),
        (  # no trailing comma
            'model.compile(\n    optimizer="adam",\n    loss="mse"\n)\n',
            'model.compile(\n    optimizer="adam",\n    loss="mse", steps_per_execution=16\n)\n',
        ),
        (  # the value replaced where the keyword is given
            "model.compile(loss='mse', steps_per_execution=4)\n",
            "model.compile(loss='mse', steps_per_execution=16)\n",
        ),
        (  # a trailing comma on one line
            "model.compile('adam', 'mse',)\n",
            "model.compile('adam', 'mse', steps_per_execution=16)\n",
        ),
    ],
)
def test_a_keyword_is_added_to_a_call_or_its_value_replaced(before, after):
    new = src.with_keyword(before, _call(before, 1), "steps_per_execution", "16")
    assert new == after
    assert src.parse(new) is not None


def test_a_call_with_unpacked_keywords_gets_no_edit():
    text = "model.compile(**settings)\n"
    assert src.with_keyword(text, _call(text, 1), "jit_compile", "False") is None


def test_the_call_a_frame_runs_is_found_on_any_of_its_lines():
    text = textwrap.dedent(
        """\
        model.compile(
            optimizer=keras.optimizers.Adam(
                1e-3),
            loss="mse",
        )
        other.compile()
        """
    )
    tree = src.parse(text)
    assert src.method_call(tree, 1, "compile").lineno == 1
    assert src.method_call(tree, 3, "compile").lineno == 1  # inside it
    assert src.method_call(tree, 6, "compile").lineno == 6
    assert src.method_call(tree, 6, "fit") is None


def test_the_statement_that_last_bound_a_name_before_a_line_in_its_scope():
    text = textwrap.dedent(
        """\
        train = make()
        def run():
            train = other()
            model.fit(train)
        train = train.prefetch(2)
        with strategy.scope():
            a, (train, b) = get()
            model.fit(train, epochs=2)
        """
    )
    tree = src.parse(text)
    inside = src.last_binding(text, tree, "train", 4)  # the function's own
    assert (inside.line, inside.text) == (3, "train = other()")
    outside = src.last_binding(text, tree, "train", 8)  # a tuple target inside a with block
    assert (outside.line, outside.text) == (7, "a, (train, b) = get()")
    assert src.last_binding(text, tree, "missing", 8) is None


def test_the_top_of_a_script_is_after_its_docstring_and_future_imports():
    assert (
        src.top_line(src.parse('"""Doc."""\nfrom __future__ import annotations\nimport os\n')) == 3
    )
    assert src.top_line(src.parse("import os\n")) == 1
    assert src.top_line(src.parse('"""A\nlong doc."""\nx = 1\n')) == 3


def test_lines_are_inserted_indented_and_the_diff_applies_with_patch_p1():
    old = "a = 1\nif a:\n    b = 2\n"
    new = src.inserted(old, 4, "c = b", indent="    ")
    assert new == "a = 1\nif a:\n    b = 2\n    c = b\n"
    diff = src.unified_diff("train.py", old, new)
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+    c = b\n" in diff
    assert src.unified_diff("train.py", old, old) == ""


def test_a_place_in_words_says_what_was_looked_for_when_not_found():
    assert where_text("compile", Place("train.py", 57)) == "train.py:57 (the model's compile call)"
    assert where_text("data", Place("t.py", 4), "train_ds") == "t.py:4 (where train_ds is built)"
    assert where_text("data", None) == "place not found (the fit call, where its data is)"
    assert src.parse("def (") is None
