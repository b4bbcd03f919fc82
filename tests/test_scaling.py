"""tfgpu.scaling(): the cost model (pure), the reasons (pure, from built numbers), the
arguments and the factory (refused before any timing), the verdicts on a scripted stand-in
of every measurement (`_Scripted`: no test here depends on this machine's speed or load),
and one real run on the process's logical CPU devices that asserts only what no speed can
change."""

from __future__ import annotations

import json
import math
import re
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tests.conftest import ScriptedTiming
from tfgpu._internal.measure.rules import Gain
from tfgpu.scalability import _cost as cost
from tfgpu.scalability._result import Point, ScalingResult
from tfgpu.scalability._scaling import replica_counts


def test_replica_counts_double_up_to_the_devices_and_always_start_at_one():
    assert replica_counts(4, None) == [1, 2, 4]
    assert replica_counts(6, None) == [1, 2, 4, 6]
    assert replica_counts(1, None) == [1]
    assert replica_counts(8, [4, 2]) == [1, 2, 4]


def test_the_ring_moves_less_than_a_reduction_through_one_device():
    assert cost.all_reduce_factor(cost.RING, 1) == (0.0, 0)
    assert cost.all_reduce_factor(cost.RING, 2) == (1.0, 2)
    assert cost.all_reduce_factor(cost.RING, 8) == (1.75, 14)
    assert cost.all_reduce_factor(cost.THROUGH_ONE, 4) == (6.0, 6)


def test_a_calibration_reproduces_its_measurements_and_extrapolates_by_the_formula():
    mib = 2**20
    # 2 replicas, ring: 1 x bytes at 10 GB/s = 6.7 ms for 64 MiB, plus 2 latency steps of 50 us.
    full = 64 * mib / 10e9 + 2 * 50e-6
    c = cost.Calibration.from_measurements(cost.RING, 2, 64 * mib, full, 2 * 50e-6)
    assert c.bandwidth_bytes_s == pytest.approx(10e9)
    assert c.latency_s == pytest.approx(50e-6)
    assert c.seconds(2, 64 * mib) == pytest.approx(full)
    assert c.seconds(4, 64 * mib) == pytest.approx(1.5 * 64 * mib / 10e9 + 6 * 50e-6)
    # Too fast to tell the bandwidth: latency alone.
    assert cost.Calibration.from_measurements(cost.RING, 2, 1, 1e-4, 1e-4).seconds(4, 1) == (
        pytest.approx(6 * 0.5e-4)
    )


@pytest.mark.parametrize(
    "mode, c1, c2, n, expected",
    [
        ("weak", 0.010, 0.010, 8, 0.010),  # GPUs: each replica's work is the same
        ("weak", 0.010, 0.020, 4, 0.040),  # shared cores: the work adds up
        ("weak", 0.010, 0.008, 4, 0.010),  # less time for the same work: noise, flat
        ("strong", 0.010, 0.005, 4, 0.0025),  # GPUs: each replica does 1/n
        ("strong", 0.010, 0.010, 4, 0.010),  # shared cores: the same total work
    ],
)
def test_the_compute_model_through_one_and_two_replicas(mode, c1, c2, n, expected):
    a, b = cost.fit_compute(mode, c1, c2)
    assert cost.compute_at(mode, a, b, 1) == pytest.approx(c1)
    assert cost.compute_at(mode, a, b, 2) == pytest.approx(max(c2, c1) if mode == "weak" else c2)
    assert cost.compute_at(mode, a, b, n) == pytest.approx(expected)


def test_a_step_is_the_device_work_in_sequence_or_the_input_when_slower():
    assert cost.step_time(0.010, 0.004, 0.001, 0.002) == pytest.approx(0.015)
    assert cost.step_time(0.010, 0.004, 0.001, 0.020) == pytest.approx(0.020)
    assert cost.ring_s(2, 1e9, 12.5e9) == pytest.approx(0.08)


