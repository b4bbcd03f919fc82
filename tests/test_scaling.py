"""tfgpu.scaling(): the cost model (pure), the reasons (pure, from built numbers), the
arguments (refused before any work), and real runs on the process's 4 logical CPU devices
with a bottleneck built in: a Python generator (input-bound) and large gradients on tiny
compute (all-reduce-bound)."""

from __future__ import annotations

import json
import math
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
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
        ({"model": _tiny_model()}, TypeError, r"argument `model`.*cannot be built again"),
        (
            {"model": "m"},
            TypeError,
            r"argument `model`\. Received: model='m'",
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

    call = {"model": factory, "data": (X, Y), **kwargs}
    with pytest.raises(error, match=match):
        tfgpu.scaling(call.pop("model"), call.pop("data"), **call)
    assert built == []


def test_a_log_dir_under_a_file_and_a_factory_with_its_own_strategy_are_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"argument `log_dir`"):
        tfgpu.scaling(_tiny_model, (X, Y), log_dir=tmp_path / "f" / "run")

    def own_strategy():
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            return _tiny_model()

    with pytest.raises(ValueError, match=r"argument `model`.*open no strategy scope"):
        tfgpu.scaling(own_strategy, (X, Y), replicas=[2], verbose=0)


@pytest.mark.slow
def test_a_python_generator_is_named_input_bound_and_everything_is_put_back(tmp_path):
    """A generator doing Python work per example feeds a one-weight model: the pipeline alone
    is slower than the step's device work by orders of magnitude. The factory sets a global
    policy; the user's is back after; no strategy is left open; the files parse."""

    def examples():
        for i in range(1_000_000):
            total = sum(range(2_000))  # Python work per example: the generator's cost
            yield np.full(4, (i + total) % 7, np.float32), np.ones(1, np.float32)

    spec = (tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))
    data = tf.data.Dataset.from_generator(examples, output_signature=spec).batch(64)

    def factory():
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, dtype="float32")])
        model.compile("sgd", "mse")
        return model

    before = keras.mixed_precision.global_policy().name
    # 16 timed steps a fit: the batches the generator buffered while the first step traced
    # (seconds on a loaded machine) must not make up half of them and hide the input wait.
    result = tfgpu.scaling(
        factory, data, replicas=[2], steps=16, time_budget_s=60, verbose=0, log_dir=tmp_path
    )
    assert keras.mixed_precision.global_policy().name == before
    assert not tf.distribute.has_strategy()
    points = {(p.replicas, p.mode): p for p in result.points}
    assert set(points) == {(1, "both"), (2, "weak"), (2, "strong")}
    weak = points[2, "weak"]
    assert weak.global_batch == 128 and weak.per_replica_batch == 64
    assert points[2, "strong"].global_batch == 64
    assert weak.reason.startswith("input-bound"), str(result)
    assert "tfgpu.data.pipeline" in weak.fix
    assert weak.input_s > weak.compute_s + weak.all_reduce_s
    record = json.loads((tmp_path / "scaling.json").read_text())
    assert record["device_kind"] == "logical CPU device"
    assert record["points"][1]["reason"] == weak.reason
    assert "input-bound" in record["text"]
    assert (tmp_path / "scaling.png").stat().st_size > 0


def _slow_interconnect(devices: list[str]) -> tf.distribute.Strategy:
    """A strategy whose all-reduce is deliberately slow, as over a slow link: on logical CPU
    devices the replicas share memory, so a real all-reduce moves nothing and costs one sum.
    Each reduction here makes 40 more passes over the gradients."""

    def slow_add_n(values):
        total = tf.add_n(values)
        for _ in range(40):
            total = total * 0.5 + values[0] * 0.5
        return total

    if len(devices) == 1:
        return tf.distribute.OneDeviceStrategy(devices[0])
    ops = tf.distribute.ReductionToOneDevice(accumulation_fn=slow_add_n)
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)


@pytest.mark.slow
def test_large_gradients_over_a_slow_link_are_named_all_reduce_bound_and_predicted(monkeypatch):
    """2 MiB of gradients, four examples per replica, an all-reduce made slow: it holds the
    step. The cost model, calibrated on 1 and 2 replicas, predicts 4 and says its error."""
    from tfgpu.scalability import _scaling

    monkeypatch.setattr(_scaling, "_strategy", _slow_interconnect)

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
    assert result.all_reduce == "reduction_to_one_device"
    points = {(p.replicas, p.mode): p for p in result.points}
    for key in ((2, "weak"), (4, "weak")):
        assert points[key].reason.startswith("all-reduce-bound"), str(result)
        assert "larger per-replica batch" in points[key].fix
    assert points[4, "weak"].all_reduce_s > points[4, "weak"].compute_s
    predicted = {(q.replicas, q.mode) for q in result.predictions}
    assert {(4, "weak"), (8, "weak"), (4, "strong")} <= predicted
    assert set(result.prediction_errors) >= {"4 weak"}
    assert all(math.isfinite(e) for e in result.prediction_errors.values())
    assert "prediction vs measured here: 4 weak" in str(result)
    assert isinstance(result, ScalingResult)


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


@pytest.mark.slow
def test_one_replica_alone_is_timed_not_called_out_of_budget():
    # Nothing to interleave with: the reference still gets its own rounds.
    result = tfgpu.scaling(_tiny_model, (X, Y), replicas=[1], steps=3, time_budget_s=30, verbose=0)
    (point,) = result.points
    assert point.examples_per_s and point.reason == "the reference: one replica", str(result)
    with pytest.raises(ValueError, match=r"argument `steps`\. Received: steps=2"):
        tfgpu.scaling(_tiny_model, (X, Y), steps=2, verbose=0)
