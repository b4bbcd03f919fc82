"""tfgpu.tune: the search keeps what clearly helps and nothing else, on scripted step times.

The measuring core's clock and timed fits are the suite's scripted engine
(`tests.conftest.ScriptedTiming`), here given seconds per step from the setting of each timed
run (steps_per_execution, jit_compile, a static batch shape, the private thread pool, the
precision policy) by `_Script`: no test depends on the machine's speed or load. The numerics guard, the state
restore, the pipeline rebuild and the files run for real.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
import tfgpu.batch_size
from tests.conftest import CPU_FACTS, ScriptedTiming, tune_on_a_plain_cpu
from tfgpu._internal.adapters import model_state
from tfgpu._internal.measure import facts as facts_module
from tfgpu._internal.measure import rules
from tfgpu._internal.measure.rules import Gain
from tfgpu.tuning import Trial, TuneResult, _tune
from tfgpu.tuning import _candidates as cands
from tfgpu.tuning._candidates import TuneFacts as Facts

X = np.random.default_rng(0).random((1000, 8)).astype("float32")
_SUPPORTS_XLA = model_state.supports_xla
Y = (X.sum(axis=1) > 4).astype("float32")


def _build(scale: float = 1.0):
    def build():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Rescaling(scale),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(1),
            ]
        )
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.MeanSquaredError())
        return model

    return build


def _train():
    return tfgpu.data.pipeline((X, Y), batch_size=64, seed=1)  # 16 batches, the last partial


def _setting(model, dataset) -> dict:
    leaves = tf.nest.flatten(dataset.element_spec)
    return {
        "spe": int(model.steps_per_execution),
        "jit": bool(model.jit_compile),
        "static": all(leaf.shape[0] is not None for leaf in leaves),
        "threads": int(dataset.options().threading.private_threadpool_size or 0),
        "policy": model.dtype_policy.name,
    }


def _Script(monkeypatch, step, *, real_fit=False):
    """The scripted engine, its seconds per step `step(setting, n)` (n: the fits of that
    setting before); `.settings` lists each fit's setting."""
    counts: dict[tuple, int] = {}
    settings: list[dict] = []

    def seconds(model, dataset):
        setting = _setting(model, dataset)
        settings.append(setting)
        key = tuple(sorted(setting.items()))
        n = counts.get(key, 0)
        counts[key] = n + 1
        return step(setting, n)

    engine = ScriptedTiming(monkeypatch, seconds, real_fit=real_fit)
    engine.settings = settings
    return engine


@pytest.fixture(autouse=True)
def _facts(monkeypatch):
    """A CPU without native bfloat16 and without GPUs, 4 cores, and a batch-size search that
    finds nothing faster, unless a test says otherwise; the global policy put back."""
    tune_on_a_plain_cpu(monkeypatch, 64, cpu_count=4)
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


def _names(result: TuneResult, status: str) -> list[str]:
    return [t.name for t in result.trials if t.status == status]


# The pure decisions.


def test_candidates_follow_the_facts():
    names = [
        c.name for c in cands.candidates(Facts(batches_per_epoch=10, batch_size=32, prefetch=False))
    ]
    assert names == [
        "steps_per_execution=4",
        "steps_per_execution=16",
        "steps_per_execution=64",
        "mixed precision",
        "static batch shape",
        "prefetch",
        "jit_compile=True",  # last: often much slower on a CPU, and its compile costs budget
    ]
    by_name = {
        c.name: c
        for c in cands.candidates(Facts(batches_per_epoch=10, batch_size=32, prefetch=False))
    }
    assert by_name["steps_per_execution=16"].untried == "more than the 10 batches of an epoch"
    assert by_name["static batch shape"].line == (
        "dataset = dataset.batch(32, drop_remainder=True)  # where you batch"
    )
    assert "prefetch" in by_name  # a user's dataset without a prefetch at its end
    assert by_name["mixed precision"].untried.startswith("this CPU has no native bfloat16")
    static = [c.name for c in cands.candidates(Facts(static_shape=True, jit_compile=True))]
    assert "static batch shape" not in static and "jit_compile=True" not in static


