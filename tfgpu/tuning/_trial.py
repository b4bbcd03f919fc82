"""The workload `tune` measures: `Workload.run_for(changes)` times the training step with a
setting applied, in seconds per example, as the user's `fit` runs it: each setting's first
fit is untimed (it traces), then whole epochs or an epoch's first steps are timed from their
start (`shape`); `probe` and `input_time` give the facts; `mean_loss` feeds the numerics
guard. The caller restores the model around every trial.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from tfgpu._internal.adapters import timing
from tfgpu._internal.adapters.all_reduce import using
from tfgpu._internal.adapters.datasets import cardinality, read_first
from tfgpu._internal.adapters.model_state import build, preserved
from tfgpu.tuning._candidates import COMPILE_KEYS, PIPELINE_KEYS, STEP_KEYS

# Batches the numerics guard trains on (with `steps_per_execution=1`), from the same weights.
GUARD_STEPS = 5

_Key = tuple[tuple[str, str], ...]


def _key(changes: dict[str, Any]) -> _Key:
    return tuple(sorted((k, repr(v)) for k, v in changes.items()))


class Workload:
    """The model, the data and every setting's run, built on demand and kept.

    Args:
        model: keras.Model, compiled and built: the baseline.
        factory: callable or None, builds and compiles the model (for the precision policy).
        dataset: tf.data.Dataset of batches: the user's data.
        pipeline: dict or None, the `tfgpu.data.pipeline` arguments that built `dataset`.
        global_batch: int or None, examples per batch.

    `epochs` and `steps_per_epoch` (None: whole epochs) shape every timed fit; the caller
    sets them once the step is measured, before the first run.
    """

    def __init__(
        self,
        model: Any,
        factory: Callable[[], Any] | None,
        dataset: tf.data.Dataset,
        pipeline: dict[str, Any] | None,
        global_batch: int | None,
    ):
        self.model = model
        self.factory = factory
        self.dataset = dataset
        self.pipeline = pipeline
        self.global_batch = global_batch
        self.epochs: int = 1
        self.steps_per_epoch: int | None = None
        self._datasets: dict[_Key, tuple[tf.data.Dataset, int | None]] = {}
        self._models: dict[str, Any] = {}
        self._runs: dict[_Key, timing.Run] = {}
        self._functions: dict[_Key, dict[str, Any]] = {}  # traced train steps, by `_step_key`
        self.fit_walls: list[float] = []  # seconds each timed fit took, all in
        self.warm_walls: list[float] = []  # and each untimed first fit of a setting
        self._guard_batches: list[Any] | None = None
        self.base_times: list[float] = []  # seconds per example of every baseline run

    # Data.
    def dataset_for(self, changes: dict[str, Any]) -> tuple[tf.data.Dataset, int | None]:
        """The data with the pipeline changes in `changes`, and its global batch."""
        data_change = {k: changes[k] for k in PIPELINE_KEYS if k in changes}
        key = _key(data_change)
        if key not in self._datasets:
            self._datasets[key] = self._build_dataset(data_change)
        return self._datasets[key]

    def _build_dataset(self, change: dict[str, Any]) -> tuple[tf.data.Dataset, int | None]:
        batch = change.get("batch_size", self.global_batch)
        if not change:
            return self.dataset, batch
        if self.pipeline is not None:
            from tfgpu.data import pipeline

            kwargs = dict(self.pipeline)
            for k, v in change.items():
                if k == "batch_augment":
                    kwargs["batch_augment_fn"], kwargs["augment_fn"] = kwargs["augment_fn"], None
                elif k == "batch_size":
                    replicas = getattr(kwargs.get("strategy"), "num_replicas_in_sync", 1) or 1
                    if kwargs.get("per_replica_batch_size") is not None:
                        kwargs["per_replica_batch_size"] = max(1, v // replicas)
                    else:
                        kwargs["batch_size"] = v
                elif k != "prefetch":
                    kwargs[k] = v
            kwargs["distribute"] = False
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = pipeline(**kwargs)
            ds = out[0] if isinstance(out, tuple) else out
            return ds, batch
        ds = self.dataset
        if "batch_size" in change or "drop_remainder" in change:
            ds = ds.rebatch(int(batch or 1), drop_remainder=bool(change.get("drop_remainder")))
        if change.get("cache"):
            ds = ds.cache()
        if change.get("prefetch") or change.get("cache"):
            ds = ds.prefetch(tf.data.AUTOTUNE)
        if "private_threadpool_size" in change:
            options = tf.data.Options()
            options.threading.private_threadpool_size = change["private_threadpool_size"]
            ds = ds.with_options(options)
        return ds, batch

    # Models.
    def model_for(self, changes: dict[str, Any]) -> Any:
        """The user's model, or the factory's under the precision policy in `changes`."""
        policy = changes.get("precision")
        if policy is None:
            return self.model
        if policy not in self._models:
            if self.factory is None:
                raise ValueError("the precision policy needs a model factory")
            saved = keras.mixed_precision.global_policy()
            try:
                keras.mixed_precision.set_global_policy(policy)
                model = self.factory()
            finally:
                keras.mixed_precision.set_global_policy(saved)
            build(model, self.first_inputs())
            self._models[policy] = model
        model = self._models[policy]
        try:
            model.set_weights(self.model.get_weights())  # the same start as the baseline
        except ValueError:
            pass  # another structure: its own weights (the guard still checks finiteness)
        return model

    @contextlib.contextmanager
    def strategy_for(self, model: Any, changes: dict[str, Any]) -> Iterator[None]:
        """Runs the body with the strategy settings in `changes` on `model`'s strategy (the
        all-reduce), put back afterwards; a step traced in the body keeps them."""
        name = changes.get("all_reduce")
        if name is None:
            yield
            return
        with using(model.distribute_strategy, name):
            yield

    def first_inputs(self) -> Any:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.guard_batches()[0])
        return x

    def guard_batches(self) -> list[Any]:
        """The first `GUARD_STEPS` batches of the user's data (read once)."""
        if self._guard_batches is None:
            self._guard_batches = read_first(self.dataset, GUARD_STEPS)
        return self._guard_batches

    # Runs.
    def run_for(self, changes: dict[str, Any]) -> timing.Run:
        """A `Run` timing the step with `changes`, in seconds per example."""
        key = _key(changes)
        if key not in self._runs:
            self._runs[key] = self._make_run(changes)
        return self._runs[key]

    def _make_run(self, changes: dict[str, Any]) -> timing.Run:
        model = self.model_for(changes)
        ds, batch = self.dataset_for(changes)
        attrs = {k: changes.get(k, getattr(self.model, k)) for k in COMPILE_KEYS}
        epochs, steps = self.epochs, self.steps_per_epoch
        in_epoch = cardinality(ds) if steps is None else None
        timed_ds = ds if steps is None else ds.repeat()
        filled = {"cache": "cache" not in changes}

        def measure(deadline: float | None, limit: float | None) -> float | None:
            with self.strategy_for(model, changes):
                if model.train_function is None:  # the first fit of this step: untimed, traces
                    start = timing.now()
                    if timing.epoch_time(model, timed_ds, 1, steps, in_epoch, deadline) is None:
                        return None
                    self.warm_walls.append(timing.now() - start)
                start = timing.now()
                seconds = timing.epoch_time(
                    model, timed_ds, epochs, steps, in_epoch, deadline, limit
                )
                self.fit_walls.append(timing.now() - start)
                return seconds

        store = self._functions.setdefault(self._step_key(changes, ds), {"fn": None})
        timed = timing.with_attrs(model, timed_ds, 0, 0, attrs, measure, store)
        is_base = not changes

        def run(deadline: float | None, limit: float | None) -> float | None:
            if not filled["cache"]:
                # One pass fills the cache, unless the deadline comes first.
                filled["cache"] = all(deadline is None or timing.now() < deadline for _ in ds)
                if not filled["cache"]:
                    return None
            seconds = timed(deadline, limit)
            if seconds is None:
                return None
            per_example = seconds / float(batch or 1)
            if is_base:
                self.base_times.append(per_example)
            return per_example

        return run

    def _step_key(self, changes: dict[str, Any], ds: tf.data.Dataset) -> _Key:
        """What decides the traced train step: the model, its compile settings, its strategy's
        all-reduce, the batches' spec. Settings of the pipeline alone share the baseline's."""
        step = {k: changes[k] for k in STEP_KEYS if k in changes}
        return (*_key(step), ("spec", repr(ds.element_spec)))

    def probe(self, deadline: float | None) -> float | None:
        """Seconds per step of the model as it is, from a short fit whose traced step the
        baseline's runs then share; None when the deadline came first."""
        start = timing.now()
        seconds = timing.probe_step_time(self.model, self.dataset.repeat(), deadline)
        self.warm_walls.append(timing.now() - start)  # a fit that traces, as a guide
        key = self._step_key({}, self.dataset)
        self._functions[key] = {"fn": self.model.train_function}
        return seconds

    def input_time(self, deadline: float | None, batches: int = 10) -> float | None:
        """Seconds to read one batch of the data alone (after its first), at most `batches`
        of them; None when it has fewer than two or the deadline came first."""
        it = iter(self.dataset)
        times = []
        for _ in range(batches + 1):
            if deadline is not None and timing.now() >= deadline:
                break
            try:
                next(it)
            except StopIteration:
                break
            times.append(timing.now())
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    # Numerics.
    def mean_loss(self, changes: dict[str, Any]) -> float:
        """Mean training loss over the guard's batches, one step each, from the current
        weights of the user's model (put back afterwards)."""
        model = self.model_for(changes)
        jit = changes.get("jit_compile", self.model.jit_compile)
        losses = []
        with preserved(model), self.strategy_for(model, changes), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.steps_per_execution = 1
            model.jit_compile = jit
            model.train_function = None
            for batch in self.guard_batches():
                x, y, sw = keras.utils.unpack_x_y_sample_weight(batch)
                logs = model.train_on_batch(x, y, sample_weight=sw, return_dict=True)
                losses.append(float(logs["loss"]))
        if not losses:
            return math.nan
        if not all(math.isfinite(v) for v in losses):
            return next(v for v in losses if not math.isfinite(v))
        return sum(losses) / len(losses)
