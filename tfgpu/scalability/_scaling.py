"""`scaling()`: the same model on 1, 2, 4, ... replicas, weak and strong, in interleaved rounds;
each step split into its parts; a prediction from the cost model (`_cost`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tfgpu._internal.adapters import all_reduce
from tfgpu._internal.adapters import replicas as measure
from tfgpu._internal.adapters.datasets import pipeline_arguments, read_first
from tfgpu._internal.adapters.devices import tf_gpus
from tfgpu._internal.adapters.model_state import build
from tfgpu._internal.helpers import stats
from tfgpu._internal.helpers.checks import check_int, check_number, invalid_type, invalid_value
from tfgpu._internal.measure import reader, timing
from tfgpu._internal.measure.rules import MIN_ROUNDS, SEARCH_BUDGET_S, Gain, medians
from tfgpu._internal.measure.session import Session, check_steps
from tfgpu._internal.measure.variants import Steady, Variants, batched_at
from tfgpu._internal.measure.workload import DEFAULT_BATCH_SIZE, check_model, open_workload
from tfgpu.scalability import _cost as cost
from tfgpu.scalability._links import gpu_link, host_link
from tfgpu.scalability._result import Point, Prediction, ScalingResult

WEAK, STRONG = "weak", "strong"
# The argument that builds the model, named in every error about it.
FACTORY = "model_factory"
# Timed steps of each `fit`, and the warm-up steps before them (the first traces).
STEPS, WARMUP = 8, 3
# Share of the budget for the interleaved rounds; the split of each step takes the rest, in
# rounds of its own (the median of each part over them).
ROUNDS_SHARE, PART_ROUNDS = 0.6, 3
# Machines in the prediction, and the network they are assumed on unless told.
MACHINES = (2, 4)
NETWORK_GBIT_S = 100.0
# The all-reduces (`tfgpu.strategy(all_reduce=)` names) that reduce in a ring; the others
# (reduction_to_one_device, hierarchical_copy) go through one device.
RING_IMPLEMENTATIONS = ("nccl", "ring", "collective", "auto")


def replica_counts(available: int, asked: Sequence[int] | None) -> list[int]:
    """`asked` and 1, or 1, 2, 4, ... up to `available` and `available` itself. Pure."""
    if asked is not None:
        return sorted(set(asked) | {1})
    counts, n = [], 1
    while n <= available:
        counts.append(n)
        n *= 2
    if counts[-1] != available:
        counts.append(available)
    return counts


def _devices() -> tuple[list[str], str]:
    """(this process's devices to replicate on, their kind): GPUs, else logical CPUs."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus], "GPU"
    return [d.name for d in tf.config.list_logical_devices("CPU")], "logical CPU device"


def _strategy(devices: list[str]) -> tf.distribute.Strategy:
    """The strategy of one replica count: `tfgpu.strategy` on exactly these devices."""
    from tfgpu import strategy

    if len(devices) == 1:
        return strategy("one_device", devices=devices[0])
    return strategy("mirrored", devices=devices)


@dataclasses.dataclass(frozen=True)
class _Config:
    """One replica count and mode, a variant of the workload: its strategy and global batch."""

    n: int
    mode: str
    global_batch: int
    strategy: tf.distribute.Strategy

    @property
    def key(self) -> str:
        return f"{self.n} {self.mode}"

    @property
    def changes(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "batch_size": self.global_batch, "drop_remainder": True}


def scaling(
    model_factory: Callable[[], keras.Model],
    data: Any,
    *,
    batch_size: int | None = None,
    replicas: Sequence[int] | None = None,
    steps: int = STEPS,
    time_budget_s: float | None = SEARCH_BUDGET_S,
    network_gbit_s: float = NETWORK_GBIT_S,
    log_dir: str | os.PathLike[str] | None = None,
    verbose: int | str = "auto",
) -> ScalingResult:
    """Times your model on 1, 2, 4, ... replicas of this machine and says why it scales or not.

    Each count runs weak (the per-replica batch kept) and strong (the global batch kept) in
    interleaved rounds; each step is split into compute, all-reduce, update and input; a cost
    model calibrated on 1 and 2 replicas predicts more. The guide: docs/scaling.md (logical
    CPU devices on a CPU host: "Limits").

    Args:
        model_factory: a function without arguments that builds, compiles and returns a new
            model at each call, called inside each strategy's scope (a model built already
            is refused, and so is a function that returns the same object or different
            models, or a model without trainable weights).
        data: `tf.data.Dataset` of batches or examples, or arrays `x`, `(x, y)` or
            `(x, y, sample_weight)`.
        batch_size: int or None, the global batch of one replica. Defaults to None: the
            data's batch size, else 32.
        replicas: list of int or None, the replica counts (1 always added). Defaults to
            None: 1, 2, 4, ... up to this process's devices.
        steps: int, timed steps of each timed `fit` (>= 3). Defaults to 8.
        time_budget_s: float or None, seconds for the whole call (None: no limit).
            Defaults to 300.0.
        network_gbit_s: float, the network between machines the prediction assumes, in
            Gbit/s. Defaults to 100.0.
        log_dir: str, os.PathLike or None, where `scaling.json` and `scaling.png` go.
            Defaults to None.
        verbose: `"auto"`, 0, 1 or 2, progress lines as `fit`'s. Defaults to `"auto"`.

    Returns:
        A `ScalingResult`: print it for the table, the reasons and the prediction.

    Raises:
        TypeError: if an argument has the wrong type (`model_factory` not a function, for
            one).
        ValueError: if a value is out of range (more `replicas` than devices, for one), or
            the factory's model is not compiled, opens its own strategy, has no trainable
            weights, is the same object at each call or differs from call to call. What
            the factory itself raises comes through as it is.

    Example:

    >>> tfgpu.configure(cpu_devices=4)       # on a CPU host; GPUs are found as they are
    >>> result = tfgpu.scaling(build_model, (x, y), batch_size=64, time_budget_s=120)
    >>> print(result)
    """
    session = Session.open(
        "scaling",
        verbose=verbose,
        time_budget_s=time_budget_s,
        log_dir=log_dir,
        measure_share=ROUNDS_SHARE,
    )
    check_int("batch_size", batch_size, allow_none=True)
    check_steps(steps)
    network = check_number(
        "network_gbit_s",
        network_gbit_s,
        minimum=0,
        exclusive_minimum=True,
        expected="a finite number of Gbit/s > 0",
    )
    devices, kind = _devices()
    counts = replica_counts(len(devices), _check_replicas(replicas, devices, kind))
    one = _strategy(devices[:1])
    work = open_workload(
        model_factory,
        data,
        examples_ok=True,
        factory_only=True,
        strategy=one,
        argument=FACTORY,
    )
    from tfgpu.data import pipeline

    base_batch = batch_size or work.batch_size or DEFAULT_BATCH_SIZE
    variants = Variants(
        work.model,
        work.dataset,
        Steady(steps, WARMUP),
        batch_size=base_batch,
        factory=work.factory,
        pipeline=pipeline_arguments(work.dataset),
        rebuild=pipeline,
        per_example=True,
        batches=work.batches,
        batch=_first_batch(batched_at(work.dataset, base_batch, False, work.batches)),
        argument=FACTORY,
    )
    _check_trainable(variants)
    session.progress.phase("building the model on each replica count")
    configs = _configs(variants, devices, counts, base_batch, one, session.notes)
    result = _measure(session, variants, configs, steps, kind, network)
    return session.finish(result, result.headline())


def _first_batch(dataset: tf.data.Dataset, whole: int | None = None) -> Any:
    """The first batch of `dataset` (bounded: a dataset that never yields is a TimeoutError);
    a ValueError naming `data` when it yields none (`whole`: the batches are whole ones of
    that many examples)."""
    read = read_first(dataset, 1)
    if not read:
        what = "batch" if whole is None else f"whole batch of {whole} examples"
        raise invalid_value(
            "data",
            None,
            f"a dataset that yields at least one {what}",
            received=f"a dataset that yields no {what}",
        )
    return read[0]


def _check_trainable(variants: Variants) -> None:
    """Refuses, before any timing, a model without trainable weights (built on the first
    batch): nothing to all-reduce."""
    model = variants.model
    x, _, _ = keras.utils.unpack_x_y_sample_weight(variants.first_batch())
    build(model, x)
    if model.trainable_weights:
        return
    raise invalid_value(
        FACTORY,
        variants.factory,
        "a function whose model has trainable weights: scaling times the all-reduce of their "
        "gradients (set `trainable=True` on the layers to train)",
        received=f"a function whose model has no trainable weights (its {len(model.weights)} "
        "weights are all non-trainable: `fit` trains nothing and there is nothing to reduce)",
    )


def _check_replicas(replicas: Any, devices: list[str], kind: str) -> Sequence[int] | None:
    if replicas is None:
        return None
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
        raise invalid_type("replicas", replicas, "a list of ints >= 1, or None")
    expected = f"replica counts between 1 and {len(devices)} (the {kind}s of this process)"
    for n in replicas:
        check_int("replicas", n, maximum=len(devices), expected=expected)
    return replicas


def _measure(
    session: Session,
    variants: Variants,
    configs: list[_Config],
    steps: int,
    kind: str,
    network: float,
) -> ScalingResult:
    """The interleaved rounds, the split of each step, the points and the prediction."""
    progress, notes = session.progress, session.notes
    base, others = configs[0], configs[1:]
    _first_batch(variants.dataset_for(base.changes)[0], base.global_batch)  # bounded
    progress.phase(f"timing {len(configs)} configurations in interleaved rounds")
    base_run = variants.run_for(base.changes)
    comparisons = timing.compare(
        base_run,
        {c.key: variants.run_for(c.changes) for c in others},
        budget=session.budget,
        max_rounds=MIN_ROUNDS,
        timed_units=steps * max(c.global_batch for c in configs),
        clearly_slower=None,
        failures=(tf.errors.OpError, ValueError),
    )
    base_rounds = [b for c in comparisons.values() for b, _ in c.rounds]
    if not others:  # one replica: nothing to interleave with, its own rounds (the first always)
        runs = [
            base_run(None if r == 0 else session.budget.deadline, None) for r in range(MIN_ROUNDS)
        ]
        base_rounds = [seconds for seconds in runs if seconds is not None]
    base_s = stats.median(base_rounds) if base_rounds else None
    split_budget = timing.Budget(session.budget.seconds, 0.95, start=session.budget.start)
    samples: dict[tuple[str, Any], list[float]] = {}
    for r in range(PART_ROUNDS):
        for c in configs[r % len(configs) :] + configs[: r % len(configs)]:
            if split_budget.left() <= 0:
                break
            progress.phase(
                f"splitting the step (round {r + 1} of {PART_ROUNDS}): {c.n} "
                f"replica{'s' if c.n > 1 else ''}, {c.mode}"
            )
            _sample_parts(variants, c, split_budget, samples, r)
    if any(("compute_s", c.key) not in samples for c in configs):
        notes.append("the budget ran out before every step was split into its parts")
    parts = {c.key: _parts_of(c, samples) for c in configs}
    link = _link(kind, max(c.n for c in configs))
    grad_bytes = measure.gradient_bytes(variants.model)
    points = [_point(c, comparisons.get(c.key), base_s, parts.get(c.key, {})) for c in configs]
    for p in points:
        p.explain(points[0], kind, grad_bytes)
    in_use = next((all_reduce.describe(c.strategy).in_use for c in others), "")
    predictions, errors = predict(points, parts, grad_bytes, in_use, network, kind, link)
    return ScalingResult(
        points=points,
        predictions=predictions,
        prediction_errors=errors,
        gradient_bytes=grad_bytes,
        device_kind=kind,
        all_reduce=in_use,
        link=link,
        notes=notes,
    )


def _configs(
    variants: Variants,
    devices: list[str],
    counts: list[int],
    base_batch: int,
    one: tf.distribute.Strategy,
    notes: list[str],
) -> list[_Config]:
    """One replica (the workload's own model, built under `one`), then each count weak and
    strong, its model built by the factory inside its strategy's scope and checked."""
    configs = [_Config(1, WEAK, base_batch, one)]  # as `scaling` read its first batch
    for n in counts[1:]:
        for mode in (WEAK, STRONG):
            global_batch = base_batch * n if mode == WEAK else base_batch
            if global_batch % n:
                notes.append(
                    f"strong scaling on {n} replicas skipped: a global batch of {global_batch} "
                    f"does not split into {n} equal shares"
                )
                continue
            c = _Config(n, mode, global_batch, _strategy(devices[:n]))
            _check_built(variants, c)
            configs.append(c)
    return configs


def _check_built(variants: Variants, c: _Config) -> None:
    """Builds the model of `c` by the factory inside its strategy's scope; a ValueError naming
    `model_factory` when it is not compiled or has another replica count (its own strategy)."""
    model = check_model(variants.model_for(c.changes), from_factory=True, argument=FACTORY)
    built = getattr(model.distribute_strategy, "num_replicas_in_sync", 1)
    if built != c.n:
        raise invalid_value(
            FACTORY,
            variants.factory,
            "a function that builds its model inside the strategy scope it is called in (open "
            f"no strategy scope inside it); its model has {built} replica(s) where {c.n} were "
            "asked",
        )


def _sample_parts(
    variants: Variants,
    c: _Config,
    budget: timing.Budget,
    samples: dict[tuple[str, Any], list[float]],
    round_: int,
) -> None:
    """One sample of each of the step's parts into `samples`: the compute of `c`; the
    all-reduce (and its latency) and the update of its replica count, and the pipeline's
    rate at its global batch, once per round (they do not depend on the mode)."""

    def add(name: str, key: Any, value: float) -> None:
        samples.setdefault((name, key), []).append(value)

    def due(name: str, key: Any) -> bool:
        return len(samples.get((name, key), [])) <= round_ and budget.left() > 0

    model, (dataset, _) = variants.model_for(c.changes), variants.dataset_for(c.changes)
    batch = read_first(dataset, 1)[0]
    add("compute_s", c.key, measure.compute_s(c.strategy, model, batch))
    if c.n > 1 and due("all_reduce_s", c.n):
        add("all_reduce_s", c.n, measure.all_reduce_s(c.strategy, model, tiny=False))
        add("latency_s", c.n, measure.all_reduce_s(c.strategy, model, tiny=True))
    if due("apply_s", c.n):  # the all-reduce and the update: the weights change, not the cost
        add("apply_s", c.n, measure.apply_s(c.strategy, model))
    if due("input_rate", c.global_batch):
        pipe = reader.read_alone(dataset, STEPS, WARMUP)
        add("input_rate", c.global_batch, pipe.examples_per_s)


def _parts_of(c: _Config, samples: dict[tuple[str, Any], list[float]]) -> dict[str, float]:
    """The medians of `c`'s parts over the rounds (those never sampled left out); the input
    at the median of every rate measured, whatever the batch (docs/scaling.md says why)."""
    out = {"all_reduce_s": 0.0, "latency_s": 0.0} if c.n == 1 else {}
    keys = {"compute_s": c.key, "all_reduce_s": c.n, "latency_s": c.n, "apply_s": c.n}
    for name, key in keys.items():
        if samples.get((name, key)):
            out[name] = stats.median(samples[name, key])
    rates = [r for (name, _), values in samples.items() if name == "input_rate" for r in values]
    if rates:
        out["input_s"] = c.global_batch / stats.median(rates)
    if "apply_s" in out and "all_reduce_s" in out:  # the update: the apply but its all-reduce
        out["update_s"] = max(0.0, out.pop("apply_s") - out["all_reduce_s"])
    return out


def _link(kind: str, replicas: int) -> Any:
    """What links the devices: NVML's view between the GPUs TensorFlow trains on (mapped to
    NVML's indices), else host memory; None where NVML cannot say."""
    if kind != "GPU":
        return host_link()
    gpus = tf_gpus()[:replicas]
    if any(g.nvml is None for g in gpus):
        return None
    return gpu_link(sorted({g.nvml.index for g in gpus if g.nvml is not None}))


def _point(c: _Config, comparison: Any, base_s: float | None, parts: dict[str, float]) -> Point:
    if c.n == 1:  # no comparison: the baseline of the others
        seconds = base_s
        gain = Gain(1.0, 1.0, 1.0) if base_s else None
    else:
        rounds = comparison.rounds if comparison else []
        seconds = medians(rounds)[1] if rounds else None
        gain = Gain.of(rounds)
    step = None if seconds is None else seconds * c.global_batch
    return Point(
        replicas=c.n,
        mode=c.mode if c.n > 1 else "both",
        global_batch=c.global_batch,
        per_replica_batch=c.global_batch // c.n,
        step_s=step,
        examples_per_s=None if not seconds else 1.0 / seconds,
        speedup=gain,
        compute_s=parts.get("compute_s"),
        all_reduce_s=parts.get("all_reduce_s"),
        update_s=parts.get("update_s"),
        input_s=parts.get("input_s"),
        error=comparison.error if comparison else "",
    )


def _calibrate(
    mode: str,
    by_key: dict[str, Point],
    parts: dict[str, dict[str, float]],
    gradient_bytes: int,
    ring: str,
    link_bytes_s: float | None,
) -> Callable[..., Prediction] | None:
    """The cost model of `mode`, calibrated on its 1- and 2-replica points (`by_key`) and
    parts: `model(n, machines=1, network_bytes_s=0.0)` predicts `n` replicas over `machines`;
    None without the points. `link_bytes_s`: between GPUs, per direction (None: unknown)."""
    one, two = parts.get(f"1 {WEAK}", {}), parts.get(f"2 {mode}", {})
    base, second = by_key.get("1 both"), by_key.get(f"2 {mode}")
    if base is None or second is None or not base.step_s or not second.step_s:
        return None
    if (
        not {"compute_s", "update_s", "input_s"} <= one.keys()
        or not {"compute_s", "all_reduce_s", "latency_s", "update_s", "input_s"} <= two.keys()
    ):
        return None
    a, b = cost.fit_compute(mode, one["compute_s"], two["compute_s"])
    # Every replica updates its own copy, whatever the batch: as weak compute in the replicas.
    update_a, update_b = cost.fit_compute(WEAK, one["update_s"], two["update_s"])
    all_reduce = cost.Calibration.from_measurements(
        ring, 2, gradient_bytes, two["all_reduce_s"], two["latency_s"]
    )
    busy = two["compute_s"] + two["all_reduce_s"] + two["update_s"]
    other_s = max(0.0, second.step_s - busy)
    rate = second.global_batch / two["input_s"]  # examples/s the host's pipeline gives
    base_batch, base_rate = base.global_batch, base.global_batch / base.step_s

    def model(n: int, machines: int = 1, network_bytes_s: float = 0.0) -> Prediction:
        local = n // machines
        global_batch = base_batch * n if mode == WEAK else base_batch
        compute = cost.compute_at(mode, a, b, local if mode == WEAK else n)
        reduce_s = all_reduce.seconds(local, gradient_bytes)
        if link_bytes_s:  # never faster than a ring over the link allows
            reduce_s = max(reduce_s, cost.ring_s(local, gradient_bytes, link_bytes_s))
        if machines > 1:
            reduce_s += cost.ring_s(machines, gradient_bytes, network_bytes_s)
        input_s = (global_batch / machines) / rate
        update = cost.compute_at(WEAK, update_a, update_b, local)
        step = cost.step_time(compute, reduce_s, update + other_s, input_s)
        return Prediction(
            replicas=n,
            machines=machines,
            mode=mode,
            global_batch=global_batch,
            step_s=step,
            examples_per_s=global_batch / step,
            efficiency=(global_batch / step) / (n * base_rate),
            compute_s=compute,
            all_reduce_s=reduce_s,
            update_s=update,
            input_s=input_s,
        )

    return model


def predict(
    points: list[Point],
    parts: dict[str, dict[str, float]],
    gradient_bytes: int,
    implementation: str,
    network_gbit_s: float,
    kind: str,
    link: Any,
) -> tuple[list[Prediction], dict[str, float]]:
    """Predictions from the 1- and 2-replica points per mode (more replicas; more machines
    on GPUs, where the all-reduce is never faster than the `link` allows); the error on the
    larger counts measured here. Pure."""
    predictions: list[Prediction] = []
    errors: dict[str, float] = {}
    by_key = {f"{p.replicas} {p.mode}": p for p in points}
    ring = cost.RING if implementation in RING_IMPLEMENTATIONS else cost.THROUGH_ONE
    local = max(p.replicas for p in points)
    link_bytes_s = getattr(link, "bandwidth_bytes_s", None) if kind == "GPU" else None
    for mode in (WEAK, STRONG):
        model = _calibrate(mode, by_key, parts, gradient_bytes, ring, link_bytes_s)
        if model is None:
            continue
        for n in sorted({p.replicas for p in points if p.replicas > 2} | {4, 8}):
            p = model(n)
            measured = by_key.get(f"{n} {mode}")
            if measured is not None and measured.step_s:
                errors[f"{n} {mode}"] = p.step_s / measured.step_s - 1.0
            predictions.append(p)
        if kind == "GPU":
            for machines in MACHINES:
                predictions.append(model(local * machines, machines, network_gbit_s * 1e9 / 8))
    return predictions, errors
