"""`tfgpu demo`: the pure decisions (sizes, the table, tune's waterfall), argument
checks before any work, the TFDS loader on a dataset built here, and the whole demo for real
in its quick mode (a subprocess: `configure()` needs a fresh TensorFlow runtime)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, prepare_tfds
from tfgpu import demo
from tfgpu._internal.measure.rules import Gain
from tfgpu.demo import _args, _plan, _results, _run, _workload
from tfgpu.tuning import Trial, TuneResult

# ---- sizes ---------------------------------------------------------------------------------


def test_sizes_scale_with_the_hardware():
    quick = _plan.choose_sizes(quick=True, num_gpus=0)
    cpu = _plan.choose_sizes(quick=False, num_gpus=0)
    one = _plan.choose_sizes(quick=False, num_gpus=1)
    four = _plan.choose_sizes(quick=False, num_gpus=4)
    assert quick.num_train < cpu.num_train < one.num_train < four.num_train
    assert quick.epochs == 2 and not quick.check_xla
    assert cpu.image_size < one.image_size and cpu.width < one.width
    assert cpu.per_replica_batch < one.per_replica_batch
    for sizes, replicas in ((quick, 1), (cpu, 1), (one, 1), (four, 4)):
        assert sizes.num_train % (sizes.per_replica_batch * replicas) == 0  # no partial batch
        assert sizes.width % 8 == 0 or sizes.width == 8
        assert sizes.stored_size >= sizes.resize_to > sizes.image_size  # real resize + crop


def test_epochs_override():
    assert _plan.choose_sizes(quick=True, num_gpus=0, epochs=7).epochs == 7
    assert _plan.choose_sizes(quick=False, num_gpus=2, epochs=1).epochs == 1


# ---- tune's waterfall and the augmentation it can move after the batching -----------------


def test_sizes_give_tune_a_budget_and_a_quick_one():
    quick = _plan.choose_sizes(quick=True, num_gpus=0)
    cpu = _plan.choose_sizes(quick=False, num_gpus=0)
    assert 0 < quick.tune_budget_s < cpu.tune_budget_s


def test_waterfall_shows_each_kept_setting_then_the_verified_total():
    result = TuneResult(
        trials=[
            Trial("steps_per_execution=4", {"steps_per_execution": 4}, Gain(1.5, 1.4, 1.6), "kept"),
            Trial("jit_compile=True", {"jit_compile": True}, Gain(0.5, 0.4, 0.6), "slower"),
            Trial(
                "precision mixed_bfloat16",
                {"precision": "mixed_bfloat16"},
                Gain(1.5, 1.3, 1.6),
                "kept",
            ),
        ],
        baseline_examples_per_s=1000.0,
        tuned_examples_per_s=1440.0,
        speedup=Gain(1.44, 1.4, 1.5),  # verified together: less than 1.5 x 1.5
    )
    lines = _results.waterfall_lines(result, width=20)
    assert [line.split("  ")[0] for line in lines] == [
        "baseline",
        "+ steps_per_execution=4",
        "+ precision mixed_bfloat16",
        "tuned (verified together)",
    ]
    # Equal measured gains: equal steps, scaled to end at the verified total (1.2 x 1.2).
    assert "1,200 ex/s" in lines[1] and "measured x1.50 against the best before it" in lines[1]
    assert "1,440 ex/s" in lines[2] and "#" * 20 in lines[2]  # the longest bar
    assert "1,440 ex/s" in lines[3] and "x1.44 (1.40-1.50)" in lines[3]
    assert "jit_compile" not in "\n".join(lines)


def test_waterfall_with_nothing_verified_keeps_the_steps_flat():
    result = TuneResult(
        trials=[Trial("steps_per_execution=4", {}, Gain(1.3, 1.2, 1.4), "kept")],
        baseline_examples_per_s=500.0,
        tuned_examples_per_s=500.0,
    )
    lines = _results.waterfall_lines(result)
    assert all("500 ex/s" in line for line in lines)


def test_waterfall_without_a_measured_baseline_says_so():
    lines = _results.waterfall_lines(TuneResult(trials=[]))
    assert len(lines) == 1 and "could not time the baseline" in lines[0]


def test_augment_takes_one_image_or_a_batch_each_image_its_own_crop():
    import tensorflow as tf

    augment = _workload.augment_fn(4)
    image = tf.reshape(tf.range(6 * 6 * 3, dtype=tf.float32), (6, 6, 3))
    one, label = augment(image, 3)
    assert one.shape == (4, 4, 3) and label == 3
    batch = tf.stack([image] * 64)
    out, labels = augment(batch, tf.range(64))
    assert out.shape == (64, 4, 4, 3) and labels.shape == (64,)
    # Each image a crop of the original (plus one brightness delta in [-0.1, 0.1)) ...
    top_left = out[:, 0, 0, 0].numpy()
    corner = top_left - np.round(top_left / 3) * 3  # offsets are multiples of 3 (channels)
    assert np.all(np.abs(corner) <= 0.1 + 1e-6)
    # ... and not the same crop for the whole batch.
    assert len(set(np.round(top_left).tolist())) > 1


# ---- figures and the table -----------------------------------------------------------------


def _history(rates, steps, acc):
    return {
        "examples_per_s": rates,
        "step_time_median_s": steps,
        "accuracy": acc,
        "host_cpu_pct_mean": [50.0] * len(rates),
    }


def test_side_summary_uses_steady_epochs():
    summary = _results.side_figures(
        _history([10.0, 100.0, 200.0], [1.0, 0.02, 0.01], [0.2, 0.6, 0.9]),
        wall_time_s=12.0,
        test_accuracy=0.88,
        input_wait_share=0.4,
        on_gpu=False,
    )
    assert summary.examples_per_s == 150.0  # the first epoch (tracing, cache) is left out
    assert summary.step_time_s == pytest.approx(0.015)
    assert summary.gpu_util_pct is None and summary.mfu is None
    assert summary.train_accuracy == [0.2, 0.6, 0.9]


def test_table_on_cpu_says_no_gpu_and_gives_the_speedup():
    naive = _results.side_figures(
        _history([1.0, 1000.0], [1.0, 0.064], [0.3, 0.8]),
        wall_time_s=30.0,
        test_accuracy=0.81,
        input_wait_share=0.55,
        on_gpu=False,
    )
    tuned = _results.side_figures(
        _history([1.0, 2500.0], [1.0, 0.0256], [0.3, 0.85]),
        wall_time_s=15.0,
        test_accuracy=0.84,
        input_wait_share=0.05,
        on_gpu=False,
    )
    assert _results.speedups(naive, tuned) == _results.Speedups(wall_time=2.0, examples_per_s=2.5)
    table = _results.format_table(naive, tuned, on_gpu=False, epochs=2)
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert "n/a (no GPU)" in lines["GPU utilization"] and "n/a (no GPU)" in lines["MFU"]
    assert "1,000" in lines["examples/s (steady state)"]
    assert "2,500" in lines["examples/s (steady state)"]
    assert "55%" in lines["input-wait share"] and "5%" in lines["input-wait share"]
    assert "64.0 ms" in lines["step time (median)"]
    assert "0.810" in lines["final accuracy (test)"]
    assert "2.00x" in lines["speedup"] and "2.50x by examples/s" in lines["speedup"]


def test_table_on_gpu_shows_utilization_and_mfu():
    history = _history([1.0, 1000.0], [1.0, 0.01], [0.5, 0.9])
    history["gpu_util_pct_mean"] = [10.0, 92.0]
    history["mfu"] = [0.01, 0.314]
    side = _results.side_figures(
        history, wall_time_s=5.0, test_accuracy=0.9, input_wait_share=0.01, on_gpu=True
    )
    table = _results.format_table(side, side, on_gpu=True, epochs=2)
    assert "92%" in table and "31.4%" in table and "n/a (no GPU)" not in table


def test_missing_figures_print_as_na():
    side = _results.side_figures(
        {}, wall_time_s=1.0, test_accuracy=math.nan, input_wait_share=None, on_gpu=False
    )
    table = _results.format_table(side, side, on_gpu=False, epochs=1)
    assert "input-wait share" in table and " n/a" in table


def test_demo_json_stores_each_side_as_its_figures_then_its_recipe():
    figures = _results.side_figures(
        _history([1.0, 100.0], [1.0, 0.02], [0.5, 0.9]),
        wall_time_s=3.0,
        test_accuracy=0.9,
        input_wait_share=0.2,
        on_gpu=False,
    )
    recipe = _results.Recipe(
        global_batch=32,
        steps_trained=32,
        learning_rate={"decay_steps": 32},
        initial_weights_sha256="ab",
    )
    side = _run._Side(figures, recipe, diagnosis=None)  # type: ignore[arg-type]
    stored = side.to_dict()
    assert list(stored) == [
        "examples_per_s",
        "step_time_s",
        "input_wait_share",
        "gpu_util_pct",
        "mfu",
        "host_cpu_pct",
        "train_time_s",
        "train_accuracy",
        "test_accuracy",
        "recipe",
    ]
    assert stored["recipe"] == {
        "global_batch": 32,
        "steps_trained": 32,
        "learning_rate": {"decay_steps": 32},
        "initial_weights_sha256": "ab",
    }
    assert json.loads(json.dumps(stored))["examples_per_s"] == 100.0


# ---- argument checks: before any work ------------------------------------------------------


def test_run_demo_takes_keyword_arguments_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="positional argument"):
        demo.run_demo(True)  # type: ignore[misc]
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"epochs": 0}, ValueError, "Received: epochs=0"),
        ({"epochs": -1}, ValueError, "Received: epochs=-1"),
        ({"epochs": np.int64(0)}, ValueError, "argument `epochs`"),
        ({"epochs": 2.5}, TypeError, r"Received: epochs=2\.5 \(of type float\)"),
        ({"epochs": np.float64(2.0)}, TypeError, "argument `epochs`"),
        ({"epochs": "3"}, TypeError, "argument `epochs`"),
        ({"epochs": True}, TypeError, "argument `epochs`"),
        ({"quick": "yes"}, TypeError, "argument `quick`"),
        ({"quick": None}, TypeError, "argument `quick`"),
        ({"dataset": ""}, ValueError, "argument `dataset`"),
        ({"dataset": "  "}, ValueError, "argument `dataset`"),
        ({"dataset": 10}, TypeError, "Received: dataset=10"),
        ({"log_dir": 3}, TypeError, "argument `log_dir`"),
        ({"log_dir": 123}, TypeError, "Received: log_dir=123"),
        ({"log_dir": b"runs/x"}, TypeError, "argument `log_dir`"),
        ({"log_dir": ""}, ValueError, "argument `log_dir`"),
        ({"log_dir": "{file}"}, ValueError, r"argument `log_dir`.*is a file"),
        ({"log_dir": "{file}/run"}, ValueError, r"argument `log_dir`.*is under the file"),
    ],
)
def test_bad_arguments_raise_before_any_work(kwargs, error, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep")
    kwargs = {
        k: v.format(file=tmp_path / "notes.txt") if isinstance(v, str) else v
        for k, v in kwargs.items()
    }
    with pytest.raises(error, match=match):
        demo.run_demo(**kwargs)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # nothing written
    assert (tmp_path / "notes.txt").read_text() == "keep"


def test_a_log_dir_that_holds_anything_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "old.csv").write_text("x")
    with pytest.raises(ValueError, match=r"is not empty, and a demo never writes into an earlier"):
        demo.run_demo(log_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["old.csv"]
    assert (tmp_path / "old.csv").read_text() == "x"
    (tmp_path / "empty").mkdir()
    assert _args.check_arguments(False, None, tmp_path / "empty", None) == tmp_path / "empty"
    assert (
        _args.check_arguments(False, None, tmp_path / "new" / "run", 3) == tmp_path / "new" / "run"
    )


def test_the_default_log_dir_never_reuses_an_earlier_run(tmp_path, monkeypatch):
    import datetime

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2025, 1, 2, 3, 4, 5)

    monkeypatch.chdir(tmp_path)
    from tfgpu._internal.helpers import files

    monkeypatch.setattr(files.datetime, "datetime", Frozen)
    first = _args.check_arguments(False, None, None, None)
    assert first == Path("runs/demo-20250102-030405") and not first.exists()
    first.mkdir(parents=True)
    (first / "demo.json").write_text("{}")
    second = _args.check_arguments(False, None, None, None)
    assert second == Path("runs/demo-20250102-030405-2")
    assert (first / "demo.json").read_text() == "{}"
    # `runs` a file: refused before any work.
    (first / "demo.json").unlink()
    first.rmdir()
    (tmp_path / "runs").rmdir()
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(ValueError, match=r"is under the file 'runs'"):
        _args.check_arguments(False, None, None, None)


def test_a_log_dir_filled_after_the_check_is_still_refused(tmp_path):
    run = tmp_path / "run"
    _args.claim_log_dir(run)  # new: created
    assert run.is_dir()
    (run / "timeline.csv").write_text("another run's data")
    with pytest.raises(ValueError, match="is not empty"):
        _args.claim_log_dir(run)
    assert (run / "timeline.csv").read_text() == "another run's data"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--epochs", "0"], "Received: --epochs=0"),
        (["demo", "--epochs", "-1"], "Received: --epochs=-1"),
        (["demo", "--epochs", "2.5"], "argument --epochs: invalid int value: '2.5'"),
        (["demo", "--dataset", ""], "argument `--dataset`"),
        (["demo", "--log-dir", "{full}"], "is not empty, and a demo never writes"),
        (["demo", "--log-dir", "{full}"], "argument `--log-dir`. Received: --log-dir="),
        (["demo", "--log-dir", "{full}"], "or leave --log-dir out for a fresh runs/demo-"),
        (["demo", "--log-dir", "{full}/timeline.csv"], "is a file"),
    ],
)
def test_cli_bad_arguments_get_usage_and_exit_2_before_tensorflow(
    argv, message, tmp_path, capsys, monkeypatch
):
    from tfgpu import cli

    (tmp_path / "timeline.csv").write_text("earlier run")
    monkeypatch.setattr(cli, "_load_tensorflow", lambda: pytest.fail("TensorFlow loaded"))
    monkeypatch.setattr(demo, "run_demo", lambda **kw: pytest.fail("the demo started"))
    with pytest.raises(SystemExit) as e:
        cli.main([a.format(full=tmp_path) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tfgpu demo" in err and "tfgpu demo: error:" in err and message in err
    assert "Traceback" not in err
    assert (tmp_path / "timeline.csv").read_text() == "earlier run"


@pytest.mark.slow
def test_cli_argument_errors_never_import_tensorflow(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    code = (
        "import sys\n"
        "from tfgpu.cli import main\n"
        "for argv in (['demo', '--epochs', '-1'], ['demo', '--log-dir', sys.argv[1]],\n"
        "             ['report', sys.argv[1] + '/old.txt']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        print(e.code)\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert result.stdout.split() == ["2", "2", "2", "[]"], result.stderr[-2000:]
    assert result.stderr.count("usage: tfgpu") == 3 and "Traceback" not in result.stderr


# ---- TFDS ----------------------------------------------------------------------------------


def test_tfds_examples_become_jpegs_of_one_size(tmp_path):
    import tensorflow as tf

    splits = {"train": range(12)}
    prepare_tfds(tmp_path, "tfgpu_demo_shapes", side=20, classes=3, splits=splits, level=20)
    jpegs, labels, num_classes = _workload.tfds_jpegs(
        "tfgpu_demo_shapes", 10, 16, data_dir=str(tmp_path)
    )
    assert num_classes == 3
    assert jpegs.shape == (10,) and labels.dtype == np.int32
    assert set(labels.tolist()) <= {0, 1, 2}
    image = tf.io.decode_jpeg(jpegs[0], channels=3)
    assert image.shape == (16, 16, 3)  # grayscale, resized, decodable as RGB
    pixels = image.numpy().astype(float)
    assert pixels.std() < 3 and round(pixels.mean() / 20) * 20 == pytest.approx(
        pixels.mean(), abs=3
    )
    with pytest.raises(ValueError, match="Expected at least 50"):
        _workload.tfds_jpegs("tfgpu_demo_shapes", 50, 16, data_dir=str(tmp_path))


@pytest.mark.slow
def test_cli_demo_with_a_dataset_that_is_not_here_fails_clearly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tfgpu", "demo", "--quick", "--dataset", "cifar10"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
        env={**_env(), "TFDS_DATA_DIR": str(tmp_path / "tfds")},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "tfgpu demo: error:" in result.stderr
    assert "'cifar10' is not prepared" in result.stderr and "tfds build cifar10" in result.stderr


# ---- the demo, for real --------------------------------------------------------------------


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.mark.slow
def test_quick_demo_trains_both_sides_and_writes_the_run(tmp_path):
    log_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "tfgpu", "demo", "--quick", "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env=_env(),
    )
    out = result.stdout
    assert result.returncode == 0, f"{out[-3000:]}\n{result.stderr[-3000:]}"
    # Progress while training: Keras prints one line per epoch, per side.
    assert out.count("Epoch 2/2") == 2
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"):
        assert step in out
    assert "bottleneck =" in out  # the diagnosis is printed
    assert "tune: each setting against the best so far" in out  # tune's table
    # and its waterfall (verified together unless the budget ran out first: the machine's load)
    assert "tuned (verified together)" in out or "tuned (not verified together)" in out

    summary = json.loads((log_dir / "demo.json").read_text())
    assert summary["table"] in out  # the printed table is the stored one
    for side in ("naive", "tfgpu"):
        figures = summary[side]
        assert figures["examples_per_s"] > 0 and figures["step_time_s"] > 0
        assert figures["train_time_s"] > 0
        assert 0.0 <= figures["input_wait_share"] <= 1.0
        assert 0.0 <= figures["test_accuracy"] <= 1.0
        assert len(figures["train_accuracy"]) == 2
        directory = log_dir / side
        for name in ("run.json", "timeline.csv", "steps.csv", "diagnosis.json", "report.md"):
            assert (directory / name).exists(), (side, name)
        steps = (directory / "steps.csv").read_text().splitlines()
        assert steps[0] == "time,epoch,step,step_time_s,examples_per_s" and len(steps) > 2
    # The tfgpu side's settings come from tfgpu.tune: its table, tune.json and its result.
    assert (log_dir / "tfgpu" / "tune.json").exists()
    tune = summary["tune"]
    assert tune["speedup"]["value"] >= 1.0 and {t["name"] for t in tune["trials"]} >= {
        "jit_compile=True"
    }
    # Both sides train the same model the same way: same initial weights, global batch,
    # number of steps (none dropped, none skipped by the diagnosis) and learning rate.
    naive_recipe, tfgpu_recipe = summary["naive"]["recipe"], summary["tfgpu"]["recipe"]
    assert naive_recipe == tfgpu_recipe
    assert naive_recipe["steps_trained"] == 2 * 512 // naive_recipe["global_batch"]
    assert naive_recipe["learning_rate"]["decay_steps"] == naive_recipe["steps_trained"]
    # Same data and epochs on both sides; the speedups are measured, not assumed.
    assert summary["speedup"]["wall_time"] > 0 and summary["speedup"]["examples_per_s"] > 0
    assert any("tfgpu.data.pipeline" in s for s in summary["tfgpu_settings"])
    if not summary["configuration"]["gpus"]:
        assert "n/a (no GPU)" in summary["table"]
        assert summary["naive"]["gpu_util_pct"] is None
    assert str(log_dir.resolve()) in out


# ---- the synthetic data --------------------------------------------------------------------


def _orientation_by_fft(images: np.ndarray, num_classes: int) -> np.ndarray:
    """Each image's class read from the peak of its 2-D power spectrum (no learning)."""
    from tfgpu.demo._synthetic import class_angles

    gray = images.astype(np.float32).mean(axis=-1)
    gray -= gray.mean(axis=(1, 2), keepdims=True)
    power = np.abs(np.fft.fftshift(np.fft.fft2(gray), axes=(1, 2))) ** 2
    size = images.shape[1]
    ky, kx = np.mgrid[0:size, 0:size] - size // 2
    power[:, size // 2, size // 2] = 0
    peak = power.reshape(len(images), -1).argmax(axis=1)
    angle = np.arctan2(ky.ravel()[peak], kx.ravel()[peak]) % np.pi
    distance = np.abs(angle[:, None] - class_angles(num_classes)[None, :])
    distance = np.minimum(distance, np.pi - distance)
    return distance.argmin(axis=1)


@pytest.mark.slow
def test_synthetic_classes_differ_only_by_a_noisy_orientation():
    from tfgpu.demo._synthetic import make_images

    images, labels = make_images(2000, num_classes=10, size=64, seed=3)
    assert images.shape == (2000, 64, 64, 3) and images.dtype == np.uint8
    assert set(np.unique(labels)) == set(range(10))
    # Not solvable from colour: a nearest-class-mean on the mean RGB is near chance (0.1).
    colour = images.reshape(len(images), -1, 3).mean(axis=1)
    train, test = slice(0, 1000), slice(1000, None)
    means = np.stack([colour[train][labels[train] == c].mean(axis=0) for c in range(10)])
    guess = np.linalg.norm(colour[test][:, None] - means[None], axis=-1).argmin(axis=1)
    assert (guess == labels[test]).mean() < 0.2
    # Noisy: the pixel noise is larger than the stripes' own swing.
    residual = images.astype(np.float32) - images.astype(np.float32).mean(
        axis=(1, 2), keepdims=True
    )
    assert residual.std() / 255 > 0.3
    # Yet the orientation is there: read off the spectrum, it names the class most times.
    accuracy = (_orientation_by_fft(images, 10) == labels).mean()
    assert 0.8 < accuracy < 1.0, accuracy


def test_synthetic_data_is_reproducible_and_jpeg_encoded():
    from tfgpu.demo._synthetic import make_images, make_jpegs

    a, la = make_images(8, size=32, seed=1)
    b, lb = make_images(8, size=32, seed=1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    jpegs, labels = make_jpegs(8, size=32, seed=1)
    np.testing.assert_array_equal(labels, la)
    assert jpegs.dtype == object and all(j[:2] == b"\xff\xd8" for j in jpegs)  # JPEG magic


# ---- the demo's callbacks ------------------------------------------------------------------


def test_demo_callbacks_take_mfu_from_step_timer_for_the_visible_gpu(tmp_path, monkeypatch):
    import keras
    import tensorflow as tf

    from tests import fake_pynvml
    from tfgpu import flops
    from tfgpu.callbacks import step_timer

    # NVML: GPU 0 an A100, GPU 1 a V100; this process is given only the V100, which
    # TensorFlow lists as its one GPU (this CPU stands in for it).
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    list_physical, get_visible = tf.config.list_physical_devices, tf.config.get_visible_devices
    monkeypatch.setattr(
        tf.config,
        "list_physical_devices",
        lambda kind=None: [gpu] if kind == "GPU" else list_physical(kind),
    )
    monkeypatch.setattr(
        tf.config,
        "get_visible_devices",
        lambda kind=None: [gpu] if kind == "GPU" else get_visible(kind),
    )
    monkeypatch.setattr(step_timer, "_trains_on_gpu", lambda: True)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((128, 8), dtype="float32")
    history = model.fit(
        x, x[:, :1], batch_size=32, epochs=1, verbose=0, callbacks=_run._callbacks(tmp_path, 32)
    )
    median = history.history["step_time_median_s"][0]
    v100 = flops.peak_flops("Tesla V100-SXM2-16GB", "float32")
    expected = flops.train_step_flops(model, 32) / median / v100
    assert history.history["mfu"][0] == pytest.approx(expected, rel=1e-9)
    assert (tmp_path / "steps.csv").exists() and (tmp_path / "timeline.csv").exists()
