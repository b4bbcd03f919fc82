"""`tfgpu demo`: train one reference model naively, then with tfgpu, and compare.

The same small image classifier trains twice on the same JPEG-encoded data, the same way:
the same initial weights (seeded just before each model is built), the same augmentation, the
same global batch, the same number of steps and the same learning-rate schedule (Adam, cosine
decay to zero over the run, so the final weights do not depend on where the last epoch
happened to stop in a noisy descent). Only how the work is done differs:

1. **naive**, as a typical Keras user writes it: float32, `Dataset.from_tensor_slices(...)
   .shuffle(...).map(decode_and_augment).batch(...)` (no `num_parallel_calls`, no
   `prefetch`, every image decoded again every epoch; TensorFlow's default tf.data
   rewrites stay on, as they would for that user), `steps_per_execution=1`, no strategy
   (one device takes the whole global batch).
   `tfgpu.diagnose()` measures this setup first and says what holds it back.
2. **tfgpu**: `tfgpu.configure()` (memory growth, the precision policy for the GPU),
   `tfgpu.strategy()` (all GPUs), `tfgpu.data.pipeline(...)` (parallel decode, cache of the
   decoded images, shuffle, parallel augmentation, prefetch), plus the settings the
   diagnosis recommends (e.g. `steps_per_execution`, `jit_compile`). `tfgpu.diagnose()` runs
   again after training to measure what is left.

Both sides run with `GPUMonitor` and `StepTimer`. `demo.json` records each side's recipe
(global batch, steps trained, learning rate, a digest of the initial weights), so that the
sameness is checked, not assumed. The demo prints a side-by-side table
(examples/s, step time, input-wait share, GPU utilization and MFU where a GPU exists, final
test accuracy, speedup) and writes a run directory:

```
RUN_DIR/demo.json            the table and every figure behind it, the settings applied
RUN_DIR/naive/, RUN_DIR/tfgpu/
    run.json, timeline.csv   GPUMonitor (GPU and host samples)
    steps.csv                StepTimer (per-step times)
    diagnosis.json           tfgpu.diagnose()
    report.md, *.png         tfgpu.report.write_report()
```

The data is generated offline (`tfgpu._synthetic`: ten learnable stripe patterns, stored as
JPEG bytes so the input pipeline does real decode work), or read from TensorFlow Datasets
with `dataset=` (e.g. `"cifar10"`, when prepared on disk). Sizes scale with the hardware:
a few minutes on a 2-core CPU, larger data and model on GPUs, seconds with `quick=True`.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from tfgpu._checks import check_bool, check_dir, check_int, invalid_type, invalid_value
from tfgpu._json import json_safe

__all__ = ["run_demo"]

_SEED = 0
_NUM_CLASSES = 10
_LEARNING_RATE = 2e-3
_NA_GPU = "n/a (no GPU)"
# Settings a diagnosis finding maps to (finding kind -> what the demo changes).
_KNOBS = ("host_overhead", "xla")


# ----------------------------------------------------------------------------------------
# Pure decisions


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """How big the demo runs. Chosen by `_choose_sizes` from the hardware."""

    num_train: int  # examples per epoch (a multiple of the largest global batch)
    num_test: int
    stored_size: int  # side of the stored JPEGs
    image_size: int  # side of the model input (random crop of the resized image)
    per_replica_batch: int
    width: int  # filters of the first conv layer (then 2x, 4x); a multiple of 8
    epochs: int
    diagnose_steps: int
    diagnose_warmup: int
    check_xla: bool

    @property
    def resize_to(self) -> int:
        """Side the decoded image is resized to, before the random crop (+12.5%)."""
        return self.image_size + self.image_size // 8


def _choose_sizes(*, quick: bool, num_gpus: int, epochs: int | None = None) -> _Sizes:
    """Returns the demo's sizes for the hardware. Pure.

    Args:
        quick: bool, a tiny run for tests (seconds).
        num_gpus: int, GPUs TensorFlow sees (0 on the CPU).
        epochs: int or None, epochs per side. Defaults to None (2 quick, 8 on the CPU, 5 on GPUs).

    Returns:
        `_Sizes`; `num_train` is a multiple of the global batch on up to 8 replicas.
    """
    if quick:
        sizes = _Sizes(
            num_train=512,
            num_test=256,
            stored_size=48,
            image_size=24,
            per_replica_batch=32,
            width=8,
            epochs=2,
            diagnose_steps=3,
            diagnose_warmup=1,
            check_xla=False,
        )
    elif num_gpus == 0:
        # Under a minute per side on 2 cores (8 epochs of 128 steps). The images are stored larger than the model
        # input (as in most datasets) and the model is small next to their decoding, as a
        # GPU's step is short next to a CPU input pipeline.
        sizes = _Sizes(
            num_train=8192,
            num_test=1024,
            stored_size=128,
            image_size=32,
            per_replica_batch=64,
            width=8,
            epochs=8,
            diagnose_steps=20,
            diagnose_warmup=3,
            check_xla=True,
        )
    else:
        replicas = min(num_gpus, 8)
        batch = 256
        steps = 80  # per epoch, on all GPUs together
        sizes = _Sizes(
            num_train=steps * batch * replicas,
            num_test=4096,
            stored_size=128,
            image_size=96,
            per_replica_batch=batch,
            width=32,
            epochs=5,
            diagnose_steps=20,
            diagnose_warmup=3,
            check_xla=True,
        )
    if epochs is not None:
        sizes = dataclasses.replace(sizes, epochs=epochs)
    return sizes


@dataclasses.dataclass(frozen=True)
class _Settings:
    """What the tfgpu side changes because the diagnosis recommends it."""

    steps_per_execution: int = 1
    jit_compile: bool | str = "auto"
    applied: tuple[str, ...] = ()


def _settings_from(findings: list[Any], *, jit_compile_now: bool) -> _Settings:
    """Turns diagnosis findings into compile settings for the tfgpu side. Pure.

    `host_overhead` -> `steps_per_execution` (the probed value); `xla` -> `jit_compile`
    flipped from what the naive model used. Other findings are about the input pipeline
    (which the tfgpu side replaces anyway), precision (which `configure()` sets) or the
    batch size (kept equal on both sides, so they train on the same examples).

    Args:
        findings: list of `tfgpu.diagnosis.Finding` (anything with `kind`).
        jit_compile_now: bool, whether the diagnosed model ran with XLA.

    Returns:
        `_Settings`, with `applied` naming each change and why.
    """
    from tfgpu.diagnosis import PROBE_STEPS_PER_EXECUTION

    spe = 1
    jit: bool | str = "auto"
    applied: list[str] = []
    for finding in findings:
        if finding.kind == "host_overhead" and spe == 1:
            spe = PROBE_STEPS_PER_EXECUTION
            applied.append(f"steps_per_execution={spe} ({finding.title})")
        elif finding.kind == "xla" and jit == "auto":
            jit = not jit_compile_now
            applied.append(f"jit_compile={jit} ({finding.title})")
    return _Settings(steps_per_execution=spe, jit_compile=jit, applied=tuple(applied))


def _learning_rate(total_steps: int):
    """The learning-rate schedule of both sides: cosine decay from 2e-3 to 0 over the run.

    At a constant rate the test accuracy after the last epoch swings by several points from
    one epoch to the next (measured on the CPU demo: 0.83 to 0.94), so a comparison of two
    runs would mostly compare where each happened to stop; annealed to zero, both end at
    their converged accuracy.
    """
    import keras

    return keras.optimizers.schedules.CosineDecay(_LEARNING_RATE, decay_steps=total_steps)


def _recipe(model, *, global_batch: int, initial_digest: str) -> dict[str, Any]:
    """How a side trained (after `fit`): what must be equal on both sides."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # loss scaling
    schedule = getattr(optimizer, "_learning_rate", None)
    if schedule is not None and hasattr(schedule, "get_config"):
        config = {k: v for k, v in schedule.get_config().items() if k != "name"}
    else:
        config = {"value": float(optimizer.learning_rate.numpy())}
    return {
        "global_batch": int(global_batch),
        "steps_trained": int(optimizer.iterations.numpy()),
        "learning_rate": config,
        "initial_weights_sha256": initial_digest,
    }


