"""`run_demo`: the demo's phases, in order (set up, build the data, the naive side and its
diagnosis, the tfgpu side: tune, train and diagnose; write and print the comparison)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfgpu._internal.helpers.jsonable import json_safe
from tfgpu.demo import _workload as workload
from tfgpu.demo._args import check_arguments, claim_log_dir
from tfgpu.demo._plan import SEED, Sizes, choose_sizes
from tfgpu.demo._results import (
    Figures,
    Recipe,
    format_table,
    side_figures,
    speedups,
    waterfall_lines,
)

if TYPE_CHECKING:
    from tfgpu.config import Configuration
    from tfgpu.diagnosis import Diagnosis
    from tfgpu.tuning import TuneResult

# The compile settings `tfgpu.tune` may keep (the others: precision, pipeline settings).
_COMPILE_SETTINGS = ("steps_per_execution", "jit_compile")


@dataclasses.dataclass(frozen=True)
class _Run:
    """The run settings, fixed before either side trains: equal on both sides."""

    config: Configuration  # what tfgpu.configure() applied (the tfgpu side's precision)
    strategy: Any  # tf.distribute.Strategy, from tfgpu.strategy()
    sizes: Sizes
    num_gpus: int
    global_batch: int  # both sides

    @property
    def total_steps(self) -> int:
        """Both sides': the learning-rate schedule decays to 0 over them."""
        return self.sizes.epochs * (self.sizes.num_train // self.global_batch)

    @property
    def on_gpu(self) -> bool:
        return self.num_gpus > 0

    @property
    def device(self) -> str:
        return (
            f"{self.num_gpus} GPU(s)" if self.on_gpu else "CPU only (no GPU visible to TensorFlow)"
        )


@dataclasses.dataclass(frozen=True)
class _Side:
    """What one side produced: its figures, how it trained, and its diagnosis."""

    figures: Figures
    recipe: Recipe
    diagnosis: Diagnosis
    tuning: TuneResult | None = None  # the tfgpu side's tfgpu.tune result

    def to_dict(self) -> dict[str, Any]:
        """The side as stored in `demo.json`: the figures, then `"recipe"`."""
        return {**dataclasses.asdict(self.figures), "recipe": dataclasses.asdict(self.recipe)}


def run_demo(
    *,
    quick: bool = False,
    dataset: str | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    epochs: int | None = None,
) -> int:
    """Trains a reference image classifier naively, then with tfgpu, and compares them.

    The same model and recipe on both sides; only how the work is done differs. Prints a
    side-by-side table and writes the run directory. The guide: docs/demo.md.

    Args:
        quick: bool, a tiny run (seconds) to check that everything works. Defaults to False.
        dataset: str or None, a prepared TensorFlow Datasets image classification dataset
            (e.g. `"cifar10"`). Defaults to None: synthetic data made offline.
        log_dir: str, os.PathLike or None, a new or empty directory for the run.
            Defaults to None: a new `runs/demo-YYYYmmdd-HHMMSS` in the current directory.
        epochs: int or None, epochs per side. Defaults to None (8 on the CPU, 5 on GPUs,
            2 with `quick`).

    Returns:
        int, 0 when both sides trained and the run directory is written.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if `epochs` is not positive, `log_dir` is (or is under) a file or is not
            empty, or `dataset` is empty or not an image classification dataset.
        FileNotFoundError: if `dataset` is not prepared on this machine (with how to get it).

    Example:

    ```python
    from tfgpu.demo import run_demo
    run_demo(quick=True, log_dir="runs/demo-quick")   # or: tfgpu demo --quick
    ```
    """
    path = check_arguments(quick, dataset, log_dir, epochs)
    run = _set_up(quick=quick, epochs=None if epochs is None else int(epochs))  # NumPy ints
    data = _build_data(run, dataset)
    claim_log_dir(path)
    naive = _naive_side(run, data, path / "naive")
    gc.collect()  # the naive model and pipeline are gone: free their memory first
    tuned, changes = _tfgpu_side(run, data, path / "tfgpu")
    _compare(run, data, naive, tuned, changes, path)
    return 0


def _set_up(*, quick: bool, epochs: int | None) -> _Run:
    """Configures tfgpu (before any tensor exists), picks the strategy and the sizes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf

    import tfgpu

    # The naive side runs in float32 anyway; configure() must come before any tensor.
    config = tfgpu.configure(seed=SEED)
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    strategy = tfgpu.strategy()
    sizes = choose_sizes(quick=quick, num_gpus=num_gpus, epochs=epochs)
    global_batch = tfgpu.global_batch_size(sizes.per_replica_batch, strategy)
    run = _Run(config, strategy, sizes, num_gpus, global_batch)
    _say(f"tfgpu demo on {run.device}; precision for the tfgpu side: {config.precision}")
    return run


def _build_data(run: _Run, dataset: str | None) -> workload.Data:
    start = time.perf_counter()
    data = workload.build_data(dataset, run.sizes)
    sizes = run.sizes
    _say(
        f"data: {data.source}, {sizes.num_train} training + {sizes.num_test} test images as "
        f"{sizes.stored_size}x{sizes.stored_size} JPEGs, {data.num_classes} classes, model input "
        f"{sizes.image_size}x{sizes.image_size} ({time.perf_counter() - start:.1f} s)"
    )
    return data


def _naive_side(run: _Run, data: workload.Data, log_dir: Path) -> _Side:
    """Diagnoses, then trains, what a typical Keras user writes."""
    import keras
    import tensorflow as tf

    sizes = run.sizes
    _say(
        f"\n[1/5] naive: float32, .map(decode+augment) without num_parallel_calls or prefetch, "
        f"batch {run.global_batch}, steps_per_execution=1, no strategy"
    )
    keras.mixed_precision.set_global_policy("float32")
    model = _compiled_model(run, data)
    digest = workload.weights_digest(model)
    decode, augment = workload.decode_fn(sizes.resize_to), workload.augment_fn(sizes.image_size)

    def decode_and_augment(jpeg, label):
        return augment(*decode(jpeg, label))

    train = (
        tf.data.Dataset.from_tensor_slices((data.train_x, data.train_y))
        .shuffle(sizes.num_train, seed=SEED)
        .map(decode_and_augment)
        .batch(run.global_batch)
    )
    _say("[2/5] tfgpu.diagnose(naive model, naive pipeline): what holds it back")
    before = _diagnose(model, train, sizes, log_dir, check_xla=sizes.check_xla)
    _say(f"  training the naive side ({sizes.epochs} epochs):")
    trained = _train(model, train, data.test, run=run, log_dir=log_dir)
    figures = side_figures(**trained, input_wait_share=before.input_wait_share, on_gpu=run.on_gpu)
    recipe = workload.read_recipe(model, global_batch=run.global_batch, initial_digest=digest)
    return _Side(figures, recipe, before)


def _tfgpu_changes(run: _Run, result: TuneResult) -> list[str]:
    """What the tfgpu side does differently, as printed and stored (`tfgpu_settings`)."""
    precision = result.settings.get("precision")
    chosen_by = "tfgpu.tune" if precision else "tfgpu.configure"
    kept = [f"{k}={v!r}" for k, v in result.settings.items() if k != "precision"]
    batched = result.settings.get("batch_augment")
    augment = "batch -> batch augment" if batched else "parallel augment -> batch"
    return [
        f"precision {precision or run.config.precision} ({chosen_by})",
        f"{_strategy_name(run.strategy)}, global batch {run.global_batch} (tfgpu.strategy)",
        f"tfgpu.data.pipeline: parallel decode -> cache -> shuffle -> {augment} -> prefetch",
        (f"tfgpu.tune kept: {', '.join(kept)}" if kept else "tfgpu.tune kept no other setting")
        + f" ({result.speedup.text()} verified in {result.time_s:.0f} s)",
    ]


def _tfgpu_side(run: _Run, data: workload.Data, log_dir: Path) -> tuple[_Side, list[str]]:
    """Tunes, trains with what `tfgpu.tune` kept, then diagnoses what is left."""
    import keras

    import tfgpu.data

    sizes = run.sizes
    keras.mixed_precision.set_global_policy(run.config.precision)
    _say(
        f"\n[3/5] tfgpu: configure (precision {run.config.precision}), "
        f"{_strategy_name(run.strategy)}, tfgpu.data.pipeline; tfgpu.tune tries the rest "
        f"(budget {sizes.tune_budget_s:.0f} s)"
    )
    train = tfgpu.data.pipeline(
        (data.train_x, data.train_y),
        batch_size=run.global_batch,
        strategy=run.strategy,
        map_fn=workload.decode_fn(sizes.resize_to),
        augment_fn=workload.augment_fn(sizes.image_size),
        seed=SEED,
    )

    def build_compiled(**compile_settings: Any) -> Any:
        """The naive side's model (same seed, optimizer, schedule), under the strategy."""
        with run.strategy.scope():
            return _compiled_model(run, data, **compile_settings)

    result = _tune(build_compiled, train, sizes, log_dir)
    changes = _tfgpu_changes(run, result)
    _say("[4/5] tfgpu: " + "; ".join(changes))
    keras.mixed_precision.set_global_policy(result.settings.get("precision", run.config.precision))
    model = build_compiled(**{k: v for k, v in result.settings.items() if k in _COMPILE_SETTINGS})
    digest = workload.weights_digest(model)
    train = result.dataset  # the pipeline rebuilt with the kept settings, or as it was
    trained = _train(model, train, data.test, run=run, log_dir=log_dir)
    recipe = workload.read_recipe(model, global_batch=run.global_batch, initial_digest=digest)
    _say("[5/5] tfgpu.diagnose(tfgpu model, tfgpu pipeline) again, after training")
    after = _diagnose(
        model, train, sizes, log_dir, check_xla=False, check_steps_per_execution=False
    )
    figures = side_figures(**trained, input_wait_share=after.input_wait_share, on_gpu=run.on_gpu)
    return _Side(figures, recipe, after, result), changes


def _compiled_model(run: _Run, data: workload.Data, **compile_settings: Any) -> Any:
    """The reference model with its seeded initial weights, compiled as on both sides: the
    naive side's global batch, hence its learning rate (no replica scaling)."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = workload.build_model(run.sizes, data.num_classes)
    model.compile(
        keras.optimizers.Adam(workload.learning_rate(run.total_steps)),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
        **compile_settings,
    )
    return model


def _tune(factory: Any, train: Any, sizes: Sizes, log_dir: Path) -> TuneResult:
    """`tfgpu.tune()` with the demo's budget; prints its table and the waterfall."""
    import tfgpu

    result = tfgpu.tune(
        factory, train, time_budget_s=sizes.tune_budget_s, log_dir=log_dir, verbose=0
    )
    _say("  " + str(result).replace("\n", "\n  "))
    _say("  what each kept setting gave on this machine:")
    _say("  " + "\n  ".join(waterfall_lines(result)))
    return result


def _compare(
    run: _Run, data: workload.Data, naive: _Side, tuned: _Side, changes: list[str], path: Path
) -> None:
    """Writes the reports and `demo.json`, then prints the table and where the run is."""
    import tfgpu

    table = format_table(naive.figures, tuned.figures, on_gpu=run.on_gpu, epochs=run.sizes.epochs)
    reports = {"naive": _write_report(path / "naive"), "tfgpu": _write_report(path / "tfgpu")}
    result = {
        "tfgpu_version": tfgpu.__version__,
        "device": run.device,
        "data": data.source,
        "sizes": dataclasses.asdict(run.sizes),
        "configuration": run.config.to_dict(),
        "tfgpu_settings": changes,
        "diagnosis_before": [f.kind for f in naive.diagnosis.findings],
        "tune": tuned.tuning.to_dict() if tuned.tuning is not None else None,
        "naive": naive.to_dict(),
        "tfgpu": tuned.to_dict(),
        "speedup": dataclasses.asdict(speedups(naive.figures, tuned.figures)),
        "table": table,
        "reports": reports,
    }
    (path / "demo.json").write_text(json.dumps(json_safe(result), indent=2))
    _say("\n" + table)
    if not run.on_gpu:
        _say(
            "\nNo GPU here: both sides ran on the CPU, so GPU utilization and MFU are n/a; on "
            "a GPU the naive input pipeline starves the device far more."
        )
    _say(f"\nRun directory: {path.resolve()}")
    _say(
        "  demo.json, naive/ and tfgpu/ (timeline.csv, steps.csv, diagnosis.json, report.md; "
        "tfgpu/ also tune.json, tune.png)"
    )
    for side, report in reports.items():
        if report:
            _say(f"  {side} report: {report}")


def _diagnose(model: Any, train: Any, sizes: Sizes, log_dir: Path, **checks: bool) -> Diagnosis:
    """`tfgpu.diagnose()` with the demo's step counts and `checks`, printed indented."""
    from tfgpu.diagnosis import diagnose

    steps, warmup = sizes.diagnose_steps, sizes.diagnose_warmup
    diagnosis = diagnose(model, train, steps=steps, warmup=warmup, log_dir=log_dir, **checks)
    _say("  " + str(diagnosis).replace("\n", "\n  "))
    return diagnosis


def _callbacks(log_dir: Path, global_batch: int) -> list[Any]:
    """GPUMonitor and StepTimer into `log_dir`; StepTimer works out MFU on a known GPU."""
    from tfgpu.callbacks import GPUMonitor, StepTimer

    return [GPUMonitor(log_dir=log_dir), StepTimer(batch_size=global_batch, log_dir=log_dir)]


def _train(model: Any, train: Any, test: Any, *, run: _Run, log_dir: Path) -> dict[str, Any]:
    """Fits (one progress line per epoch) and evaluates: what `side_figures` takes of it."""
    callbacks = _callbacks(log_dir, run.global_batch)
    start = time.perf_counter()
    with warnings.catch_warnings():
        if not run.on_gpu:  # the demo says so itself, once, with the table
            warnings.filterwarnings(
                "ignore", "tfgpu.monitor records no GPU metrics", RuntimeWarning
            )
        history = model.fit(
            train, epochs=run.sizes.epochs, verbose=2, shuffle=False, callbacks=callbacks
        )
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(test, verbose=0)
    return {"history": history.history, "wall_time_s": seconds, "test_accuracy": float(accuracy)}


def _write_report(log_dir: Path) -> str | None:
    try:
        from tfgpu.report import write_report

        return str(write_report(log_dir))
    except Exception as e:  # the report is a side feature: the run itself is done
        _say(f"  (report for {log_dir} not written: {e})")
        return None


def _strategy_name(strategy: Any) -> str:
    name = type(strategy).__name__.lstrip("_")
    if name == "DefaultDistributionStrategy":
        name = "default strategy"
    replicas = int(strategy.num_replicas_in_sync)
    return f"{name} ({replicas} replica{'s' if replicas != 1 else ''})"


def _say(*parts: Any) -> None:
    """Prints at once (progress stays visible when the output is piped, e.g. to `tee`)."""
    print(*parts, flush=True)
