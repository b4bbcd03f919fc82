"""tfgpu.configure: argument checks, the pure plan for every device mix, and the real apply."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_config

import tfgpu
from tests.conftest import run_python
from tfgpu import config
from tfgpu.config import Configuration, _Facts, _Gpu, _Wishes

A100 = _Gpu("/physical_device:GPU:0", "NVIDIA A100-SXM4-80GB", (8, 0))
H100 = _Gpu("/physical_device:GPU:1", "NVIDIA H100 80GB HBM3", (9, 0))
V100 = _Gpu("/physical_device:GPU:1", "Tesla V100-SXM2-16GB", (7, 0))
P100 = _Gpu("/physical_device:GPU:1", "Tesla P100-PCIE-16GB", (6, 0))
UNKNOWN = _Gpu("/physical_device:GPU:0", None, None)


@pytest.fixture(autouse=True)
def _fresh_configure_state():
    """Forgets configure()'s last call after each test (conftest undoes determinism and seeds)."""
    config._last = None
    yield
    config._last = None


# --- bad input: each raises before anything changes ------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (
            {"memory_growth": "yes"},
            TypeError,
            r"argument `memory_growth`. Received: memory_growth='yes'",
        ),
        ({"memory_limit_mib": 4096.5}, TypeError, r"memory_limit_mib=4096.5 \(of type float\)"),
        ({"memory_limit_mib": True}, TypeError, r"argument `memory_limit_mib`"),
        ({"memory_limit_mib": 0}, ValueError, r"memory_limit_mib=0. Expected a positive"),
        ({"memory_limit_mib": -1}, ValueError, r"memory_limit_mib=-1"),
        (
            {"memory_growth": True, "memory_limit_mib": 4096},
            ValueError,
            r"Conflicting arguments: memory_growth=True and memory_limit_mib=4096\. Choose",
        ),
        ({"gpus": "0"}, TypeError, r"argument `gpus`. Received: gpus='0'"),
        ({"gpus": 0}, TypeError, r"Expected a list of GPU indices"),
        ({"gpus": [0.0]}, TypeError, r"gpus=\[0.0\]"),
        ({"gpus": [-1]}, ValueError, r"gpus=\[-1\]. Expected GPU indices >= 0"),
        ({"gpus": [0, 0]}, ValueError, r"each GPU index at most once"),
        (
            {"precision": "fp16"},
            ValueError,
            r"Received: precision='fp16'. Expected one of: 'auto', 'float32', 'mixed_float16', 'mixed_bfloat16'",
        ),
        ({"precision": None}, TypeError, r"argument `precision`"),
        ({"deterministic": 1}, TypeError, r"deterministic=1 \(of type int\). Expected a bool"),
        ({"seed": "42"}, TypeError, r"seed='42'"),
        ({"seed": -1}, ValueError, r"seed=-1. Expected an int in \[0, 2\*\*32 - 1\]"),
        ({"seed": 2**32}, ValueError, r"argument `seed`"),
        ({"async_allocator": "yes"}, TypeError, r"argument `async_allocator`"),
        ({"cpu_devices": 0}, ValueError, r"cpu_devices=0. Expected an int >= 1"),
        ({"cpu_devices": 2.0}, TypeError, r"argument `cpu_devices`"),
    ],
)
def test_bad_arguments_raise_keras_style_before_any_change(kwargs, exc, match):
    keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(exc, match=match):
        tfgpu.configure(**{"precision": "mixed_bfloat16", **kwargs})
    assert keras.mixed_precision.global_policy().name == "float32"


def test_misspelled_option_is_not_swallowed():
    with pytest.raises(TypeError, match="memory_grwth"):
        tfgpu.configure(memory_grwth=True)


def test_gpu_index_out_of_range_on_this_machine():
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has GPUs")
    with pytest.raises(
        ValueError, match=r"gpus=\[0\]. Expected None or \[\] \(TensorFlow sees no GPU"
    ):
        tfgpu.configure(gpus=[0])


def test_gpu_index_out_of_range_in_the_plan():
    facts = _Facts(gpus=(A100, H100))
    with pytest.raises(ValueError, match=r"gpus=\[0, 2\]. Expected indices .* 0 to 1 \(2 GPU"):
        config._plan(facts, _Wishes(gpus=(0, 2)))


# --- the plan: every device mix, without a GPU --------------------------------------------


def _planned(facts, wishes) -> Configuration:
    """The record the plan would have `configure()` return."""
    return config._plan(facts, wishes).configuration


def _labels(gpus) -> tuple[str, ...]:
    return tuple(g.label() for g in gpus)