def test_pipeline_candidates_come_from_its_arguments():
    def decode(x, y):
        return x, y

    arguments = {"map_fn": decode, "augment_fn": decode, "cache": "auto", "batch_size": 64}
    facts = Facts(pipeline=arguments, batch_size=64, cpu_count=2)
    by_name = {c.name: c for c in cands.candidates(facts)}
    assert by_name["cache in memory"].line == "tfgpu.data.pipeline(..., cache='memory')"
    assert by_name["batch-level augmentation"].line == (
        "tfgpu.data.pipeline(..., augment_fn=None, batch_augment_fn=decode)"
    )
    assert by_name["private thread pool 1"].change == {"private_threadpool_size": 1}
    assert by_name["private thread pool 2"].change == {"private_threadpool_size": 2}
    assert by_name["static batch shape"].line == "tfgpu.data.pipeline(..., drop_remainder=True)"
    assert "prefetch" not in by_name
    cached = {c.name for c in cands.candidates(Facts(pipeline=arguments, cache="memory"))}
    assert "cache in memory" not in cached


def test_an_undo_comes_first_then_the_groups_the_bottleneck_predicts():
    base = dict(
        batches_per_epoch=100, batch_size=32, cpu_count=2, cpu_native_bf16=True, prefetch=False
    )
    base["has_factory"] = True

    def order(**facts):
        return [c.name for c in cands.candidates(Facts(**{**base, **facts})) if not c.untried]

    # XLA on, steps of 50 ms, reading a batch takes 1 ms: compute -> precision first.
    assert order(jit_compile=True, step_time_s=0.05, input_time_s=0.001) == [
        "jit_compile=False",  # undoes a setting the model has: first, not last
        "precision mixed_bfloat16",
        "steps_per_execution=4",
        "steps_per_execution=16",
        "steps_per_execution=64",  # untried in the search: 64 steps of 50 ms take 3.2 s
        "static batch shape",
        "prefetch",
        "private thread pool 1",
        "private thread pool 2",
    ]
    assert order(step_time_s=0.002, input_time_s=0.0)[:3] == [  # host overhead: the ladder first
        "steps_per_execution=4",
        "steps_per_execution=16",
        "steps_per_execution=64",
    ]
    assert (
        order(step_time_s=0.05, input_time_s=0.04)[0] == "prefetch"
    )  # input-bound: the data first
    assert order()[-1] == "jit_compile=True"  # unmeasured: the default order, XLA last
    # A mixed policy on a CPU without native bfloat16: float32 is tried first.
    facts = Facts(**{**base, "cpu_native_bf16": False, "policy": "mixed_bfloat16"})
    assert cands.candidates(facts)[0].change == {"precision": "float32"}
    assert rules.bottleneck(Facts().step_time_s) == ""


def test_a_static_batch_shape_weighs_the_examples_it_drops():
    def static(remainder):
        facts = Facts(batch_size=128, batches_per_epoch=2, remainder=remainder)
        return next(c for c in cands.candidates(facts) if c.name == "static batch shape")

    big = static((64, 192))  # the image example: a third of the data each epoch
    assert big.untried == (
        "it drops the last 64 of the 192 examples of each epoch: 5% of the data or more"
    )
    small = static((40, 10_000))
    assert small.untried == "" and small.note == (
        "drops the last 40 of the 10,000 examples of each epoch"
    )


def test_the_timed_fit_is_shaped_by_the_measured_step():
    assert cands.fit_shape(0.01, 50, 2.0) == (4, None)  # whole epochs, four of them
    assert cands.fit_shape(1.0, 2, 10.0) == (5, None)
    assert cands.fit_shape(1.0, 100, 10.0) == (1, 10)  # the first steps of an epoch
    assert cands.fit_shape(0.001, None, 1.0, unit=64) == (1, 1024)  # a multiple of the unit
    assert cands.fit_shape(1.0, None, 0.5, unit=4) == (1, 8)  # at least two calls
    assert cands.fit_shape(1.0, 12, 10.0, unit=16) == (1, None)  # more than an epoch


@pytest.mark.parametrize(
    "facts, policy, untried",
    [
        (Facts(compute_capabilities=((8, 0),), has_factory=True), "mixed_bfloat16", ""),
        (Facts(compute_capabilities=((7, 5),), has_factory=True), "mixed_float16", ""),
        (Facts(cpu_native_bf16=True, has_factory=True), "mixed_bfloat16", ""),
        (Facts(cpu_native_bf16=True), "mixed_bfloat16", cands.NEEDS_FACTORY),
        (
            Facts(compute_capabilities=((6, 1),), has_factory=True),
            "mixed_bfloat16",
            "not every GPU",
        ),
    ],
)
def test_the_precision_candidate_fits_the_hardware(facts, policy, untried):
    (cand,) = [c for c in cands.candidates(facts) if "precision" in c.change]
    assert cand.change == {"precision": policy} and cand.numerics
    assert cand.untried.startswith(untried)


