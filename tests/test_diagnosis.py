"""`tfgpu.diagnose()`: each bottleneck built on purpose is named; the decisions, tested pure."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.conftest import ScriptedTiming
from tfgpu._internal.measure import reader
from tfgpu._internal.measure import timing as protocol
from tfgpu._internal.measure import variants as variants_module
from tfgpu._internal.measure.facts import batch_facts, pipeline_facts
from tfgpu._internal.measure.rules import MAX_ROUNDS
from tfgpu._internal.measure.variants import Steady, Variants
from tfgpu.diagnosis import Diagnosis, _probes
from tfgpu.diagnosis._classify import classify, share_verdict
from tfgpu.diagnosis._facts import DiagnoseFacts
from tfgpu.diagnosis._model import lint_mixed_precision

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
def test_pipeline_slowed_on_purpose_is_measured_slow_and_its_python_step_named():
    # What holds on any machine, loaded or not: each batch sleeps 100 ms in a sequential map,
    # so no step is faster than that; the Python step and the missing prefetch are read from
    # the pipeline itself. (The verdict, which depends on the compute time, is checked on a
    # scripted clock below.)
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(256).map(_sleepy)
    diagnosis = tfgpu.diagnose(_heavy_model(), ds, **FAST)
    # (the median gap between two calls' ends: 10% below the sleep for a scheduler's jitter)
    assert diagnosis.step_time_s >= 0.09, str(diagnosis)
    traffic = diagnosis.finding("host_device_traffic")
    assert "py_function" in traffic.detail and "not prefetched" in traffic.detail


@pytest.mark.slow
def test_pipeline_slowed_on_purpose_is_input_bound(monkeypatch):
    _ScriptedSteps(monkeypatch, device_s=0.02, real_s=0.1)
    ds = tf.data.Dataset.from_tensor_slices((X[:512], Y[:512])).batch(256).map(_sleepy)
    diagnosis = tfgpu.diagnose(_heavy_model(), ds, **FAST)
    assert diagnosis.bottleneck == "input"
    assert diagnosis.input_bound == "high" and diagnosis.input_wait_share == pytest.approx(0.8)
    # A Python step in the pipeline: the advice is about that step, not "use a pipeline".
    assert "`tf.py_function`" in diagnosis.finding("input_bound").recommendation


def _ScriptedSteps(
    monkeypatch,
    *,
    device_s,
    real_s,
    spe_gain=1.0,
    xla_factor=1.0,
    xla_error=None,
    trace_s=0.0,
):
    """The suite's scripted engine (`tests.conftest.ScriptedTiming`) with diagnose's steps:
    seconds per step from the run's setup. `device_s` is the step on a batch already in
    memory, `real_s` the step on the user's data (a number, or a list used round after
    round, to script noise); `steps_per_execution=16` divides the device step by `spe_gain`,
    `jit_compile` multiplies it by `xla_factor`; `xla_error` makes the XLA probe raise it. A
    real fit of one step traces each new train function (so the probes, the state restore
    and the files are exercised), `trace_s` more on the clock. `.fits` lists each fit's
    (what, scripted seconds per step): "real", "device", "spe" or "xla".
    """
    original_device_resident = variants_module.device_resident
    device_datasets: list = []
    fits: list[tuple[str, float]] = []
    reals = [0]

    def device_resident(*args):
        ds = original_device_resident(*args)
        device_datasets.append(ds)
        return ds

    def pick(value, i):
        return value[i % len(value)] if isinstance(value, (list, tuple)) else value

    def step(model, dataset):
        if not any(dataset is d for d in device_datasets):
            seconds, what = pick(real_s, reals[0]), "real"
            reals[0] += 1
        else:
            if model.jit_compile and xla_error is not None:
                raise xla_error
            seconds, what = pick(device_s, reals[0]), "device"
            if int(model.steps_per_execution) > 1:
                seconds /= spe_gain
                what = "spe"
            if model.jit_compile:
                seconds *= xla_factor
                what = "xla"
        fits.append((what, seconds))
        return seconds

    monkeypatch.setattr(variants_module, "device_resident", device_resident)
    monkeypatch.setattr(_probes, "warm_real", lambda *a, **k: None)
    engine = ScriptedTiming(monkeypatch, step, real_fit=True, trace_s=trace_s)
    engine.fits = fits
    return engine


@pytest.mark.slow
def test_real_step_barely_above_the_device_step_is_not_input_bound(monkeypatch):
    _ScriptedSteps(monkeypatch, device_s=0.040, real_s=0.0404)
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(256).cache().prefetch(tf.data.AUTOTUNE)
    diagnosis = tfgpu.diagnose(_heavy_model(), ds, **FAST)
    assert diagnosis.input_bound == "no" and diagnosis.input_wait_share == pytest.approx(
        0.0004 / 0.0404
    )
    assert diagnosis.finding("input_bound") is None
    assert diagnosis.finding("host_device_traffic") is None


@pytest.mark.slow
def test_the_probe_keeps_the_variant_that_is_clearly_faster(monkeypatch):
    _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004, spe_gain=3.0, xla_factor=1.2)
    diagnosis = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2)
    assert diagnosis.bottleneck == "host_overhead", str(diagnosis)
    finding = diagnosis.finding("host_overhead")
    assert "steps_per_execution=16" in finding.recommendation
    assert finding.gain_measured and finding.expected_gain == pytest.approx(3.0)
    assert diagnosis.finding("xla") is None  # measured slower: not advised


@pytest.mark.slow
def test_a_probe_measured_as_no_gain_is_not_recommended(monkeypatch):
    _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004, spe_gain=1.0, xla_factor=1.0)
    diagnosis = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2)
    host = diagnosis.finding("host_overhead")
    assert host is None or "steps_per_execution=16" not in host.recommendation, str(diagnosis)


def _state(model):
    return [v.numpy().copy() for v in model.weights + model.optimizer.variables]


@pytest.mark.slow
def test_a_real_diagnosis_probes_restores_the_model_and_its_files_agree(tmp_path):
    model = _tiny_model()
    model.fit(X[:64], Y[:64], batch_size=32, epochs=1, verbose=0)
    history = model.history
    before = _state(model)

    diagnosis = tfgpu.diagnose(
        model, (X, Y), batch_size=16, steps=30, check_xla=True, log_dir=tmp_path
    )

    # Which bottleneck wins depends on this machine's load (see the scripted tests above for
    # the verdicts); what follows does not.
    spe = diagnosis.measurements["steps_per_execution_probe"]
    assert spe["steps_per_execution=1"] > 0 and spe["steps_per_execution=16"] > 0
    for finding in diagnosis.findings:  # CPU: GPU-only advice left out
        assert "TF_GPU_THREAD_MODE" not in finding.recommendation
    assert "NumPy" in diagnosis.finding("host_device_traffic").detail
    xla = diagnosis.measurements["xla"]
    assert xla["jit_compile=False"] > 0 and xla["jit_compile=True"] > 0
    # No input gradient below the first layer: 2x its forward FLOPs, 3x for the layers above.
    assert diagnosis.flops_per_step == 2 * 2 * 16 * 256 * 8 + 3 * 2 * 16 * 8 * 1
    assert diagnosis.mfu is None  # no GPU, no peak
    # The model is left as found.
    for a, b in zip(before, _state(model)):
        np.testing.assert_array_equal(a, b)
    assert model.steps_per_execution == 1 and model.jit_compile is False
    assert model.history is history
    # Text, data and the saved file agree.
    text = str(diagnosis)
    assert f"bottleneck = {diagnosis.bottleneck}" in text
    saved = json.loads((tmp_path / "diagnosis.json").read_text())
    assert saved["bottleneck"] == diagnosis.bottleneck
    assert [f["kind"] for f in saved["findings"]] == [f.kind for f in diagnosis.findings]
    from tfgpu.report import write_report

    assert f"bottleneck = {diagnosis.bottleneck}" in write_report(tmp_path).read_text()


def _facts(**kw):
    base = dict(step_time_s=0.1, compute_step_time_s=0.1, input_time_s=0.01, batch_size=64)
    return DiagnoseFacts(**{**base, **kw})


@pytest.mark.parametrize(
    ("compute", "level", "bottleneck"),
    [(0.080, "high", "input"), (0.081, "moderate", "input"), (0.095, "moderate", "input"),
     (0.0951, "no", "compute")],
)  # fmt: skip
def test_input_thresholds_are_the_profilers(compute, level, bottleneck):
    got, got_level, share, _ = classify(_facts(compute_step_time_s=compute))
    assert (got, got_level) == (bottleneck, level)
    assert share == pytest.approx((0.1 - compute) / 0.1)


def test_precision_finding_names_the_policy_and_the_peak_ratio():
    facts = _facts(on_gpu=True, gpu_name="NVIDIA A100-SXM4-40GB", compute_capabilities=[(8, 0)])
    _, _, _, findings = classify(facts)
    precision = next(f for f in findings if f.kind == "precision")
    assert 'precision="mixed_bfloat16"' in precision.recommendation
    assert precision.expected_gain == pytest.approx(312 / 156)  # bf16 vs TF32 peak
    assert not precision.gain_measured
    # Already mixed, or a GPU without tensor cores: nothing to say.
    assert all(
        f.kind != "precision" for f in classify(_facts(on_gpu=True, policy="mixed_bfloat16",
                                                         compute_capabilities=[(8, 0)]))[3]
    )  # fmt: skip
    assert all(
        f.kind != "precision"
        for f in classify(_facts(on_gpu=True, compute_capabilities=[(6, 1)]))[3]
    )


def test_memory_headroom_and_gpu_host_overhead_advice():
    facts = _facts(
        on_gpu=True,
        peak_memory_bytes=4 * 2**30,
        memory_capacity_bytes=80 * 2**30,
        compute_step_time_s=0.002,
        step_time_s=0.002,
        spe_rounds=[(0.002, 0.0005)] * 3,
    )
    bottleneck, _, _, findings = classify(facts)
    assert bottleneck == "host_overhead"
    kinds = {f.kind: f for f in findings}
    assert "TF_GPU_THREAD_MODE=gpu_private" in kinds["host_overhead"].recommendation
    assert kinds["host_overhead"].expected_gain == pytest.approx(4.0)
    assert "find_batch_size" in kinds["memory_headroom"].recommendation
    assert "18.0x" in kinds["memory_headroom"].detail
    full = _facts(on_gpu=True, peak_memory_bytes=70 * 2**30, memory_capacity_bytes=80 * 2**30)
    assert all(f.kind != "memory_headroom" for f in classify(full)[3])


def test_xla_and_loss_scale_findings():
    _, _, _, findings = classify(_facts(xla_rounds=[(0.1, 0.05)] * 3))
    xla = next(f for f in findings if f.kind == "xla")
    assert "jit_compile=True" in xla.recommendation and xla.expected_gain == pytest.approx(2.0)
    assert all(f.kind != "xla" for f in classify(_facts(xla_rounds=[(0.1, 0.099)] * 3))[3])
    collapsing = _facts(loss_scale_before=32768.0, loss_scale_after=512.0)
    assert any(f.kind == "loss_scale" for f in classify(collapsing)[3])
    stable = _facts(loss_scale_before=32768.0, loss_scale_after=16384.0)
    assert all(f.kind != "loss_scale" for f in classify(stable)[3])


def test_mixed_precision_lint():
    keras.mixed_precision.set_global_policy("mixed_float16")  # restored by conftest
    model = keras.Sequential(
        [keras.Input((30,)), keras.layers.Dense(64), keras.layers.Dense(10, activation="softmax")]
    )
    kinds = {f.kind: f for f in lint_mixed_precision(model, [(8, 0)])}
    assert 'dtype="float32"' in kinds["mixed_precision_output"].recommendation
    assert "(30, 64)" in kinds["mixed_precision_dims"].detail
    assert "(64, 10)" in kinds["mixed_precision_dims"].detail
    # No tensor cores known (CPU): the output layer still matters, the dims do not.
    assert {f.kind for f in lint_mixed_precision(model, [])} == {"mixed_precision_output"}

    fixed = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64),
            keras.layers.Dense(16),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    assert lint_mixed_precision(fixed, [(8, 0)]) == []
    keras.mixed_precision.set_global_policy("float32")
    assert lint_mixed_precision(_tiny_model(), [(8, 0)]) == []


@pytest.mark.slow
def test_profiler_trace_is_captured_into_the_log_dir(tmp_path):
    ds = tf.data.Dataset.from_tensor_slices((X[:256], Y[:256])).batch(32).prefetch(2)
    diagnosis = tfgpu.diagnose(_tiny_model(), ds, profile=True, log_dir=tmp_path, **FAST)
    assert diagnosis.profile_dir == str(tmp_path / "profile")
    assert list((tmp_path / "profile").rglob("*.xplane.pb"))


def test_bad_arguments_are_rejected_before_work():
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not compiled"):
        tfgpu.diagnose(model, (X, Y))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="steps=1"):
        tfgpu.diagnose(model, (X, Y), steps=1)
    with pytest.raises(ValueError, match="log_dir=None"):
        tfgpu.diagnose(model, (X, Y), profile=True)
    with pytest.raises(TypeError, match="argument `data`"):
        tfgpu.diagnose(model, "data")
    # Everything after the model and the data is keyword-only, as in `fit(x, y, *, ...)`.
    with pytest.raises(TypeError, match="positional argument"):
        tfgpu.diagnose(model, (X, Y), 20)
    with pytest.raises(TypeError, match="model"):
        tfgpu.diagnose("model", (X, Y))
    # The value received is shown, not only its type.
    with pytest.raises(TypeError, match=r"Received: model='m' \(of type str\)\. Expected a"):
        tfgpu.diagnose("m", (X, Y))
    with pytest.raises(TypeError, match=r"Received: data='data' \(of type str\)"):
        tfgpu.diagnose(model, "data")
    with pytest.raises(TypeError, match=r"Received: check_xla='no' \(of type str\)"):
        tfgpu.diagnose(model, (X, Y), check_xla="no")
    assert isinstance(tfgpu.Diagnosis, type) and tfgpu.Diagnosis is Diagnosis


@pytest.mark.slow
def test_paths_and_data_fit_cannot_train_on_are_refused_before_work(tmp_path, unwritable):
    model = _tiny_model()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for where in (unwritable / "run", unwritable):
        with pytest.raises(ValueError, match=r"argument `log_dir`.*can create and write to"):
            tfgpu.diagnose(model, (X, Y), log_dir=where)
    with pytest.raises(TypeError, match=r"Received: log_dir=123 \(of type int\)"):
        tfgpu.diagnose(model, (X, Y), log_dir=123)
    with pytest.raises(ValueError, match=r"`log_dir`.*is under the file"):
        tfgpu.diagnose(model, (X, Y), log_dir=a_file / "run")
    with pytest.raises(TypeError, match=r"batch_size=2\.5 \(of type float\)"):
        tfgpu.diagnose(model, (X, Y), batch_size=2.5)
    unbatched = tf.data.Dataset.from_tensor_slices((X, Y))
    with pytest.raises(ValueError, match=r"single examples \(inputs of shape \(256,\)\).*batch"):
        tfgpu.diagnose(model, unbatched)
    # Told by the dataset's chain even when the model cannot say (no Input layer yet).
    no_input = keras.Sequential([keras.layers.Dense(1)])
    no_input.compile("sgd", "mse")
    with pytest.raises(ValueError, match="single examples"):
        tfgpu.diagnose(no_input, unbatched.map(lambda x, y: (x * 2, y)).prefetch(1))
    inputs_only = tf.data.Dataset.from_tensor_slices(X).batch(32)
    with pytest.raises(ValueError, match=r"inputs without labels.*loss='mse'.*\(x, y\)"):
        tfgpu.diagnose(model, inputs_only)
    assert not model.optimizer.built  # nothing was trained


@pytest.mark.slow
def test_an_earlier_diagnosis_in_the_log_dir_is_kept(monkeypatch, tmp_path):
    _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004)
    (tmp_path / "diagnosis.json").write_text('{"bottleneck": "earlier"}')
    tfgpu.diagnose(_tiny_model(), (X[:128], Y[:128]), batch_size=16, log_dir=tmp_path, **FAST)
    assert json.loads((tmp_path / "diagnosis.1.json").read_text()) == {"bottleneck": "earlier"}
    assert "findings" in json.loads((tmp_path / "diagnosis.json").read_text())


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


@pytest.mark.slow
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


def read_pipeline(ds) -> SimpleNamespace:
    """What the measuring core reads from the dataset's graph, as attributes."""
    return SimpleNamespace(**pipeline_facts(ds))