@pytest.mark.parametrize(
    "gpus, policy",
    [
        ((), "float32"),  # CPU: never mixed_float16 (several times slower here)
        ((A100,), "mixed_bfloat16"),
        ((A100, H100), "mixed_bfloat16"),
        ((A100, V100), "mixed_float16"),  # the common denominator
        ((V100,), "mixed_float16"),
        ((A100, P100), "float32"),
        ((UNKNOWN,), "float32"),
    ],
)
def test_auto_precision_by_device_mix(gpus, policy):
    plan = _planned(_Facts(gpus=gpus), _Wishes())
    assert plan.precision == policy
    assert plan.gpus == _labels(gpus)
    assert plan.memory_growth is (True if gpus else None)  # growth is the default
    assert plan.notes == ()


def test_auto_precision_follows_the_selected_gpus():
    plan = config._plan(_Facts(gpus=(V100, A100)), _Wishes(gpus=(1,)))
    assert plan.configuration.precision == "mixed_bfloat16"
    assert plan.configuration.gpus == _labels((A100,))
    assert plan.visible_gpus == (1,)
    cpu = _planned(_Facts(gpus=(V100, A100)), _Wishes(gpus=()))
    assert cpu.precision == "float32" and cpu.gpus == () and cpu.memory_growth is None


def test_memory_limit_replaces_growth():
    plan = _planned(_Facts(gpus=(A100,)), _Wishes(memory_limit_mib=8192))
    assert plan.memory_limit_mib == 8192 and plan.memory_growth is None
    off = _planned(_Facts(gpus=(A100,)), _Wishes(memory_growth=False))
    assert off.memory_growth is False
    cpu = _planned(_Facts(), _Wishes(memory_limit_mib=8192))
    assert cpu.memory_limit_mib is None and "no GPU is used" in cpu.notes[0]