def test_verdicts():
    assert rules.verdict([(2.0, 1.0)] * 3, None)[0] == rules.KEPT
    assert rules.verdict([(1.0, 2.0)] * 3, None)[0] == rules.SLOWER
    assert rules.verdict([(1.0, 2.0)], "slower")[0] == rules.SLOWER
    assert rules.verdict([(1.0, 1.0), (1.1, 1.0), (1.0, 1.1)], None)[0] == rules.NO_GAIN
    borderline = [(1.3, 1.0), (1.0, 1.0), (1.2, 1.0)]  # x1.20 (1.00-1.30)
    assert rules.verdict(borderline, None)[0] == rules.BORDERLINE
    assert "may come and go" in rules.verdict(borderline, None)[1]
    assert not rules.decided(borderline)  # another round may settle it
    assert rules.decided([(1.0, 1.0), (1.02, 1.0), (1.1, 1.0)])  # median under the margin
    assert rules.decided([(2.0, 1.0)] * 3) and rules.decided([(1.0, 2.0)] * 3)
    assert rules.verdict([(2.0, 1.0)], "budget") == (
        rules.UNTRIED,
        "time budget spent after 1 of 3 rounds (x2.00)",
    )
    assert rules.verdict([], "budget") == (rules.UNTRIED, rules.BUDGET_SPENT)
    assert cands.numerics_verdict(0.5, math.nan).startswith("the loss is not finite")
    assert cands.numerics_verdict(0.5, 0.6).startswith("mean loss 0.6 vs 0.5")
    assert cands.numerics_verdict(0.5, 0.52) == ""
    assert cands.spe_fits(64, 0.1).startswith("steps of 100 ms")
    assert cands.spe_fits(64, 0.001) == ""


def test_combined_lines_merge_the_compile_and_pipeline_changes():
    facts = Facts(pipeline={"batch_size": 64})
    kept = [
        ({"steps_per_execution": 16}, "x"),
        ({"jit_compile": True}, "y"),
        ({"drop_remainder": True}, "z"),
        ({"precision": "mixed_bfloat16"}, "tfgpu.configure(precision='mixed_bfloat16')"),
    ]
    assert cands.combined_lines(kept, facts) == [
        "model.compile(..., steps_per_execution=16, jit_compile=True)",
        "tfgpu.data.pipeline(..., drop_remainder=True)",
        "tfgpu.configure(precision='mixed_bfloat16')",
    ]


# The search, on scripted times.


def test_a_clear_gain_is_kept_a_clear_loss_rejected_and_noise_is_no_gain(monkeypatch):
    noise = [1.0, 1.08, 0.93, 1.05, 0.97, 1.1, 0.9, 1.02, 0.96]

    def step(s, n):
        seconds = 0.01 / s["spe"]  # host overhead: each execution costs the same
        if s["static"]:
            seconds *= 2.0  # clearly slower
        if s["threads"]:
            seconds *= noise[n % len(noise)]  # within the noise
        return seconds

    script = _Script(monkeypatch, step)
    model = _build()()
    result = tfgpu.tune(model, _train(), time_budget_s=600, verbose=0)
    # Host-bound: the largest rung that runs gets a first look, x16: decided at once.
    assert _names(result, "kept") == ["steps_per_execution=16"]
    assert result.trials[0].reason == "the first round was clearly faster (x16.00)"
    assert result.trial("steps_per_execution=4").reason == "steps_per_execution=16 was kept"
    assert result.trial("steps_per_execution=64").reason == "more than the 16 batches of an epoch"
    assert result.trial("static batch shape").status == "slower"
    assert result.trial("private thread pool 1").status == "no measurable gain"
    assert result.trial("private thread pool 4").status == "no measurable gain"
    assert result.trial("jit_compile=True").reason == "Keras refuses jit_compile for this model"
    assert result.settings == {"steps_per_execution": 16}
    assert result.lines == ["model.compile(..., steps_per_execution=16)"]
    assert result.speedup.value == pytest.approx(16.0)  # verified together against the baseline
    assert result.tuned_examples_per_s == pytest.approx(16 * result.baseline_examples_per_s)
    assert result.baseline_examples_per_s == pytest.approx(64 / 0.01)
    assert result.dataset is not None
    assert {"spe": 16, "jit": False} in [{k: s[k] for k in ("spe", "jit")} for s in script.settings]
    text = str(result)
    assert "steps_per_execution=16" in text and "x16.00" in text
    assert "untried: needs a fresh process" in text