def shape_facts(ds) -> tuple:
    """(the shape that varies, whether a partial last batch does, examples per epoch)."""
    facts = batch_facts(ds)
    return facts["dynamic_shape"], facts["partial_batches"], facts["epoch_examples"]


def _inspect_dataset(ds) -> dict[str, bool]:
    facts = read_pipeline(ds)
    return {"python_input": facts.python_input, "prefetch": facts.prefetch}


def test_a_tfgpu_pipeline_counts_as_prefetched():

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


# ---- train-step ops placed on the CPU ------------------------------------------------------


class _PyLayer(keras.layers.Layer):
    """Doubles its input through Python (`tf.py_function`)."""

    def call(self, x):
        y = tf.py_function(lambda a: a * 2.0, [x], tf.float32)
        y.set_shape(x.shape)
        return x + tf.stop_gradient(y)


class _PinnedLayer(keras.layers.Layer):
    def call(self, x):
        with tf.device("/cpu:0"):
            return tf.math.square(x)


class _StringLayer(keras.layers.Layer):
    """Round-trips through strings: ops without a GPU kernel."""

    def call(self, x):
        return x + tf.stop_gradient(tf.strings.to_number(tf.strings.as_string(x)))


@pytest.mark.slow
def test_train_step_graph_names_its_ops_their_devices_and_gpu_kernels():
    from tfgpu.diagnosis._classify import _cpu_placed_ops
    from tfgpu.diagnosis._model import step_ops

    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(4, name="dense"),
            _PyLayer(name="py"),
            _PinnedLayer(name="pinned"),
            _StringLayer(name="strings"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile("adam", "mse")
    batch = (tf.zeros((2, 8)), tf.zeros((2, 1)))
    ops = step_ops(model, batch)  # traced, not run
    assert int(model.optimizer.iterations.numpy()) == 0
    by_type = {}
    for op in ops:
        by_type.setdefault(op.op, []).append(op)
    assert any("dense" in op.name and op.gpu_kernel for op in by_type["MatMul"])
    assert "/py" in by_type["EagerPyFunc"][0].name  # the layer's name scope
    (square,) = [op for op in by_type["Square"] if "/pinned" in op.name]
    assert "CPU:0" in square.device
    assert not by_type["StringToNumber"][0].gpu_kernel and not by_type["AsString"][0].gpu_kernel
    placed = {(op.op, why) for op, why in _cpu_placed_ops(ops)}
    assert placed == {
        ("EagerPyFunc", "python"),
        ("Square", "pinned"),
        ("AsString", "no_kernel"),
        ("StringToNumber", "no_kernel"),
    }
    # A plain model (conv, batch norm, dropout, Adam, accuracy) has nothing on the CPU.
    plain = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(8, 3),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.1),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    plain.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    plain_ops = step_ops(plain, (tf.zeros((2, 8, 8, 3)), tf.zeros((2,), tf.int32)))
    assert len(plain_ops) > 100 and _cpu_placed_ops(plain_ops) == []