def _weights_digest(model) -> str:
    """SHA-256 of the model's weights (float32 bytes, in order)."""
    import hashlib

    import numpy as np

    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight, dtype=np.float32).tobytes())
    return digest.hexdigest()


def _median(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def _steady(values: list[float]) -> list[float]:
    """Epochs after the first (tracing, cache filling), or all when there is only one."""
    return values[1:] if len(values) > 1 else values


def _side_summary(
    history: dict[str, list[float]],
    *,
    wall_time_s: float,
    test_accuracy: float,
    input_wait_share: float | None,
    on_gpu: bool,
) -> dict[str, Any]:
    """The figures of one side, from its Keras history and measurements. Pure."""

    def steady(key: str, stat=_median) -> float | None:
        value = stat(_steady(list(history.get(key, []))))
        return None if math.isnan(value) else value

    accuracy = list(history.get("accuracy", []))
    summary = {
        "examples_per_s": steady("examples_per_s"),
        "step_time_s": steady("step_time_median_s"),
        "input_wait_share": input_wait_share,
        "gpu_util_pct": steady("gpu0_util_pct_mean", _mean) if on_gpu else None,
        "mfu": steady("mfu") if on_gpu else None,
        "host_cpu_pct": steady("host_cpu_pct_mean", _mean),
        "train_time_s": wall_time_s,
        "train_accuracy": [float(a) for a in accuracy],
        "test_accuracy": test_accuracy,
    }
    return summary


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _speedups(naive: dict[str, Any], tuned: dict[str, Any]) -> dict[str, float | None]:
    """tfgpu over naive: by wall time of all epochs, and by steady-state examples/s. Pure."""
    return {
        "wall_time": _ratio(naive["train_time_s"], tuned["train_time_s"]),
        "examples_per_s": _ratio(tuned["examples_per_s"], naive["examples_per_s"]),
    }


def _fmt(value: float | None, kind: str, on_gpu: bool = True) -> str:
    if kind in ("gpu", "mfu") and not on_gpu:
        return _NA_GPU
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "ms":
        return f"{value * 1e3:.1f} ms"
    if kind == "share":
        return f"{value:.0%}"
    if kind in ("gpu", "pct"):
        return f"{value:.0f}%"
    if kind == "mfu":
        return f"{value:.1%}"
    if kind == "s":
        return f"{value:.1f} s"
    if kind == "acc":
        return f"{value:.3f}"
    if kind == "x":
        return f"{value:.2f}x"
    return str(value)


def _format_table(
    naive: dict[str, Any], tuned: dict[str, Any], *, on_gpu: bool, epochs: int
) -> str:
    """The side-by-side table printed at the end (and stored in `demo.json`). Pure."""
    speed = _speedups(naive, tuned)
    rows = [
        ("examples/s (steady state)", "examples_per_s", "rate"),
        ("step time (median)", "step_time_s", "ms"),
        ("input-wait share", "input_wait_share", "share"),
        ("GPU utilization", "gpu_util_pct", "gpu"),
        ("MFU", "mfu", "mfu"),
        ("host CPU", "host_cpu_pct", "pct"),
        (f"train time ({epochs} epochs)", "train_time_s", "s"),
        ("final accuracy (test)", "test_accuracy", "acc"),
    ]
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{'':<{width}}{'naive':>16}{'tfgpu':>16}"]
    for label, key, kind in rows:
        a = _fmt(naive.get(key), kind, on_gpu)
        b = _fmt(tuned.get(key), kind, on_gpu)
        lines.append(f"{label:<{width}}{a:>16}{b:>16}")
    lines.append(
        f"{'speedup':<{width}}{'1.00x':>16}{_fmt(speed['wall_time'], 'x'):>16}"
        f"   (wall time; {_fmt(speed['examples_per_s'], 'x')} by examples/s)"
    )
    return "\n".join(lines)


def _check_run_dir(run_dir: Any) -> Path:
    """The run directory, which must be new or empty: a demo never writes into an earlier run.

    Raises:
        TypeError: if `run_dir` is not a path.
        ValueError: if it is (or is under) a file, or a directory that is not empty.
    """
    path = check_dir("run_dir", run_dir)
    assert path is not None  # check_dir returns None only with allow_none
    if path.is_dir() and any(path.iterdir()):
        raise invalid_value(
            "run_dir",
            run_dir,
            f"a new or empty directory; {str(path)!r} is not empty, and a demo never writes "
            "into an earlier run (nothing there is touched): pass another directory, or leave "
            "run_dir out for a fresh runs/demo-YYYYmmdd-HHMMSS",
        )
    return path


def check_arguments(quick: Any, dataset: Any, run_dir: Any, epochs: Any) -> Path:
    """Raises `TypeError`/`ValueError` for bad arguments, before any work (no TensorFlow).

    Returns:
        The run directory: `run_dir`, or a new `runs/demo-YYYYmmdd-HHMMSS` when it is None.
    """
    check_bool("quick", quick)
    expected = "None (offline synthetic data) or a TensorFlow Datasets name such as 'cifar10'"
    if dataset is not None and not isinstance(dataset, str):
        raise invalid_type("dataset", dataset, expected)
    if dataset is not None and not dataset.strip():
        raise invalid_value("dataset", dataset, expected)
    check_int("epochs", epochs, minimum=1, allow_none=True)
    return _check_run_dir(_default_run_dir() if run_dir is None else run_dir)


def _claim_run_dir(path: Path) -> None:
    """Creates the run directory, checking again that it is empty (another run may have
    started there since the arguments were checked)."""
    path.mkdir(parents=True, exist_ok=True)
    _check_run_dir(path)


def _strategy_name(strategy) -> str:
    name = type(strategy).__name__.lstrip("_")
    if name == "DefaultDistributionStrategy":
        name = "default strategy"
    replicas = int(strategy.num_replicas_in_sync)
    return f"{name} ({replicas} replica{'s' if replicas != 1 else ''})"


def _default_run_dir() -> Path:
    """`runs/demo-YYYYmmdd-HHMMSS`, or `...-2`, `-3`, ... when that exists already."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"demo-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


# ----------------------------------------------------------------------------------------
# Effects: data, models, training


def _tfds_jpegs(
    name: str, num_examples: int, stored_size: int, *, data_dir: str | None = None
) -> tuple[Any, Any, int]:
    """Reads `num_examples` labelled images of a TFDS dataset, as JPEG bytes of one size.

    Returns:
        (object array of JPEG bytes, int32 labels, number of classes).

    Raises:
        FileNotFoundError: when the dataset is not prepared (from `tfgpu.data.load_tfds`).
        ValueError: for an unknown name, or a dataset without image and label.
    """
    import numpy as np
    import tensorflow as tf

    import tfgpu.data

    ds, info = tfgpu.data.load_tfds(
        name, "train", data_dir=data_dir, shuffle_files=False, with_info=True
    )
    keys = info.supervised_keys
    label_feature = info.features[keys[1]] if keys else None
    num_classes = getattr(label_feature, "num_classes", None)
    if not keys or not num_classes:
        raise ValueError(
            f"Invalid value for argument `dataset`. Received: dataset={name!r}, which does not "
            "define (image, label) supervised keys with a class label. Expected an image "
            "classification dataset such as 'cifar10' or 'mnist'."
        )

    def encode(image, label):
        image = tf.image.resize(image, (stored_size, stored_size))
        image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
        return tf.io.encode_jpeg(image, quality=90), tf.cast(label, tf.int32)

    jpegs, labels = [], []
    for jpeg, label in ds.take(num_examples).map(encode, num_parallel_calls=tf.data.AUTOTUNE):
        jpegs.append(jpeg.numpy())
        labels.append(int(label))
    if len(labels) < num_examples:
        raise ValueError(
            f"Invalid value for argument `dataset`. Received: dataset={name!r} with "
            f"{len(labels)} training examples. Expected at least {num_examples}."
        )
    return np.array(jpegs, dtype=object), np.array(labels, dtype=np.int32), int(num_classes)


def _decode_fn(resize_to: int):
    import tensorflow as tf

    def decode(jpeg, label):
        image = tf.io.decode_jpeg(jpeg, channels=3)
        image = tf.image.resize(image, (resize_to, resize_to)) / 255.0
        return image, label

    return decode


def _augment_fn(image_size: int):
    import tensorflow as tf

    # No flips: a mirrored stripe pattern is another class's orientation.
    def augment(image, label):
        image = tf.image.random_crop(image, (image_size, image_size, 3))
        image = tf.image.random_brightness(image, 0.1)
        return image, label

    return augment


def _test_dataset(jpegs, labels, sizes: _Sizes):
    import tensorflow as tf

    decode = _decode_fn(sizes.resize_to)
    offset = (sizes.resize_to - sizes.image_size) // 2

    def center(jpeg, label):
        image, label = decode(jpeg, label)
        crop = tf.image.crop_to_bounding_box(
            image, offset, offset, sizes.image_size, sizes.image_size
        )
        return crop, label

    ds = tf.data.Dataset.from_tensor_slices((jpegs, labels))
    return ds.map(center, num_parallel_calls=tf.data.AUTOTUNE).batch(256).cache()


def _build_model(sizes: _Sizes, num_classes: int):
    """The reference CNN: three conv blocks, global pooling, a float32 softmax output."""
    import keras

    w = sizes.width
    inputs = keras.Input((sizes.image_size, sizes.image_size, 3), name="image")
    x = keras.layers.Conv2D(w, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(2 * w, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(4 * w, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(num_classes, name="logits")(x)
    # The output stays float32 under mixed precision (softmax and loss need the range).
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probs")(x)
    return keras.Model(inputs, outputs, name="reference_cnn")


def _callbacks(log_dir: Path, global_batch: int) -> list:
    """GPUMonitor and StepTimer into `log_dir`; StepTimer works out MFU on a known GPU."""
    from tfgpu.callbacks import GPUMonitor, StepTimer

    return [GPUMonitor(log_dir=log_dir), StepTimer(batch_size=global_batch, log_dir=log_dir)]


def _train(
    model, train_ds, test_ds, *, epochs: int, callbacks: list, on_gpu: bool
) -> tuple[dict, float, float]:
    """Fits (one progress line per epoch) and evaluates; returns (history, seconds, test acc)."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        if not on_gpu:  # the demo says so itself, once, with the table
            warnings.filterwarnings(
                "ignore", "tfgpu.monitor records no GPU metrics", RuntimeWarning
            )
        history = model.fit(train_ds, epochs=epochs, verbose=2, shuffle=False, callbacks=callbacks)
    seconds = time.perf_counter() - start
    _, accuracy = model.evaluate(test_ds, verbose=0)
    return history.history, seconds, float(accuracy)


def _say(*parts: Any) -> None:
    """Prints at once (progress stays visible when the output is piped, e.g. to `tee`)."""
    print(*parts, flush=True)


def _write_report(log_dir: Path) -> str | None:
    try:
        from tfgpu.report import write_report

        return str(write_report(log_dir))
    except Exception as e:  # the report is a side feature: the run itself is done
        _say(f"  (report for {log_dir} not written: {e})")
        return None


def run_demo(
    quick: bool = False,
    dataset: str | None = None,
    run_dir: str | os.PathLike | None = None,
    epochs: int | None = None,
) -> int:
    """Trains a reference image classifier naively, then with tfgpu, and compares them.

    Both sides train the same CNN on the same JPEG-encoded images (decoded and augmented by
    the input pipeline), with the same seed, epochs and examples. The naive side is what a
    typical Keras user writes (float32, a sequential `tf.data` map without prefetch,
    `steps_per_execution=1`, no strategy); `tfgpu.diagnose()` measures it. The tfgpu side
    uses `tfgpu.configure()`, `tfgpu.strategy()`, `tfgpu.data.pipeline(...)` and the
    settings the diagnosis recommends. Prints progress, then a side-by-side table, and
    writes the run directory (see the module docstring). Sizes follow the hardware.

    Args:
        quick: bool, a tiny run (seconds) to check that everything works. Defaults to False.
        dataset: str or None, a TensorFlow Datasets image classification dataset (e.g.
            `"cifar10"`), which must be prepared in `$TFDS_DATA_DIR` or
            `~/tensorflow_datasets`. Defaults to None: synthetic data made offline.
        run_dir: str, os.PathLike or None, a new or empty directory for the run (one
            that holds anything is refused, so an earlier run is never mixed with or
            overwritten). Defaults to None: a new `runs/demo-YYYYmmdd-HHMMSS` in the current
            directory.
        epochs: int or None, epochs per side. Defaults to None (8 on the CPU, 5 on GPUs,
            2 with `quick`).

    Returns:
        int, 0 when both sides trained and the run directory is written.

    Raises:
        TypeError: if an argument has the wrong type (`epochs=2.5`, `quick="yes"`,
            `run_dir=123`, `dataset=10`).
        ValueError: if `epochs` is not positive, `run_dir` is (or is under) a file or is a
            directory that is not empty (an earlier run is never written into), or
            `dataset` is empty or not an image classification dataset.
        FileNotFoundError: if `dataset` is not prepared on this machine (with how to get it).

    Example:

    ```python
    from tfgpu.demo import run_demo
    run_demo(quick=True, run_dir="runs/demo-quick")   # or: tfgpu demo --quick
    ```
    """
    run_path = check_arguments(quick, dataset, run_dir, epochs)
    epochs = None if epochs is None else int(epochs)  # a NumPy int counts as an int
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tfgpu

    # tfgpu: configure first, before any tensor exists (the naive side runs in float32).
    config = tfgpu.configure(seed=_SEED)

    import keras
    import tensorflow as tf

    from tfgpu._synthetic import make_jpegs
    from tfgpu.diagnosis import diagnose

    num_gpus = len(tf.config.list_physical_devices("GPU"))
    on_gpu = num_gpus > 0
    strategy = tfgpu.strategy()
    sizes = _choose_sizes(quick=quick, num_gpus=num_gpus, epochs=epochs)
    device = f"{num_gpus} GPU(s)" if on_gpu else "CPU only (no GPU visible to TensorFlow)"
    _say(f"tfgpu demo on {device}; precision for the tfgpu side: {config.precision}")

    total = sizes.num_train + sizes.num_test
    start = time.perf_counter()
    if dataset is None:
        jpegs, labels = make_jpegs(
            total, num_classes=_NUM_CLASSES, size=sizes.stored_size, seed=_SEED
        )
        num_classes, source = _NUM_CLASSES, "synthetic stripes (tfgpu._synthetic)"
    else:
        jpegs, labels, num_classes = _tfds_jpegs(dataset, total, sizes.stored_size)
        source = f"TensorFlow Datasets {dataset!r}"
    train_x, train_y = jpegs[: sizes.num_train], labels[: sizes.num_train]
    test_ds = _test_dataset(jpegs[sizes.num_train :], labels[sizes.num_train :], sizes)
    _say(
        f"data: {source}, {sizes.num_train} training + {sizes.num_test} test images as "
        f"{sizes.stored_size}x{sizes.stored_size} JPEGs, {num_classes} classes, model input "
        f"{sizes.image_size}x{sizes.image_size} ({time.perf_counter() - start:.1f} s)"
    )
    _claim_run_dir(run_path)
    naive_dir, tfgpu_dir = run_path / "naive", run_path / "tfgpu"
    decode, augment = _decode_fn(sizes.resize_to), _augment_fn(sizes.image_size)

    # ---- 1. naive ------------------------------------------------------------------------
    # Both sides: the same global batch, steps and learning-rate schedule (see _recipe).
    global_batch = tfgpu.global_batch_size(sizes.per_replica_batch, strategy)
    total_steps = sizes.epochs * (sizes.num_train // global_batch)
    _say(
        f"\n[1/4] naive: float32, .map(decode+augment) without num_parallel_calls or prefetch, "
        f"batch {global_batch}, steps_per_execution=1, no strategy"
    )
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(_SEED)
    naive_model = _build_model(sizes, num_classes)
    naive_digest = _weights_digest(naive_model)
    naive_model.compile(
        keras.optimizers.Adam(_learning_rate(total_steps)),
        "sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )

    def decode_and_augment(jpeg, label):
        return augment(*decode(jpeg, label))

    naive_train = (
        tf.data.Dataset.from_tensor_slices((train_x, train_y))
        .shuffle(sizes.num_train, seed=_SEED)
        .map(decode_and_augment)
        .batch(global_batch)
    )
    _say("[2/4] tfgpu.diagnose(naive model, naive pipeline): what holds it back")
    before = diagnose(
        naive_model,
        naive_train,
        steps=sizes.diagnose_steps,
        warmup=sizes.diagnose_warmup,
        run_dir=naive_dir,
        check_xla=sizes.check_xla,
    )
    _say("  " + str(before).replace("\n", "\n  "))
    settings = _settings_from(before.findings, jit_compile_now=bool(naive_model.jit_compile))
    _say(f"  training the naive side ({sizes.epochs} epochs):")
    history, seconds, accuracy = _train(
        naive_model,
        naive_train,
        test_ds,
        epochs=sizes.epochs,
        callbacks=_callbacks(naive_dir, global_batch),
        on_gpu=on_gpu,
    )
    naive = _side_summary(
        history,
        wall_time_s=seconds,
        test_accuracy=accuracy,
        input_wait_share=before.input_wait_share,
        on_gpu=on_gpu,
    )
    naive["recipe"] = _recipe(naive_model, global_batch=global_batch, initial_digest=naive_digest)
    del naive_model, naive_train
    gc.collect()

    # ---- 2. tfgpu ------------------------------------------------------------------------
    keras.mixed_precision.set_global_policy(config.precision)
    applied = [
        f"precision {config.precision} (tfgpu.configure)",
        f"{_strategy_name(strategy)}, global batch {global_batch} (tfgpu.strategy)",
        "tfgpu.data.pipeline: parallel decode -> cache -> shuffle -> parallel augment -> "
        "batch -> prefetch",
        *settings.applied,
    ]
    _say("\n[3/4] tfgpu: " + "; ".join(applied))
    tfgpu_train = tfgpu.data.pipeline(
        (train_x, train_y),
        batch_size=global_batch,
        strategy=strategy,
        map_fn=decode,
        augment_fn=augment,
        seed=_SEED,
    )
    with strategy.scope():
        keras.utils.set_random_seed(_SEED)  # the naive side's initial weights
        tfgpu_model = _build_model(sizes, num_classes)
        tfgpu_digest = _weights_digest(tfgpu_model)
        tfgpu_model.compile(
            # The naive side's global batch, hence its learning rate (no replica scaling).
            keras.optimizers.Adam(_learning_rate(total_steps)),
            "sparse_categorical_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=settings.steps_per_execution,
            jit_compile=settings.jit_compile,
        )
    history, seconds, accuracy = _train(
        tfgpu_model,
        tfgpu_train,
        test_ds,
        epochs=sizes.epochs,
        callbacks=_callbacks(tfgpu_dir, global_batch),
        on_gpu=on_gpu,
    )
    recipe = _recipe(tfgpu_model, global_batch=global_batch, initial_digest=tfgpu_digest)
    _say("[4/4] tfgpu.diagnose(tfgpu model, tfgpu pipeline) again, after training")
    after = diagnose(
        tfgpu_model,
        tfgpu_train,
        steps=sizes.diagnose_steps,
        warmup=sizes.diagnose_warmup,
        run_dir=tfgpu_dir,
        check_xla=False,
        check_steps_per_execution=False,
    )
    _say("  " + str(after).replace("\n", "\n  "))
    tuned = _side_summary(
        history,
        wall_time_s=seconds,
        test_accuracy=accuracy,
        input_wait_share=after.input_wait_share,
        on_gpu=on_gpu,
    )
    tuned["recipe"] = recipe

    # ---- results -------------------------------------------------------------------------
    table = _format_table(naive, tuned, on_gpu=on_gpu, epochs=sizes.epochs)
    reports = {"naive": _write_report(naive_dir), "tfgpu": _write_report(tfgpu_dir)}
    result = {
        "tfgpu_version": tfgpu.__version__,
        "device": device,
        "data": source,
        "sizes": dataclasses.asdict(sizes),
        "configuration": config.to_dict(),
        "tfgpu_settings": applied,
        "diagnosis_before": [f.kind for f in before.findings],
        "naive": naive,
        "tfgpu": tuned,
        "speedup": _speedups(naive, tuned),
        "table": table,
        "reports": reports,
    }
    (run_path / "demo.json").write_text(json.dumps(json_safe(result), indent=2))
    _say("\n" + table)
    if not on_gpu:
        _say(
            "\nNo GPU here: both sides ran on the CPU, so GPU utilization and MFU are n/a; on "
            "a GPU the naive input pipeline starves the device far more."
        )
    _say(f"\nRun directory: {run_path.resolve()}")
    _say("  demo.json, naive/ and tfgpu/ (timeline.csv, steps.csv, diagnosis.json, report.md)")
    for side, path in reports.items():
        if path:
            _say(f"  {side} report: {path}")
    return 0
