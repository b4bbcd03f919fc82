"""Variants of a workload, each a dict of changes: `Variants.run_for(changes)` builds one
once, applies it for its timed run and puts the model back (docs/architecture.md, "The
measuring core")."""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfgpu._internal.adapters.all_reduce import using
from tfgpu._internal.adapters.datasets import Batches, cardinality, read_first, source_batches
from tfgpu._internal.adapters.model_state import build, clone_under
from tfgpu._internal.measure import timing
from tfgpu._internal.measure.rules import COMPILE_KEYS, MODEL_KEYS, PIPELINE_KEYS, STEP_KEYS
from tfgpu._internal.measure.workload import build_again

# One batch of the data, held in device memory: the step without its input pipeline.
DEVICE_RESIDENT = "device_resident"

_Key = tuple[tuple[str, str], ...]


def key(changes: dict[str, Any]) -> _Key:
    """A hashable key of `changes` (values by repr; a strategy by identity)."""
    return tuple(sorted((k, repr(v)) for k, v in changes.items()))


@dataclasses.dataclass(frozen=True)
class Steady:
    """Timed fits of the steady step (`timing.fit_step_time`), timed steps cut after `limit_s`."""

    steps: int
    warmup: int
    limit_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Probe:
    """A first look at a step (`timing.probe_step_time`): the fit that traces it, then at most
    two calls, those past `limit_s` after the first not run."""

    limit_s: float | None = None


@dataclasses.dataclass
class Epochs:
    """Timed fits as the user's `fit` runs them (`timing.epoch_time`), after an untimed fit that
    traces: `epochs` from each one's start (or their first `steps_per_epoch` steps). Set once
    the step is measured, before the first run."""

    epochs: int = 1
    steps_per_epoch: int | None = None


def batched_at(
    ds: tf.data.Dataset,
    global_batch: int,
    drop_remainder: bool,
    batches: Batches | None = None,
) -> tf.data.Dataset:
    """`ds` in batches of `global_batch`: its own batches cut again (`rebatch`), or its
    examples batched (the upstream, a generator included, kept: its cost is measured); with
    `drop_remainder`, only full batches, of a static shape (`full_batches`). `batches`: what
    is known of its batches already (arrays batched here), else read from its input chain."""
    ambiguous = False
    if batches is None:
        batches, ambiguous = source_batches(ds)
    if batches is None and not ambiguous:
        ds = ds.batch(global_batch)
    elif batches is None or batches.batch_size != global_batch:
        ds = ds.rebatch(global_batch)
    if drop_remainder:
        ds = full_batches(ds, global_batch)
    return ds.prefetch(tf.data.AUTOTUNE)


