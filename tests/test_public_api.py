"""The public surface: exactly the names promised, and a fast, light `import tfgpu`."""

from __future__ import annotations

import json

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
}


def test_all_is_exactly_the_promised_surface():
    assert set(tfgpu.__all__) == EXPECTED
    assert len(tfgpu.__all__) == len(EXPECTED)


def test_every_public_name_resolves_and_has_a_docstring():
    for name in tfgpu.__all__:
        value = getattr(tfgpu, name)
        if name != "__version__":
            assert value.__doc__ and value.__doc__.strip(), f"tfgpu.{name} has no docstring"


def test_functions_stay_callable_after_their_module_is_imported():
    import tfgpu.config
    import tfgpu.diagnosis

    assert callable(tfgpu.configure) and callable(tfgpu.diagnose)


def test_unknown_attribute_raises_attribute_error():
    try:
        tfgpu.does_not_exist  # noqa: B018
    except AttributeError as e:
        assert "does_not_exist" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_import_is_light_and_fast():
    code = (
        "import sys, time, json\n"
        "t = time.perf_counter(); import tfgpu; dt = time.perf_counter() - t\n"
        "heavy = [m for m in ('tensorflow', 'keras', 'pynvml', 'tensorflow_datasets', 'matplotlib')"
        " if m in sys.modules]\n"
        "print(json.dumps({'seconds': dt, 'heavy': heavy}))\n"
    )
    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["heavy"] == []
    assert out["seconds"] < 0.5


def test_every_exported_name_is_in_all_and_back():
    assert set(tfgpu._EXPORTS) | {"__version__"} == set(tfgpu.__all__)
