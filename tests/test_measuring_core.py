"""The measuring core's promise: `diagnose` and `tune` speak with one voice. On one model and
one measurement, the bottleneck `diagnose` names is the one `tune` acts on first; the core's
pieces (the gain, the verdicts, the facts, the session) are tested pure here too.

Step times are the suite's scripted engine's (`tests.conftest.ScriptedTiming`): a step costs
a fixed dispatch per call of the train function plus its compute, and the real data's step
waits for the pipeline when the pipeline is slower; the pipeline alone is scripted as well.
No test depends on this machine's speed.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
import tfgpu.batch_size
from tests.conftest import CPU_FACTS, FoundOneSize, ScriptedTiming
from tfgpu._internal.adapters import model_state
from tfgpu._internal.measure import facts as facts_module
from tfgpu._internal.measure import reader, rules
from tfgpu._internal.measure import variants as variants_module
from tfgpu._internal.measure.facts import WorkloadFacts, gather
from tfgpu._internal.measure.reader import PipelineBenchmark
from tfgpu._internal.measure.rules import Gain
from tfgpu._internal.measure.session import Session
from tfgpu._internal.measure.workload import open_workload
from tfgpu.diagnosis import _probes

X = np.random.default_rng(0).random((512, 8)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e-3), "mse")
    return model


def _data() -> tf.data.Dataset:
    # A user's dataset: 8 full batches of 64, a deterministic map, no prefetch at its end.
    return tf.data.Dataset.from_tensor_slices((X, Y)).map(lambda x, y: (x * 2.0, y)).batch(64)


def _one_measurement(monkeypatch, *, dispatch_s: float, compute_s: float, input_s: float):
    """The scripted workload both tools measure: a call of the train function costs
    `dispatch_s` plus `compute_s` a step; on the real data a step takes at least the
    pipeline's `input_s` per batch (read beside it), on a batch held in device memory not."""
    resident: list = []
    original = variants_module.device_resident

    def device_resident(*args):
        ds = original(*args)
        resident.append(ds)
        return ds

    def step(model, dataset):
        spe = int(model.steps_per_execution)
        seconds = dispatch_s / spe + compute_s
        if not any(dataset is d for d in resident):
            seconds = max(seconds, input_s)
        return seconds

    alone = PipelineBenchmark(
        examples_per_s=64 / input_s,
        batches_per_s=1 / input_s,
        num_batches=10,
        num_examples=640,
        seconds=10 * input_s,
        batch_size=64,
    )
    monkeypatch.setattr(variants_module, "device_resident", device_resident)
    monkeypatch.setattr(reader, "read_alone", lambda *a, **k: alone)
    monkeypatch.setattr(_probes, "warm_real", lambda *a, **k: None)
    monkeypatch.setattr(facts_module, "device_facts", lambda: dict(CPU_FACTS))
    monkeypatch.setattr(model_state, "supports_xla", lambda model: False)
    monkeypatch.setattr(
        tfgpu.batch_size, "find_batch_size", lambda model, data, **k: FoundOneSize(64)
    )
    return ScriptedTiming(monkeypatch, step, input_s=input_s, real_fit=True)


def _first_tried(result) -> str:
    return next(t for t in result.trials if t.status != "untried").name


@pytest.mark.slow
def test_a_host_bound_step_is_named_host_overhead_and_tune_tries_steps_per_execution_first(
    monkeypatch,
):
    # 3 ms of dispatch a call, 0.2 ms of compute a step; the pipeline keeps up (0.1 ms).
    _one_measurement(monkeypatch, dispatch_s=0.003, compute_s=0.0002, input_s=0.0001)
    diagnosis = tfgpu.diagnose(_model(), _data(), steps=5, warmup=2, check_xla=False, verbose=0)
    assert diagnosis.bottleneck == "host_overhead", str(diagnosis)
    assert diagnosis.findings[0].kind == "host_overhead"
    result = tfgpu.tune(_model(), _data(), time_budget_s=600, verbose=0)
    assert _first_tried(result) == "steps_per_execution=4", str(result)
    assert result.trial("steps_per_execution=4").status == rules.KEPT


@pytest.mark.slow
def test_an_input_bound_pipeline_is_named_input_and_tune_tries_the_data_first(monkeypatch):
    # The pipeline takes 50 ms a batch; the step itself 10 ms (dispatch included).
    _one_measurement(monkeypatch, dispatch_s=0.0005, compute_s=0.0095, input_s=0.05)
    diagnosis = tfgpu.diagnose(_model(), _data(), steps=5, warmup=2, check_xla=False, verbose=0)
    assert diagnosis.bottleneck == "input", str(diagnosis)
    assert diagnosis.findings[0].kind == "input_bound"
    result = tfgpu.tune(_model(), _data(), time_budget_s=600, verbose=0)
    first = result.trial(_first_tried(result))
    assert set(first.change) <= set(rules.PIPELINE_KEYS), str(result)
    assert first.name == "prefetch"


