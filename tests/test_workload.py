"""tfgpu._internal.measure.workload: one check of a compiled model and its data, the same
messages from `diagnose` and `find_batch_size` for the same mistake."""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfgpu
from tfgpu._internal.measure.workload import (
    ArrayData,
    DatasetData,
    Workload,
    check_data,
    check_model,
    open_workload,
)

X = np.random.default_rng(0).random((64, 4), dtype=np.float32)
Y = np.random.default_rng(1).random((64, 1), dtype=np.float32)


def _model(compiled: bool = True) -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    if compiled:
        model.compile("sgd", "mse")
    return model


def _message(call) -> tuple[type[BaseException], str]:
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return info.type, str(info.value)


def _both(model, data) -> list[tuple[type[BaseException], str]]:
    """What `diagnose`, `find_batch_size` and `tune` raise for the same model and data
    (tune also takes a model factory: a model that is not callable is its own message)."""
    raised = [
        _message(lambda: tfgpu.diagnose(model, data, batch_size=8, verbose=0)),
        _message(lambda: tfgpu.find_batch_size(model, data, verbose=0)),
    ]
    if isinstance(model, keras.Model):
        raised.append(_message(lambda: tfgpu.tune(model, data, verbose=0)))
    return raised


@pytest.mark.parametrize(
    "case, error, match",
    [
        (
            "not compiled",
            ValueError,
            r"^Invalid value for argument `model`\. Received: a model that is not compiled "
            r"\(<Sequential .*>\)\. Expected a compiled `keras\.Model`: call "
            r"`model\.compile\(optimizer=\.\.\., loss=\.\.\.\)` before passing it\.$",
        ),
        (
            "not a model",
            TypeError,
            r"^Invalid type for argument `model`\. Received: model='m' \(of type str\)\. "
            r"Expected a compiled `keras\.Model`, or a function without arguments that builds "
            r"and compiles one\.$",
        ),
        (
            "lengths",
            ValueError,
            r"^Invalid value for argument `data`\. Received: arrays of different lengths "
            r"\(16, 64 examples\): x has 64, y has 16\. Expected every array with one entry "
            r"per example\.$",
        ),
        (
            "wrong type",
            TypeError,
            r"^Invalid type for argument `data`\. Received: data='data' \(of type str\)\. "
            r"Expected a `tf\.data\.Dataset`, or arrays `x`, `\(x, y\)` or "
            r"`\(x, y, sample_weight\)`",
        ),
        (
            "no labels",
            ValueError,
            r"^Invalid value for argument `data`\. Received: inputs without labels while "
            r"the model was compiled with loss='mse'\.",
        ),
    ],
)
def test_diagnose_and_the_finder_give_the_same_message_for_the_same_mistake(case, error, match):
    model, data = {
        "not compiled": (_model(compiled=False), (X, Y)),
        "not a model": ("m", (X, Y)),
        "lengths": (_model(), (X[:64], Y[:16])),
        "wrong type": (_model(), "data"),
        "no labels": (_model(), X),
    }[case]
    raised = _both(model, data)
    assert all(r == raised[0] for r in raised)  # the same exception, word for word
    assert raised[0][0] is error
    with pytest.raises(error, match=match) as info:
        open_workload(model, data)
    assert str(info.value) == raised[0][1]  # the entry is where both got it
    optimizer = getattr(model, "optimizer", None)
    assert optimizer is None or not optimizer.built  # nothing was trained


def test_lengths_are_named_where_tensorflow_would_say_dimensions_are_not_compatible():
    # Nested structures name each array by its path.
    with pytest.raises(ValueError, match=r"\(3, 64 examples\): x\['a'\] has 64, x\['b'\] has 3"):
        check_data(({"a": X, "b": X[:3]}, Y))
    with pytest.raises(ValueError, match=r"sample_weight has 10"):
        check_data((X, Y, np.ones(10)))
    with pytest.raises(ValueError, match="arrays of 0 examples"):
        check_data((X[:0], Y[:0]))
    with pytest.raises(ValueError, match=r"a scalar \(no first dimension\) at x\. Expected arrays"):
        check_data((np.float32(1.0), Y))
    with pytest.raises(ValueError, match=r"a tuple of 4 parts\. Expected `x`, `\(x, y\)`"):
        check_data((X, Y, Y, Y))


def test_only_datasets_and_arrays_are_data_and_long_values_are_not_printed():
    for bad in (None, 3, (None, Y), iter([X]), [[1.0, 2.0]] * 100):
        with pytest.raises(TypeError, match="Invalid type for argument `data`"):
            check_data(bad)
    with pytest.raises(TypeError, match=r"Received: data of type list\. Expected"):
        check_data([[1.0, 2.0]] * 100)  # not its repr
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    )
    with pytest.raises(TypeError, match=r"before `strategy\.experimental_distribute_dataset`"):
        check_data(distributed)
    with pytest.raises(TypeError, match=r"batch_size=2\.5 \(of type float\)"):
        check_data((X, Y), batch_size=2.5)