def full_batches(ds: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """The batches of `ds` that hold `size` examples, with `size` in their spec (a partial
    one left out). Not `rebatch(drop_remainder=True)`: `tf.distribute` batches such a dataset
    again by its first batch step's settings, and a partial batch then meets a spec of full
    ones ("The given optional does not match the expected shape")."""
    single = not isinstance(ds.element_spec, tuple)

    def parts_of(args: tuple[Any, ...]) -> Any:
        return args[0] if single else args

    def is_full(*args: Any) -> Any:
        first = tf.nest.flatten(parts_of(args))[0]
        return tf.equal(tf.shape(first)[0], size)

    def shaped(*args: Any) -> Any:
        def fix(t: Any) -> Any:
            if not isinstance(t, tf.Tensor) or t.shape.rank is None or t.shape.rank == 0:
                return t
            return tf.ensure_shape(t, [size, *t.shape[1:]])

        return tf.nest.map_structure(fix, parts_of(args))

    return ds.filter(is_full).map(shaped)


def device_resident(batch: Any, on_gpu: bool, spec: Any = None) -> tf.data.Dataset:
    """`batch` repeated (prefetched to the GPU on GPUs) in the real data's `spec` shapes (`None`
    dims): the real data runs the step traced here (under XLA, the shapes compiled here)."""
    ds = tf.data.Dataset.from_tensors(batch).repeat()
    if spec is not None:

        def relax(value: Any, leaf: Any) -> Any:
            if not isinstance(leaf, tf.TensorSpec):
                return value
            return tf.raw_ops.PlaceholderWithDefault(input=value, shape=leaf.shape)

        def relaxed(*parts: Any) -> Any:
            element = parts if isinstance(spec, tuple) else parts[0]
            return tf.nest.map_structure(relax, element, spec)

        ds = ds.map(relaxed)
    if on_gpu:
        return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0", buffer_size=2))
    return ds.prefetch(2)


class Variants:
    """The workload (`model`, `dataset`, `timed`: how each timed fit runs) and every variant of
    it, built on demand and kept. `factory` builds the model again; `pipeline` and `rebuild`:
    the `tfgpu.data.pipeline` arguments and that function (this layer imports no feature);
    `per_example`: seconds per example; `batch`: the one held in device memory; `batches`:
    what is known of the batches (arrays batched here; else read from the input chain);
    `argument`: the front end's name for the factory, in its errors."""

    def __init__(
        self,
        model: Any,
        dataset: tf.data.Dataset,
        timed: Steady | Epochs | Probe,
        *,
        batch_size: int | None = None,
        factory: Callable[[], Any] | None = None,
        pipeline: dict[str, Any] | None = None,
        rebuild: Callable[..., Any] | None = None,
        per_example: bool = False,
        on_gpu: bool = False,
        batch: Any = None,
        batches: Batches | None = None,
        argument: str = "model",
    ):
        self.model, self.dataset, self.timed = model, dataset, timed
        self.argument = argument
        self.batch_size, self.factory = batch_size, factory
        self.pipeline, self.rebuild = pipeline, rebuild
        self.per_example, self.on_gpu = per_example, on_gpu
        self.batches = batches  # what is known of the batches of `dataset` (arrays batched here)
        self._datasets: dict[_Key, tuple[tf.data.Dataset, int | None]] = {}
        self._models: dict[_Key, Any] = {}
        self._runs: dict[_Key, timing.Run] = {}
        self._functions: dict[_Key, dict[str, Any]] = {}  # traced train steps, by `_step_key`
        self._first: Any = batch
        self.fit_walls: list[float] = []  # seconds each timed fit took, all in
        self.warm_walls: list[float] = []  # and each untimed first fit of a setting
        self.base_times: list[float] = []  # every baseline run's seconds

    # The data.
    def first_batch(self) -> Any:
        """The data's first batch (read once)."""
        if self._first is None:
            self._first = read_first(self.dataset, 1)[0]
        return self._first

    def dataset_for(self, changes: dict[str, Any]) -> tuple[tf.data.Dataset, int | None]:
        """The data with the data changes in `changes`, and its global batch."""
        data_keys = (*PIPELINE_KEYS, DEVICE_RESIDENT, "strategy")
        change = {k: changes[k] for k in data_keys if k in changes}
        if "strategy" in change and self.pipeline is None:
            del change["strategy"]  # another dataset is distributed by the model's fit
        k = key(change)
        if k not in self._datasets:
            self._datasets[k] = self._build_dataset(change)
        return self._datasets[k]

    def _build_dataset(self, change: dict[str, Any]) -> tuple[tf.data.Dataset, int | None]:
        batch = change.get("batch_size", self.batch_size)
        if change.get(DEVICE_RESIDENT):
            first = self.first_batch()
            return device_resident(first, self.on_gpu, self.dataset.element_spec), batch
        if not change:
            return self.dataset, batch
        if self.pipeline is not None and self.rebuild is not None:
            return self._rebuilt(change), batch
        ds = self.dataset
        if "batch_size" in change or "drop_remainder" in change:
            drop = bool(change.get("drop_remainder"))
            ds = batched_at(ds, int(batch or 1), drop, self.batches)
        if change.get("cache"):
            ds = ds.cache()
        if change.get("prefetch") or change.get("cache"):
            ds = ds.prefetch(tf.data.AUTOTUNE)
        if "private_threadpool_size" in change:
            options = tf.data.Options()
            options.threading.private_threadpool_size = change["private_threadpool_size"]
            ds = ds.with_options(options)
        return ds, batch

    def _rebuilt(self, change: dict[str, Any]) -> tf.data.Dataset:
        """The `tfgpu.data.pipeline` dataset again with `change`, undistributed (`fit` does it)."""
        kwargs = dict(self.pipeline or {})
        for k, v in change.items():
            if k == "batch_augment":
                kwargs["batch_augment_fn"], kwargs["augment_fn"] = kwargs["augment_fn"], None
            elif k == "batch_size":
                strategy = change.get("strategy", kwargs.get("strategy"))
                replicas = getattr(strategy, "num_replicas_in_sync", 1) or 1
                if kwargs.get("per_replica_batch_size") is not None:
                    kwargs["per_replica_batch_size"] = max(1, v // replicas)
                else:
                    kwargs["batch_size"] = v
            elif k != "prefetch":
                kwargs[k] = v
        kwargs["distribute"] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert self.rebuild is not None
            out = self.rebuild(**kwargs)
        return out[0] if isinstance(out, tuple) else out

    # Models.
    def model_for(self, changes: dict[str, Any]) -> Any:
        """The user's model, or the factory's under the precision policy or inside the
        strategy in `changes` (built once, from the baseline's weights where they fit); a
        strategy alone without a factory: the model cloned under it (Keras's `clone_model`)."""
        change = {k: changes[k] for k in MODEL_KEYS if k in changes}
        if change.get("strategy") is getattr(self.model, "distribute_strategy", None):
            del change["strategy"]  # the model's own
        if not change:
            return self.model
        k = key(change)
        if k not in self._models:
            if self.factory is None and set(change) != {"strategy"}:
                raise ValueError(f"{', '.join(change)} needs a model factory")
            self._models[k] = self._built(change)
        model = self._models[k]
        with contextlib.suppress(ValueError):  # the same start as the baseline, where it fits
            model.set_weights(self.model.get_weights())
        return model

    def _built(self, change: dict[str, Any]) -> Any:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(self.first_batch())
        strategy, policy = change.get("strategy"), change.get("precision")
        if self.factory is None:  # a strategy alone: the model cloned under it
            model = clone_under(self.model, strategy)
            build(model, x)
            return model
        return build_again(
            self.factory, self.model, x, strategy=strategy, policy=policy, argument=self.argument
        )

    def strategy_for(
        self, model: Any, changes: dict[str, Any]
    ) -> contextlib.AbstractContextManager[None]:
        """The body runs with the all-reduce in `changes` (a step traced there keeps it)."""
        name = changes.get("all_reduce")
        return contextlib.nullcontext() if name is None else using(model.distribute_strategy, name)

    # Runs.
    def run_for(self, changes: dict[str, Any]) -> timing.Run:
        """A `timing.Run` timing the step with `changes` (the baseline: `{}`)."""
        k = key(changes)
        if k not in self._runs:
            self._runs[k] = self._make_run(changes)
        return self._runs[k]

    def _make_run(self, changes: dict[str, Any]) -> timing.Run:
        model = self.model_for(changes)
        ds, batch = self.dataset_for(changes)
        attrs = {k: changes.get(k, getattr(self.model, k)) for k in COMPILE_KEYS}
        store = self._functions.setdefault(self._step_key(changes, ds), {"fn": None})
        timed = _with_attrs(model, attrs, self._timed(model, ds, changes), store)
        filled = {"cache": "cache" not in changes}
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
            if self.per_example:
                seconds /= float(batch or 1)
            if is_base and not isinstance(self.timed, Probe):  # a first look: another unit
                self.base_times.append(seconds)
            return seconds

        return run

    def _timed(self, model: Any, ds: tf.data.Dataset, changes: dict[str, Any]) -> timing.Run:
        """The timed fit of `model` on `ds`, as `self.timed` says when it runs."""
        resident = bool(changes.get(DEVICE_RESIDENT))
        repeated = ds if resident else ds.repeat()
        in_epoch = cardinality(ds)

        def run(deadline: float | None, limit: float | None) -> float | None:
            t = self.timed
            with self.strategy_for(model, changes):
                if isinstance(t, Probe):
                    start = timing.now()
                    seconds = timing.probe_step_time(model, repeated, deadline, t.limit_s)
                    self.warm_walls.append(timing.now() - start)
                    return seconds
                if isinstance(t, Steady):
                    if t.limit_s is not None:
                        limit = t.limit_s if limit is None else min(limit, t.limit_s)
                    start = timing.now()
                    seconds = timing.fit_step_time(
                        model, repeated, t.steps, t.warmup, deadline, limit
                    )
                    self.fit_walls.append(timing.now() - start)
                    return seconds
                whole = t.steps_per_epoch is None
                timed_ds, steps_in = (ds, in_epoch) if whole else (repeated, None)
                if model.train_function is None:  # the first fit of this step: untimed, traces
                    start = timing.now()
                    first = timing.epoch_time(
                        model, timed_ds, 1, t.steps_per_epoch, steps_in, deadline
                    )
                    if first is None:
                        return None
                    self.warm_walls.append(timing.now() - start)
                start = timing.now()
                seconds = timing.epoch_time(
                    model, timed_ds, t.epochs, t.steps_per_epoch, steps_in, deadline, limit
                )
                self.fit_walls.append(timing.now() - start)
                return seconds

        return run

    def _step_key(self, changes: dict[str, Any], ds: tf.data.Dataset) -> _Key:
        """What decides the traced step (settings of the pipeline alone share the baseline's)."""
        step = {k: changes[k] for k in STEP_KEYS if k in changes}
        return (*key(step), ("spec", repr(ds.element_spec)))

    def share_step(self, changes: dict[str, Any] | None = None) -> None:
        """Lets the runs of `changes` (the baseline: None) use the model's train function as
        traced now (by a first look at the step)."""
        changes = changes or {}
        ds, _ = self.dataset_for(changes)
        self._functions[self._step_key(changes, ds)] = {"fn": self.model.train_function}


def _with_attrs(
    model: Any, attrs: dict[str, Any], measure: timing.Run, functions: dict[str, Any]
) -> timing.Run:
    """`measure` with `attrs` set on `model` for the run, each setting with its own traced train
    function (`functions`: the store its runs share, "fn" None until traced); the model put back."""

    def run(deadline: float | None, limit: float | None) -> float | None:
        saved = {k: getattr(model, k) for k in attrs}
        saved_fn = model.train_function
        try:
            for k, v in attrs.items():
                setattr(model, k, v)
            model.train_function = functions["fn"]
            seconds = measure(deadline, limit)
            functions["fn"] = model.train_function
            return seconds
        finally:
            for k, v in saved.items():
                setattr(model, k, v)
            model.train_function = saved_fn

    return run
