"""The texts of the findings: what was seen and the exact argument to change. Pure."""

from __future__ import annotations

import dataclasses
import math

from tfgpu._internal.adapters import gpu_counters as counters
from tfgpu._internal.adapters.datasets import DROP_REMAINDER_MAX_SHARE
from tfgpu.diagnosis._facts import PROBE_STEPS_PER_EXECUTION, DiagnoseFacts, OpFact
from tfgpu.diagnosis._result import Finding


@dataclasses.dataclass(frozen=True)
class ServiceAdvice:
    """The tf.data service advice: workers like this host, the cores they add up to, its text."""

    workers: int
    cores: int
    text: str


# Below this host CPU use, the pipeline is short of settings (or of I/O), not of CPU.
CPU_SATURATED = 0.85
# Workers are sized for this much more than the GPU consumes, so they keep ahead.
HEADROOM = 1.15


def service_advice(
    *,
    input_bound: bool,
    host_cpu_busy: float,
    cpu_count: int,
    parallel: bool,
    cached: bool,
    pipeline_batches_per_s: float,
    step_batches_per_s: float,
) -> ServiceAdvice | None:
    """Whether to move the input work to tf.data service workers, and how many; None when
    the rule does not apply: input-bound, at least `CPU_SATURATED` of the host's cores busy
    (`host_cpu_busy`, 0 to 1), maps already parallel and cached (no setting is left on this
    host). One worker like this host makes `pipeline_batches_per_s`; workers = ceil(`HEADROOM`
    x step rate / that)."""
    rates = (pipeline_batches_per_s, step_batches_per_s)
    if not all(math.isfinite(r) and r > 0 for r in rates) or rates[0] >= rates[1]:
        return None  # no shortage
    if not (input_bound and parallel and cached and host_cpu_busy >= CPU_SATURATED):
        return None
    need = HEADROOM * step_batches_per_s / pipeline_batches_per_s
    workers = max(1, math.ceil(need))
    cores = max(1, math.ceil(need * cpu_count))
    text = (
        f"The host cannot feed the training step: its {cpu_count} CPU cores are "
        f"{host_cpu_busy:.0%} busy and the pipeline, already parallel and cached, makes "
        f"{pipeline_batches_per_s:.3g} batches/s while the step could take "
        f"{step_batches_per_s:.3g} (on a batch already in device memory). No setting is left "
        f"on this host: run the input work on tf.data service workers, about {workers} with "
        f"{cpu_count} cores each ({cores} cores in all): `tfgpu data-service dispatcher "
        "--port 5050` on one machine, `tfgpu data-service worker --dispatcher HOST:5050` on "
        "each worker machine, then `tfgpu.data.pipeline(..., service='grpc://HOST:5050')` "
        "(docs/data_service.md)."
    )
    return ServiceAdvice(workers=workers, cores=cores, text=text)


def finding(found: counters.CounterFinding, detail: str | None = None, fix: str | None = None):
    """A `Finding` from a shared rule's text pieces (`detail`, `fix`: what the model adds)."""
    detail = found.detail() if detail is None else detail
    fix = found.recommendation if fix is None else fix
    return Finding(found.kind, found.severity, found.title, detail, fix)