def _point(n=2, mode="weak", step=0.020, compute=0.010, all_reduce=0.001, input_s=0.001, **kw):
    batch = 64 * n if mode == "weak" else 64
    p = Point(
        replicas=n,
        mode=mode,
        global_batch=batch,
        per_replica_batch=batch // n,
        step_s=step,
        examples_per_s=batch / step,
        speedup=Gain(*[kw.pop("speedup", 1.2)] * 3),
        compute_s=compute,
        all_reduce_s=all_reduce,
        input_s=input_s,
        **kw,
    )
    return p


def _base(step=0.010, compute=0.007):
    base = _point(1, "both", step=step, compute=compute, all_reduce=0.0, speedup=1.0)
    base.update_s = 0.001
    base.explain(base, "GPU", 0)
    return base


@pytest.mark.parametrize(
    "point, kind, reason, fix",
    [
        (_point(speedup=1.9), "GPU", r"^scales: 95% of linear$", ""),
        (
            _point(compute=0.005, input_s=0.019),
            "GPU",
            r"^input-bound \(60% of linear\)",
            "tfgpu.data.pipeline",
        ),
        (
            _point(all_reduce=0.006),
            "GPU",
            r"^all-reduce-bound \(60% of linear\): 16\.0 MiB",
            "all_reduce",
        ),
        (_point(compute=0.016, all_reduce=0.002), "logical CPU device", r"^shared cores", ""),
        (
            _point(mode="strong", step=0.009, compute=0.007),
            "GPU",
            r"^per-replica batch too small \(60% of linear\): 32 examples per replica",
            "global_batch_size",
        ),
        (_point(step=0.030, compute=0.008), "GPU", r"^host-bound", "steps_per_execution"),
        (
            _point(step=0.030, compute=0.008, update_s=0.015),
            "GPU",
            r"^update-bound \(60% of linear\): updating every replica's copy of the weights "
            r"takes 15\.0 ms",
            "larger per-replica batch",
        ),
        (_point(step=0.012, compute=0.011), "GPU", r"^compute slows", "GPUMonitor"),
    ],
)
def test_each_point_gets_the_reason_of_what_grew_and_its_fix(point, kind, reason, fix):
    point.explain(_base(), kind, 16 * 2**20)
    assert point.efficiency == pytest.approx(point.speedup.value / point.replicas)
    assert re.search(reason, point.reason), point.reason
    assert fix in point.fix


def test_the_step_split_adds_up_to_the_step():
    p = _point(step=0.020, compute=0.010, all_reduce=0.003, input_s=0.015, update_s=0.001)
    p.explain(_base(), "GPU", 0)
    assert p.input_wait_s == pytest.approx(0.001)  # the pipeline beyond the device's work
    parts = p.compute_s + p.all_reduce_s + p.update_s + p.input_wait_s + p.other_s
    assert parts == pytest.approx(0.020)


def _tiny_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model


X = np.random.default_rng(0).random((64, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((64, 1), dtype=np.float32)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"model_factory": _tiny_model()},
            TypeError,
            r"argument `model_factory`.*cannot be built again",
        ),
        (
            {"model_factory": "m"},
            TypeError,
            r"argument `model_factory`\. Received: model_factory='m'",
        ),
        ({"data": "data"}, TypeError, r"argument `data`"),
        (
            {"replicas": [8]},
            ValueError,
            r"argument `replicas`\. Received: replicas=8\. Expected replica counts between 1 and 4",
        ),
        ({"replicas": 2}, TypeError, r"argument `replicas`"),
        ({"batch_size": 0}, ValueError, r"argument `batch_size`"),
        ({"time_budget_s": -1}, ValueError, r"argument `time_budget_s`"),
        ({"network_gbit_s": float("nan")}, ValueError, r"argument `network_gbit_s`"),
        ({"verbose": 3}, ValueError, r"argument `verbose`"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(kwargs, error, match):
    built = []

    def factory():
        built.append(1)
        return _tiny_model()

    call = {"model_factory": factory, "data": (X, Y), **kwargs}
    with pytest.raises(error, match=match):
        tfgpu.scaling(call.pop("model_factory"), call.pop("data"), **call)
    assert built == []


def test_a_log_dir_under_a_file_and_a_factory_with_its_own_strategy_are_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"argument `log_dir`"):
        tfgpu.scaling(_tiny_model, (X, Y), log_dir=tmp_path / "f" / "run")

    def own_strategy():
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            return _tiny_model()

    with pytest.raises(ValueError, match=r"argument `model_factory`.*open no strategy scope"):
        tfgpu.scaling(own_strategy, (X, Y), replicas=[2], verbose=0)