def test_cpu_placed_train_step_ops_are_a_host_device_traffic_finding_on_gpus():
    from tfgpu.diagnosis._facts import OpFact

    ops = [
        OpFact("model/dense/MatMul", "MatMul"),
        OpFact("model/py/EagerPyFunc", "EagerPyFunc", "/job:localhost/replica:0/task:0"),
        OpFact("model/pinned/Square", "Square", "/device:CPU:0"),
        OpFact("model/strings/StringToNumber", "StringToNumber", gpu_kernel=False),
        OpFact("model/Const", "Const", gpu_kernel=False),  # string constants: no cost
    ]
    _, _, _, findings = classify(_facts(on_gpu=True, train_step_ops=ops))
    (traffic,) = [f for f in findings if f.kind == "host_device_traffic"]
    assert traffic.severity == "moderate" and "placed on the CPU" in traffic.title
    assert "3 train-step op(s) run on the CPU" in traffic.detail
    for name in ("model/py/EagerPyFunc", "model/pinned/Square", "model/strings/StringToNumber"):
        assert f"`{name}`" in traffic.detail
    assert "MatMul" not in traffic.detail and "Const" not in traffic.detail
    assert "`tf.py_function` with TF ops" in traffic.recommendation
    assert 'with tf.device("/cpu:0")' in traffic.recommendation
    assert "no GPU kernel" in traffic.recommendation
    # Off the GPU every op runs on the CPU anyway; under XLA the whole step is compiled.
    for facts in (_facts(train_step_ops=ops), _facts(on_gpu=True, jit_compile=True,
                                                     train_step_ops=ops)):  # fmt: skip
        assert all(f.kind != "host_device_traffic" for f in classify(facts)[3])


# ---- input-bound advice for a pipeline that is already tuned ---------------------------------


def test_input_bound_advice_for_a_tfgpu_pipeline_is_what_is_left():
    def augment(x, y):
        return x + tf.random.uniform(tf.shape(x), 0, 0.1), y

    def timings(facts: SimpleNamespace) -> DiagnoseFacts:  # highly input-bound, with these facts
        return _facts(
            compute_step_time_s=0.05,
            input_time_s=0.05,  # the pipeline explains the 50 ms wait
            prefetch=facts.prefetch,
            parallel_map=facts.parallel_map,
            sequential_map=facts.sequential_map,
            cache=facts.cache,
            map_after_cache=facts.map_after_cache,
            private_threadpool_size=facts.private_threadpool_size,
        )

    piped = tfgpu.data.pipeline(
        (X[:256], Y[:256]), batch_size=32, map_fn=lambda x, y: (x * 2, y), augment_fn=augment
    )
    facts = read_pipeline(piped)
    assert (facts.parallel_map, facts.sequential_map, facts.cache) == (True, False, "memory")
    assert facts.map_after_cache and facts.prefetch
    advice = next(f for f in classify(timings(facts))[3] if f.kind == "input_bound")
    text = advice.recommendation
    assert "tfgpu.data.pipeline(...)` (parallel" not in text  # not "build what you have"
    assert text.startswith("The pipeline already maps in parallel, caches in memory, prefetches")
    for knob in ("map_fn", "batch_augment_fn=", "private_threadpool_size=", "TFRecord"):
        assert knob in text, knob
    assert "`cache=True`" not in text  # already cached

    # Uncached work (a map_fn): caching its output is the advice. (Without a map there is
    # nothing to cache: see test_in_memory_pipeline_without_a_map_gets_in_memory_advice.)
    uncached = tfgpu.data.pipeline(
        (X[:256], Y[:256]), batch_size=32, map_fn=lambda x, y: (x * 2, y), cache=False
    )
    facts = read_pipeline(uncached)
    assert facts.cache is None and not facts.map_after_cache
    text = next(f for f in classify(timings(facts))[3] if f.kind == "input_bound").recommendation
    assert "`cache=True` (memory)" in text and "batch_augment_fn" not in text

    # A hand-written pipeline with a sequential map still gets the pipeline builder.
    naive = tf.data.Dataset.from_tensor_slices((X[:256], Y[:256])).map(augment).batch(32)
    facts = read_pipeline(naive)
    assert facts.sequential_map and not facts.parallel_map and facts.cache is None
    text = next(f for f in classify(timings(facts))[3] if f.kind == "input_bound").recommendation
    assert "Build the input with `tfgpu.data.pipeline(ds, batch_size=...)`" in text
    assert "num_parallel_calls=tf.data.AUTOTUNE" in text
    assert "a map runs one element at a time" in text and "not prefetched" in text


# ---- when no setting is left on this host: the tf.data service -------------------------------

# Input-bound (60% of the step waits): the pipeline makes 40 batches/s, the step takes 100.
_SATURATED = dict(
    step_time_s=0.025, compute_step_time_s=0.01, input_time_s=0.025,
    parallel_map=True, cache="memory", prefetch=True, made_by_pipeline=True,
    pipeline_cpu_busy=0.97, cpu_cores=16,
)  # fmt: skip


def _input_finding(**kw):
    return next(f for f in classify(_facts(**{**_SATURATED, **kw}))[3] if f.kind == "input_bound")


def test_a_saturated_host_with_a_tuned_pipeline_is_told_to_use_service_workers():
    finding = _input_finding()
    assert "keeps 97% of 16 CPU cores busy" in finding.detail
    text = finding.recommendation
    # ceil(1.15 x 100 / 40) = 3 workers like this host, 46 cores in all.
    assert "about 3 with 16 cores each (46 cores in all)" in text
    assert "tfgpu data-service worker --dispatcher" in text and "service='grpc://" in text


@pytest.mark.parametrize(
    ("change", "instead"),
    [
        (dict(pipeline_cpu_busy=0.6), "private_threadpool_size="),  # cores left on this host
        (dict(pipeline_cpu_busy=math.nan, cpu_cores=0), "private_threadpool_size="),  # unmeasured
        (dict(cache=None), "`cache=True` (memory)"),  # caching is cheaper than machines
        (dict(sequential_map=True), "one element at a time"),  # a setting is left
        (dict(python_input=True), "holds the GIL"),  # Python: more workers of it, no
        (dict(input_time_s=0.008, step_time_s=0.025), None),  # not the pipeline's wait
    ],
)
def test_the_service_is_advised_only_when_nothing_is_left_on_this_host(change, instead):
    findings = classify(_facts(**{**_SATURATED, **change}))[3]
    texts = [f.recommendation for f in findings]
    assert not any("data-service" in t for t in texts), texts
    if instead is not None:
        text = next(f for f in findings if f.kind == "input_bound").recommendation
        assert instead in text, text


def test_augmentation_after_the_cache_is_moved_to_batches_before_adding_machines():
    text = _input_finding(map_after_cache=True).recommendation
    assert text.startswith("First move the per-example augmentation after the cache into ")
    assert "If the host still cannot keep up: the host cannot feed the training step" in text


def test_a_pipeline_already_on_the_service_is_told_to_scale_its_workers():
    text = _input_finding(service=True).recommendation
    assert "tf.data service workers" in text and "about 2.9x the workers" in text
    assert "cache" not in text  # the service takes the cache away


@pytest.mark.slow
def test_diagnose_recommends_service_workers_from_what_it_measured(monkeypatch):
    # The step clock is scripted (input-bound), and so is the pipeline's own benchmark: a
    # saturated 16-core host making 40 batches/s, whatever this machine is.
    _ScriptedSteps(monkeypatch, device_s=0.01, real_s=0.025)
    measured = tfgpu.data.PipelineBenchmark(
        examples_per_s=40 * 32, batches_per_s=40.0, num_batches=5,
        num_examples=160, seconds=0.125, batch_size=32, cpu_busy=0.97, cpu_cores=16,
    )  # fmt: skip
    monkeypatch.setattr(reader, "read_alone", lambda ds, steps, warmup, **kw: measured)
    train = tfgpu.data.pipeline(
        (X[:256], Y[:256]), batch_size=32, map_fn=lambda x, y: (x * 2, y), cache=True
    )
    diagnosis = tfgpu.diagnose(_heavy_model(), train, steps=5, warmup=2, check_xla=False)
    assert diagnosis.measurements["data_service"] == {"workers": 3, "cores": 46}
    assert diagnosis.measurements["pipeline"]["cpu_busy"] == 0.97
    assert "tfgpu data-service worker" in diagnosis.finding("input_bound").recommendation


def test_in_memory_pipeline_without_a_map_gets_in_memory_advice():
    facts = read_pipeline(tfgpu.data.pipeline((X[:256], Y[:256]), batch_size=32))
    assert not (facts.parallel_map or facts.sequential_map or facts.python_input)
    slow = _facts(  # a wait of 50 ms per step, as long as the pipeline's batch: input-bound
        compute_step_time_s=0.05,
        input_time_s=0.05,
        batch_size=32,
        steps_per_execution=4,
        prefetch=facts.prefetch,
        parallel_map=facts.parallel_map,
        sequential_map=facts.sequential_map,
        cache=facts.cache,
    )
    bottleneck, level, _, findings = classify(slow)
    assert (bottleneck, level) == ("input", "high")
    text = next(f for f in findings if f.kind == "input_bound").recommendation
    assert text.startswith("The pipeline has no map (in-memory data)")
    for knob in ("`batch_size=`, now 32", "steps_per_execution=)` (now 4; e.g. 16)",
                 "repeat=True", "steps_per_epoch"):  # fmt: skip
        assert knob in text, knob
    for wrong in ("decode_jpeg", "TFRecord", "`cache=True`", "map_fn", "private_threadpool"):
        assert wrong not in text, wrong


