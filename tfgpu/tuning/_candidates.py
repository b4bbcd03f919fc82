"""`tune`'s candidates in their order, the numerics guard's verdict, the lines to change and
the verification of the kept ones together (the verdicts are the core's `rules`). Pure."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfgpu._internal.adapters.all_reduce import MIRRORED, MULTI_WORKER
from tfgpu._internal.adapters.datasets import DROP_REMAINDER_MAX_SHARE
from tfgpu._internal.measure import rules
from tfgpu._internal.measure.facts import WorkloadFacts
from tfgpu.precision import choose_policy

# The numerics guard: a mean loss above the baseline's by more than this share is unsafe.
LOSS_TOLERANCE = 0.10
LOSS_ABS_TOLERANCE = 1e-6
# The gain of nothing kept.
NONE = rules.Gain(1.0, 1.0, 1.0)
# The `steps_per_execution` ladder; it stops at the first value not kept.
SPE_LADDER = (4, 16, 64)
# One execution of `steps_per_execution` steps should take at most this long: longer steps
# leave no host overhead worth saving, and a fit would run for minutes.
SPE_MAX_EXECUTION_S = 1.0
# A timed fit runs a whole epoch when one lasts at most this many times the fit's target: the
# epoch's start (its iterator, a distributed dataset, a shuffle buffer filling) then weighs in
# it as in the user's `fit`; in the first steps of an epoch it weighs more (a gain that helps
# the steps read smaller).
WHOLE_EPOCH = 2.0
# The untried reasons several places give.
NEEDS_FACTORY = "needs a model factory: pass a function that builds and compiles the model"
FRESH_PROCESS = "needs a fresh process (`tfgpu tune SCRIPT.py`)"
NEEDS_GPU = "needs a GPU (TensorFlow saw none in the script's process)"
HALTED = "tune stopped"  # the data or the model raised: no candidate after it ran
# The settings read once when TensorFlow starts, tried in fresh processes: (name, environment
# variable, value, whether it needs a GPU).
PROCESS_SETTINGS = (
    ("XLA auto-clustering", "TF_XLA_FLAGS", "--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit", False),
    ("thread counts", "TF_NUM_INTEROP_THREADS", "1", False),
    ("GPU private threads", "TF_GPU_THREAD_MODE", "gpu_private", True),
    ("async allocator", "TF_GPU_ALLOCATOR", "cuda_malloc_async", True),
)


@dataclasses.dataclass
class TuneFacts(WorkloadFacts):
    """The workload's facts and what only `tune` reads."""

    augment_on_batches: str = ""  # why `augment_fn` cannot run on whole batches ("": it can)
    cache_untried: str | None = None  # why another dataset's output is not cached (None: unknown)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One setting to try: what changes, the code line, and how to judge it. Pure data."""

    name: str
    change: dict[str, Any]
    line: str
    numerics: bool = False  # it can change the loss: the numerics guard checks it
    probe: bool = False  # may be worth x2 or more: a first look decides its place in the order
    group: str = ""  # a ladder, tried until one is slower or gives nothing
    untried: str = ""  # never run, for that reason
    note: str = ""  # added to the reason when it is kept


def _compile_line(change: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in change.items())
    return f"model.compile(..., {args})"


def _pipeline_line(change: dict[str, Any], arguments: dict[str, Any]) -> str:
    args = []
    for k, v in change.items():
        if k == "batch_augment":
            name = getattr(arguments.get("augment_fn"), "__name__", "augment_fn")
            args.append(f"augment_fn=None, batch_augment_fn={name}")
        elif k == "batch_size" and arguments.get("per_replica_batch_size") is not None:
            replicas = getattr(arguments.get("strategy"), "num_replicas_in_sync", 1) or 1
            args.append(f"per_replica_batch_size={v // max(1, int(replicas))}")
        else:
            args.append(f"{k}={v!r}")
    return f"tfgpu.data.pipeline(..., {', '.join(args)})"