def test_allow_growth_variable_overriding_the_wish_is_noted():
    facts = _Facts(gpus=(A100,), env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    plan = _planned(facts, _Wishes())
    assert "TF_FORCE_GPU_ALLOW_GROWTH=false overrides memory_growth=True" in plan.notes[0]


@pytest.mark.parametrize(
    "gpus, precision, note",
    [
        ((), "mixed_float16", "slower than float32"),
        ((V100,), "mixed_bfloat16", "no bfloat16 tensor cores"),
        ((P100,), "mixed_float16", "without tensor cores"),
    ],
)
def test_explicit_policy_that_does_not_fit_is_kept_and_noted(gpus, precision, note):
    plan = _planned(_Facts(gpus=gpus), _Wishes(precision=precision))
    assert plan.precision == precision and plan.precision_reason == "requested"
    assert note in plan.notes[0]


def test_determinism_without_seed_uses_zero():
    plan = _planned(_Facts(), _Wishes(deterministic=True))
    assert plan.seed == 0 and plan.deterministic and "seed=0" in plan.notes[0]


def test_async_allocator_before_and_after_gpu_init():
    fresh = config._plan(_Facts(gpus=(A100,)), _Wishes(async_allocator=True))
    assert fresh.set_async_allocator and fresh.configuration.async_allocator
    assert fresh.configuration.notes == ()
    late = config._plan(
        _Facts(gpus=(A100,), runtime_initialized=True), _Wishes(async_allocator=True)
    )
    assert not late.set_async_allocator and not late.configuration.async_allocator
    notes = late.configuration.notes
    assert "already initialized" in notes[0] and "before starting Python" in notes[0]
    preset = _Facts(
        gpus=(A100,), runtime_initialized=True, env={"TF_GPU_ALLOCATOR": "cuda_malloc_async"}
    )
    assert _planned(preset, _Wishes(async_allocator=True)).async_allocator
    assert _planned(preset, _Wishes()).async_allocator  # set by the environment
    cpu = _planned(_Facts(), _Wishes(async_allocator=True))
    assert "no effect: no GPU" in cpu.notes[0]
    other = _planned(
        _Facts(gpus=(A100,), env={"TF_GPU_ALLOCATOR": "cuda_malloc"}), _Wishes(async_allocator=True)
    )
    assert "TF_GPU_ALLOCATOR=cuda_malloc replaced" in other.notes[0]


# --- the real apply path on this CPU ------------------------------------------------------


def test_apply_sets_policy_seed_and_determinism():
    cfg = tfgpu.configure(precision="mixed_bfloat16", deterministic=True, seed=7)
    assert isinstance(cfg, Configuration)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert tf_config.is_op_determinism_enabled()
    first = (np.random.rand(), float(keras.random.uniform(())), float(tf.random.uniform(())))
    keras.utils.set_random_seed(7)
    second = (np.random.rand(), float(keras.random.uniform(())), float(tf.random.uniform(())))
    assert first == second
    assert cfg.precision == "mixed_bfloat16" and cfg.seed == 7 and cfg.deterministic
    json.dumps(cfg.to_dict())
    text = str(cfg)
    assert "precision    mixed_bfloat16 (requested)" in text
    assert "determinism  on, seed 7" in text


def test_record_says_when_determinism_cannot_be_turned_off():
    tfgpu.configure(precision="float32", deterministic=True, seed=1)
    cfg = tfgpu.configure(precision="float32", deterministic=False)
    assert tf_config.is_op_determinism_enabled()
    assert cfg.deterministic  # the record tells the truth, not the wish
    assert any("op determinism stays on" in n for n in cfg.notes)


def test_auto_on_this_cpu_is_float32():
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has GPUs")
    keras.mixed_precision.set_global_policy("mixed_float16")
    cfg = tfgpu.configure()
    assert cfg.precision == "float32" and "no GPU" in cfg.precision_reason
    assert keras.mixed_precision.global_policy().name == "float32"
    assert cfg.gpus == () and cfg.memory_growth is None
    assert "GPUs         none (TensorFlow runs on the CPU)" in str(cfg)


def test_same_wishes_again_do_nothing():
    cfg = tfgpu.configure(precision="mixed_bfloat16", seed=3)
    keras.mixed_precision.set_global_policy("float32")  # changed behind configure's back
    assert tfgpu.configure(precision="mixed_bfloat16", seed=3) is cfg
    assert keras.mixed_precision.global_policy().name == "float32"  # nothing was re-applied
    assert tfgpu.configure(precision="mixed_float16", seed=3).precision == "mixed_float16"


def test_after_init_device_settings_in_effect_pass_and_others_raise():
    tf.constant(1.0)  # the runtime is initialized (conftest split the CPU into 4)
    assert tfgpu.configure(cpu_devices=4).cpu_devices == 4  # already in effect: fine
    keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(RuntimeError, match=r"could not apply cpu_devices=2: .* before building"):
        tfgpu.configure(cpu_devices=2, precision="mixed_bfloat16")
    assert keras.mixed_precision.global_policy().name == "float32"  # nothing else changed
    assert len(tf.config.list_logical_devices("CPU")) == 4


def test_memory_growth_refused_by_tensorflow_names_the_setting(monkeypatch):
    # A GPU process whose runtime started without growth: TensorFlow refuses the change.
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")

    def refuse(device, enable):
        raise RuntimeError("Physical devices cannot be modified after being initialized")

    monkeypatch.setattr(
        config, "_read_facts", lambda: _Facts(gpus=(A100,), runtime_initialized=True)
    )
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [gpu])
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", refuse)
    with pytest.raises(
        RuntimeError, match=r"could not apply memory_growth=True: TensorFlow already"
    ):
        tfgpu.configure(precision="float32")


@pytest.mark.slow
def test_fresh_process_applies_async_allocator_and_refuses_late_changes():
    code = """
import json, os, tfgpu
cfg = tfgpu.configure(cpu_devices=3, async_allocator=True, deterministic=True)
import tensorflow as tf
n = len(tf.config.list_logical_devices("CPU"))
same = tfgpu.configure(cpu_devices=3, async_allocator=True, deterministic=True) is cfg
try:
    tfgpu.configure(cpu_devices=2)
    late = None
except RuntimeError as e:
    late = str(e)
print(json.dumps({"n": n, "same": same, "late": late, "env": os.environ.get("TF_GPU_ALLOCATOR"),
                  "cfg": cfg.to_dict()}))
"""
    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["n"] == 3 and out["same"] is True
    assert "cpu_devices=2" in out["late"] and "tfgpu.configure()" in out["late"]
    assert out["env"] == "cuda_malloc_async"
    assert out["cfg"]["seed"] == 0 and out["cfg"]["deterministic"] is True


def test_facts_are_the_gpus_tensorflow_lists_hidden_ones_too(monkeypatch):
    from tfgpu._internal.adapters import devices
    from tfgpu._internal.adapters.devices import PhysicalGpu

    listed = [
        PhysicalGpu(0, A100.name, A100.device_name, A100.compute_capability, False, 0),
        PhysicalGpu(1, H100.name, H100.device_name, H100.compute_capability, True, 1),
    ]
    monkeypatch.setattr(devices, "physical_gpus", lambda: listed)
    # configure(gpus=...) indexes every GPU TensorFlow lists, not only the ones it uses now.
    assert config._read_facts().gpus == (A100, H100)