@pytest.mark.parametrize(
    ("step_ms", "compute_ms", "level"),
    [(0.32, 0.16, "no"), (2.0, 1.01, "no"), (2.0, 1.0, "high"), (20.0, 18.9, "moderate")],
)
def test_input_bound_needs_a_millisecond_of_wait_per_step(step_ms, compute_ms, level):
    # The README quick start on a CPU: 0.32 ms per step, 0.16 ms on a resident batch. Half
    # the step "waits", but 0.16 ms is tf.data's per-batch hand-over, not pipeline work.
    facts = _facts(step_time_s=step_ms / 1e3, compute_step_time_s=compute_ms / 1e3)
    bottleneck, got, share, findings = classify(facts)
    assert got == level
    assert share == pytest.approx(1 - compute_ms / step_ms)  # still reported as measured
    assert (bottleneck == "input") == (level != "no")
    assert any(f.kind == "input_bound" for f in findings) == (level != "no")


@pytest.mark.slow
def test_tiny_in_memory_pipeline_is_not_called_input_bound(monkeypatch):
    # The README quick start's shape: in-memory arrays through tfgpu.data.pipeline, no map,
    # a tiny Dense model, with the step times measured on a quiet CPU (0.32 ms per step,
    # 0.16 ms on a resident batch), scripted so that this machine's load cannot change them.
    _ScriptedSteps(monkeypatch, device_s=0.00016, real_s=0.00032)
    train = tfgpu.data.pipeline((X, Y), batch_size=128)
    model = _tiny_model()
    model.compile(keras.optimizers.Adam(1e-3), "mse", steps_per_execution=16)
    diagnosis = tfgpu.diagnose(model, train, **FAST)
    assert diagnosis.input_bound == "no", str(diagnosis)
    assert diagnosis.bottleneck != "input" and diagnosis.finding("input_bound") is None
    text = str(diagnosis)
    for wrong in ("decode_jpeg", "TFRecord", "cache the decoded"):
        assert wrong not in text, wrong
    assert diagnosis.input_wait_share == pytest.approx(0.5)  # the share alone says input-bound
    assert any("per-batch hand-over" in n for n in diagnosis.notes), diagnosis.notes


def test_gpu_facts_describe_the_gpu_tensorflow_was_given(monkeypatch):
    import sys

    from tests import fake_pynvml
    from tfgpu._internal.measure.facts import device_facts

    # NVML sees an A100 and a V100; TensorFlow was given only the V100 (set_visible_devices).
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    physical, visible = tf.config.list_physical_devices, tf.config.get_visible_devices
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda k=None: devices if k == "GPU" else physical(k)
    )
    monkeypatch.setattr(
        tf.config, "get_visible_devices", lambda k=None: devices[1:] if k == "GPU" else visible(k)
    )
    facts = device_facts()
    name, capacity = facts["gpu_name"], facts["memory_capacity_bytes"]
    assert (name, capacity) == ("Tesla V100-SXM2-16GB", 16384 * 2**20), facts


# ---- what GPU utilization hides: findings from the GPU counters (issue 15) -------------------


def _gpu(**kw):
    """A monitored GPU run on an A100 (cc 8.0) with every counter measured, all healthy."""
    base = dict(
        on_gpu=True,
        gpu_name="NVIDIA A100-SXM4-40GB",
        compute_capabilities=[(8, 0)],
        policy="mixed_bfloat16",
        util_pct_mean=90.0,
        sm_active_pct_mean=85.0,
        tensor_active_pct_mean=40.0,
        pcie_mib_s_mean=10.0,
        power_w_mean=350.0,
        power_limit_w_max=400.0,
        throttle_reasons_any=float(0x1 | 0x4),
        sm_clock_mhz_mean=1410.0,
        energy_j=1000.0,
        batch_bytes=2**20,
        tf32_enabled=True,
    )
    return _facts(**{**base, **kw})


_COUNTER_KINDS = {"tensor_cores_idle", "small_kernels", "pcie_traffic", "clocks_throttled"}


def _counter_kinds(facts) -> set[str]:
    return {f.kind for f in classify(facts)[3]} & _COUNTER_KINDS


def test_a_healthy_gpu_run_has_no_counter_findings_and_no_unseen_notes():
    from tfgpu.diagnosis._classify import unseen

    assert _counter_kinds(_gpu()) == set()
    assert unseen(_gpu()) == []


def test_tensor_cores_idle_under_mixed_precision_names_layers_dims_and_tf32():
    facts = _gpu(
        tensor_active_pct_mean=1.5,
        float32_layers=["`encoder_dense`"],
        odd_dim_layers=["`dense` (30, 64)"],
        tf32_enabled=False,
    )
    (finding,) = [f for f in classify(facts)[3] if f.kind == "tensor_cores_idle"]
    assert "1.5%" in finding.detail and "90% utilization" in finding.detail
    assert "mixed_bfloat16" in finding.detail and "TF32 is off" in finding.detail
    rec = finding.recommendation
    assert "`encoder_dense`" in rec and "keep float32 math" in rec
    assert "`dense` (30, 64)" in rec and "multiples of 8" in rec
    assert "enable_tensor_float_32_execution" in rec and rec[0].isupper()
    # TF32 on (the default): not blamed; mixed already: no mixed-precision advice.
    rec_on = next(
        f.recommendation
        for f in classify(_gpu(tensor_active_pct_mean=1.5))[3]
        if f.kind == "tensor_cores_idle"
    )
    assert "TF32" not in rec_on and "tfgpu.configure" not in rec_on and "jit_compile" in rec_on


def test_tensor_cores_idle_under_float32_advises_mixed_precision_for_the_gpu():
    rec = next(
        f.recommendation
        for f in classify(_gpu(policy="float32", tensor_active_pct_mean=0.0))[3]
        if f.kind == "tensor_cores_idle"
    )
    assert 'precision="mixed_bfloat16"' in rec
    t4 = _gpu(
        policy="float32", tensor_active_pct_mean=0.0, gpu_name="Tesla T4",
        compute_capabilities=[(7, 5)], tf32_enabled=False,
    )  # fmt: skip
    rec = next(f.recommendation for f in classify(t4)[3] if f.kind == "tensor_cores_idle")
    assert 'precision="mixed_float16"' in rec and "before Ampere" in rec
    assert "TF32" not in rec  # a T4 has no TF32: "off" means nothing there


@pytest.mark.parametrize(
    "kw",
    [
        dict(tensor_active_pct_mean=5.0),  # at the threshold: not "near zero"
        dict(tensor_active_pct_mean=1.0, util_pct_mean=49.0),  # the GPU mostly idle anyway
        dict(tensor_active_pct_mean=1.0, compute_capabilities=[(6, 1)]),  # no tensor cores
        dict(tensor_active_pct_mean=float("nan")),  # not measured (no GPM)
        dict(tensor_active_pct_mean=1.0, util_pct_mean=float("nan")),
        dict(tensor_active_pct_mean=1.0, on_gpu=False),
    ],
)
def test_tensor_cores_idle_needs_a_busy_tensor_core_gpu_and_a_measurement(kw):
    assert "tensor_cores_idle" not in _counter_kinds(_gpu(**kw))


def test_small_kernels_high_utilization_low_sm_activity():
    facts = _gpu(util_pct_mean=95.0, sm_active_pct_mean=30.0, batch_size=32)
    (finding,) = [f for f in classify(facts)[3] if f.kind == "small_kernels"]
    assert "95%" in finding.detail and "30%" in finding.detail
    rec = finding.recommendation
    assert "now 32" in rec and "find_batch_size" in rec
    assert "steps_per_execution=16" in rec and "jit_compile=True" in rec
    already = _gpu(util_pct_mean=95.0, sm_active_pct_mean=30.0, jit_compile=True)
    rec = next(f.recommendation for f in classify(already)[3] if f.kind == "small_kernels")
    assert "XLA is already on" in rec
    for kw in (
        dict(util_pct_mean=79.0, sm_active_pct_mean=30.0),
        dict(util_pct_mean=95.0, sm_active_pct_mean=50.0),
        dict(util_pct_mean=95.0, sm_active_pct_mean=float("nan")),
    ):
        assert "small_kernels" not in _counter_kinds(_gpu(**kw))


def test_pcie_traffic_far_above_the_batch_bytes_names_the_causes():
    from tfgpu.diagnosis._facts import OpFact

    # 100 MiB/s x 0.1 s = 10 MiB per step, 10x a 1 MiB batch.
    ops = [OpFact("model/pinned/Square", "Square", "/device:CPU:0")]
    facts = _gpu(pcie_mib_s_mean=100.0, train_step_ops=ops, from_arrays=True)
    (finding,) = [f for f in classify(facts)[3] if f.kind == "pcie_traffic"]
    assert "10.0 MiB crossed PCIe per step" in finding.detail
    assert "10x the batch's 1.00 MiB" in finding.detail
    assert "`model/pinned/Square`" in finding.detail and "NumPy arrays" in finding.detail
    rec = finding.recommendation
    assert "placed on the CPU" in rec and "`.numpy()`" in rec and "`tf.py_function`" in rec
    # 4x the batch is the threshold (40 MiB/s -> 4 MiB per step: not above it).
    assert "pcie_traffic" not in _counter_kinds(_gpu(pcie_mib_s_mean=40.0))
    assert "pcie_traffic" in _counter_kinds(_gpu(pcie_mib_s_mean=41.0))
    assert "pcie_traffic" not in _counter_kinds(_gpu(pcie_mib_s_mean=100.0, batch_bytes=None))
    assert "pcie_traffic" not in _counter_kinds(_gpu(pcie_mib_s_mean=float("nan")))