# The line of a change to a dataset tfgpu did not build, by its key (`value`: the change's,
# `batch`: the data's global batch).
_DATASET_LINES = {
    "prefetch": "dataset = dataset.prefetch(tf.data.AUTOTUNE)",
    "private_threadpool_size": "options = tf.data.Options(); options.threading."
    "private_threadpool_size = {value}; dataset = dataset.with_options(options)",
    "cache": "dataset = dataset.cache()  # at the end of your chain, before its prefetch",
    "drop_remainder": "dataset = dataset.batch({batch}, drop_remainder=True)  # where you batch",
    "batch_size": "dataset = dataset.batch({value})  # where you batch",
}


# What `result.dataset` changes for array data, by the change's key.
_ARRAY_CHANGES = {
    "drop_remainder": "the partial batch left out",
    "prefetch": "batches prefetched",
    "private_threadpool_size": "a private thread pool",
    "cache": "the batches cached",
    "batch_size": "another batch size",
}


def line_for(change: dict[str, Any], facts: TuneFacts) -> str:
    """The code line that makes `change` (keys of one kind) in the user's code. Pure."""
    keys = set(change)
    if keys <= set(rules.COMPILE_KEYS):
        return _compile_line(change)
    if keys == {"strategy"}:
        was = facts.one_replica_strategy or "the strategy"
        return (
            f"strategy = tfgpu.strategy()  # in place of {was}(): one replica here, its "
            "distribution is only overhead"
        )
    if keys <= set(rules.MODEL_KEYS):
        return (
            f"tfgpu.configure(precision={change['precision']!r})  # first, before building "
            "the model"
        )
    if keys <= set(rules.STRATEGY_KEYS):
        kind = facts.all_reduce.kind if facts.all_reduce else "mirrored"
        return f"tfgpu.strategy({kind!r}, ..., all_reduce={change['all_reduce']!r})"
    if facts.pipeline is not None:
        return _pipeline_line(change, facts.pipeline)
    if facts.from_arrays:  # `fit(x, y)` has no such setting: the batches tune made, changed
        what = ", ".join(_ARRAY_CHANGES[k] for k in change)
        return (
            "model.fit(result.dataset, validation_data=result.validation_data, ...)  # in "
            f"place of fit(x, y, batch_size={facts.batch_size}, ...): {what}"
        )
    (key, value), *_ = change.items()
    return _DATASET_LINES[key].format(value=value, batch=facts.batch_size)


def _candidate(name: str, change: dict[str, Any], facts: TuneFacts, **kwargs: Any) -> Candidate:
    return Candidate(name, change, line_for(change, facts), **kwargs)


def precision_choice(facts: TuneFacts) -> tuple[str | None, str]:
    """(the mixed policy to try or None, why not): `choose_policy` on GPUs; on the CPU,
    bfloat16 only with native bfloat16 units. Pure."""
    if facts.compute_capabilities:
        choice = choose_policy(list(facts.compute_capabilities))
        if choice.policy == "float32":
            return None, choice.reason
        return choice.policy, ""
    if facts.cpu_native_bf16:
        return "mixed_bfloat16", ""
    return None, "this CPU has no native bfloat16 (no AMX or AVX-512 BF16): it would only add casts"


def all_reduce_candidates(facts: TuneFacts) -> list[Candidate]:
    """The all-reduces that apply to the model's replicas but the one in use (none on one
    replica; which: docs/tuning.md, "What it tries")."""
    ar = facts.all_reduce
    if ar is None or not ar.kind or ar.replicas <= 1:
        return []
    names: tuple[str, ...]
    if ar.kind == "mirrored":
        names = MIRRORED if ar.on_gpus else MIRRORED[1:]
    else:
        names = MULTI_WORKER if ar.on_gpus else ()
    untried = ar.missing
    if not untried and ar.workers > 1:
        untried = (
            f"{ar.workers} workers: each would time and decide apart, and every worker must "
            "all-reduce the same way (compare on one machine, or set all_reduce by hand)"
        )
    if not untried and ar.kind == "mirrored" and ar.on_gpus and facts.jit_compile:
        untried = (
            "under jit_compile, MirroredStrategy on GPUs all-reduces with TensorFlow's "
            "collective ops whatever is set"
        )
    return [
        _candidate(f"all_reduce={name}", {"all_reduce": name}, facts, untried=untried)
        for name in names
        if name != ar.in_use
    ]