def test_the_verification_drops_a_setting_that_does_not_hold_up(monkeypatch):
    static_runs = []

    def step(s, n):
        if s["static"]:  # helps in its own trial (an untimed fit, 3 rounds), slower later
            static_runs.append(n)
            return 0.01 / 4 * 0.8 if len(static_runs) <= 4 else 0.011
        return 0.01 / s["spe"]

    _Script(monkeypatch, step)
    model = _build()()
    train = tfgpu.data.pipeline((X, Y), batch_size=64, seed=1)
    monkeypatch.setattr(cands, "SPE_LADDER", (4,))
    result = tfgpu.tune(model, train, time_budget_s=600, verbose=0)
    static = result.trial("static batch shape")
    assert static.status == "borderline" and "did not hold the gain" in static.reason
    assert result.settings == {"steps_per_execution": 4}
    assert result.speedup.value == pytest.approx(4.0)
    assert "static batch shape dropped at the verification" in result.notes


def test_the_budget_is_respected(monkeypatch):
    script = _Script(monkeypatch, lambda s, n: 0.05)
    result = tfgpu.tune(_build()(), _train(), time_budget_s=20, verbose=0)
    assert script.clock - 1000.0 <= 20
    untried = [t for t in result.trials if t.reason.startswith("time budget spent")]
    assert untried, str(result)
    assert result.speedup.value == 1.0 and result.settings == {} and result.lines == []


def test_a_baseline_the_budget_cannot_time_gives_every_candidate_untried(monkeypatch):
    _Script(monkeypatch, lambda s, n: 10.0)
    result = tfgpu.tune(_build()(), _train(), time_budget_s=5, verbose=0)
    assert all(t.status == "untried" for t in result.trials)
    assert math.isnan(result.baseline_examples_per_s)
    assert "the baseline could not be timed" in result.notes[0]