@pytest.mark.parametrize(
    ("reasons", "severity", "names"),
    [
        (0x1 | 0x40, "high", ["HW thermal slowdown"]),
        (0x4, "moderate", ["SW power cap"]),
        (0x20 | 0x80, "high", ["SW thermal slowdown", "HW power brake slowdown"]),
        (0x2, "moderate", ["applications clocks setting"]),
        (0x1000, "moderate", ["reason bits 0x1000"]),
    ],
)
def test_low_power_with_throttled_clocks_names_the_reason(reasons, severity, names):
    facts = _gpu(power_w_mean=150.0, throttle_reasons_any=float(reasons))
    (finding,) = [f for f in classify(facts)[3] if f.kind == "clocks_throttled"]
    assert finding.severity == severity
    for name in names:
        assert name in finding.title and f"{name}:" in finding.recommendation
    assert "38% of the 400 W limit" in finding.detail and "1410 MHz" in finding.detail


@pytest.mark.parametrize(
    "kw",
    [
        dict(power_w_mean=150.0, throttle_reasons_any=float(0x1)),  # idle only: no throttle
        dict(power_w_mean=150.0, throttle_reasons_any=0.0),
        dict(power_w_mean=240.0, throttle_reasons_any=float(0x40)),  # 60% of the limit
        dict(power_w_mean=150.0, throttle_reasons_any=float("nan")),
        dict(power_w_mean=150.0, power_limit_w_max=float("nan"), throttle_reasons_any=64.0),
        dict(power_w_mean=150.0, power_limit_w_max=0.0, throttle_reasons_any=64.0),
    ],
)
def test_throttle_finding_needs_low_power_and_a_real_reason(kw):
    assert "clocks_throttled" not in _counter_kinds(_gpu(**kw))


def test_a_gpu_without_gpm_uses_what_exists_and_says_what_it_cannot_see():
    from tfgpu.diagnosis._classify import unseen

    nan = float("nan")
    # An A10 without GPM: utilization, power and throttle reasons exist; GPM counters do not.
    facts = _gpu(
        util_pct_mean=92.0, sm_active_pct_mean=nan, tensor_active_pct_mean=nan,
        pcie_mib_s_mean=nan, power_w_mean=60.0, power_limit_w_max=150.0,
        throttle_reasons_any=float(0x20),
    )  # fmt: skip
    assert _counter_kinds(facts) == {"clocks_throttled"}  # what exists still decides
    notes = unseen(facts)
    assert any(
        "tensor/SM activity not measured: GPM needs a Hopper or newer GPU" in n
        and "cannot tell idle SMs from busy ones" in n
        and "92%" in n
        for n in notes
    )
    assert any("PCIe traffic not measured" in n for n in notes)
    no_power = _gpu(power_limit_w_max=nan, throttle_reasons_any=nan)
    assert unseen(no_power) == [
        "power limit or clock throttle reasons not reported by NVML: throttling not checked"
    ]
    assert "not compared" in unseen(_gpu(batch_bytes=None))[0]
    # No monitor at all (monitor=False, no NVML) or no GPU: the monitor's own note says so.
    assert unseen(_gpu(util_pct_mean=nan, sm_active_pct_mean=nan)) == []
    assert unseen(_gpu(on_gpu=False, sm_active_pct_mean=nan)) == []


def test_monitor_facts_read_gpu0_and_absent_or_odd_values_as_nan():
    import math

    from tfgpu.diagnosis._classify import monitor_facts

    agg = {
        "gpu0_util_pct_mean": np.float32(75.0),
        "gpu0_sm_active_pct_mean": 40.0,
        "gpu0_pcie_tx_mib_s_mean": 30.0,
        "gpu0_pcie_rx_mib_s_mean": float("nan"),  # one direction measured: that one
        "gpu0_throttle_reasons_any": 68.0,
        "gpu0_power_w_mean": "250",  # not a number: NaN, not a crash
        "gpu0_energy_j": float("inf"),
        "gpu1_tensor_active_pct_mean": 12.0,  # another GPU: not /GPU:0
    }
    facts = monitor_facts(agg)
    assert facts["util_pct_mean"] == 75.0 and facts["sm_active_pct_mean"] == 40.0
    assert facts["pcie_mib_s_mean"] == 30.0 and facts["throttle_reasons_any"] == 68.0
    for key in ("tensor_active_pct_mean", "power_w_mean", "energy_j", "sm_clock_mhz_mean"):
        assert math.isnan(facts[key])
    assert all(math.isnan(v) for v in monitor_facts({}).values())  # an older monitor
    both = monitor_facts({"gpu0_pcie_tx_mib_s_mean": 1.5, "gpu0_pcie_rx_mib_s_mean": 2.5})
    assert both["pcie_mib_s_mean"] == 4.0
    assert all(math.isnan(v) for v in monitor_facts(None).values())  # type: ignore[arg-type]


def test_batch_bytes_and_the_layers_the_tensor_core_advice_names():
    from tfgpu._internal.measure.facts import batch_nbytes
    from tfgpu.diagnosis._model import precision_layers

    batch = (tf.zeros((4, 3), tf.float32), tf.zeros((4,), tf.int64))
    assert batch_nbytes(batch) == 4 * 3 * 4 + 4 * 8
    assert batch_nbytes({"a": tf.zeros((2, 2), tf.float16)}) == 8
    keras.mixed_precision.set_global_policy("mixed_float16")  # restored by conftest
    model = keras.Sequential(
        [
            keras.Input((30,)),
            keras.layers.Dense(64),
            keras.layers.Dense(64, dtype="float32", name="kept_f32"),
            keras.layers.Dense(10, dtype="float32", name="head"),  # a float32 head is right
        ]
    )
    float32, odd = precision_layers(model)
    assert float32 == ["`kept_f32`"]
    assert len(odd) == 1 and odd[0].endswith("(30, 64)")  # 64 -> 10 is the float32 head
    keras.mixed_precision.set_global_policy("float32")
    plain = keras.Sequential([keras.Input((30,)), keras.layers.Dense(64), keras.layers.Dense(8)])
    float32, odd = precision_layers(plain)
    assert float32 == [] and len(odd) == 1 and odd[0].endswith("(30, 64)")


def test_a_hand_built_diagnosis_prints_the_activity_counters():
    d = Diagnosis(
        bottleneck="compute", input_bound="no", input_wait_share=0.0, step_time_s=0.1,
        compute_step_time_s=0.1, input_batch_time_s=0.01, batch_size=64,
        examples_per_s=640.0, findings=[], device="GPU:0 (NVIDIA H100 80GB HBM3)",
        monitor={"gpu0_util_pct_mean": 97.0, "gpu0_sm_active_pct_mean": 41.5,
                 "gpu0_tensor_active_pct_mean": float("nan")},
        notes=["tensor/SM activity not measured: ..."],
    )  # fmt: skip
    text = str(d)
    assert "gpu0_sm_active_pct_mean: 41.5" in text
    assert "tensor_active" not in text  # NaN: not printed
    assert json.loads(json.dumps(d.to_dict()))["monitor"]["gpu0_sm_active_pct_mean"] == 41.5


def test_diagnose_decides_with_the_rules_it_shares_with_the_report(monkeypatch):
    from tfgpu._internal.adapters import gpu_counters
    from tfgpu.diagnosis import _classify as _classify_module
    from tfgpu.diagnosis import _facts

    facts = _gpu(tensor_active_pct_mean=3.0)
    assert "tensor_cores_idle" in _counter_kinds(facts)
    monkeypatch.setattr(gpu_counters, "TENSOR_ACTIVE_LOW_PCT", 2.0)  # one threshold, moved
    assert "tensor_cores_idle" not in _counter_kinds(facts)
    # No second copy of the thresholds or the throttle table in the diagnosis package.
    for name in ("TENSOR_ACTIVE_LOW_PCT", "SMALL_KERNELS_UTIL_PCT", "PCIE_BATCH_FACTOR",
                 "POWER_LOW_SHARE", "THROTTLE_REASONS"):  # fmt: skip
        for module in (tfgpu.diagnosis, _facts, _classify_module):
            assert not hasattr(module, name), name
    # The same clocks-throttled text in both.
    throttled = _gpu(power_w_mean=150.0, throttle_reasons_any=float(0x40))
    (finding,) = [f for f in classify(throttled)[3] if f.kind == "clocks_throttled"]
    shared = gpu_counters.clocks_throttled(_classify_module._counters(throttled))
    assert shared is not None
    assert (finding.title, finding.detail, finding.recommendation) == (
        shared.title,
        shared.detail(),
        shared.recommendation,
    )


# ---- issue 11: quick (a time budget), stable (noise measured), right, honest, quiet ---------


def _piped_slowly(ms: float = 20.0, n: int = 512):
    """A pipeline whose batches take `ms` each (a Python sleep), so it explains a wait."""

    def slow(x, y):
        def nap(a):
            time.sleep(ms / 1e3)
            return a

        out = tf.py_function(nap, [x], tf.float32)
        out.set_shape(x.shape)
        return out, y

    return tf.data.Dataset.from_tensor_slices((X[:n], Y[:n])).batch(256).map(slow).prefetch(2)


def test_median_interval_is_the_order_statistics_interval():
    from tfgpu._internal.measure.rules import median_interval as _median_interval

    assert _median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)  # too few: the full range
    low, high, confidence = _median_interval(list(range(12)))
    assert (low, high) == (2, 9) and confidence >= 0.9  # 3rd smallest to 3rd largest
    low, high, confidence = _median_interval(list(range(8)))
    assert (low, high) == (1, 6) and confidence == pytest.approx(1 - 2 * 9 / 256)


