"""`tfgpu.diagnose()`: each bottleneck built on purpose is named; the decisions, tested pure."""

from __future__ import annotations

import json
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu.diagnosis import (
    Diagnosis,
    _classify,
    _Facts,
    _lint_mixed_precision,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(1024, 256)).astype("float32")
Y = RNG.normal(size=(1024, 1)).astype("float32")


def _heavy_model():
    """A step of tens of milliseconds on a CPU core: fixed per-step costs are small."""
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile("adam", "mse")
    return model


def _tiny_model():
    model = keras.Sequential(
        [keras.Input((256,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=1)
    return model


def _sleepy(x, y):
    def slow(a):
        time.sleep(0.1)
        return a

    out = tf.py_function(slow, [x], tf.float32)
    out.set_shape(x.shape)
    return out, y


FAST = dict(check_xla=False, check_steps_per_execution=False, steps=5, warmup=2)


@pytest.mark.slow
def test_pipeline_slowed_on_purpose_is_input_bound():
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(256).map(_sleepy)
    diagnosis = tfgpu.diagnose(_heavy_model(), ds, **FAST)
    assert diagnosis.bottleneck == "input"
    assert diagnosis.input_bound == "high" and diagnosis.input_wait_share >= 0.2
    finding = diagnosis.finding("input_bound")
    assert "tfgpu.data.pipeline" in finding.recommendation and finding.gain_measured
    traffic = diagnosis.finding("host_device_traffic")
    assert "py_function" in traffic.detail and "not prefetched" in traffic.detail


@pytest.mark.slow
def test_same_model_on_cached_prefetched_data_is_not_input_bound():
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(256).cache().prefetch(tf.data.AUTOTUNE)
    # Longer windows than FAST: on a shared 2-core host a 5-step window is too noisy.
    diagnosis = tfgpu.diagnose(_heavy_model(), ds, **{**FAST, "steps": 20})
    # Not highly input-bound. On a 2-core host shared with other jobs, tf.data's threads and
    # the matmuls contend, which can show as a few percent of "wait" (moderate at most).
    assert diagnosis.input_bound != "high", str(diagnosis)
    assert diagnosis.input_wait_share < 0.2
    assert diagnosis.finding("host_device_traffic") is None


def _state(model):
    return [v.numpy().copy() for v in model.weights + model.optimizer.variables]


@pytest.mark.slow
def test_tiny_model_with_one_step_per_execution_is_host_overhead_bound(tmp_path):
    model = _tiny_model()
    model.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0)
    history = model.history
    before = _state(model)

    diagnosis = tfgpu.diagnose(
        model, (X, Y), batch_size=16, steps=30, check_xla=True, run_dir=tmp_path
    )

    assert diagnosis.bottleneck == "host_overhead", str(diagnosis)
    finding = diagnosis.finding("host_overhead")
    assert "steps_per_execution=16" in finding.recommendation
    assert finding.gain_measured and finding.expected_gain >= 1.3
    assert "TF_GPU_THREAD_MODE" not in finding.recommendation  # CPU: GPU-only advice left out
    assert "NumPy" in diagnosis.finding("host_device_traffic").detail
    xla = diagnosis.measurements["xla"]
    assert xla["jit_compile=False"] > 0 and xla["jit_compile=True"] > 0
    assert diagnosis.flops_per_step == 3 * 2 * 16 * (256 * 8 + 8 * 1)
    assert diagnosis.mfu is None  # no GPU, no peak
    # The model is left as found.
    for a, b in zip(before, _state(model)):
        np.testing.assert_array_equal(a, b)
    assert model.steps_per_execution == 1 and model.jit_compile is False
    assert model.history is history
    # Text, data and the saved file agree.
    text = str(diagnosis)
    assert "bottleneck = host_overhead" in text and "steps_per_execution=16" in text
    saved = json.loads((tmp_path / "diagnosis.json").read_text())
    assert saved["bottleneck"] == "host_overhead"
    assert saved["findings"][0]["kind"] == diagnosis.findings[0].kind
    from tfgpu.report import write_report

    assert "bottleneck = host_overhead" in write_report(tmp_path).read_text()


def _facts(**kw):
    base = dict(step_time_s=0.1, compute_step_time_s=0.1, input_batch_time_s=0.01, batch_size=64)
    return _Facts(**{**base, **kw})


@pytest.mark.parametrize(
    ("compute", "level", "bottleneck"),
    [(0.080, "high", "input"), (0.081, "moderate", "input"), (0.095, "moderate", "input"),
     (0.0951, "no", "compute")],
)  # fmt: skip
def test_input_thresholds_are_the_profilers(compute, level, bottleneck):
    got, got_level, share, _ = _classify(_facts(compute_step_time_s=compute))
    assert (got, got_level) == (bottleneck, level)
    assert share == pytest.approx((0.1 - compute) / 0.1)


def test_precision_finding_names_the_policy_and_the_peak_ratio():
    facts = _facts(on_gpu=True, gpu_name="NVIDIA A100-SXM4-40GB", compute_capabilities=[(8, 0)])
    _, _, _, findings = _classify(facts)
    precision = next(f for f in findings if f.kind == "precision")
    assert 'precision="mixed_bfloat16"' in precision.recommendation
    assert precision.expected_gain == pytest.approx(312 / 156)  # bf16 vs TF32 peak
    assert not precision.gain_measured
    # Already mixed, or a GPU without tensor cores: nothing to say.
    assert all(
        f.kind != "precision" for f in _classify(_facts(on_gpu=True, policy="mixed_bfloat16",
                                                         compute_capabilities=[(8, 0)]))[3]
    )  # fmt: skip
    assert all(
        f.kind != "precision"
        for f in _classify(_facts(on_gpu=True, compute_capabilities=[(6, 1)]))[3]
    )


def test_memory_headroom_and_gpu_host_overhead_advice():
    facts = _facts(
        on_gpu=True,
        peak_memory_bytes=4 * 2**30,
        memory_capacity_bytes=80 * 2**30,
        compute_step_time_s=0.002,
        step_time_s=0.002,
        spe_probe_step_time_s=0.0005,
    )
    bottleneck, _, _, findings = _classify(facts)
    assert bottleneck == "host_overhead"
    kinds = {f.kind: f for f in findings}
    assert "TF_GPU_THREAD_MODE=gpu_private" in kinds["host_overhead"].recommendation
    assert kinds["host_overhead"].expected_gain == pytest.approx(4.0)
    assert "find_batch_size" in kinds["memory_headroom"].recommendation
    assert "18.0x" in kinds["memory_headroom"].detail
    full = _facts(on_gpu=True, peak_memory_bytes=70 * 2**30, memory_capacity_bytes=80 * 2**30)
    assert all(f.kind != "memory_headroom" for f in _classify(full)[3])


def test_xla_and_loss_scale_findings():
    _, _, _, findings = _classify(_facts(xla_other_step_time_s=0.05))
    xla = next(f for f in findings if f.kind == "xla")
    assert "jit_compile=True" in xla.recommendation and xla.expected_gain == pytest.approx(2.0)
    assert all(f.kind != "xla" for f in _classify(_facts(xla_other_step_time_s=0.095))[3])
    collapsing = _facts(loss_scale_before=32768.0, loss_scale_after=512.0)
    assert any(f.kind == "loss_scale" for f in _classify(collapsing)[3])
    stable = _facts(loss_scale_before=32768.0, loss_scale_after=16384.0)
    assert all(f.kind != "loss_scale" for f in _classify(stable)[3])


def test_mixed_precision_lint():
    keras.mixed_precision.set_global_policy("mixed_float16")  # restored by conftest
    model = keras.Sequential(
        [keras.Input((30,)), keras.layers.Dense(64), keras.layers.Dense(10, activation="softmax")]
    )
    kinds = {f.kind: f for f in _lint_mixed_precision(model, [(8, 0)])}
    assert 'dtype="float32"' in kinds["mixed_precision_output"].recommendation
    assert "(30, 64)" in kinds["mixed_precision_dims"].detail
    assert "(64, 10)" in kinds["mixed_precision_dims"].detail
    # No tensor cores known (CPU): the output layer still matters, the dims do not.
    assert {f.kind for f in _lint_mixed_precision(model, [])} == {"mixed_precision_output"}

    fixed = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64),
            keras.layers.Dense(16),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    assert _lint_mixed_precision(fixed, [(8, 0)]) == []
    keras.mixed_precision.set_global_policy("float32")
    assert _lint_mixed_precision(_tiny_model(), [(8, 0)]) == []


@pytest.mark.slow
def test_profiler_trace_is_captured_into_the_run_dir(tmp_path):
    ds = tf.data.Dataset.from_tensor_slices((X[:256], Y[:256])).batch(32).prefetch(2)
    diagnosis = tfgpu.diagnose(_tiny_model(), ds, profile=True, run_dir=tmp_path, **FAST)
    assert diagnosis.profile_dir == str(tmp_path / "profile")
    assert list((tmp_path / "profile").rglob("*.xplane.pb"))


def test_bad_arguments_are_rejected_before_work():
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not compiled"):
        tfgpu.diagnose(model, (X, Y))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="steps=1"):
        tfgpu.diagnose(model, (X, Y), steps=1)
    with pytest.raises(ValueError, match="run_dir=None"):
        tfgpu.diagnose(model, (X, Y), profile=True)
    with pytest.raises(TypeError, match="dataset"):
        tfgpu.diagnose(model, "data")
    with pytest.raises(TypeError, match="model"):
        tfgpu.diagnose("model", (X, Y))
    assert isinstance(tfgpu.Diagnosis, type) and tfgpu.Diagnosis is Diagnosis