def test_the_kind_is_decided_once_and_carries_what_the_callers_need():
    model = _model()
    arrays = open_workload(model, [X, Y], batch_size=16)
    assert isinstance(arrays, Workload) and isinstance(arrays.data, ArrayData)
    assert arrays.from_arrays and arrays.batch_size == 16
    batch, size = arrays.first_batch()
    assert size == 16 and batch[0].shape == (16, 4)
    assert open_workload(model, (X, Y)).batch_size == 32  # fit's default
    x, y, sw = arrays.examples(10)
    assert x.shape == (10, 4) and y.shape == (10, 1) and sw is None

    batched = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).prefetch(1)
    work = open_workload(model, batched, batch_size=99)  # ignored, as fit does
    assert isinstance(work.data, DatasetData) and work.dataset is batched
    assert not work.from_arrays and work.batch_size == 8
    x, y, sw = work.examples(20)  # unbatched: examples, whatever the batch
    assert x.shape == (20, 4) and y.shape == (20, 1) and sw is None

    weighted = open_workload(model, (X, Y, np.ones(64, "float32")), batch_size=8)
    assert weighted.first_batch()[0][2].shape == (8,)
    assert weighted.examples(5)[2].shape == (5,)


def test_single_examples_are_refused_where_batches_are_needed_and_read_nowhere():
    model = _model()
    read = []

    def examples():
        read.append(True)
        yield from zip(X, Y)

    unbatched = tf.data.Dataset.from_tensor_slices((X, Y))
    with pytest.raises(ValueError, match=r"single examples \(inputs of shape \(4,\)\)"):
        open_workload(model, unbatched)
    work = open_workload(model, unbatched, examples_ok=True)  # the finder's case
    assert work.batch_size is None and work.examples(8)[0].shape == (8, 4)
    spec = (tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
    generated = tf.data.Dataset.from_generator(examples, output_signature=spec)
    with pytest.raises(ValueError, match="single examples"):  # told by the model's rank
        open_workload(model, generated)
    assert read == []
    flat = tf.data.Dataset.from_tensor_slices((X[:, 0], Y)).batch(8)  # batched, a rank short
    with pytest.raises(
        ValueError,
        match=r"batches whose inputs have one dimension fewer \(shape "
        r"\(None,\)\)\. Expected .*model's inputs \(shape \(None, 4\)\)",
    ):
        open_workload(model, flat)
    empty = open_workload(model, unbatched.take(0).batch(8))
    with pytest.raises(ValueError, match=r"an empty dataset\. Expected at least one batch"):
        empty.first_batch()
    with pytest.raises(ValueError, match=r"an empty dataset\. Expected at least one example"):
        empty.examples(8)


def test_a_model_built_by_a_factory_is_named_so():
    with pytest.raises(ValueError, match="the model the factory returned that is not compiled"):
        check_model(_model(compiled=False), from_factory=True)
    with pytest.raises(TypeError, match="Expected a function that returns a compiled"):
        check_model(3, from_factory=True)
    model = _model()
    assert check_model(model) is model


def test_a_custom_train_step_may_train_without_labels():
    class Custom(keras.Sequential):
        def train_step(self, data):
            return super().train_step((data, tf.zeros((tf.shape(data)[0], 1))))

    model = Custom([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    assert open_workload(model, X).from_arrays


def _stalls(release: threading.Event, kind: str) -> tf.data.Dataset:
    """Datasets that yield no batch until `release` is set, without using a CPU: a generator
    that waits, the same behind a parallel `map` and a `shuffle`, and one that yields a single
    partial batch first (diagnose then looks for a full one)."""

    def examples(first: int):
        def gen():
            for _ in range(first):
                yield np.zeros(4, np.float32), np.zeros(1, np.float32)
            release.wait()

        return gen

    spec = (tf.TensorSpec([4], tf.float32), tf.TensorSpec([1], tf.float32))
    if kind == "waits":
        return tf.data.Dataset.from_generator(examples(0), output_signature=spec).batch(8)
    if kind == "mapped":
        ds = tf.data.Dataset.from_generator(examples(0), output_signature=spec)
        return ds.map(lambda x, y: (x + 1, y), num_parallel_calls=2).shuffle(16).batch(8)
    source = tf.data.Dataset.from_generator(examples(3), output_signature=spec).batch(4)
    return tf.data.Dataset.from_tensor_slices((X[:3], Y[:3])).batch(3).concatenate(source)


@pytest.mark.parametrize("kind", ["waits", "mapped", "one partial batch"])
@pytest.mark.slow  # over 0.4 s: out of the edit loop (make test-fast)
def test_a_dataset_that_yields_nothing_is_reported_by_each_caller_not_waited_on(kind, monkeypatch):
    """diagnose, tune and the batch-size finder read the data before training, each read
    bounded by `READ_TIMEOUT_S` without an element: TimeoutError saying so, not a hang. What
    is checked is that each returns at all, not when."""
    from tfgpu._internal.adapters import datasets

    monkeypatch.setattr(datasets, "READ_TIMEOUT_S", 0.2)
    release = threading.Event()
    pattern = r"^No element from `data` in 0\.2 s \(after \d+ (of the first \d+|batches)\)\. "
    try:
        model = _model()
        calls = [
            lambda: tfgpu.diagnose(model, _stalls(release, kind), verbose=0),
            lambda: tfgpu.tune(model, _stalls(release, kind), verbose=0),
        ]
        if kind != "one partial batch":  # the finder's pool of examples ends with the data
            calls.append(lambda: tfgpu.find_batch_size(model, _stalls(release, kind), verbose=0))
        for call in calls:
            with pytest.raises(TimeoutError, match=pattern):
                call()
    finally:
        release.set()  # the reading threads end with their datasets