def test_verbose_is_checked_before_work():
    model = _tiny_model()
    for bad, error in (("loud", ValueError), (3, ValueError), (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match=r"argument `verbose`. Received: verbose=.*'auto'"):
            tfgpu.diagnose(model, (X, Y), verbose=bad)
    assert not model.optimizer.built


@pytest.mark.slow
def test_progress_shows_each_phase_with_the_time_left_on_the_budgets_clock(monkeypatch, capsys):
    clock = _ScriptedSteps(monkeypatch, device_s=0.04, real_s=0.04)
    start = clock.clock
    capsys.readouterr()
    diagnosis = tfgpu.diagnose(
        _tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2, check_xla=False,
        time_budget_s=5.0, verbose=2,
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out  # plain lines for a log file
    lines = out.splitlines()
    assert all(line.startswith("diagnose: ") for line in lines), out
    phases = [line.removeprefix("diagnose: ").split(" \u00b7 ")[0] for line in lines]
    assert phases[:4] == [
        "timing the input pipeline alone",
        "warming up and timing the step on one batch held in memory",
        "warming up on the real data",
        f"timing the real data against a batch in memory, round 1 of at most {MAX_ROUNDS}",
    ]
    rounds = len(diagnosis.measurements["rounds"])
    assert (
        f"timing the real data against a batch in memory, round {rounds} of at most {MAX_ROUNDS}"
        in phases
    )
    probe = [p for p in phases if p.startswith("trying steps_per_execution=16 against 1, round")]
    assert len(probe) == len(diagnosis.measurements["steps_per_execution_probe"]["rounds"])
    assert phases[-3:-1] == [
        "restoring the model's weights, optimizer and settings",
        "counting the FLOPs of a training step",
    ]
    # The times are the scripted clock's: 5 s at the start, less as the scripted fits run.
    assert lines[0].endswith("\u00b7 5 s left")
    spent = clock.clock - start
    assert lines[-2].endswith(f"\u00b7 {5 - spent:.0f} s left"), (spent, lines[-2])
    assert lines[-1] == f"diagnose: done in {spent:.0f} s \u00b7 bottleneck: {diagnosis.bottleneck}"


def test_time_budget_is_checked_before_work():
    model = _tiny_model()
    for bad in ("60", True, [60]):
        with pytest.raises(TypeError, match=r"time_budget_s.*Expected a finite number"):
            tfgpu.diagnose(model, (X, Y), time_budget_s=bad)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`time_budget_s`.*Expected a finite number"):
            tfgpu.diagnose(model, (X, Y), time_budget_s=bad)
    assert not model.optimizer.built


@pytest.mark.slow
def test_the_budget_is_respected_and_what_it_left_out_is_noted(monkeypatch, capsys):
    clock = _ScriptedSteps(monkeypatch, device_s=0.04, real_s=0.04)
    capsys.readouterr()
    diagnosis = tfgpu.diagnose(
        _tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2, time_budget_s=1.0, verbose=0
    )
    assert capsys.readouterr().out == ""  # verbose=0: quiet
    m = diagnosis.measurements
    assert m["time_budget_s"] == 1.0 and diagnosis.time_s <= 1.0 + 0.04  # one step past, at most
    assert "steps_per_execution_probe" not in m and "xla" not in m
    assert all(what in ("device", "real") for what, _ in clock.fits)
    (skipped,) = [n for n in diagnosis.notes if "skipped for the time budget" in n]
    assert "steps_per_execution=16 probe" in skipped and "jit_compile=True probe" in skipped
    assert any("rounds ran within the time budget" in n for n in diagnosis.notes)
    # No limit: every probe runs.
    _ScriptedSteps(monkeypatch, device_s=0.04, real_s=0.04)
    full = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2,
                          time_budget_s=None)  # fmt: skip
    assert "steps_per_execution_probe" in full.measurements and "xla" in full.measurements
    assert full.measurements["time_budget_s"] is None


@pytest.mark.slow
def test_a_variant_ten_times_slower_is_stopped_after_its_first_round(monkeypatch):
    clock = _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004, xla_factor=10.0)
    diagnosis = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=20, warmup=3)
    xla = diagnosis.measurements["xla"]
    assert len(xla["rounds"]) == 1 and xla["stopped"] == "slower"
    assert [what for what, _ in clock.fits].count("xla") == 1
    assert any("jit_compile=True measured 10.0x slower after one round" in n
               for n in diagnosis.notes)  # fmt: skip
    assert diagnosis.finding("xla") is None


@pytest.mark.slow
def test_noise_straddling_the_threshold_is_inconclusive_and_without_noise_it_is_not(
    monkeypatch,
):
    # Device-resident step 100 ms; the real step alternates 103 and 108 ms: a wait share of
    # 3% or 7.4%, round after round, around the 5% threshold. The pipeline alone takes
    # 20 ms per batch, so a wait of up to 8 ms is its doing.
    clock = _ScriptedSteps(monkeypatch, device_s=0.1, real_s=[0.103, 0.108])
    noisy = tfgpu.diagnose(_heavy_model(), _piped_slowly(), **FAST)
    assert noisy.input_bound == "inconclusive" and noisy.bottleneck == "inconclusive"
    assert len(noisy.measurements["rounds"]) == MAX_ROUNDS  # kept adding rounds, then said so
    assert [what for what, _ in clock.fits].count("real") == MAX_ROUNDS
    assert noisy.noise == pytest.approx(0.108 - 0.1 - 0.003 / 0.103 * 0.108, abs=0.05)
    text = str(noisy)
    assert "input-bound: inconclusive (noise" in text and "3% to 7%" in text, text
    assert noisy.finding("input_bound") is None
    assert any("too noisy to call" in n for n in noisy.notes)
    assert "Nothing to change" not in text

    _ScriptedSteps(monkeypatch, device_s=0.1, real_s=0.108)
    steady = tfgpu.diagnose(_heavy_model(), _piped_slowly(), **FAST)
    assert (steady.input_bound, steady.bottleneck) == ("moderate", "input"), str(steady)
    assert len(steady.measurements["rounds"]) == 3 and steady.noise == 0


def test_a_noisy_wait_the_pipeline_cannot_cause_is_not_input_bound():
    # The MNIST case on a loaded machine: rounds give 0% to 7% of a 45 ms step, but the
    # pipeline alone makes a batch in 0.6 ms; even at half speed it cannot cost 5%.
    rounds = [(0.043, 0.043), (0.042, 0.0452), (0.044, 0.0441), (0.043, 0.0465)]
    noisy = _facts(step_time_s=0.045, compute_step_time_s=0.043, rounds=rounds)
    assert classify(replace(noisy, input_time_s=0.0006))[:2] == ("compute", "no")
    # A pipeline slow enough to cost that much leaves the noise undecided.
    assert classify(replace(noisy, input_time_s=0.004))[:2] == (
        "inconclusive",
        "inconclusive",
    )
    # The note says why (the pipeline's speed), never that a 3 ms wait is "below 1 ms".
    from tfgpu.diagnosis._classify import share_verdict, wait_notes

    fast = replace(noisy, input_time_s=0.0006)
    notes = wait_notes(fast, share_verdict(rounds), "no", 0.066, [])
    assert len(notes) == 1 and "the pipeline alone makes a batch in 0.60 ms" in notes[0]
    steady = share_verdict([(0.043, 0.046)] * 3)  # 6.5%, every round: "moderate"
    notes = wait_notes(replace(fast, rounds=[(0.043, 0.046)] * 3), steady, "no", 0.07, [])
    assert "3.00 ms per step (7%)" in notes[0] and "below 1 ms" not in notes[0]


@pytest.mark.slow
def test_a_probe_measured_at_1_015x_is_recommended_nowhere(monkeypatch):
    _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004, spe_gain=1.015)
    diagnosis = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2)
    assert diagnosis.measurements["steps_per_execution_probe"]["gain"].value == pytest.approx(1.015)
    assert "steps_per_execution=" not in "\n".join(
        f"{f.title} {f.detail} {f.recommendation}" for f in diagnosis.findings
    )
    # The in-memory advice leaves it out too once the probe measured no gain ...
    facts = dict(compute_step_time_s=0.05, input_time_s=0.05, batch_size=32)
    no_gain = _facts(**facts, spe_rounds=[(0.004, 0.004 / 1.015)] * 3)
    text = next(f for f in classify(no_gain)[3] if f.kind == "input_bound").recommendation
    assert "steps_per_execution" not in text and "`batch_size=`" in text
    # ... and keeps it when the probe did not run.
    text = next(f for f in classify(_facts(**facts))[3] if f.kind == "input_bound").recommendation
    assert "steps_per_execution" in text
    # A gain whose interval reaches below the margin does not count either.
    straddling = _facts(spe_rounds=[(0.004, 0.004 / 1.02), (0.004, 0.004 / 2.0), (0.004, 0.002)])
    assert classify(straddling)[0] != "host_overhead"


def test_a_wait_far_above_the_pipelines_batch_time_is_not_input_bound():
    # The image-folder case: 518 ms of "wait" against a pipeline making a batch in 3.9 ms.
    facts = _facts(
        step_time_s=0.6, compute_step_time_s=0.082, input_time_s=0.0039,
        dynamic_shape="(None, 64, 64, 3)", partial_batches=True, jit_compile=True,
        made_by_pipeline=True, parallel_map=True,
    )  # fmt: skip
    bottleneck, level, _, findings = classify(facts)
    assert (bottleneck, level) == ("inconclusive", "inconclusive")
    assert all(f.kind != "input_bound" for f in findings)
    (why,) = [f for f in findings if f.kind == "input_wait_unexplained"]
    assert findings[0] is why
    assert "518.00 ms" in why.detail and "3.90 ms" in why.detail
    assert "(None, 64, 64, 3)" in why.recommendation and "partial" in why.recommendation
    assert "recompiles it under `jit_compile`" in why.recommendation
    assert "drop_remainder=True" in why.recommendation
    assert "tfgpu.data.pipeline(...)` (parallel" not in why.recommendation
    loaded = _facts(step_time_s=0.6, compute_step_time_s=0.082, host_load=3.5, replicas=2)
    rec = next(f for f in classify(loaded)[3] if f.kind == "input_wait_unexplained")
    assert "2 replicas" in rec.recommendation and "load average 3.5" in rec.recommendation
    # A clear host-overhead finding still decides the bottleneck.
    host = _facts(step_time_s=0.006, compute_step_time_s=0.002, input_time_s=0.0001,
                  spe_rounds=[(0.002, 0.0005)] * 3)  # fmt: skip
    assert classify(host)[:2] == ("host_overhead", "inconclusive")