def candidates(facts: TuneFacts) -> list[Candidate]:
    """The ordered candidates for `facts`, untried ones with their reason (the order and why:
    docs/tuning.md, "What it tries"). Those that may be worth x2 or more are marked `probe`.
    Pure."""
    bottleneck = rules.bottleneck(facts.step_time_s, facts.input_time_s, facts.steps_per_execution)
    undo: list[Candidate] = []
    spe: list[Candidate] = []
    for v in SPE_LADDER:  # a ladder, each value at most the batches of an epoch
        if v <= facts.steps_per_execution:
            continue
        too_many = facts.batches_per_epoch is not None and v > facts.batches_per_epoch
        untried = f"more than the {facts.batches_per_epoch} batches of an epoch" if too_many else ""
        group, probe = "steps_per_execution", bottleneck == "host"  # its largest that runs
        spe.append(
            _candidate(f"{group}={v}", {group: v}, facts, group=group, untried=untried, probe=probe)
        )
    precision: list[Candidate] = []
    policy, why = precision_choice(facts)
    needs = "" if facts.has_factory else NEEDS_FACTORY
    if facts.policy.startswith("mixed_") and policy is None:  # casts without native units
        change: dict[str, Any] = {"precision": "float32"}
        undo.append(_candidate("precision float32", change, facts, untried=needs, probe=True))
    elif not facts.policy.startswith("mixed_"):
        name = f"precision {policy}" if policy else "mixed precision"
        change = {"precision": policy or "mixed_bfloat16"}
        untried = why if policy is None else needs
        kwargs = {"numerics": True, "probe": policy is not None}
        precision.append(_candidate(name, change, facts, untried=untried, **kwargs))
    static: list[Candidate] = []
    if not facts.static_shape:  # the step traced for one batch size
        untried = ""
        if facts.batch_size is None:
            untried = "the batch size of the data is unknown"
        elif facts.pipeline is not None and facts.pipeline.get("drop_remainder") is False:
            untried = "the pipeline was asked for drop_remainder=False"
        drops = ""
        if facts.remainder:
            left, examples = facts.remainder
            drops = f"drops the last {left:,} of the {examples:,} examples of each epoch"
            if not untried and left >= DROP_REMAINDER_MAX_SHARE * examples:
                untried = f"it {drops}: {DROP_REMAINDER_MAX_SHARE:.0%} of the data or more"
        change = {"drop_remainder": True}
        static.append(_candidate("static batch shape", change, facts, untried=untried, note=drops))
    data = _data_candidates(facts)
    untried = "" if facts.xla_supported else "Keras refuses jit_compile for this model"
    if facts.jit_compile:  # an undo: XLA off changes no arithmetic precision
        undo.append(
            _candidate(
                "jit_compile=False", {"jit_compile": False}, facts, untried=untried, probe=True
            )
        )
    order = {
        "input": (data, spe, precision, static),
        "host": (spe, static, data, precision),
        "compute": (precision, spe, static, data),
    }.get(bottleneck, (spe, precision, static, data))
    tail = []
    if not facts.jit_compile:  # last: it gains most from the settings before it
        tail.append(
            _candidate(
                "jit_compile=True", {"jit_compile": True}, facts, numerics=True, untried=untried
            )
        )
    return (
        undo
        + strategy_candidates(facts)
        + all_reduce_candidates(facts)
        + [c for group in order for c in group]
        + tail
    )


def strategy_candidates(facts: TuneFacts) -> list[Candidate]:
    """`tfgpu.strategy()` in place of a strategy made for several replicas that has one, on a
    machine where it would pick one device: its distribution is pure overhead."""
    if not facts.one_replica_strategy or len(facts.compute_capabilities) > 1:
        return []
    change = {"strategy": "auto"}  # `tfgpu.strategy(kind)`, built by the tuner
    return [_candidate("tfgpu.strategy() (one replica)", change, facts, probe=True)]