def _frozen() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, trainable=False)])
    model.compile("sgd", "mse")
    return model


def _widths():
    widths = iter([16, 32, 48, 64, 80])

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(next(widths))])
        model.compile("sgd", "mse")
        return model

    return build


def _uncompiled() -> keras.Model:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


_ONE_MODEL = _tiny_model()


@pytest.mark.parametrize(
    "make_factory, error, match",
    [
        (
            lambda: _frozen,
            ValueError,
            r"argument `model_factory`\. Received: a function whose model has no trainable "
            r"weights \(its 2 weights are all non-trainable",
        ),
        (
            _widths,
            ValueError,
            r"argument `model_factory`\. Received: a function that built different models "
            r"\(weight 1 of 2 \(`dense\w*/kernel`\): \(4, 16\), then \(4, 32\); 80 "
            r"parameters, then 160\)",
        ),
        (
            lambda: lambda: _ONE_MODEL,
            ValueError,
            r"argument `model_factory`\. Received: a function that returned the same model "
            r"object twice",
        ),
        (
            lambda: _uncompiled,
            ValueError,
            r"argument `model_factory`\. Received: the model the factory returned that is not "
            r"compiled",
        ),
    ],
    ids=["all-layers-frozen", "another-width-each-call", "the-same-object", "not-compiled"],
)
def test_a_factory_scaling_cannot_compare_is_refused_before_any_timing(
    make_factory, error, match, monkeypatch
):
    """Frozen layers (plain `fit` trains, there is nothing to all-reduce: it failed after 6 s
    inside `tf.add_n`), a model that changes from call to call (the speedups would compare
    different models), one object returned every time, a model not compiled."""
    engine = ScriptedTiming(monkeypatch, lambda model, dataset: 0.01)
    with pytest.raises(error, match=match):
        tfgpu.scaling(make_factory(), (X, Y), replicas=[2], verbose=0)
    assert engine.calls == 0


@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_what_the_factory_raises_comes_through_as_itself(failing_call):
    calls = []

    def factory():
        calls.append(1)
        if len(calls) == failing_call:
            raise RuntimeError("could not load the pretrained weights")
        return _tiny_model()

    with pytest.raises(RuntimeError, match=r"^could not load the pretrained weights$"):
        tfgpu.scaling(factory, (X, Y), replicas=[2], verbose=0)
    assert len(calls) == failing_call