def test_advice_fits_what_built_the_input():
    base = dict(compute_step_time_s=0.05, input_time_s=0.05)
    # A tfgpu pipeline around a dataset with a sequential map: its own arguments.
    piped = _facts(**base, made_by_pipeline=True, parallel_map=True, sequential_map=True)
    text = next(f for f in classify(piped)[3] if f.kind == "input_bound").recommendation
    assert "Build the input" not in text and "batch_map_fn=" in text and "map_fn=" in text
    # A Keras loader with the user's sequential map: num_parallel_calls or the pipeline.
    loader = _facts(**base, parallel_map=True, sequential_map=True)
    text = next(f for f in classify(loader)[3] if f.kind == "input_bound").recommendation
    assert "tfgpu.data.pipeline(ds, batch_size=...)" in text
    assert "num_parallel_calls=tf.data.AUTOTUNE" in text
    # A generator: the Python step.
    python = _facts(**base, python_input=True, sequential_map=True, made_by_pipeline=True)
    text = next(f for f in classify(python)[3] if f.kind == "input_bound").recommendation
    assert "`tf.py_function` / a generator" in text and "Build the input" not in text


@pytest.mark.slow
def test_a_probe_error_is_one_line(monkeypatch):
    trace = "\n".join(f'  File "/site-packages/keras/x{i}.py", line {i}, in f' for i in range(30))
    error = tf.errors.InvalidArgumentError(
        None,
        None,
        "Graph execution error:\n\nDetected at node StatefulPartitionedCall defined at (most "
        f"recent call last):\n{trace}\n\nDetected unsupported operations when trying to "
        "compile graph __inference_one_step_on_data_1234 on XLA_CPU_JIT: MultiDeviceIterator"
        "GetNextFromShard " + "x" * 300 + "\n\t [[{{node MultiDeviceIteratorGetNextFromShard}}]]",
    )
    _ScriptedSteps(monkeypatch, device_s=0.004, real_s=0.004, xla_error=error)
    diagnosis = tfgpu.diagnose(_tiny_model(), (X, Y), batch_size=16, steps=5, warmup=2)
    (note,) = [n for n in diagnosis.notes if n.startswith("XLA not measured")]
    assert "\n" not in note and "File " not in note and len(note) < 300
    assert "InvalidArgumentError: Detected unsupported operations" in note
    assert note.endswith("...)")
    assert "\n" not in "".join(diagnosis.notes)
    from tfgpu._internal.helpers.warn import one_line as _one_line

    assert _one_line(ValueError("")) == "ValueError"
    assert _one_line(RuntimeError("plain message")) == "RuntimeError: plain message"


def test_the_text_keeps_the_pipeline_and_the_training_throughput_apart():
    d = Diagnosis(
        bottleneck="compute", input_bound="no", input_wait_share=0.0, step_time_s=0.1,
        compute_step_time_s=0.1, input_batch_time_s=0.004, batch_size=16,
        examples_per_s=160.0, findings=[],
    )  # fmt: skip
    lines = str(d).splitlines()
    (pipe,) = [line for line in lines if "input pipeline alone" in line]
    assert pipe.strip() == "input pipeline alone: 4.00 ms per batch (4,000 examples/s)"
    (train,) = [line for line in lines if "training:" in line]
    assert "160 examples/s (batch 16)" in train and "pipeline alone" not in train


class _AnyShape(keras.layers.Layer):
    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 4))

    def call(self, x):
        return tf.reduce_mean(tf.matmul(x, self.kernel), axis=1)