def _fresh_model(initial=None):
    """A freshly compiled model (Adam and a metric not built yet), with a dropout seed."""
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.2, seed=1),
            keras.layers.Dense(1),
        ]
    )
    if initial is not None:
        model.set_weights(initial)
    model.compile(keras.optimizers.Adam(1e-2), "mse", metrics=["mae"])
    return model


def test_training_after_diagnose_is_the_training_without_it():
    keras.utils.set_random_seed(0)
    initial = _fresh_model().get_weights()
    ds = tf.data.Dataset.from_tensor_slices((X[:256], Y[:256])).batch(32)

    alone = _fresh_model(initial)
    alone.fit(ds, epochs=2, verbose=0, shuffle=False)

    diagnosed = _fresh_model(initial)
    assert not diagnosed.optimizer.built  # the case that used to leak the probe steps
    tfgpu.diagnose(diagnosed, ds, **{**FAST, "steps": 3, "warmup": 1})
    assert int(diagnosed.optimizer.iterations.numpy()) == 0
    history = diagnosed.fit(ds, epochs=2, verbose=0, shuffle=False)

    for a, b in zip(alone.get_weights(), diagnosed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(alone.optimizer.variables, diagnosed.optimizer.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert history.history["mae"] == pytest.approx(alone.history.history["mae"], rel=1e-6)


def test_a_tfgpu_pipeline_counts_as_prefetched():
    from tfgpu.diagnosis import _inspect_dataset

    piped = tfgpu.data.pipeline((X[:256], Y[:256]), batch_size=32)
    assert _inspect_dataset(piped) == {"python_input": False, "prefetch": True}
    # Options and other no-op wrappers on top of a prefetch are looked through...
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    wrapped = tf.data.Dataset.from_tensor_slices(X[:64]).batch(8).prefetch(2)
    assert _inspect_dataset(wrapped.with_options(options).with_options(options))["prefetch"]
    # ... but not work that comes after it.
    after = wrapped.map(lambda x: x * 2).with_options(options)
    assert not _inspect_dataset(after)["prefetch"]
    assert not _inspect_dataset(tf.data.Dataset.from_tensor_slices(X[:64]).batch(8))["prefetch"]
