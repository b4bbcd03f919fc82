"""Where `tfgpu tune SCRIPT.py`'s kept settings go in the script (tfgpu/tuning/_edits.py): the
file and line of each, and one diff of the unambiguous edits that applies. Pure: source texts
in, lines and a diff out."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tfgpu._internal.helpers.source import Place
from tfgpu.tuning._edits import Places, edits_for

SCRIPT = textwrap.dedent(
    '''\
    """Train."""
    import numpy as np
    import tensorflow as tf
    import keras

    x = np.zeros((64, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    if True:
        model.compile(optimizer="adam", loss="mse",
                      jit_compile=True,
        )
    train = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32)
    model.fit(train, epochs=2)
    '''
)


def _places(path: str, **overrides) -> Places:
    values = {
        "fit": Place(path, 13),
        "compile": Place(path, 9),
        "data": Place(path, 12),
        "data_name": "train",
    }
    return Places(path, **{**values, **overrides})


def test_every_kind_of_setting_gets_its_place_and_one_diff_that_applies(tmp_path):
    path = str(tmp_path / "train.py")
    kept = [
        ({"steps_per_execution": 16}, "model.compile(..., steps_per_execution=16)"),
        ({"jit_compile": False}, "model.compile(..., jit_compile=False)"),
        ({"prefetch": True}, "dataset = dataset.prefetch(tf.data.AUTOTUNE)"),
        ({"precision": "mixed_bfloat16"}, "tfgpu.configure(precision='mixed_bfloat16')"),
        ({"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}, "export TF_XLA_FLAGS=--tf_xla_auto_jit=2"),
    ]
    lines, diff = edits_for(kept, _places(path), {path: SCRIPT})
    assert lines == [
        f"{path}:9 (the model's compile call): model.compile(..., steps_per_execution=16, "
        "jit_compile=False)",
        f"{path}:12 (where train is built): dataset = dataset.prefetch(tf.data.AUTOTUNE)",
        f"{path}:5 (after the script imports Keras, before it builds a model): "
        "keras.mixed_precision.set_global_policy('mixed_bfloat16')",
        "in the shell that starts the script: export TF_XLA_FLAGS=--tf_xla_auto_jit=2",
        f"or {path}:2 (the top of the script, before it imports TensorFlow): import os; "
        "os.environ['TF_XLA_FLAGS'] = '--tf_xla_auto_jit=2'",
    ]
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "tune.diff").write_text(diff)
    subprocess.run(
        ["patch", "-p1", "-i", "tune.diff"], cwd=tmp_path, check=True, capture_output=True
    )
    assert (tmp_path / "train.py").read_text() == textwrap.dedent(
        '''\
        """Train."""
        import os
        os.environ['TF_XLA_FLAGS'] = '--tf_xla_auto_jit=2'
        import numpy as np
        import tensorflow as tf
        import keras
        keras.mixed_precision.set_global_policy('mixed_bfloat16')

        x = np.zeros((64, 4), "float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        if True:
            model.compile(optimizer="adam", loss="mse",
                          jit_compile=False,
                          steps_per_execution=16,
            )
        train = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32)
        train = train.prefetch(tf.data.AUTOTUNE)
        model.fit(train, epochs=2)
        '''
    )


@pytest.mark.parametrize(
    ("imports", "line", "code"),
    [
        (
            "import tensorflow as tf\n",
            2,
            "tf.keras.mixed_precision.set_global_policy('mixed_float16')",
        ),
        (
            "from tensorflow import keras\n",
            2,
            "keras.mixed_precision.set_global_policy('mixed_float16')",
        ),
        ("import numpy\n", 1, "keras.mixed_precision.set_global_policy('mixed_float16')"),
    ],
)
def test_the_policy_goes_after_the_import_that_names_keras(tmp_path, imports, line, code):
    path = str(tmp_path / "t.py")
    text = imports + "model = build()\n"
    lines, diff = edits_for([({"precision": "mixed_float16"}, "")], Places(path), {path: text})
    assert lines == [
        f"{path}:{line} (after the script imports Keras, before it builds a model): {code}"
    ]
    # No import that names Keras: the diff imports it with the line.
    assert ("+import keras\n" in diff) == imports.startswith("import numpy")
    assert f"+{code}\n" in diff


def test_places_not_found_are_said_and_get_no_diff(tmp_path):
    path = str(tmp_path / "train.py")
    kept = [
        ({"steps_per_execution": 4}, "model.compile(..., steps_per_execution=4)"),
        ({"drop_remainder": True}, "dataset = dataset.batch(32, drop_remainder=True)"),
    ]
    places = Places(path, fit=Place(path, 13), data_name="")
    lines, diff = edits_for(kept, places, {path: SCRIPT})
    assert lines == [
        "place not found (the model's compile call): model.compile(..., steps_per_execution=4)",
        "place not found (the fit call, where its data is): "
        "dataset = dataset.batch(32, drop_remainder=True)",
    ]
    assert diff == ""


def test_a_compile_with_unpacked_settings_gets_its_line_and_no_diff(tmp_path):
    path = str(tmp_path / "train.py")
    text = "settings = {}\nmodel.compile(**settings)\n"
    places = Places(path, compile=Place(path, 2))
    lines, diff = edits_for([({"jit_compile": False}, "")], places, {path: text})
    assert lines == [f"{path}:2 (the model's compile call): model.compile(..., jit_compile=False)"]
    assert diff == ""


def test_places_are_read_back_from_a_childs_report():
    places = Places.from_dict(
        "t.py", {"fit": ["t.py", 9], "compile": None, "data": ["t.py", 7], "data_name": "ds"}
    )
    assert places == Places("t.py", Place("t.py", 9), None, Place("t.py", 7), "ds")