class _Scripted:
    """Every measurement of `scaling` scripted from the parts of a step, so that a verdict
    comes from these numbers and never from this machine: per replica count `n` and global
    batch, the compute (`compute(n, per_replica_batch)`), the all-reduce (`all_reduce(n)`,
    its latency a tenth of it), the update (`update(n)`) and the pipeline alone (`rate`
    examples/s); each timed fit's step is the device's parts in sequence, or the input when
    slower (`cost.step_time`, as the cost model says)."""

    def __init__(self, monkeypatch, *, compute, all_reduce, update, rate):
        from tfgpu._internal.adapters import replicas
        from tfgpu._internal.measure import reader

        self.compute, self.all_reduce, self.update, self.rate = compute, all_reduce, update, rate
        self.engine = ScriptedTiming(monkeypatch, self._step)
        monkeypatch.setattr(
            replicas,
            "compute_s",
            lambda strategy, model, batch: self._compute(strategy.num_replicas_in_sync, batch),
        )
        monkeypatch.setattr(
            replicas,
            "all_reduce_s",
            lambda strategy, model, tiny: (
                self._reduce(strategy.num_replicas_in_sync) / (10 if tiny else 1)
            ),
        )
        monkeypatch.setattr(
            replicas,
            "apply_s",
            lambda strategy, model: (
                self._reduce(strategy.num_replicas_in_sync) + update(strategy.num_replicas_in_sync)
            ),
        )
        monkeypatch.setattr(
            reader,
            "read_alone",
            lambda dataset, steps, warmup: types.SimpleNamespace(examples_per_s=rate),
        )

    def _reduce(self, n: int) -> float:
        return 0.0 if n == 1 else self.all_reduce(n)

    def _compute(self, n: int, batch) -> float:
        return self.compute(n, int(tf.nest.flatten(batch)[0].shape[0]) // n)

    def _step(self, model, dataset) -> float:
        n = model.distribute_strategy.num_replicas_in_sync
        global_batch = tf.nest.flatten(dataset.element_spec)[0].shape[0]  # whole batches
        busy = self.compute(n, global_batch // n) + self._reduce(n) + self.update(n)
        return cost.step_time(busy, 0.0, 0.0, global_batch / self.rate)


def _sets_a_policy() -> keras.Model:
    """A factory that sets a global precision policy: scaling puts the user's back."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, dtype="float32")])
    model.compile("sgd", "mse")
    return model


def test_a_slow_pipeline_is_named_input_bound_and_everything_is_put_back(tmp_path, monkeypatch):
    """A pipeline of 1,000 examples/s feeds a step whose device work takes about 1 ms: at 64
    examples a step (64 ms of input) on, every step waits for its batch. The factory sets a
    global policy; the user's is back after; no strategy is left open; the files parse."""
    _Scripted(
        monkeypatch,
        compute=lambda n, per_replica: 0.001 * per_replica / 64,
        all_reduce=lambda n: 0.0001,
        update=lambda n: 0.0001,
        rate=1000.0,
    )

    before = keras.mixed_precision.global_policy().name
    result = tfgpu.scaling(
        _sets_a_policy, (X, Y), replicas=[2], time_budget_s=60, verbose=0, log_dir=tmp_path
    )
    assert keras.mixed_precision.global_policy().name == before
    assert not tf.distribute.has_strategy()
    points = {(p.replicas, p.mode): p for p in result.points}
    assert set(points) == {(1, "both"), (2, "weak"), (2, "strong")}
    weak = points[2, "weak"]
    assert weak.global_batch == 64 and weak.per_replica_batch == 32
    assert points[2, "strong"].global_batch == 32
    assert weak.speedup.value == pytest.approx(1.0)  # twice the examples, twice the input time
    assert weak.reason == (
        "input-bound (50% of linear): the pipeline alone delivers 1,000 examples/s, 64.0 ms per "
        "global batch of 64"
    ), str(result)
    assert "tfgpu.data.pipeline" in weak.fix
    assert weak.input_wait_s == pytest.approx(0.064 - 0.0007)  # 0.5 ms of compute on 32
    record = json.loads((tmp_path / "scaling.json").read_text())
    assert record["device_kind"] == "logical CPU device"
    assert record["points"][1]["reason"] == weak.reason
    assert "input-bound" in record["text"]
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_large_gradients_over_a_slow_link_are_named_all_reduce_bound_and_predicted(monkeypatch):
    """2 MiB of gradients, four examples per replica: an all-reduce of 8 ms on 2 replicas,
    12 on 4, beside 1 ms of compute, holds the step. The cost model, calibrated on 1 and 2
    replicas, predicts 4 and says its error against the 4 measured."""
    _Scripted(
        monkeypatch,
        compute=lambda n, per_replica: 0.001 * per_replica / 4,
        all_reduce=lambda n: {2: 0.008, 4: 0.012}[n],
        update=lambda n: 0.0005,
        rate=1e6,
    )

    def factory():
        model = keras.Sequential(
            [keras.Input((512,)), keras.layers.Dense(1024), keras.layers.Dense(1)]
        )
        model.compile("sgd", "mse")
        return model

    x = np.random.default_rng(0).random((64, 512), dtype=np.float32)
    y = np.ones((64, 1), np.float32)
    result = tfgpu.scaling(factory, (x, y), batch_size=4, time_budget_s=None, verbose=0)
    assert result.gradient_bytes == 4 * (512 * 1024 + 1024 + 1024 + 1)
    points = {(p.replicas, p.mode): p for p in result.points}
    assert points[2, "weak"].speedup.value == pytest.approx(2 * 0.0015 / 0.0095)
    for key in ((2, "weak"), (4, "weak")):
        assert points[key].reason.startswith("all-reduce-bound"), str(result)
        assert "2.0 MiB of gradients take" in points[key].reason
        assert "larger per-replica batch" in points[key].fix
    assert points[4, "weak"].all_reduce_s == pytest.approx(0.012)
    assert points[4, "weak"].compute_s == pytest.approx(0.001)
    predicted = {(q.replicas, q.mode) for q in result.predictions}
    assert {(4, "weak"), (8, "weak"), (4, "strong")} <= predicted
    assert set(result.prediction_errors) >= {"4 weak"}
    assert all(math.isfinite(e) for e in result.prediction_errors.values())
    assert "prediction vs measured here: 4 weak" in str(result)
    assert isinstance(result, ScalingResult)


@pytest.mark.parametrize("replicas", [[1], None], ids=["replicas-1", "one-device"])
def test_one_replica_alone_is_timed_even_when_the_build_spent_the_budget(replicas, monkeypatch):
    """Nothing to interleave with: the reference gets rounds of its own, the first without a
    deadline, even when building the model took the whole budget (a one-GPU machine with
    `replicas=None` is the same call)."""
    from tfgpu.scalability import _scaling

    scripted = _Scripted(
        monkeypatch,
        compute=lambda n, per_replica: 0.001,
        all_reduce=lambda n: 0.0,
        update=lambda n: 0.0,
        rate=1e6,
    )
    if replicas is None:
        monkeypatch.setattr(_scaling, "_devices", lambda: (["/cpu:0"], "logical CPU device"))

    def slow_to_build():
        scripted.engine.clock += 100.0  # past the 8 s budget before any timing
        return _tiny_model()

    result = tfgpu.scaling(
        slow_to_build, (X, Y), replicas=replicas, steps=3, time_budget_s=8, verbose=0
    )
    (point,) = result.points
    assert point.examples_per_s == pytest.approx(1 / 0.001 * 32), str(result)
    assert point.reason == "the reference: one replica"
    with pytest.raises(ValueError, match=r"argument `steps`\. Received: steps=2"):
        tfgpu.scaling(_tiny_model, (X, Y), steps=2, verbose=0)


@pytest.mark.slow
def test_a_real_run_times_every_configuration_and_puts_everything_back(tmp_path):
    """The one real run (4 logical CPU devices, no time limit): what it asserts holds at any
    speed, on any load: every configuration is timed and split, a reason per point, the
    predictions, the policy and the strategy put back, the files written."""

    before = keras.mixed_precision.global_policy().name
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    result = tfgpu.scaling(
        _sets_a_policy, data, replicas=[2], steps=3, time_budget_s=None, verbose=0, log_dir=tmp_path
    )
    assert keras.mixed_precision.global_policy().name == before
    assert not tf.distribute.has_strategy()
    assert [(p.replicas, p.mode, p.global_batch) for p in result.points] == [
        (1, "both", 8),
        (2, "weak", 16),
        (2, "strong", 8),
    ]
    for p in result.points:
        assert p.examples_per_s > 0 and p.compute_s is not None and p.input_s is not None
        assert p.reason and not p.reason.startswith("not timed"), str(result)
    assert result.gradient_bytes == 4 * (4 + 1)
    assert result.device_kind == "logical CPU device" and result.all_reduce
    assert {(q.replicas, q.mode) for q in result.predictions} >= {(4, "weak"), (4, "strong")}
    record = json.loads((tmp_path / "scaling.json").read_text())
    assert [p["reason"] for p in record["points"]] == [p.reason for p in result.points]
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_without_an_interconnect_cost_the_same_gradients_are_not_all_reduce_bound():
    """The counterpart, pure: the same 8 MiB and a cheap all-reduce (logical CPU devices
    share memory) leave the step to compute and the update."""
    base = _point(1, "both", step=0.010, compute=0.006, all_reduce=0.0, speedup=1.0)
    base.explain(base, "logical CPU device", 8 * 2**20)
    p = _point(4, "weak", step=0.040, compute=0.030, all_reduce=0.002, speedup=1.0)
    p.explain(base, "logical CPU device", 8 * 2**20)
    assert p.reason.startswith("shared cores"), p.reason


def test_a_dataset_that_never_yields_is_reported_not_waited_on(monkeypatch):
    """The data is read before any timed `fit`, with the bound every measuring call has."""
    import threading

    from tfgpu._internal.adapters import datasets

    monkeypatch.setattr(datasets, "READ_TIMEOUT_S", 0.2)
    release = threading.Event()

    def examples():
        release.wait()
        yield np.zeros(4, np.float32), np.zeros(1, np.float32)

    spec = (tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))
    data = tf.data.Dataset.from_generator(examples, output_signature=spec).batch(8)
    try:
        with pytest.raises(TimeoutError, match=r"^No element from `data` in 0\.2 s"):
            tfgpu.scaling(_tiny_model, data, replicas=[2], verbose=0)
    finally:
        release.set()


def _measured_gpu_points(gradient_bytes: int):
    """1 and 2 GPUs measured, weak: 10 ms of compute, an all-reduce calibrated fast (as a
    tiny measured one would be), 1 ms of update."""
    base = _point(1, "both", step=0.012, compute=0.010, all_reduce=0.0, speedup=1.0)
    two = _point(2, "weak", step=0.0125, compute=0.010, all_reduce=0.0005, speedup=1.9)
    for p in (base, two):
        p.update_s = 0.001
        p.explain(base, "GPU", gradient_bytes)
    parts = {
        "1 weak": {"compute_s": 0.010, "update_s": 0.001, "input_s": 0.001},
        "2 weak": {
            "compute_s": 0.010,
            "all_reduce_s": 0.0005,
            "latency_s": 0.0001,
            "update_s": 0.001,
            "input_s": 0.002,
        },
    }
    return [base, two], parts


@pytest.mark.parametrize(
    "topology, kind, floor_s",
    [
        ({"nvlinks": "nvswitch"}, "nvlink", 2 * 7 / 8 * 2**30 / 450e9),
        ({"p2p": "off"}, "pcie", 2 * 7 / 8 * 2**30 / (16e9 * 128 / 130 / 8 * 16 / 2)),
    ],
)
def test_the_link_nvml_reports_is_stated_and_bounds_the_predicted_all_reduce(
    topology, kind, floor_s, monkeypatch
):
    """Fake NVML topologies: an H100-like NVSwitch board and PCIe Gen4 x16 without peer
    access. The link is stated, and no predicted all-reduce of 1 GiB of gradients over 8 GPUs
    beats a ring over it (the calibration from 2 GPUs alone would say ~4 ms)."""
    import sys

    from tests import fake_pynvml
    from tfgpu.scalability import _links
    from tfgpu.scalability._scaling import predict

    if "nvlinks" in topology:
        fake = fake_pynvml.make(fake_pynvml.machine(8, nvlinks=fake_pynvml.nvswitch_links(18)))
    else:
        no_p2p = fake_pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        fake = fake_pynvml.make(fake_pynvml.machine(8), p2p=no_p2p)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    link = _links.gpu_link()
    assert link.kind == kind
    points, parts = _measured_gpu_points(2**30)
    predictions, _ = predict(points, parts, 2**30, "nccl", 100.0, "GPU", link)
    eight = next(q for q in predictions if (q.replicas, q.machines, q.mode) == (8, 1, "weak"))
    assert eight.all_reduce_s == pytest.approx(
        max(floor_s, 14 * 0.0001 / 2 + 1.75 * 2**30 / (2**30 / 0.0004))
    )
    result = ScalingResult(points, predictions, {}, 2**30, "GPU", "nccl", link, [])
    assert link.description in str(result)
    assert f"the link allows >= {floor_s * 1e3:.1f} ms" in str(result)
    # Across machines: the stated network adds its ring.
    two_machines = next(q for q in predictions if q.machines == 2 and q.mode == "weak")
    assert two_machines.replicas == 4  # this machine's 2 replicas, twice
    network = 2**30 / (100e9 / 8)  # a ring of 2 machines moves the gradients once, 100 Gbit/s
    assert two_machines.all_reduce_s == pytest.approx(
        max(2 / 2 * 2**30 / link.bandwidth_bytes_s, 2 * 0.00005 + 2**30 / (2**30 / 0.0004))
        + network
    )