@pytest.mark.slow
def test_state_is_restored_after_every_trial(monkeypatch):
    monkeypatch.setattr(model_state, "supports_xla", _SUPPORTS_XLA)
    monkeypatch.setattr(cands, "SPE_LADDER", (4,))
    _Script(monkeypatch, lambda s, n: 0.01 / s["spe"], real_fit=True)
    model = _build()()
    train = _train()
    model.fit(train, epochs=1, verbose=0, shuffle=False)  # optimizer state that must survive
    model.steps_per_execution = 2

    def state():
        values = [v.numpy().copy() for v in model.weights + model.optimizer.variables]
        return values, model.steps_per_execution, model.jit_compile

    before = state()
    checks = []
    original = _tune._Tuner._try

    def checked(self, cand, budget):
        trial = original(self, cand, budget)
        checks.append(cand.name)
        after = state()
        assert after[1:] == before[1:], cand.name
        for a, b in zip(after[0], before[0], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=cand.name)
        return trial

    monkeypatch.setattr(_tune._Tuner, "_try", checked)
    result = tfgpu.tune(model, train, time_budget_s=600, verbose=0)
    assert "steps_per_execution=4" in checks and "jit_compile=True" in checks
    after = state()
    assert after[1:] == before[1:]
    for a, b in zip(after[0], before[0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert keras.mixed_precision.global_policy().name == "float32"
    assert result.settings.get("steps_per_execution") == 4


@pytest.mark.slow
def test_a_precision_policy_that_overflows_is_unsafe(monkeypatch):
    # float16 on a simulated 7.5 GPU: x * 1e5 overflows (max 65504), the loss is not finite.
    gpu = {**CPU_FACTS, "on_gpu": True, "compute_capabilities": ((7, 5),)}
    monkeypatch.setattr(facts_module, "device_facts", lambda: gpu)
    _Script(monkeypatch, lambda s, n: 0.001 if s["policy"] == "mixed_float16" else 0.01)
    result = tfgpu.tune(_build(1e5), _train(), time_budget_s=600, verbose=0)
    trial = result.trial("precision mixed_float16")
    assert trial.status == "unsafe numerics", str(result)
    assert "not finite" in trial.reason
    assert "precision" not in result.settings
    assert keras.mixed_precision.global_policy().name == "float32"
    assert result.trial("GPU private threads").reason == cands.FRESH_PROCESS


@pytest.mark.slow
def test_the_precision_candidate_on_a_cpu_both_ways(monkeypatch):
    _Script(monkeypatch, lambda s, n: 0.004 if s["policy"] == "mixed_bfloat16" else 0.01)
    result = tfgpu.tune(_build(), _train(), time_budget_s=600, verbose=0)
    assert result.trial("mixed precision").reason.startswith("this CPU has no native bfloat16")

    monkeypatch.setattr(
        facts_module, "device_facts", lambda: {**CPU_FACTS, "cpu_native_bf16": True}
    )
    result = tfgpu.tune(_build(), _train(), time_budget_s=600, verbose=0)
    assert result.trial("precision mixed_bfloat16").status == "kept", str(result)
    assert result.settings["precision"] == "mixed_bfloat16"
    assert "tfgpu.configure(precision='mixed_bfloat16')  # first, before building the model" in (
        result.lines
    )
    assert keras.mixed_precision.global_policy().name == "float32"
    # Without a factory the precision cannot be tried.
    result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0)
    assert result.trial("precision mixed_bfloat16").reason == cands.NEEDS_FACTORY


def test_a_factory_that_returns_its_first_model_again_leaves_the_precision_untried(monkeypatch):
    """`tune(lambda: model, train)`: nothing is ever built under the policy, so no verdict
    (noise alone would decide it). A factory of a different model each call is named."""
    monkeypatch.setattr(
        facts_module, "device_facts", lambda: {**CPU_FACTS, "cpu_native_bf16": True}
    )
    _Script(monkeypatch, lambda s, n: 0.01)
    model = _build()()
    result = tfgpu.tune(lambda: model, _train(), time_budget_s=600, verbose=0)
    trial = result.trial("precision mixed_bfloat16")
    assert trial.status == "untried" and trial.gain is None, str(result)
    assert trial.reason == (
        "the factory returned the same model object: nothing was built under the policy"
    )
    assert keras.mixed_precision.global_policy().name == "float32"

    widths = iter([8, 16])

    def grows():
        grown = keras.Sequential([keras.Input((8,)), keras.layers.Dense(next(widths))])
        grown.compile("sgd", "mse")
        return grown

    result = tfgpu.tune(grows, _train(), time_budget_s=600, verbose=0)
    trial = result.trial("precision mixed_bfloat16")
    assert trial.status == "failed", str(result)
    assert re.search(
        r"argument `model`\. Received: a function that built different models \(weight 1 of 2 "
        r"\(`dense\w*/kernel`\): \(8, 8\), then \(8, 16\)",
        trial.reason,
    ), trial.reason


def test_the_batch_size_is_reported_and_kept_only_when_allowed(monkeypatch):
    _Script(monkeypatch, lambda s, n: 0.01)

    class Found:
        fastest = 256
        trials = [
            type("T", (), {"batch_size": 64, "fits": True, "examples_per_s": 6400.0}),
            type("T", (), {"batch_size": 256, "fits": True, "examples_per_s": 25600.0}),
        ]

    monkeypatch.setattr(tfgpu.batch_size, "find_batch_size", lambda model, data, **k: Found())
    result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0)
    trial = result.trial("batch size 256")
    assert trial.status == "untried"
    assert "25,600 examples/s at 256 vs 6,400 at 64" in trial.reason
    assert "learning rate 0.001 -> 0.002 (sqrt rule)" in trial.reason
    assert "change_batch_size=True" in trial.reason
    assert trial.line.startswith("tfgpu.data.pipeline(..., batch_size=256)")

    result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0, change_batch_size=True)
    trial = result.trial("batch size 256")
    # Per example, the scripted step of 0.01 s is 4x faster at 256 than at 64.
    assert trial.status == "kept" and result.settings["batch_size"] == 256
    assert result.speedup.value == pytest.approx(4.0)
    first = next(iter(result.dataset))
    assert first[0].shape[0] == 256


def test_apply_sets_the_compile_settings_and_names_what_it_cannot():
    model = _build()()
    result = TuneResult(
        trials=[],
        settings={"steps_per_execution": 16, "jit_compile": True, "precision": "mixed_bfloat16"},
    )
    with pytest.warns(UserWarning, match=r"precision='mixed_bfloat16' cannot be applied"):
        assert result.apply(model) is model
    assert model.steps_per_execution == 16 and model.jit_compile is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TuneResult(trials=[], settings={"steps_per_execution": 4}).apply(model)
    with pytest.raises(TypeError, match="Invalid type for argument `model`"):
        result.apply("model")