@pytest.mark.slow
def test_flops_use_the_batch_shapes_and_a_count_above_the_peak_is_not_achieved(monkeypatch):
    from tfgpu._internal.adapters import cpu

    # Inputs with a None dimension (a sequence of any length): counted from the batch seen.
    model = keras.Sequential([keras.Input((None, 8)), _AnyShape(), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    x = RNG.normal(size=(64, 10, 8)).astype("float32")
    monkeypatch.setattr(cpu, "peak_flops", lambda dtype="float32": 1e15)
    _ScriptedSteps(monkeypatch, device_s=0.01, real_s=0.01)
    ok = tfgpu.diagnose(model, (x, Y[:64]), batch_size=16, **FAST)
    # Forward and weight gradients of the first layer at the length seen (10): 2 x 2 x 16x10x8x4.
    assert ok.flops_per_step and ok.flops_per_step >= 2 * 2 * 16 * 10 * 8 * 4
    assert ok.achieved_flops_per_s == pytest.approx(ok.flops_per_step / 0.01)
    assert not any("input_signature" in n or "FLOP" in n for n in ok.notes), ok.notes

    monkeypatch.setattr(cpu, "peak_flops", lambda dtype="float32": 1e6)  # 1 MFLOP/s
    _ScriptedSteps(monkeypatch, device_s=0.01, real_s=0.01)
    wrong = tfgpu.diagnose(model, (x, Y[:64]), batch_size=16, **FAST)
    assert wrong.achieved_flops_per_s is None and wrong.mfu is None
    (note,) = [n for n in wrong.notes if "FLOP count cannot be right" in n]
    assert "exceeds this device's peak of about 0.0 GFLOP/s" in note
    assert "GFLOP/s achieved" not in str(wrong)


@pytest.mark.slow
def test_nvml_warning_once_in_a_script_with_diagnose_and_gpumonitor_fits(monkeypatch, tmp_path):
    import sys
    import warnings

    from tfgpu._internal.helpers import warn

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("checks a machine without a GPU")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML at all
    warn.forget()
    model = _tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        tfgpu.diagnose(model, (X[:64], Y[:64]), batch_size=16, **{**FAST, "steps": 3})
        for i in range(2):
            model.fit(X[:32], Y[:32], batch_size=16, epochs=1, verbose=0,
                      callbacks=[tfgpu.callbacks.GPUMonitor(log_dir=tmp_path / str(i))])  # fmt: skip
        tfgpu.diagnose(model, (X[:64], Y[:64]), batch_size=16, **{**FAST, "steps": 3})
    warn.forget()
    nvml = [w for w in caught if "records no GPU metrics" in str(w.message)]
    assert len(nvml) == 1, [str(w.message) for w in caught]


def test_an_inconclusive_run_without_findings_does_not_say_nothing_to_change():
    d = Diagnosis(
        bottleneck="inconclusive", input_bound="inconclusive", input_wait_share=0.05,
        step_time_s=0.1, compute_step_time_s=0.095, input_batch_time_s=0.01, batch_size=16,
        examples_per_s=160.0, findings=[], noise=0.4,
        measurements={"noise": {"low": 0.0, "high": 0.4}},
    )  # fmt: skip
    text = str(d)
    assert "inconclusive (noise 40%: 0% to 40%)" in text
    assert "Nothing to change" not in text and "No clear finding" in text


@pytest.mark.slow
def test_a_fit_cut_before_a_timed_step_is_no_measurement():
    # The deadline has passed: the fit stops after its first call, a warm-up (tracing) call,
    # whose time is not a step time. A probe cut that way records no round, not "slower".
    model = _tiny_model()
    data = tf.data.Dataset.from_tensor_slices((X[:64], Y[:64])).batch(16).repeat()
    assert protocol.fit_step_time(model, data, 5, 2, deadline=0.0) is None
    assert protocol.fit_step_time(model, data, 5, 2) > 0
    spent = protocol.Budget(0.0)
    v = Variants(model, data, Steady(5, 2))
    c = protocol.compare(
        v.run_for({}), {"variant": v.run_for({"steps_per_execution": 4})}, budget=spent
    )["variant"]
    assert (c.rounds, c.stopped) == ([], "budget")
    assert int(model.steps_per_execution) == 1  # put back


def test_fewer_rounds_than_the_minimum_cannot_tell_the_noise():
    one = share_verdict([(0.1, 0.2)])
    assert one["level"] == "inconclusive" and one["rounds"] == 1
    three = share_verdict([(0.1, 0.2)] * 3)
    assert three["level"] == "high"


def test_full_batches_with_an_unknown_batch_dimension_do_not_change_shape():
    full = tf.data.Dataset.from_tensor_slices(X[:64]).batch(16)  # 4 full batches, spec (None, 256)
    assert shape_facts(full) == (None, False, 64)
    partial = tf.data.Dataset.from_tensor_slices(X[:60]).batch(16)
    assert shape_facts(partial) == ("(None, 256)", True, 60)
    ragged_text = tf.data.Dataset.from_tensor_slices(np.zeros((64, 7), "int64")).batch(16)
    padded = ragged_text.map(lambda t: tf.pad(t, [[0, 0], [0, tf.shape(t)[0] % 3]]))
    assert shape_facts(padded)[0] == "(None, None)"


def test_mfu_under_several_gpus_divides_by_all_their_peaks():
    # The step's FLOPs are the global batch's: two A100s (one replica each) have twice the
    # peak of one, as StepTimer counts it.
    from tfgpu.diagnosis._diagnose import flop_facts
    from tfgpu.flops import peak_flops

    model = _tiny_model()
    x = X[:16]
    a100 = dict(policy="mixed_bfloat16", gpu_name="NVIDIA A100-SXM4-80GB", on_gpu=True)
    a100.update(compute_capabilities=[(8, 0)], step_time_s=0.01)
    one = flop_facts(model, x, 16, DiagnoseFacts(**a100))
    two = flop_facts(model, x, 16, DiagnoseFacts(**a100, replicas=2))
    peak = peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16")
    assert one[2] == pytest.approx(one[0] / 0.01 / peak)
    assert two[2] == pytest.approx(one[2] / 2)


def test_a_small_flop_rate_is_shown_in_a_unit_that_shows_it():
    from tfgpu.diagnosis._result import _flop_rate

    assert _flop_rate(3.2e6) == "3.20 MFLOP/s"  # a tiny model on a CPU: not "0.00 GFLOP/s"
    assert _flop_rate(2.5e9) == "2.50 GFLOP/s"
    assert _flop_rate(4e12) == "4.00 TFLOP/s"
    assert _flop_rate(12.0) == "12 FLOP/s"


# ---- issue 27: long steps within the budget, an undoing probe first, the batch, the remainder


def _jit_model():
    model = _tiny_model()
    model.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=True)
    return model


@pytest.mark.slow
def test_one_second_steps_under_xla_fit_the_budget_and_undoing_xla_comes_first(monkeypatch):
    # The image-folder case: XLA on and 5x slower (1 s per step, 0.2 s without), 5 s to trace
    # each train function, a 60 s budget and the default 3 + 20 steps per measurement.
    clock = _ScriptedSteps(monkeypatch, device_s=0.2, real_s=1.0, xla_factor=5.0, trace_s=5.0)
    diagnosis = tfgpu.diagnose(_jit_model(), (X, Y), batch_size=16, verbose=0)
    m = diagnosis.measurements
    assert diagnosis.time_s <= 60.0 * 1.1
    kinds = [what for what, _ in clock.fits]
    assert kinds[:2] == ["xla", "device"]  # the first step, then jit_compile=False at once
    assert len(m["rounds"]) == 3  # shorter fits: the rounds fit too
    assert m["xla"]["stopped"] == "faster" and len(m["xla"]["rounds"]) == 1
    xla = diagnosis.finding("xla")
    assert xla.recommendation == "`model.compile(..., jit_compile=False)`."
    assert xla.gain_measured and xla.expected_gain == pytest.approx(5.0)
    assert "steps of 1.00 s: each fit timed for at most 3 s" in "\n".join(diagnosis.notes)
    assert "jit_compile=False measured 5.0x faster after one round" in "\n".join(diagnosis.notes)


@pytest.mark.slow
def test_an_unclear_first_look_at_undoing_xla_goes_on_after_the_pairs(monkeypatch):
    clock = _ScriptedSteps(monkeypatch, device_s=0.01, real_s=0.0125, xla_factor=1.25)
    diagnosis = tfgpu.diagnose(
        _jit_model(), (X, Y), batch_size=16, steps=5, warmup=2, time_budget_s=None
    )
    kinds = [what for what, _ in clock.fits]
    assert kinds[:2] == ["xla", "device"]
    assert "device" in kinds[kinds.index("real") :]  # more rounds after the pairs
    xla = diagnosis.measurements["xla"]
    assert len(xla["rounds"]) >= 1 + 3 and "stopped" not in xla
    assert diagnosis.finding("xla").expected_gain == pytest.approx(1.25)


@pytest.mark.slow
def test_a_probe_that_cannot_trace_in_the_time_left_is_skipped(monkeypatch):
    # Each new train function takes 25 s to trace: after the pairs, less than that is left.
    clock = _ScriptedSteps(monkeypatch, device_s=0.04, real_s=0.04, trace_s=25.0)
    diagnosis = tfgpu.diagnose(
        _tiny_model(), (X, Y), batch_size=16, check_steps_per_execution=False, verbose=0
    )
    assert "xla" not in diagnosis.measurements
    assert [what for what, _ in clock.fits].count("xla") == 0
    (skipped,) = [n for n in diagnosis.notes if "skipped for the time budget" in n]
    assert "the jit_compile=True probe" in skipped
    assert diagnosis.time_s <= 60.0


def test_a_fit_is_planned_to_fit_the_budget():
    from tfgpu.diagnosis._probes import fit_plan

    assert fit_plan(40.0, None, 1.0, 5, 3, 1) == (3, None)  # no budget: as asked
    assert fit_plan(40.0, 60.0, None, 1, 3, 1) == (3, 3.0)  # step not known: 5% of 60 s
    assert fit_plan(40.0, 60.0, 0.01, 5, 3, 1) == (3, 3.0)  # short steps: as asked
    assert fit_plan(20.0, 60.0, 1.0, 5, 3, 1) == (1, 2.0)  # 1 s steps: one warm-up, 2 s timed
    assert fit_plan(5.0, 60.0, 1.0, 5, 3, 1) == (1, 0.5)  # at least one timed call
    warm, timed = fit_plan(20.0, 60.0, 0.1, 5, 3, 16)  # calls of 16 steps of 0.1 s
    assert warm == 1 and timed == pytest.approx(0.8)


@pytest.mark.slow
def test_the_batch_size_is_a_full_batchs_when_the_partial_one_comes_first(monkeypatch):
    from tfgpu.diagnosis._diagnose import full_batch

    ds = tf.data.Dataset.from_tensor_slices((X[:192], Y[:192])).batch(128)
    partial_first = ds.repeat(2).skip(1)  # 64, 128, 64: as a shuffle of batches can give
    first = next(iter(partial_first))
    assert first[0].shape[0] == 64
    batch, size = full_batch(partial_first, first, 64, 128)
    assert size == 128 and batch[0].shape[0] == 128
    small = tf.data.Dataset.from_tensor_slices(X[:100]).batch(128)  # one batch, never full
    assert full_batch(small, next(iter(small)), 100, 128)[1] == 100
    _ScriptedSteps(monkeypatch, device_s=0.01, real_s=0.01)
    diagnosis = tfgpu.diagnose(_tiny_model(), partial_first, **FAST)
    assert diagnosis.batch_size == 128
    assert diagnosis.examples_per_s == pytest.approx(128 / 0.01)


def test_drop_remainder_is_advised_only_when_it_drops_little():
    wait = dict(
        step_time_s=0.6, compute_step_time_s=0.082, input_time_s=0.0039, batch_size=128,
        dynamic_shape="(None, 64, 64, 3)", partial_batches=True,
    )  # fmt: skip

    def fix(**kw):
        findings = classify(_facts(**wait, **kw))[3]
        return next(f for f in findings if f.kind == "input_wait_unexplained").recommendation

    # Issue 27's image folder: 192 images in batches of 128; dropping loses a third of them.
    rec = fix(epoch_examples=192)
    assert (
        "not `drop_remainder=True`: it would drop the last 64 of the 192 examples of each "
        "epoch (33%)" in rec
    )
    assert "a batch size that divides the 192 examples (e.g. 96)" in rec
    assert "batch with `drop_remainder=True`" not in rec
    rec = fix(epoch_examples=10_000)  # 16 of 10,000: advised, with what it drops
    assert "batch with `drop_remainder=True`" in rec
    assert "drops the last 16 of the 10,000 examples of each epoch" in rec
    assert "drops the last batch of each epoch (up to 127 examples)" in fix()  # count unknown
    rec = fix(epoch_examples=191)  # no batch size from 64 to 127 divides 191
    assert "divides" not in rec and "pad to fixed shapes; not `drop_remainder=True`" in rec
    batched = tf.data.Dataset.from_tensor_slices(X[:192]).batch(128)
    assert shape_facts(batched) == ("(None, 256)", True, 192)


class _Counted(keras.layers.Layer):
    traces = 0

    def call(self, x):
        _Counted.traces += 1  # Python: runs only when the step is traced
        return x


def test_the_real_data_runs_the_step_traced_on_the_device_resident_batch():
    # A step traced for (128, 256) would be traced again for the real data's (None, 256),
    # and under XLA compiled again for 128: a second compile inside the time budget.
    model = keras.Sequential([keras.Input((256,)), _Counted(), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    real = tf.data.Dataset.from_tensor_slices((X[:256], Y[:256])).batch(128)
    device = variants_module.device_resident(next(iter(real)), False, real.element_spec)
    assert device.element_spec == real.element_spec
    model.fit(device, steps_per_epoch=2, verbose=0, shuffle=False)
    traced = _Counted.traces
    model.fit(real, verbose=0, shuffle=False)
    assert _Counted.traces == traced
    named = tf.data.Dataset.from_tensor_slices(({"a": X[:64], "b": X[:64, :3]}, Y[:64])).batch(32)
    spec = named.element_spec
    assert variants_module.device_resident(next(iter(named)), False, spec).element_spec == spec


def test_a_one_replica_mirrored_strategy_is_named_with_the_line_that_replaces_it():
    facts = _facts(one_replica_strategy="MirroredStrategy")
    _, _, _, findings = classify(facts)
    found = next(f for f in findings if f.kind == "one_replica_strategy")
    assert found.title.startswith("A MirroredStrategy of one replica")
    assert "`strategy = tfgpu.strategy()` in its place" in found.recommendation
    # Several GPUs: tfgpu.strategy() would mirror them, a question for tfgpu.scaling.
    facts = _facts(one_replica_strategy="MirroredStrategy", compute_capabilities=((8, 0),) * 2)
    assert all(f.kind != "one_replica_strategy" for f in classify(facts)[3])


def test_an_all_reduce_that_holds_the_step_is_named_scaling_bound_and_points_to_scaling():
    facts = _facts(replicas=4, all_reduce_s=0.04, gradient_bytes=64 * 2**20)
    bottleneck, _, _, findings = classify(facts)
    assert bottleneck == "scaling"
    lead = findings[0]
    assert lead.kind == "scaling_bound"
    assert "64.0 MiB of gradients take 40.00 ms of a 100.00 ms step" in lead.detail
    assert "tfgpu.scaling(" in lead.recommendation
    assert lead.expected_gain == pytest.approx(0.1 / 0.06)
    # One replica, or an all-reduce below a quarter of the step: not scaling-bound.
    for facts in (_facts(all_reduce_s=0.04), _facts(replicas=2, all_reduce_s=0.02)):
        bottleneck, _, _, findings = classify(facts)
        assert bottleneck == "compute" and all(f.kind != "scaling_bound" for f in findings)
