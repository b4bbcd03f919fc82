"""tfgpu.tune on several replicas: the strategy's other all-reduces are candidates.

On 2 of the suite's logical CPU devices (tests/conftest.py), a model under
`tfgpu.strategy("mirrored")` (which reduces to one device on CPUs): `tune` lists
`all_reduce=hierarchical_copy` (NCCL has no CPU kernel), runs it with the strategy's
cross-device ops swapped, keeps or rejects it like any other candidate, gives the
`tfgpu.strategy(...)` line, and leaves the strategy as it was. A model on one replica gets no
all-reduce candidate. Timing is scripted or unasserted: no test depends on speed.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
import tfgpu.batch_size
from tests.conftest import ScriptedTiming, tune_on_a_plain_cpu
from tfgpu._internal.adapters import all_reduce
from tfgpu._internal.measure import rules
from tfgpu.tuning import _candidates as cands
from tfgpu.tuning._candidates import TuneFacts as Facts

X = np.random.default_rng(0).random((64, 4)).astype("float32")
Y = X.sum(axis=1)
LINE = "tfgpu.strategy('mirrored', ..., all_reduce='hierarchical_copy')"


def _mirrored() -> tf.distribute.Strategy:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no GPU is visible": the point here
        return tfgpu.strategy("mirrored", devices=["/cpu:0", "/cpu:1"])


def _model(strategy: tf.distribute.Strategy | None = None) -> keras.Model:
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(1e-2), "mse")
    return model


def _data() -> tf.data.Dataset:
    # 2 static batches per epoch, already cached and prefetched: no data, shape or ladder
    # candidate runs, so the all-reduce is the one measured.
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).cache()
    return ds.batch(32, drop_remainder=True).prefetch(1)


@pytest.fixture(autouse=True)
def _facts(monkeypatch):
    """No GPU, one core (no thread-pool candidates), no XLA candidate, a batch-size search
    that finds nothing faster."""
    tune_on_a_plain_cpu(monkeypatch, 32)


def _ScriptedFits(monkeypatch):
    """The scripted engine: seconds per step from the all-reduce the model's strategy uses
    while the fit runs (hierarchical copy twice as fast); `.seen` lists them."""
    seen: list[str] = []

    def seconds(model, dataset):
        name = all_reduce.describe(model.distribute_strategy).in_use
        seen.append(name)
        return 0.5 if name == "hierarchical_copy" else 1.0

    engine = ScriptedTiming(monkeypatch, seconds)
    engine.seen = seen
    return engine


def _trial(result, name="all_reduce=hierarchical_copy"):
    return next(t for t in result.trials if t.name == name)


# The pure decisions.


@pytest.mark.parametrize(
    "facts, names",
    [
        (all_reduce.AllReduce("mirrored", 2, 1, True, "nccl"), ["hierarchical_copy", "reduction_to_one_device"]),
        (all_reduce.AllReduce("mirrored", 2, 1, False, "reduction_to_one_device"), ["hierarchical_copy"]),
        (all_reduce.AllReduce("mirrored", 2, 1, False, "collective"), ["hierarchical_copy", "reduction_to_one_device"]),
        (all_reduce.AllReduce("multi_worker", 4, 1, True, "ring"), ["nccl"]),
        (all_reduce.AllReduce("multi_worker", 4, 1, True, "auto"), ["nccl", "ring"]),
        (all_reduce.AllReduce("multi_worker", 1, 1, False, "ring"), []),
        (all_reduce.AllReduce(replicas=1), []),
        (None, []),
    ],
)  # fmt: skip
def test_the_candidates_are_the_all_reduces_that_apply_but_the_one_in_use(facts, names):
    found = cands.all_reduce_candidates(Facts(all_reduce=facts))
    assert [c.change["all_reduce"] for c in found] == names
    assert all(c.name == f"all_reduce={c.change['all_reduce']}" and not c.untried for c in found)


def test_the_line_keeps_the_strategy_kind_and_the_all_reduce_comes_after_an_undo():
    mirrored = Facts(all_reduce=all_reduce.AllReduce("mirrored", 2, 1, False, "collective"))
    assert cands.line_for({"all_reduce": "hierarchical_copy"}, mirrored) == LINE
    multi = Facts(all_reduce=all_reduce.AllReduce("multi_worker", 2, 1, True, "ring"))
    assert cands.line_for({"all_reduce": "nccl"}, multi) == (
        "tfgpu.strategy('multi_worker', ..., all_reduce='nccl')"
    )
    names = [
        c.name for c in cands.candidates(Facts(jit_compile=True, all_reduce=mirrored.all_reduce))
    ]
    assert names[:3] == ["jit_compile=False", "all_reduce=hierarchical_copy", "all_reduce=reduction_to_one_device"]  # fmt: skip
    assert cands.combined_lines(
        [({"steps_per_execution": 4}, "x"), ({"all_reduce": "hierarchical_copy"}, LINE)], mirrored
    ) == ["model.compile(..., steps_per_execution=4)", LINE]


@pytest.mark.parametrize(
    "facts, reason",
    [
        (Facts(all_reduce=all_reduce.AllReduce("multi_worker", 4, 2, True, "ring")), "2 workers"),
        (Facts(jit_compile=True, all_reduce=all_reduce.AllReduce("mirrored", 2, 1, True, "nccl")), "jit_compile"),
        (Facts(all_reduce=all_reduce.AllReduce("mirrored", 2, 1, False, "", missing="TensorFlow 9 keeps")), "TensorFlow 9"),
    ],
)  # fmt: skip
def test_an_all_reduce_that_cannot_be_tried_here_is_untried_with_the_reason(facts, reason):
    found = cands.all_reduce_candidates(facts)
    assert found and all(reason in c.untried for c in found)


# The adapter on a real strategy.


def test_the_strategy_all_reduce_is_read_swapped_and_put_back():
    strategy = _mirrored()
    facts = all_reduce.describe(strategy)
    assert (facts.kind, facts.replicas, facts.on_gpus, facts.in_use, facts.missing) == (
        "mirrored", 2, False, "reduction_to_one_device", ""
    )  # fmt: skip
    original = all_reduce.reach(strategy).get()
    with pytest.raises(KeyError), all_reduce.using(strategy, "hierarchical_copy"):
        assert all_reduce.describe(strategy).in_use == "hierarchical_copy"
        raise KeyError("a fit that raised")
    assert all_reduce.reach(strategy).get() is original
    with pytest.raises(ValueError, match="Expected one of"), all_reduce.using(strategy, "ring"):
        pass
    assert all_reduce.describe(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])).in_use == (
        all_reduce.COLLECTIVE
    )
    assert all_reduce.describe(tf.distribute.get_strategy()) == all_reduce.AllReduce()


def test_a_multi_worker_strategy_gets_new_collectives_with_the_options_and_the_old_back():
    strategy = tfgpu.strategy("multi_worker", all_reduce="ring")  # one task, one CPU replica
    slot = all_reduce.reach(strategy)
    original = slot.get()
    assert original[0].implementation.name == "RING"
    with all_reduce.using(strategy, "nccl"):
        options, ops, host_ops = slot.get()
        assert options.implementation.name == "NCCL"
        assert options.timeout_seconds == original[0].timeout_seconds
        assert ops is not original[1] and type(ops) is type(original[1])
        assert host_ops is not original[2]
    assert all(now is then for now, then in zip(slot.get(), original, strict=True))


# tune.


def test_tune_applies_keeps_and_prints_the_all_reduce_and_puts_the_strategy_back(monkeypatch):
    script = _ScriptedFits(monkeypatch)
    strategy = _mirrored()
    original = all_reduce.reach(strategy).get()
    model = _model(strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = tfgpu.tune(model, _data(), time_budget_s=60, verbose=0)
    trial = _trial(result)
    assert (trial.status, trial.line) == (rules.KEPT, LINE)
    assert "all_reduce=reduction_to_one_device" not in [t.name for t in result.trials]
    assert result.settings == {"all_reduce": "hierarchical_copy"}
    assert result.lines == [LINE] and LINE in str(result)
    # The candidate's fits ran with the hierarchical copy, the baseline's with the original.
    assert {"hierarchical_copy", "reduction_to_one_device"} <= set(script.seen)
    assert all_reduce.reach(strategy).get() is original
    with pytest.warns(UserWarning, match="all_reduce='hierarchical_copy'"):
        result.apply(model)


def test_one_all_reduce_at_a_time_on_a_strategy_built_with_tensorflow(monkeypatch):
    # TensorFlow's own MirroredStrategy reduces with its collective ops: both others apply.
    script = _ScriptedFits(monkeypatch)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = tfgpu.tune(_model(strategy), _data(), time_budget_s=60, verbose=0)
    assert _trial(result).status == rules.KEPT
    other = _trial(result, "all_reduce=reduction_to_one_device")
    assert other.status == rules.UNTRIED
    assert "all_reduce=hierarchical_copy was kept" in other.reason
    assert result.lines == [LINE]
    assert all_reduce.describe(strategy).in_use == all_reduce.COLLECTIVE
    assert "collective" in script.seen


def test_a_model_on_one_replica_gets_no_all_reduce_candidate(monkeypatch):
    _ScriptedFits(monkeypatch)
    result = tfgpu.tune(_model(), _data(), time_budget_s=60, verbose=0)
    assert not [t for t in result.trials if t.name.startswith("all_reduce")]


def test_a_tensorflow_that_keeps_the_all_reduce_elsewhere_gives_untried(monkeypatch):
    _ScriptedFits(monkeypatch)
    monkeypatch.setattr(all_reduce, "reach", lambda strategy: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = tfgpu.tune(_model(_mirrored()), _data(), time_budget_s=60, verbose=0)
    trial = _trial(result)
    assert trial.status == rules.UNTRIED
    assert f"TensorFlow {tf.__version__} keeps a strategy's all-reduce elsewhere" in trial.reason


@pytest.mark.slow
def test_a_real_tune_measures_the_all_reduce_on_two_replicas():
    # Real fits, unscripted: the candidate trains (its step traced with the hierarchical
    # copy), is measured and judged; the verdict itself is the machine's, not asserted.
    strategy = _mirrored()
    original = all_reduce.reach(strategy).get()
    model = _model(strategy)
    weights = [w.copy() for w in model.get_weights()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = tfgpu.tune(model, _data(), steps=3, time_budget_s=None, verbose=0)
    trial = _trial(result)
    assert trial.status in (rules.KEPT, rules.BORDERLINE, rules.NO_GAIN, rules.SLOWER), trial
    assert trial.line == LINE
    assert all_reduce.reach(strategy).get() is original
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), weights, strict=True))