def test_apply_refuses_a_model_not_compiled_yet_and_leaves_it_untouched():
    """`compile()` after `apply` would reset `steps_per_execution` to 1 without a word."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    result = TuneResult(trials=[], settings={"steps_per_execution": 16})
    with pytest.raises(
        TypeError, match=r"argument `model`\. Received: a model that is not compiled"
    ):
        result.apply(model)
    assert model.steps_per_execution == 1


@pytest.mark.slow
def test_tune_json_and_the_waterfall_are_written_and_rotated(monkeypatch, tmp_path):
    _Script(monkeypatch, lambda s, n: 0.01 / s["spe"])
    for _ in range(2):
        result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0, log_dir=tmp_path)
    record = json.loads((tmp_path / "tune.json").read_text())
    assert record["speedup"]["value"] == pytest.approx(result.speedup.value)
    assert record["settings"] == {"steps_per_execution": 16}
    assert {t["status"] for t in record["trials"]} <= set(rules.STATUSES)
    assert (tmp_path / "tune.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "tune.1.json").exists() and (tmp_path / "tune.1.png").exists()


def test_progress_lines_are_shown_with_verbose_2(monkeypatch, capsys):
    _Script(monkeypatch, lambda s, n: 0.01)
    tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=2)
    out = capsys.readouterr().out
    assert "tune: a first look at the step" in out and "tune: trying steps_per_execution=4" in out
    tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0)
    assert capsys.readouterr().out == ""


def test_a_trial_is_constructible_and_prints_its_gain():
    trial = Trial("x", {"a": 1}, Gain(1.5, 1.2, 1.8), "kept", "over 5 rounds", "line")
    assert trial.gain_text == "x1.50 (1.20-1.80)"
    assert Trial("y").gain_text == "-" and Trial("y").status == "untried"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"data": "data"}, TypeError, r"Received: data='data' \(of type str\)"),
        ({"data": (X, Y[:3])}, ValueError, "arrays of different lengths"),
        ({"model": 3}, TypeError, "Invalid type for argument `model`"),
        ({"steps": 2}, ValueError, "Invalid value for argument `steps`"),
        ({"warmup": 5}, TypeError, "unexpected keyword argument 'warmup'"),
        ({"time_budget_s": -1.0}, ValueError, "Invalid value for argument `time_budget_s`"),
        ({"time_budget_s": "60"}, TypeError, "Invalid type for argument `time_budget_s`"),
        ({"change_batch_size": 1}, TypeError, "Invalid type for argument `change_batch_size`"),
        ({"verbose": 5}, ValueError, "Invalid value for argument `verbose`"),
        (
            {"data": tf.data.Dataset.from_tensor_slices((X, Y))},
            ValueError,
            "single examples",
        ),
    ],
)
def test_argument_errors_are_raised_before_any_work(monkeypatch, kwargs, error, match):
    script = _Script(monkeypatch, lambda s, n: 0.01)
    args = {"model": _build()(), "data": _train(), **kwargs}
    model, data = args.pop("model"), args.pop("data")
    with pytest.raises(error, match=match):
        tfgpu.tune(model, data, **{"verbose": 0, **args})
    assert script.calls == 0


def test_arrays_are_tuned_as_fit_batches_them(monkeypatch):
    _Script(monkeypatch, lambda s, n: 0.01)
    result = tfgpu.tune(_build()(), (X, Y), verbose=0, time_budget_s=None)
    assert result.dataset.element_spec[0].shape[0] in (None, 32)
    assert next(iter(result.dataset))[0].shape[0] == 32


def test_an_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="not compiled"):
        tfgpu.tune(model, _train(), verbose=0)
    with pytest.raises(ValueError, match="the model the factory returned that is not compiled"):
        tfgpu.tune(lambda: model, _train(), verbose=0)


@pytest.mark.slow
def test_a_real_run_on_a_tiny_model_has_the_promised_structure(tmp_path):
    # Unscripted: only the structure is checked, never the speed.
    result = tfgpu.tune(_build(), _train(), steps=5, time_budget_s=10, verbose=0, log_dir=tmp_path)
    assert result.trials and all(t.status in rules.STATUSES for t in result.trials)
    assert result.speedup.value >= 1.0 or result.settings == {}
    assert (tmp_path / "tune.json").exists()
    assert keras.mixed_precision.global_policy().name == "float32"
    assert "candidate" in str(result)


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_batch_level_augmentation_is_tried_only_where_augment_fn_runs_on_a_batch(monkeypatch):
    _Script(monkeypatch, lambda s, n: 0.01)
    images = np.random.default_rng(0).random((64, 6, 6, 3), "float32"), np.zeros(64, "int32")

    def crop(image, label):  # written for one image: fails on a batch
        return tf.image.random_crop(image, (4, 4, 3)), label

    def flip(image, label):  # runs on a batch too, a draw per image
        return tf.image.random_flip_left_right(image), label

    def brighten(image, label):  # runs on a batch, but one draw for the whole batch
        return tf.image.random_brightness(image, 0.5), label

    model = keras.Sequential([keras.Input((None, None, 3)), keras.layers.GlobalAveragePooling2D()])
    model.compile("sgd", "mse")
    train = tfgpu.data.pipeline(images, batch_size=16, augment_fn=crop)
    trial = tfgpu.tune(model, train, verbose=0).trial("batch-level augmentation")
    assert trial.status == "untried" and "does not run on a whole batch" in trial.reason
    assert "Incompatible shapes" in trial.reason
    train = tfgpu.data.pipeline(images, batch_size=16, augment_fn=brighten)
    trial = tfgpu.tune(model, train, verbose=0).trial("batch-level augmentation")
    assert trial.status == "untried" and "once for the whole batch" in trial.reason
    train = tfgpu.data.pipeline(images, batch_size=16, augment_fn=flip)
    trial = tfgpu.tune(model, train, verbose=0).trial("batch-level augmentation")
    assert trial.status == "no measurable gain"  # scripted: the same time
    assert trial.line == "tfgpu.data.pipeline(..., augment_fn=None, batch_augment_fn=flip)"


def test_a_budget_that_left_candidates_untried_is_never_called_nothing_helped():
    tried = [Trial(f"tried {i}", status="no measurable gain") for i in range(2)]
    left = [Trial(f"left {i}", reason=rules.BUDGET_SPENT) for i in range(3)]
    other = Trial("XLA auto-clustering", reason=cands.FRESH_PROCESS)
    result = TuneResult(trials=[*tried, *left, other], time_s=30.0)
    text = str(result)
    assert "no setting helped" not in text
    assert (
        "not measured: 3 of 6 candidates untried (time budget spent, about 30 s more would "
        "try them: give a larger budget, `time_budget_s=` or `tfgpu tune --time-budget-s`)"
    ) in text
    assert "nothing to change: no setting helped" in str(TuneResult(trials=[*tried, other]))
    kept = TuneResult(trials=[*tried, *left], lines=["model.compile(..., jit_compile=False)"])
    assert "change in your code:" in str(kept) and "3 of 5 candidates untried" in str(kept)


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_second_long_steps_leave_every_candidate_tried_and_xla_off_first(monkeypatch):
    # The image example's shape: XLA on and 5x slower than without, steps of a second.
    monkeypatch.setattr(model_state, "supports_xla", lambda model: True)
    script = _Script(monkeypatch, lambda s, n: 1.0 if s["jit"] else 0.2)
    model = _build()()
    model.jit_compile = True
    result = tfgpu.tune(model, _train(), time_budget_s=90, verbose=0)
    first = result.trials[0]
    assert (first.name, first.status) == ("jit_compile=False", "kept"), str(result)
    spent = [t.name for t in result.trials if t.reason.startswith(rules.BUDGET_SPENT)]
    assert spent == [], str(result)  # XLA off decided at its first look: time for every one
    # Steps of 200 ms once XLA is off: 4 of them in a call is worth trying.
    assert result.trial("steps_per_execution=4").status == "no measurable gain"
    assert result.trial("steps_per_execution=16").reason == "steps_per_execution=4 was not kept"
    assert result.settings == {"jit_compile": False}
    assert result.speedup.value == pytest.approx(5.0)
    assert script.clock - 1000.0 <= 90 * 1.1
    assert any("the first 8 steps of an epoch" in n for n in result.notes), result.notes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_runs_keep_the_same_settings_and_mark_what_may_differ(monkeypatch, seed):
    # A clear gain (x1.5), a marginal one (x1.06), and noise of about 5% on every fit.
    rng = np.random.default_rng(seed)

    def step(s, n):
        seconds = 0.01 * (1 / 1.5 if s["spe"] > 1 else 1.0)
        if s["threads"] == 1:
            seconds /= 1.06
        return seconds * float(np.exp(rng.normal(0.0, 0.05)))

    monkeypatch.setattr(cands, "SPE_LADDER", (4,))
    _Script(monkeypatch, step)
    result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0)
    assert result.trial("steps_per_execution=4").status == "kept", str(result)
    assert result.trial("private thread pool 1").status in (
        "kept",
        "borderline",
        "no measurable gain",
    )
    assert result.trial("private thread pool 4").status != "kept", str(result)
    rounds = [t for t in result.trials if t.gain is not None]
    assert rounds  # every measured trial took at most the cap of rounds


def test_a_dataset_tfgpu_did_not_build_gets_what_applies_to_any_dataset(monkeypatch):
    _Script(monkeypatch, lambda s, n: 0.01 if s["threads"] != 1 else 0.005)
    user = tf.data.Dataset.from_tensor_slices((X, Y)).batch(100)  # 10 full batches
    result = tfgpu.tune(_build()(), user, time_budget_s=600, verbose=0)
    assert result.trial("prefetch").status == "no measurable gain"
    kept = result.trial("private thread pool 1")
    assert kept.status == "kept", str(result)
    assert result.lines == [
        "options = tf.data.Options(); options.threading.private_threadpool_size = 1; "
        "dataset = dataset.with_options(options)"
    ]
    assert result.dataset.options().threading.private_threadpool_size == 1


def test_an_error_of_the_data_stops_tune_instead_of_failing_each_candidate(monkeypatch):
    calls = []

    def step(s, n):
        calls.append(s)
        if len(calls) > 2:  # the input raises mid-run, whatever the setting
            raise tf.errors.UnknownError(
                None,
                None,
                "Graph execution error:\n\nDetected at node PyFunc defined at (most recent call "
                "last):\n<stack traces unavailable>\nValueError: bad record 10 in shard 3",
            )
        return 0.01

    _Script(monkeypatch, step)
    result = tfgpu.tune(_build()(), _train(), time_budget_s=600, verbose=0)
    first = result.trials[0]
    assert first.status == "untried" and first.reason.startswith("tune stopped"), str(result)
    assert "ValueError: bad record 10 in shard 3 (node PyFunc)" in first.reason
    assert not [t for t in result.trials if t.status == "failed"], str(result)
    assert all(
        t.reason.startswith(("tune stopped", "needs", "this CPU", "more than", "Keras"))
        for t in result.trials
    ), str(result)
    assert result.settings == {} and any(n.startswith("tune stopped") for n in result.notes)
    text = str(result)
    assert "no setting helped" not in text and "time budget" not in text
    assert "candidates untried (tune stopped: see the note)" in text, text


@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_caching_another_dataset_is_tried_only_where_every_epoch_is_the_same(monkeypatch):
    def scale(x, y):
        return x * 2.0, y

    def jitter(x, y):
        return x + tf.random.uniform(tf.shape(x)), y

    plain = tf.data.Dataset.from_tensor_slices((X, Y)).map(scale).batch(100)
    shuffled = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(100).map(scale).batch(100)
    noisy = tf.data.Dataset.from_tensor_slices((X, Y)).map(jitter).batch(100)

    _Script(monkeypatch, lambda s, n: 0.01)
    result = tfgpu.tune(_build()(), plain, time_budget_s=600, verbose=0)
    trial = result.trial("cache in memory")
    assert trial.status == "no measurable gain", str(result)  # measured: same speed
    assert (
        trial.line == "dataset = dataset.cache()  # at the end of your chain, before its prefetch"
    )
    for data, why in [(shuffled, "it shuffles"), (noisy, "its MapDataset runs RandomUniform")]:
        result = tfgpu.tune(_build()(), data, time_budget_s=600, verbose=0)
        assert result.trial("cache in memory").reason.startswith(why), str(result)


def test_a_log_dir_that_cannot_be_written_is_refused_before_any_work(monkeypatch, unwritable):
    script = _Script(monkeypatch, lambda s, n: 0.01)
    for where in (unwritable / "tune", unwritable):
        with pytest.raises(ValueError, match=r"argument `log_dir`.*can create and write to"):
            tfgpu.tune(_build()(), _train(), log_dir=where, verbose=0)
    assert script.calls == 0


def test_caching_another_dataset_is_weighed_against_the_memory_available(monkeypatch):
    from types import SimpleNamespace

    from tfgpu.tuning import _trial

    monkeypatch.setattr(_trial.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3), "float32"), np.zeros(8))).batch(4)
    first = next(iter(data))  # 4 * 3 * 4 + 4 * 8 = 80 bytes a batch
    assert _trial.cache_untried(data, first, 2) == ""  # 160 bytes: under a quarter of 1000
    why = _trial.cache_untried(data, first, 4)  # 320 bytes: over it
    assert why == "about 0 MiB: more than a quarter of the memory available"
