"""tfgpu._internal.helpers.warn: warnings reach the user however Python runs their code.

In-process: the kinds of `__main__` (a file, `-c`, stdin, a cell without a file) built with
`exec`. In subprocesses: a real `GPUMonitor` without NVML, run as a script file, with `-c`,
from standard input, in IPython and in a Jupyter kernel; the "records no GPU metrics"
warning must appear exactly once in each, and nothing about failing to start sampling.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tfgpu._internal.helpers import warn

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_once_warnings():
    warn.forget()
    yield
    warn.forget()


def _run_as_main(filename: str, loader=None, **extra) -> list[warnings.WarningMessage]:
    """Runs a call to `warn_at_user_code` as `__main__` code compiled from `filename`."""
    source = (
        "from tfgpu._internal.helpers import warn\n"
        "for _ in range(3):\n"
        "    warn.warn_at_user_code('about your fit', RuntimeWarning, once='test-key')\n"
    )
    namespace = {"__name__": "__main__", "__builtins__": builtins, **extra}
    if loader is not None:
        namespace["__loader__"] = loader
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        exec(compile(source, filename, "exec"), namespace)
    return caught


@pytest.mark.parametrize(
    ("filename", "loader"),
    [
        ("<stdin>", importlib.machinery.BuiltinImporter),  # python - <<EOF
        ("<string>", importlib.machinery.BuiltinImporter),  # python -c
        ("/tmp/ipykernel_1234/1234567.py", None),  # a Jupyter cell: no loader, no file
        ("<ipython-input-3-abc>", None),  # an IPython cell
    ],
)
def test_a_warning_reaches_every_kind_of_main_once(filename, loader):
    caught = _run_as_main(filename, loader)
    assert [(str(w.message), w.filename, w.lineno) for w in caught] == [
        ("about your fit", filename, 3)
    ]
    warn.forget("test-key")
    assert len(_run_as_main(filename, loader)) == 1  # forgotten: shown again


def test_a_script_file_gets_its_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    (warning,) = _run_as_main(str(script), None, __file__=str(script))
    assert warning.filename == str(script) and warning.lineno == 3


def test_without_a_key_python_s_rule_applies_once_per_call_site():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            warn.warn_at_user_code("same line", UserWarning)
        warn.warn_at_user_code("same line", UserWarning)  # another line
    assert [w.filename for w in caught] == [__file__, __file__]


def test_the_user_s_filters_apply():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warn.warn_at_user_code("hidden", RuntimeWarning)
    assert caught == []
    with warnings.catch_warnings(), pytest.raises(RuntimeWarning, match="an error"):
        warnings.simplefilter("error")
        warn.warn_at_user_code("an error", RuntimeWarning)


def test_a_broken_showwarning_never_raises(caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("stderr is closed")

    monkeypatch.setattr(warnings, "showwarning", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = broken
        warn.warn_at_user_code("still said", RuntimeWarning)
    assert any("still said" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- real processes
_FIT = """\
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.modules["pynvml"] = None  # NVML missing, whatever this machine has
import keras, numpy as np
from tfgpu.callbacks import GPUMonitor
x, y = np.zeros((8, 2), "float32"), np.zeros((8, 1), "float32")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
"""
_TWO_FITS = """\
for _ in range(2):
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[GPUMonitor()])
print("TRAINED", len(model.history.history["host_rss_mib_max"]))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": ""}


def _check(output: str) -> None:
    assert "TRAINED 1" in output, output[-3000:]
    assert output.count("records no GPU metrics") == 1, output[-3000:]
    assert "could not start sampling" not in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["script", "-c", "stdin", "ipython"])
def test_the_nvml_warning_is_shown_once_however_python_runs_the_code(how, tmp_path):
    code = _FIT + _TWO_FITS
    stdin = None
    if how == "script":
        script = tmp_path / "train.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    elif how == "-c":
        argv = [sys.executable, "-c", code]
    elif how == "stdin":
        argv, stdin = [sys.executable, "-"], code
    else:
        pytest.importorskip("IPython")
        argv = [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=NoColor"]
        argv += ["-c", code]
    result = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check(result.stdout + result.stderr)
    if how == "script":  # at the user's fit line
        assert f"{tmp_path / 'train.py'}:10: RuntimeWarning" in result.stderr


@pytest.mark.slow
def test_the_nvml_warning_is_shown_once_in_a_jupyter_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for key, value in _env().items():
        monkeypatch.setenv(key, value)  # the kernel inherits this environment
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(_FIT), nbformat.v4.new_code_cell(_TWO_FITS)]
    nb.cells.append(nbformat.v4.new_code_cell(_TWO_FITS))  # a cell run again: still once
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", output
            text.append(output.get("text", ""))
    joined = "\n".join(text)
    assert joined.count("TRAINED 1") == 2, joined[-3000:]
    _check(joined)
