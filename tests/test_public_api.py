"""The public surface: exactly the names promised, and a fast, light `import tfgpu`."""

from __future__ import annotations

import json

import pytest

import tfgpu
from tests.conftest import run_python

EXPECTED = {
    "__version__",
    "configure",
    "Configuration",
    "environment",
    "EnvironmentReport",
    "strategy",
    "global_batch_size",
    "scale_learning_rate",
    "diagnose",
    "Diagnosis",
    "find_batch_size",
    "BatchSizeResult",
    "callbacks",
    "data",
    "monitor",
    "flops",
    "precision",
    "report",
    "tune",
    "TuneResult",
    "scaling",
    "ScalingResult",
}


def test_all_is_exactly_the_promised_surface():
    assert set(tfgpu.__all__) == EXPECTED
    assert len(tfgpu.__all__) == len(EXPECTED)


def test_the_type_checking_imports_name_exactly_the_declared_exports():
    # The names are declared once (`_EXPORTS`); the imports for type checkers repeat them
    # and must not drift: the same names, each from the module that defines it.
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(tfgpu))
    block = next(
        n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
    )
    imported = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            module = node.module if node.module != "tfgpu" else f"tfgpu.{alias.name}"
            imported[alias.asname or alias.name] = module
    assert imported == tfgpu._EXPORTS


def test_every_public_name_resolves_and_has_a_docstring():
    for name in tfgpu.__all__:
        value = getattr(tfgpu, name)
        if name != "__version__":
            assert value.__doc__ and value.__doc__.strip(), f"tfgpu.{name} has no docstring"


def test_a_function_is_still_itself_after_its_module_is_imported():
    # `import tfgpu.diagnosis` sets the attribute `tfgpu.diagnosis` (the module): the lazy
    # names must keep pointing at the functions, never at a module of a similar name.
    import tfgpu.config
    import tfgpu.diagnosis

    assert tfgpu.configure is tfgpu.config.configure
    assert tfgpu.diagnose is tfgpu.diagnosis.diagnose
    import tfgpu.tuning

    assert tfgpu.tune is tfgpu.tuning.tune


def test_the_modules_the_docs_present_are_reachable_after_import_tfgpu():
    for name in ("callbacks", "data", "monitor", "flops", "precision", "report"):
        module = getattr(tfgpu, name)
        assert module.__name__ == f"tfgpu.{name}" and module.__all__, name


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'does_not_exist'"):
        tfgpu.does_not_exist  # noqa: B018


def test_import_is_light():
    # Fast by construction, not by a stopwatch (a loaded machine makes any time limit flaky):
    # `import tfgpu` loads its own __init__ and a handful of standard-library modules, and
    # nothing heavy (no TensorFlow, Keras, NVML, TFDS or matplotlib).
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import tfgpu\n"
        "new = sorted(set(sys.modules) - before)\n"
        "print(json.dumps(new))\n"
    )
    new = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert [m for m in new if m.split(".")[0] == "tfgpu"] == ["tfgpu"]
    heavy = ("tensorflow", "keras", "pynvml", "tensorflow_datasets", "matplotlib", "numpy")
    assert not [m for m in new if m.split(".")[0] in heavy]
    assert len(new) < 20, new


def test_every_exported_name_is_in_all_and_back():
    assert set(tfgpu._EXPORTS) | {"__version__"} == set(tfgpu.__all__)