def _data_candidates(facts: TuneFacts) -> list[Candidate]:
    """The pipeline's settings (a tfgpu pipeline built again), or those of any dataset."""
    out: list[Candidate] = []
    p = facts.pipeline
    if p is not None:
        mapped = p.get("map_fn") is not None and p.get("cache") == "auto"
        if mapped and facts.cache is None and not p.get("repeat"):
            out.append(_candidate("cache in memory", {"cache": "memory"}, facts))
        if p.get("augment_fn") is not None and p.get("batch_augment_fn") is None:
            untried = (
                f"augment_fn does not run on a whole batch ({facts.augment_on_batches}): a "
                "version written for batches, passed as batch_augment_fn, may be faster"
                if facts.augment_on_batches
                else ""
            )
            note = (
                "augment_fn now sees whole batches: a random value it draws once is shared by "
                "every example of a batch"
            )
            name = "batch-level augmentation"
            out.append(_candidate(name, {"batch_augment": True}, facts, untried=untried, note=note))
    else:
        if not facts.prefetch:
            out.append(_candidate("prefetch", {"prefetch": True}, facts))
        if facts.cache_untried is not None and facts.cache is None:
            untried = facts.cache_untried
            out.append(_candidate("cache in memory", {"cache": True}, facts, untried=untried))
    on_cpus = not facts.compute_capabilities and facts.cpu_count > 1
    if on_cpus and not (p or {}).get("private_threadpool_size"):
        # One thread leaves the cores to the model's ops; one per core keeps input apace.
        for size in sorted({1, facts.cpu_count}):
            change = {"private_threadpool_size": size}
            out.append(_candidate(f"private thread pool {size}", change, facts))
    return out


def fit_shape(
    step_s: float, batches_per_epoch: int | None, target_s: float, unit: int = 1
) -> tuple[int, int | None]:
    """(epochs, steps per epoch or None for whole epochs) of a timed `fit` that lasts about
    `target_s` for steps of `step_s`: whole epochs when one lasts at most `WHOLE_EPOCH` times
    the target, else the first steps of an epoch, a multiple of `unit` (the largest
    `steps_per_execution` tried), at least 2 calls. Pure."""
    if batches_per_epoch is not None and batches_per_epoch * step_s <= WHOLE_EPOCH * target_s:
        return max(1, round(target_s / (batches_per_epoch * step_s))), None
    steps = max(2 * unit, math.ceil(target_s / step_s / unit) * unit)
    if batches_per_epoch is not None and steps >= batches_per_epoch:
        return 1, None
    return 1, steps


def process_settings(has_gpu: bool) -> list[tuple[str, dict[str, str], str, str]]:
    """The settings that need a fresh process, tried by `tfgpu tune SCRIPT.py`: (name,
    environment variables, line, why not tried here or ""). Pure."""
    out = []
    for name, var, value, gpu in PROCESS_SETTINGS:
        untried = NEEDS_GPU if gpu and not has_gpu else ""
        out.append((name, {var: value}, f"export {var}={shlex.quote(value)}", untried))
    return out


def spe_fits(value: int, step_s: float | None) -> str:
    """Why `steps_per_execution=value` is not tried for steps of `step_s` ("": it is). Pure."""
    if step_s is not None and math.isfinite(step_s) and value * step_s > SPE_MAX_EXECUTION_S:
        return (
            f"steps of {step_s * 1e3:.0f} ms leave little host overhead to save "
            f"({value} steps would run {value * step_s:.1f} s per call)"
        )
    return ""


def numerics_verdict(base_loss: float, loss: float) -> str:
    """Why a mean loss is unsafe next to the baseline's from the same weights ("": safe). Pure."""
    if not math.isfinite(loss):
        return f"the loss is not finite ({loss}; baseline {base_loss:.4g})"
    if not math.isfinite(base_loss):
        return ""
    if loss > base_loss * (1.0 + LOSS_TOLERANCE) + LOSS_ABS_TOLERANCE and loss > base_loss:
        return (
            f"mean loss {loss:.4g} vs {base_loss:.4g} for the baseline from the same weights "
            f"(more than {LOSS_TOLERANCE:.0%} worse)"
        )
    return ""


def combined_lines(kept: Sequence[tuple[dict[str, Any], str]], facts: TuneFacts) -> list[str]:
    """The lines to change for the kept candidates (their `change`, their own line): one
    `model.compile(...)` line, one pipeline line, the others as they are. Pure."""
    compile_change: dict[str, Any] = {}
    pipeline_change: dict[str, Any] = {}
    lines: list[str] = []
    for change, line in kept:
        if set(change) <= set(rules.COMPILE_KEYS):
            compile_change.update(change)
        elif (facts.pipeline is not None or facts.from_arrays) and set(change) <= set(
            rules.PIPELINE_KEYS
        ):
            pipeline_change.update(change)
        elif line not in lines:
            lines.append(line)
    head = []
    if compile_change:
        head.append(_compile_line(compile_change))
    if pipeline_change:
        head.append(line_for(pipeline_change, facts))
    return head + lines


