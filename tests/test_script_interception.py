"""The one interception of a script's `fit` and `compile` (tfgpu/_internal/adapters/script.py),
which `tfgpu run` and `tfgpu tune SCRIPT.py`'s child share: the replaced `fit` takes exactly
what Keras's takes, the places in the script come from the call stack, and the script runs as
`python SCRIPT.py` runs it. Tiny scripts, in this process."""

from __future__ import annotations

import inspect
import sys
import textwrap

import keras
import numpy as np
import pytest

from tfgpu._internal.adapters import script as script_module
from tfgpu._internal.adapters.script import (
    Interception,
    exit_status,
    print_error,
    run_as_main,
    training_part,
)

_MODEL = """
import numpy as np
import keras

x = np.arange(64 * 4, dtype="float32").reshape(64, 4)
y = np.ones((64, 1), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
"""


def _run(tmp_path, body: str, *args: str, helper: str = ""):
    """Runs a script of `_MODEL` + `body` under an interception that lets every fit run;
    returns the calls and what the script's fits returned."""
    script = tmp_path / "train.py"
    script.write_text(_MODEL + textwrap.dedent(body))
    if helper:
        (tmp_path / "helper.py").write_text(textwrap.dedent(helper))
    calls, returned = [], []

    def on_fit(call):
        calls.append(call)
        returned.append(call.run())
        return returned[-1]

    with Interception(on_fit):
        run_as_main(script, list(args))
    return script, calls, returned


def test_positional_arguments_reach_keras_as_keras_takes_them(tmp_path):
    # issue 36: `m.fit(x, y, 32, 2)` broke the replaced fit of `tfgpu tune`'s child.
    _, calls, returned = _run(
        tmp_path,
        """
        model.compile(optimizer="adam", loss="mse")
        history = model.fit(x, y, 32, 2, verbose=0, validation_split=0.25)
        assert len(history.history["loss"]) == 2
        """,
    )
    (call,) = calls
    args = call.arguments
    assert (args["batch_size"], args["epochs"], args["validation_split"]) == (32, 2, 0.25)
    assert args["shuffle"] is True and args["callbacks"] is None  # Keras's defaults, filled in
    assert sorted(returned[0].history) == ["loss", "val_loss"]
    data, batch = call.training_arrays()  # without the validation part, cut as Keras cuts it
    assert [a.shape[0] for a in data] == [48, 48] and batch == 32
    np.testing.assert_array_equal(data[0], np.arange(48 * 4, dtype="float32").reshape(48, 4))


def test_the_replaced_fit_has_keras_signature_and_refuses_what_keras_refuses(tmp_path):
    original = keras.Model.fit
    with Interception(lambda call: call.run()):
        assert keras.Model.fit is not original
        assert inspect.signature(keras.Model.fit) == inspect.signature(original)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        with pytest.raises(TypeError, match="unexpected keyword argument 'epoch'"):
            model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epoch=2)
        with pytest.raises(TypeError, match="too many positional arguments"):
            model.fit(*([None] * 17))
    assert keras.Model.fit is original  # put back


def test_places_come_from_the_stack_into_the_users_own_modules(tmp_path):
    _, calls, _ = _run(
        tmp_path,
        """
        import helper

        helper.build(model)
        train = x
        train = train * 1.0
        helper.train(model, train)
        """,
        helper="""
        def build(model):
            model.compile(optimizer="adam", loss="mse")


        def train(model, data):
            model.fit(data, data[:, :1], epochs=1, verbose=0)
        """,
    )
    (call,) = calls
    helper = str(tmp_path / "helper.py")
    assert (call.compiled_at.file, call.compiled_at.line) == (helper, 3)
    assert (call.place.file, call.place.line) == (helper, 7)
    # `data` is the function's argument: no assignment in its scope, the fit call it is.
    assert call.data_at == call.place and call.data_name == "data"
    assert call.where("compile") == f"{helper}:3 (the model's compile call)"
    places = call.places()
    assert places["compile"] == [helper, 3] and places["data_name"] == "data"