def test_both_tools_read_one_threshold_for_host_bound_and_one_for_input_bound():
    # The rule tune orders by is the rule diagnose probes by: one constant each.
    step = rules.HOST_BOUND_STEP_S
    assert rules.bottleneck(0.9 * step) == "host"
    assert rules.bottleneck(1.1 * step) == "compute"
    assert rules.bottleneck(1.1 * step, steps_per_execution=1) == "compute"
    assert rules.bottleneck(0.9 * step * 16, steps_per_execution=16) == "compute"
    assert rules.bottleneck(0.1, input_s=rules.INPUT_SHARE * 0.1) == "input"
    assert rules.bottleneck(None) == ""


def test_a_gain_has_its_interval_and_one_text():
    assert Gain.of([(2.0, 1.0)] * 3) == Gain(2.0, 2.0, 2.0)
    assert Gain.of([]) is None
    g = Gain.of([(1.0, 0.5), (1.0, 0.8), (1.0, 0.4)])
    assert g.value == pytest.approx(2.0) and g.low <= g.value <= g.high
    assert Gain(1.32, 1.25, 1.4).text() == "x1.32 (1.25-1.40)"
    assert Gain(2.0, 2.0, 2.0).text() == "x2.00" and rules.gain_text(None) == "-"


def test_the_verdicts_and_the_stop_rule_use_the_one_margin():
    keep = [(rules.MARGIN * 1.1, 1.0)] * rules.MIN_ROUNDS
    assert rules.verdict(keep, None)[0] == rules.KEPT and rules.decided(keep)
    assert rules.verdict([(1.0, 1.0)] * rules.MIN_ROUNDS, None)[0] == rules.NO_GAIN
    assert rules.verdict([(3.0, 1.0)], "faster") == (
        rules.KEPT,
        "the first round was clearly faster (x3.00)",
    )
    assert rules.verdict([(1.0, 3.0)], "slower")[0] == rules.SLOWER
    assert math.isclose(rules.CLEARLY, 2.0) and rules.MIN_ROUNDS <= rules.MAX_ROUNDS
    # No verdict from fewer rounds than the docs promise, unless the first was clear.
    two_slower = [(1.0, 1.1), (1.0, 1.08)]
    assert rules.verdict(two_slower, "budget") == (
        rules.UNTRIED,
        "time budget spent after 2 of 3 rounds (x0.92 (0.91-0.93))",
    )


def test_a_gain_the_baselines_own_drift_explains_is_not_kept():
    # Every round agrees on about x1.09, but the baseline itself moved x1.4 between rounds.
    drifting = [(1.0, 0.92), (1.4, 1.28), (1.0, 0.91)]
    assert rules.drift([b for b, _ in drifting]) == pytest.approx(1.4)
    assert rules.Gain.of(drifting).low >= rules.MARGIN
    status, reason = rules.verdict(drifting, None)
    assert status == rules.BORDERLINE and "the baseline itself moved x1.40" in reason
    assert not rules.decided(drifting)  # more rounds, while the drift can explain the gain
    steady = [(1.0, 0.92), (1.01, 0.93), (1.0, 0.91)]  # the same gain on a steady baseline
    assert rules.verdict(steady, None)[0] == rules.KEPT and rules.decided(steady)
    large = [(1.0, 0.4), (1.4, 0.6), (1.0, 0.45)]  # a gain far beyond the drift
    assert rules.verdict(large, None)[0] == rules.KEPT


def test_the_facts_of_a_model_and_its_batches_are_read_once_without_training():
    model = _model()
    facts = WorkloadFacts(**gather(open_workload(model, _data())))
    assert (facts.batch_size, facts.batches_per_epoch, facts.epoch_examples) == (64, 8, 512)
    assert not facts.prefetch and facts.cache is None and facts.sequential_map
    assert facts.replicas == 1 and facts.steps_per_execution == 1 and facts.pipeline is None
    assert not model.optimizer.built  # nothing was trained
    partial = WorkloadFacts(
        **gather(
            open_workload(model, tf.data.Dataset.from_tensor_slices((X[:100], Y[:100])).batch(64))
        )
    )
    assert partial.remainder == (36, 100) and partial.partial_batches
    arrays = WorkloadFacts(**gather(open_workload(model, (X[:100], Y[:100]), batch_size=64)))
    assert arrays.from_arrays and arrays.remainder == (36, 100) and arrays.batches_per_epoch == 2


def test_a_session_checks_its_arguments_before_any_work(tmp_path, unwritable):
    session = Session.open("tune", verbose=0, time_budget_s=60, log_dir=tmp_path / "run")
    assert session.log_path == tmp_path / "run" and (tmp_path / "run").is_dir()
    assert session.budget.seconds == 60 and session.budget.left() <= 60
    with pytest.raises(ValueError, match="argument `time_budget_s`"):
        Session.open("tune", verbose=0, time_budget_s=-1)
    with pytest.raises(ValueError, match="argument `verbose`"):
        Session.open("tune", verbose=3, time_budget_s=None)
    with pytest.raises(ValueError, match=r"argument `log_dir`.*can create and write to"):
        Session.open("tune", verbose=0, time_budget_s=None, log_dir=unwritable / "x")