@dataclasses.dataclass
class Kept:
    """A setting kept by the search: its trial (what it changes: `trial.change`), its rounds,
    and whether they were measured against the baseline itself."""

    trial: Any  # tfgpu.tuning.Trial
    rounds: list[tuple[float, float]]
    against_baseline: bool


def verify(
    kept: list[Kept],
    together: Callable[[dict[str, Any]], Any],
    notes: list[str],
    *,
    again: bool = False,
) -> tuple[rules.Gain, bool]:
    """The gain of the kept settings together over the baseline, timed by `together(changes)`
    (a `timing.Comparison`), and whether it was verified. While they do not clear the margin
    over the rounds the rules ask, the one that gave the least is dropped (its trial, now
    borderline, and `notes` say so); a verification the budget cut first drops nothing: the
    search's gains multiplied are returned, unverified. A single setting measured in rounds
    against the baseline is its own verification, unless `again`: then it is measured once
    more, its gain over all its rounds (rounds that agree by chance seldom agree twice).
    `kept` is left with what holds."""
    while kept:
        one = kept[0]
        alone = len(kept) == 1 and one.against_baseline and len(one.rounds) >= rules.MIN_ROUNDS
        if alone and not again:
            return rules.Gain.of(one.rounds) or NONE, True
        changes: dict[str, Any] = {}
        for k in kept:
            changes = merged(changes, k.trial.change)
        c = together(changes)
        status, reason = rules.verdict(c.rounds, c.stopped)
        g = rules.Gain.of(c.rounds)
        every_round = all(b / v >= rules.MARGIN for b, v in c.rounds if v > 0)
        if c.error:
            notes.append(f"the verification failed: {c.error}")
            reason = c.error
        elif status == rules.KEPT and g is not None:
            return (rules.Gain.of(one.rounds + c.rounds) or g) if alone else g, True
        elif c.stopped == "budget" and g and every_round and len(c.rounds) >= 2:
            notes.append(
                f"verified over {len(c.rounds)} round(s) only (time budget spent): every round "
                f"cleared x{rules.MARGIN:.2f}"
            )
            return g, True
        elif status == rules.UNTRIED and alone:  # its own rounds stand
            return rules.Gain.of(one.rounds) or NONE, True
        elif status == rules.UNTRIED:  # cut by the budget before the rounds the rules ask
            notes.append(
                "the kept settings were not verified together (the time budget ran out first): "
                "the speedup is the search's gains multiplied, each measured against the best "
                "before it; a larger time_budget_s verifies them"
            )
            return estimate(kept), False
        weakest = min(kept, key=lambda k: k.trial.gain.value if k.trial.gain else 0.0)
        kept.remove(weakest)
        weakest.trial.status = rules.BORDERLINE
        if alone:
            weakest.trial.reason = (
                f"measured {weakest.trial.gain_text} against the baseline, but measured again "
                f"it did not hold the gain ({reason}): not kept, and it may come and go from "
                "run to run"
            )
        else:
            weakest.trial.reason = (
                f"measured {weakest.trial.gain_text} against the best before it, but the kept "
                f"settings together against the baseline did not hold the gain ({reason}); "
                "this one gave the least: not kept, and it may come and go from run to run"
            )
        notes.append(f"{weakest.trial.name} dropped at the verification")
    return NONE, True


def estimate(kept: list[Kept]) -> rules.Gain:
    """The search's gain of `kept` together: each one's gain (and interval ends) multiplied."""
    gains = [k.trial.gain for k in kept if k.trial.gain is not None]
    if not gains:
        return NONE
    return rules.Gain(
        math.prod(g.value for g in gains),
        math.prod(g.low for g in gains),
        math.prod(g.high for g in gains),
    )


def merged(settings: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with `change` on top; environment flags (`TF_XLA_FLAGS`) are joined."""
    out = dict(settings)
    for key, value in change.items():
        if key == "TF_XLA_FLAGS" and out.get(key):
            out[key] = f"{out[key]} {value}"
        else:
            out[key] = value
    return out