def test_the_data_place_is_the_last_statement_that_built_it(tmp_path):
    script, calls, _ = _run(
        tmp_path,
        """
        model.compile(optimizer="adam", loss="mse")
        import tensorflow as tf
        train_ds = tf.data.Dataset.from_tensor_slices((x, y))
        train_ds = train_ds.batch(16)
        model.fit(
            train_ds,
            epochs=1,
            verbose=0,
        )
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0)
        """,
    )
    first, second = calls
    lines = script.read_text().splitlines()
    assert lines[first.data_at.line - 1] == "train_ds = train_ds.batch(16)"
    assert first.data_name == "train_ds" and lines[first.place.line - 1] == "model.fit("
    assert second.data_at == second.place and second.data_name == ""  # built in the call
    assert second.index == 2


def test_fits_inside_on_fit_go_straight_to_keras(tmp_path):
    seen = []

    def on_fit(call):
        seen.append(call.index)
        call.model.fit(call.arguments["x"], call.arguments["y"], epochs=1, verbose=0)  # tfgpu's
        return call.run()

    script = tmp_path / "train.py"
    script.write_text(_MODEL + 'model.compile("sgd", "mse")\nmodel.fit(x, y, verbose=0)\n')
    with Interception(on_fit):
        run_as_main(script, [])
    assert seen == [1]


def test_the_script_runs_as_python_runs_it(tmp_path, monkeypatch):
    script = tmp_path / "argv.py"
    out = tmp_path / "out.txt"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            open({str(out)!r}, "w").write(repr((__name__, sys.argv, sys.path[0])))
            """
        )
    )
    argv = list(sys.argv)
    run_as_main(script, ["--epochs", "3"])
    name, args, first = eval(out.read_text())
    assert name == "__main__" and args == [str(script), "--epochs", "3"]
    assert first == str(tmp_path.resolve())
    assert sys.argv == argv and str(tmp_path.resolve()) not in sys.path  # put back


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (None, 0),
        (SystemExit(), 0),
        (SystemExit(0), 0),
        (SystemExit(3), 3),
        (SystemExit("bad input"), 1),
        (KeyboardInterrupt(), 130),
        (ValueError("x"), 1),
    ],
)
def test_the_exit_status_is_pythons(error, status):
    assert exit_status(error) == status


def test_a_scripts_traceback_starts_at_the_script_without_tfgpus_frames(tmp_path, capsys):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    with pytest.raises(ValueError) as info, Interception(lambda call: call.run()):
        run_as_main(script, [])
    print_error(info.value, script)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n  File ")
    assert f'"{script}", line 4, in <module>' in err and "ValueError: boom" in err
    assert "runpy" not in err and script_module.__file__ not in err
    print_error(SystemExit("bad input"), script)
    assert capsys.readouterr().err == "bad input\n"


def test_a_script_that_does_not_compile_shows_its_syntax_error_as_python_does(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n    pass\n")
    with pytest.raises(SyntaxError) as info:
        run_as_main(script, [])
    print_error(info.value, script)
    err = capsys.readouterr().err
    assert err.startswith(f'  File "{script}", line 1\n') and "SyntaxError: " in err
    assert "Traceback" not in err and "runpy" not in err


def test_the_training_part_is_cut_as_fit_cuts_it():
    x, y = np.arange(10), np.arange(10) * 2
    part = training_part((x, {"a": y}), 0.25)  # floor(10 * 0.75) = 7
    assert part[0].tolist() == list(range(7)) and part[1]["a"].tolist() == [0, 2, 4, 6, 8, 10, 12]


def test_a_loaded_model_is_compiled_as_keras_compiles_it(tmp_path):
    # Keras skips compiling a loaded model whose class has a `compile` of its own: the one
    # put in place must read as Keras's (the multi-GPU guide restores its checkpoints).
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.save(tmp_path / "m.keras")
    seen = []

    def on_fit(call):
        seen.append(call.compiled_at)
        return call.run(verbose=0)

    with Interception(on_fit):
        loaded = keras.models.load_model(tmp_path / "m.keras")
        loaded.fit(np.zeros((4, 2)), np.zeros((4, 1)))
    assert loaded.optimizer is not None and loaded.compiled
    assert seen == [None]  # compiled by `load_model`, not by a line of the user's