def tensor_idle_finding(
    f: DiagnoseFacts, found: counters.CounterFinding, xla_no_gain: bool = False
) -> Finding:
    mixed = f.policy in ("mixed_float16", "mixed_bfloat16")
    tf32_capable = all(tuple(cc) >= (8, 0) for cc in f.compute_capabilities)
    tf32_off = f.tf32_enabled is False and tf32_capable
    fixes = []
    if mixed and f.float32_layers:
        fixes.append(
            "these layers keep float32 math under the mixed policy, so their matmuls skip the "
            "tensor cores: " + ", ".join(f.float32_layers[:8]) + " (drop their "
            '`dtype="float32"` unless they must stay float32, like a final softmax)'
        )
    if f.odd_dim_layers:
        fixes.append(counters.MULTIPLES_OF_8 + ": " + ", ".join(f.odd_dim_layers[:8]))
    if tf32_off:
        fixes.append(
            "TF32 is off, so float32 matmuls run on the CUDA cores: remove "
            "`tf.config.experimental.enable_tensor_float_32_execution(False)` (or call it "
            "with `True`)"
        )
    if not mixed:
        choice = "mixed_bfloat16" if tf32_capable else "mixed_float16"
        fixes.append(
            f'mixed precision: `tfgpu.configure(precision="{choice}")` before building the '
            "model" + ("" if tf32_capable else " (float32 never uses tensor cores before Ampere)")
        )
    if not xla_no_gain:  # never advise what its own probe measured as no gain
        fixes.append(counters.ELEMENTWISE_FIX)
    detail = f"{found.measured} under the {f.policy} policy: {found.meaning}."
    return finding(
        found, detail + (" TF32 is off." if tf32_off else ""), _sentence("; ".join(fixes))
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def pcie_finding(
    f: DiagnoseFacts, found: counters.CounterFinding, cpu_ops: list[tuple[OpFact, str]]
) -> Finding:
    seen = [cpu_ops_traffic(cpu_ops)[0]] if cpu_ops else []
    if f.from_arrays:
        seen.append("the data is fed as NumPy arrays")
    if f.python_input:
        seen.append("the pipeline runs `tf.py_function` / a generator")
    return finding(found, found.measured + (f"; seen: {'; '.join(seen)}" if seen else "") + ".")


def unexplained_wait_finding(f: DiagnoseFacts, wait: float) -> Finding:
    """The input wait is far longer than the pipeline's own time per batch: what to check. Pure."""
    causes = []
    if f.dynamic_shape:
        causes.append(
            f"the batches' shape {f.dynamic_shape} has `None` dims"
            + (" and the last batch is partial" if f.partial_batches else "")
            + ": each new shape retraces the train step"
            + (" and recompiles it under `jit_compile`" if f.jit_compile else "")
            + "; "
            + (remainder_fix(f) if f.partial_batches else "pad to fixed shapes")
        )
    if f.replicas > 1:
        causes.append(
            f"the batches are split across {f.replicas} replicas every step (the distributed "
            "iterator's overhead): time a single-device run to compare"
        )
    if f.host_load is not None and f.host_load >= 1.0:
        causes.append(
            f"the host is loaded (load average {f.host_load:.1f} per core): other processes "
            "compete for the cores tf.data and the step use; diagnose on a quieter machine"
        )
    if not causes:
        causes.append(
            "none of the usual causes was seen (fixed batch shapes, one replica, host not "
            "loaded): rerun `diagnose` with a larger `time_budget_s`, or capture a trace "
            "with `profile=True` and a `log_dir`"
        )
    return Finding(
        "input_wait_unexplained",
        "moderate",
        "Steps wait far longer than the pipeline takes: the input pipeline is not the cause",
        f"{wait * 1e3:.2f} ms of each {f.step_time_s * 1e3:.2f} ms step waits beside a "
        f"{f.compute_step_time_s * 1e3:.2f} ms device-resident step, but the pipeline alone "
        f"makes a batch in {f.input_time_s * 1e3:.2f} ms: not called input-bound.",
        _sentence("check: " + "; ".join(causes)),
    )


def remainder_fix(f: DiagnoseFacts) -> str:
    """How to end a partial last batch, with what `drop_remainder=True` drops: advised only
    below `DROP_REMAINDER_MAX_SHARE` of an epoch, else a batch size that divides it. Pure."""
    n, size = f.epoch_examples, f.batch_size
    if n and size and n % size:
        left = n % size
        drops = f"the last {left:,} of the {n:,} examples of each epoch"
        if left >= DROP_REMAINDER_MAX_SHARE * n:
            divisor = max((d for d in range(size // 2, size) if n % d == 0), default=None)
            fix = f"a batch size that divides the {n:,} examples (e.g. {divisor}) or "
            cost = f"not `drop_remainder=True`: it would drop {drops} ({left / n:.0%})"
            return f"{fix if divisor else ''}pad to fixed shapes; {cost}"
    else:  # how many it drops is not known
        drops = "the last batch of each epoch" + (f" (up to {size - 1:,} examples)" if size else "")
    return (
        "batch with `drop_remainder=True` (`.batch(..., drop_remainder=True)` or "
        f"`tfgpu.data.pipeline(..., drop_remainder=True)`), which drops {drops}, or pad to "
        "fixed shapes"
    )


def advise_service(f: DiagnoseFacts) -> ServiceAdvice | None:
    """`service_advice` on these facts, for an input-bound run. Pure."""
    if f.service or f.input_time_s <= 0 or f.compute_step_time_s <= 0:
        return None
    return service_advice(
        input_bound=True,
        host_cpu_busy=f.pipeline_cpu_busy,
        cpu_count=f.cpu_cores,
        parallel=f.parallel_map and not (f.sequential_map or f.python_input),
        cached=f.cache is not None,
        pipeline_batches_per_s=1.0 / f.input_time_s,
        step_batches_per_s=1.0 / f.compute_step_time_s,
    )


def input_advice(f: DiagnoseFacts, spe_no_gain: bool = False) -> str:
    """What to change in an input-bound pipeline, given what it already does and who built
    it (a `tfgpu.data.pipeline`, a Keras loader or hand-made chain, a generator). Pure."""
    if f.service:
        need = HEADROOM * f.input_time_s / f.compute_step_time_s
        return (
            "The batches come from tf.data service workers, and they make fewer than the "
            f"step takes: about {need:.1f}x the workers you have (or cores per worker) would "
            "keep up; check that each worker's CPUs are busy and that the trainer reaches "
            "every worker's port (docs/data_service.md)."
        )
    service = advise_service(f)
    if service is not None and f.map_after_cache:  # one setting is left, and it is cheaper
        return (
            "First move the per-example augmentation after the cache into "
            "`batch_augment_fn=` (vectorized: one op per batch instead of one per example). "
            "If the host still cannot keep up: " + service.text[0].lower() + service.text[1:]
        )
    if service is not None:
        return service.text
    if not (f.parallel_map or f.sequential_map or f.python_input):
        return _in_memory_advice(f, spe_no_gain)
    if f.python_input:
        where = "before a `cache()`"
        if f.made_by_pipeline:
            where = "in `map_fn`, then let `cache=` keep its output"
        return (
            "The pipeline runs Python for every element (`tf.py_function` / a generator), "
            "which holds the GIL and cannot run in parallel: rewrite that step with TF ops "
            f"(`tf.io`, `tf.image`, `tf.strings`), or run it once {where}."
        )
    if f.made_by_pipeline or (f.prefetch and not f.sequential_map):
        return _tuned_advice(f)
    return _builder_advice(f)


def _builder_advice(f: DiagnoseFacts) -> str:
    """A hand-made chain that is not tuned: build it with the pipeline, or tune its steps."""
    seen = ((f.sequential_map, "a map runs one element at a time"),
            (f.cache is None, "nothing is cached"),
            (not f.prefetch, "batches are not prefetched"))  # fmt: skip
    missing = [what for found, what in seen if found]
    return (
        "Build the input with `tfgpu.data.pipeline(ds, batch_size=...)` (it takes a Keras "
        "loader's dataset too: parallel `map(num_parallel_calls=tf.data.AUTOTUNE)`, "
        "`cache()`, `prefetch(tf.data.AUTOTUNE)`), or give your own `ds.map(...)` "
        "`num_parallel_calls=tf.data.AUTOTUNE` and end with `.prefetch(tf.data.AUTOTUNE)`"
        + (f": now {', '.join(missing)}" if missing else "")
        + "; move per-example Python work into TF ops or before `cache()`."
    )


def _tuned_advice(f: DiagnoseFacts) -> str:
    """A pipeline whose steps are set already: what is left, beyond its settings."""
    cached = {"memory": "caches in memory", "file": "caches to a file"}.get(f.cache or "", "")
    parallel = "maps in parallel" if f.parallel_map else ""
    prefetches = "prefetches" if f.prefetch else ""
    done = ", ".join(x for x in (parallel, cached, prefetches) if x) or "is a tfgpu pipeline"
    left = [
        "make the per-example work cheaper (fewer ops in `map_fn`/`augment_fn`; decode "
        "smaller, e.g. `tf.io.decode_jpeg(..., ratio=2)` or `decode_and_crop_jpeg`)"
    ]
    if f.sequential_map:
        left.insert(
            0,
            "a map in the dataset passed in runs one element at a time: move that work into "
            "`map_fn=` (run in parallel) or, vectorized, `batch_map_fn=`",
        )
    if f.map_after_cache:
        left.append(
            "move the augmentation after the cache into `batch_augment_fn=` (vectorized: one "
            "op per batch instead of one per example)"
        )
    if f.cache is None:
        left.append(
            'cache the decoded examples: `cache=True` (memory) or `cache="/path/prefix"` (a '
            "file), with the deterministic work in `map_fn` before it"
        )
    pool = f.private_threadpool_size
    left += [
        "give tf.data more CPU cores (a host with more cores per GPU; "
        f"`private_threadpool_size=` sized to them, now {pool or 'the shared pool'})",
        "preprocess offline: write the decoded, resized examples to TFRecord files once and "
        'read them with `tfgpu.data.pipeline("data-*.tfrecord", map_fn=parse, ...)`',
    ]
    return f"The pipeline already {done}: what is left is to " + "; ".join(left) + "."


def _in_memory_advice(f: DiagnoseFacts, spe_no_gain: bool = False) -> str:
    """What helps a pipeline without a map (in-memory arrays): fewer, larger hand-overs (the
    cost is per batch and per host round trip, not in maps or caches). Pure."""
    left = []
    if not f.prefetch:
        left.append("end the pipeline with `.prefetch(tf.data.AUTOTUNE)`")
    batch = f"now {f.batch_size}" if f.batch_size else "per replica"
    left.append(
        f"a larger batch (`batch_size=`, {batch}): the per-batch cost is paid for more "
        "examples; scale the learning rate with `tfgpu.scale_learning_rate`"
    )
    if not spe_no_gain:  # never advise what its own probe measured as no gain
        left.append(
            f"`model.compile(..., steps_per_execution=)` (now {f.steps_per_execution}; "
            f"e.g. {max(PROBE_STEPS_PER_EXECUTION, 4 * f.steps_per_execution)}): fewer host "
            "round trips, several batches fetched per call"
        )
    left.append(
        "`tfgpu.data.pipeline(..., repeat=True)` with `model.fit(..., steps_per_epoch=...)`: "
        "one iterator for the whole run instead of a new one every epoch"
    )
    intro = "The pipeline has no map (in-memory data): the wait is per-batch hand-over, so "
    return intro + "; ".join(left) + "."


_CPU_OP_FIXES = {
    "pinned": 'remove the `with tf.device("/cpu:0")` around it in the model; a preprocessing '
    "layer that pins itself there (`TextVectorization`, `StringLookup`, `Hashing`) belongs in "
    "the input pipeline instead (`map_fn=layer`)",
    "python": "rewrite the `tf.py_function` with TF ops, or move it into the input pipeline",
    "no_kernel": "no GPU kernel for it (a string op, an op without a GPU kernel for its "
    "dtype): move it into the input pipeline (`map_fn`) or replace it with an op that has one",
}


def cpu_ops_traffic(cpu_ops: list[tuple[OpFact, str]]) -> tuple[str, str]:
    """(what was seen, the fix) for train-step ops on the CPU. Pure."""
    shown = [f"`{op.name}` ({op.op}{', ' + op.device if why == 'pinned' else ''})"
             for op, why in cpu_ops[:6]]  # fmt: skip
    more = f" and {len(cpu_ops) - 6} more" if len(cpu_ops) > 6 else ""
    seen = (
        f"{len(cpu_ops)} train-step op(s) run on the CPU, so tensors cross between host and "
        f"GPU every step: {', '.join(shown)}{more}"
    )
    reasons = dict.fromkeys(why for _, why in cpu_ops)  # each once, in order
    return seen, "; ".join(_CPU_OP_FIXES[why] for why in reasons)


def loss_scale_finding(before: float, after: float) -> Finding:
    return Finding(
        "loss_scale",
        "high",
        "The dynamic loss scale keeps collapsing",
        f"The scale fell from {before:g} to {after:g} during the run: each halving is a step "
        "whose gradients overflowed float16 and whose update was skipped silently.",
        'Use `"mixed_bfloat16"` on GPUs with compute capability >= 8.0 (no loss scale '
        "needed); otherwise find the overflow (unnormalized inputs, large logits, a layer "
        'that must run in float32: `dtype="float32"`).',
    )
