"""The batch-size finder: search order, OOM by type, memory budget, strategy, state left alone."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfgpu._internal.measure.workload import DatasetData
from tfgpu.batch_size import BatchSizeResult, find_batch_size
from tfgpu.batch_size import _trial as trial_module
from tfgpu.batch_size._search import accumulation_plan, next_candidate, stopped_by


def _search(fails_above: int, **kw) -> list[int]:
    """Runs the pure search against a fake: sizes above `fails_above` fail."""
    trials: list[tuple[int, bool]] = []
    while (b := next_candidate(trials, **kw)) is not None:
        trials.append((b, b <= fails_above))
    return [b for b, _ in trials]


def test_search_doubles_then_bisects_on_multiples_of_8():
    kw = dict(start=8, max_batch_size=4096, multiple_of=8)
    assert _search(40, **kw) == [8, 16, 32, 64, 48, 40]
    assert _search(100, **kw) == [8, 16, 32, 64, 128, 96, 112, 104]


def test_search_bisects_to_one_without_rounding():
    assert _search(41, start=8, max_batch_size=4096, multiple_of=1) == [
        8, 16, 32, 64, 48, 40, 44, 42, 41,
    ]  # fmt: skip


def test_search_stops_at_max_and_halves_when_start_fails():
    assert _search(10**6, start=8, max_batch_size=100, multiple_of=8) == [8, 16, 32, 64, 100]
    assert _search(3, start=8, max_batch_size=100, multiple_of=8) == [8, 4, 2, 3]
    assert _search(0, start=2, max_batch_size=100, multiple_of=8) == [2, 1]


def test_accumulation_plan():
    assert accumulation_plan(1024, 96, 1) == (16, 64)  # 11 steps of ~93 don't divide; 16x64
    assert accumulation_plan(256, 64, 2) == (2, 64)
    assert accumulation_plan(100, 128, 1) == (1, 100)
    steps, per = accumulation_plan(1000, 48, 3)
    assert steps * per * 3 >= 1000 and per <= 48


@keras.saving.register_keras_serializable(package="tfgpu_tests")
class _OOMAbove(keras.layers.Layer):
    """Raises the real `ResourceExhaustedError` when the batch is larger than `limit`."""

    def __init__(self, limit: int, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def call(self, x):
        if x.shape[0] is not None and x.shape[0] > self.limit:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating tensor with shape[{x.shape[0]},16]"
            )
        return x

    def get_config(self):
        return {**super().get_config(), "limit": self.limit}


def _model(extra=None, width=16):
    layers = [keras.Input((8,)), keras.layers.Dense(width)]
    if extra is not None:
        layers.append(extra)
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    return model


def _data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def _state(model):
    return [v.numpy().copy() for v in model.weights] + [
        v.numpy().copy() for v in model.optimizer.variables
    ]


@pytest.mark.slow
def test_oom_path_runs_exact_trials_and_leaves_model_as_found(capsys):
    model = _model(_OOMAbove(40))
    model.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # non-trivial optimizer state
    before = _state(model)
    capsys.readouterr()

    result = find_batch_size(model, (x, y), start=8, max_batch_size=1024, steps=1, verbose=2)

    # Progress: each trial with its size, then its outcome; one plain line each.
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("find_batch_size: ") for line in lines)
    assert not any("\x1b" in line or "\r" in line for line in lines)
    phases = [line.removeprefix("find_batch_size: ").split(" \u00b7 ")[0] for line in lines]
    assert phases[1:5] == [
        "trial 1 of at most 16: batch size 8",
        phases[2],
        "trial 2 of at most 16: batch size 16",
        phases[4],
    ]
    assert phases[2].startswith("trial 1: batch size 8 fits, ") and "examples/s" in phases[2]
    assert "trial 4: batch size 64 does not fit (out of memory)" in phases
    assert phases[-1].startswith("done in ") and lines[-1].endswith(
        f"\u00b7 6 trials, largest 40, fastest {result.fastest}"
    )

    assert isinstance(result, BatchSizeResult)
    assert [t.batch_size for t in result.trials] == [8, 16, 32, 64, 48, 40]
    assert [t.reason for t in result.trials] == ["ok", "ok", "ok", "oom", "oom", "ok"]
    assert result.largest == 40 and result.per_replica_largest == 40
    assert result.fastest in (8, 16, 32, 40)
    assert all(t.examples_per_s > 0 for t in result.trials if t.fits)
    after = _state(model)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert "largest that fits: 40" in str(result)


class _FakeAllocator:
    """TensorFlow's allocator statistics, scripted: present (peak grows with the batch) or not.

    Which CPUs keep allocator statistics depends on the machine (TensorFlow's BFC CPU
    allocator is on by default on some CPUs only), so both kinds are simulated here.
    """

    def __init__(
        self, monkeypatch, *, available: bool, bytes_per_example: int = 1000, zeros: bool = False
    ):
        self.available = available
        self.zeros = zeros  # answers, but only zeros (TF_CPU_ALLOCATOR_USE_BFC=false on some CPUs)
        self.bytes_per_example = bytes_per_example
        self.batch = 0
        monkeypatch.setattr(tf.config.experimental, "get_memory_info", self.get_memory_info)
        monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", self.reset)
        original = trial_module.make_batch

        def make_batch(pool, size):
            self.batch = size
            return original(pool, size)

        monkeypatch.setattr(trial_module, "make_batch", make_batch)

    def _check(self, device):
        if not self.available:
            raise ValueError(f"Allocator stats not available for device '{device}'")

    def reset(self, device):
        self._check(device)

    def get_memory_info(self, device):
        self._check(device)
        if self.zeros:
            return {"current": 0, "peak": 0}
        peak = 10_000 + self.batch * self.bytes_per_example
        return {"current": 10_000, "peak": peak}


@pytest.mark.slow
def test_memory_budget_stops_the_search_where_allocator_statistics_exist(monkeypatch):
    _FakeAllocator(monkeypatch, available=True)
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data(256)
    budget = 10_000 + 200 * 1000  # sizes up to 200 fit the budget
    result = find_batch_size(
        model, (x, y), start=64, max_batch_size=512, steps=1, memory_limit_mib=budget / 2**20
    )  # MiB, as configure(memory_limit_mib=): a fraction of a MiB is exact in bytes
    assert result.memory_source == "allocator" and result.memory_budget_bytes == budget
    assert [t.batch_size for t in result.trials] == [64, 128, 256, 192, 224, 208, 200]
    assert result.largest == 200 and result.stopped_by == "limit"
    over = [t for t in result.trials if t.reason == "over_budget"]
    assert over and all(t.peak_memory_bytes > budget for t in over)
    assert all(t.peak_memory_bytes <= budget for t in result.trials if t.fits)


@pytest.mark.slow
def test_without_allocator_statistics_the_search_says_so_and_stops_at_oom(monkeypatch):
    _FakeAllocator(monkeypatch, available=False)
    model = _model(_OOMAbove(40))
    model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    result = find_batch_size(model, (x, y), start=8, max_batch_size=1024, steps=1)
    assert result.memory_source is None
    assert result.largest == 40 and result.stopped_by == "limit"
    assert all(t.peak_memory_bytes is None for t in result.trials)
    assert any("no allocator statistics for CPU:0" in n for n in result.notes)
    assert "peak memory:       not measured" in str(result)
    # A limit that cannot be enforced is refused before any trial, with the ways out.
    model = _model()
    model.compile("sgd", "mse")
    with pytest.raises(
        ValueError,
        match=r"memory_limit_mib=1 while TensorFlow keeps no "
        r"allocator statistics for CPU:0.*in_subprocess=True.*TF_CPU_ALLOCATOR_USE_BFC",
    ):
        find_batch_size(model, (x, y), memory_limit_mib=1)
    assert not model.optimizer.built  # no step was trained


@pytest.mark.slow
def test_allocator_statistics_that_read_zero_are_no_statistics(monkeypatch):
    """A CPU allocator that answers zeros instead of refusing: every peak 0, every size
    "fits", the limit never enforced. Zeros are treated as no statistics, all the way."""
    _FakeAllocator(monkeypatch, available=True, zeros=True)
    model = _model(_OOMAbove(40))
    model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    result = find_batch_size(model, (x, y), start=8, max_batch_size=1024, steps=1)
    assert result.memory_source is None
    assert result.largest == 40 and result.stopped_by == "limit"  # by the OOM alone
    assert all(t.peak_memory_bytes is None for t in result.trials)
    assert any("no allocator statistics for CPU:0 here (or only zeros)" in n for n in result.notes)
    for limit in (1, 0.5, 4096):
        fresh = _model()
        fresh.compile("sgd", "mse")
        with pytest.raises(
            ValueError,
            match=rf"memory_limit_mib={limit} while TensorFlow keeps no allocator statistics "
            r"for CPU:0 in this process \(or only zeros\).*in_subprocess=True",
        ):
            find_batch_size(fresh, (x, y), memory_limit_mib=limit)
        assert not fresh.optimizer.built  # refused before any step


def test_a_zero_peak_after_training_steps_is_not_a_measurement(monkeypatch):
    """Statistics that exist at the start but read zero once a trial trained: that trial's
    peak is "not measured", never 0 bytes under any budget."""
    fake = _FakeAllocator(monkeypatch, available=True)
    assert trial_module.allocator_statistics("CPU:0")
    fake.zeros = True
    assert not trial_module.allocator_statistics("CPU:0")
    model = _model()
    model.compile("sgd", "mse", run_eagerly=True)
    trial = trial_module.run_trial(
        model, (*_data(), None), 8, steps=1, device="CPU:0", budget=1, replicas=1
    )
    assert trial.peak_memory_bytes is None and trial.fits  # no figure to compare


@pytest.mark.slow
def test_in_subprocess_measures_real_peak_memory_on_any_cpu():
    # The subprocess starts TensorFlow with the BFC CPU allocator, so the statistics exist
    # whatever this machine's default; the budget is enforced on real figures.
    model = _model(width=2048)
    model.compile("sgd", "mse")
    x, y = _data(256)
    free = find_batch_size(model, (x, y), start=64, max_batch_size=512, steps=1, in_subprocess=True)
    assert free.memory_source == "allocator" and free.stopped_by == "max_batch_size"
    peaks = {t.batch_size: t.peak_memory_bytes for t in free.trials}
    assert peaks[512] > peaks[64] > 0  # peak grows with the batch
    budget = (peaks[128] + peaks[256]) // 2
    limited = find_batch_size(
        model,
        (x, y),
        start=64,
        max_batch_size=512,
        steps=1,
        memory_limit_mib=budget / 2**20,
        in_subprocess=True,
    )
    assert limited.memory_budget_bytes == budget
    # A fresh process's peaks differ a little from the first search's (the allocator's
    # pooling), so the verdicts are checked against this search's own figures.
    over = [t for t in limited.trials if t.reason == "over_budget"]
    fits = [t for t in limited.trials if t.fits]
    assert over and all(t.peak_memory_bytes > budget for t in over)
    assert fits and all(0 < t.peak_memory_bytes <= budget for t in fits)
    assert limited.largest == max(t.batch_size for t in fits)
    assert 64 <= limited.largest < min(t.batch_size for t in over) <= 512  # the budget bit


@pytest.mark.slow
def test_a_search_that_never_reached_a_limit_does_not_report_one():
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data()
    result = find_batch_size(model, (x, y), start=8, max_batch_size=32, steps=1)
    assert result.largest == 32 and result.stopped_by == "max_batch_size"
    assert "not a limit: every size tried fitted" in str(result)
    assert any("raise max_batch_size" in n for n in result.notes)
    short = find_batch_size(model, (x, y), start=8, max_batch_size=4096, steps=1, max_trials=3)
    assert [t.batch_size for t in short.trials] == [8, 16, 32]
    assert short.stopped_by == "max_trials" and short.largest == 32
    assert any("ran out of trials" in n for n in short.notes)
    assert "not a limit: the search ran out of trials" in str(short)


def test_stopped_by_is_pure():
    assert (
        stopped_by([(8, True), (16, False), (12, True)], max_batch_size=64, ran_out=False)
        == "limit"
    )
    assert (
        stopped_by(
            [(8, False), (4, False), (2, False), (1, False)], max_batch_size=64, ran_out=False
        )
        == "nothing_fits"
    )
    assert stopped_by([(8, True), (16, True)], max_batch_size=16, ran_out=False) == "max_batch_size"
    assert stopped_by([(8, True), (16, True)], max_batch_size=64, ran_out=True) == "max_trials"


@pytest.mark.slow
def test_an_absurd_start_counts_as_not_fitting_instead_of_crashing():
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data()
    result = find_batch_size(
        model, (x, y), start=2**50, max_batch_size=2**50, steps=1, max_trials=2
    )
    assert [t.reason for t in result.trials] == ["host_oom", "host_oom"]
    assert result.largest is None and result.fastest is None


def test_mismatched_lengths_are_refused_before_any_trial():
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data()
    with pytest.raises(ValueError, match=r"arrays of different lengths \(32, 64 examples\)"):
        find_batch_size(model, (x, y[:32]))
    assert not model.optimizer.built


@pytest.mark.slow
def test_under_a_strategy_sizes_are_global_as_fit_takes_them_and_per_replica_is_reported():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = _model(_OOMAbove(16))
        model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    before = [w.numpy().copy() for w in model.weights]
    result = find_batch_size(
        model, (x, y), start=16, max_batch_size=128, steps=1, target_batch_size=128
    )
    assert result.replicas == 2
    assert [t.per_replica_batch_size for t in result.trials] == [8, 16, 32, 24]
    assert [t.batch_size for t in result.trials] == [16, 32, 64, 48]
    assert result.largest == 32 and result.per_replica_largest == 16
    steps, batch = result.gradient_accumulation_steps, result.accumulation_batch_size
    assert steps * batch == 128 and batch <= 32
    with pytest.raises(ValueError, match=r"start=15.*multiple of the strategy's 2 replicas"):
        find_batch_size(model, (x, y), start=15)
    for a, w in zip(before, model.weights):
        np.testing.assert_array_equal(a, w.numpy())


@pytest.mark.slow
def test_dataset_input_and_accumulation_steps():
    x, y = _data(32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    model = _model(_OOMAbove(32))
    model.compile("sgd", "mse", run_eagerly=True)
    result = find_batch_size(model, ds, start=16, steps=1, target_batch_size=96)
    assert result.largest == 32
    assert result.gradient_accumulation_steps * result.accumulation_batch_size == 96
    assert result.to_dict()["trials"][-1]["reason"] == "oom"


@pytest.mark.slow
def test_in_subprocess_leaves_this_process_alone_and_says_so(capsys):
    model = _model(_OOMAbove(16))
    model.compile("sgd", "mse", run_eagerly=True)
    x, y = _data()
    before = [w.numpy().copy() for w in model.weights]
    opt_built = model.optimizer.built
    capsys.readouterr()
    result = find_batch_size(
        model, (x, y), start=8, max_batch_size=64, steps=1, in_subprocess=True, verbose=2
    )
    assert result.in_subprocess
    assert any("subprocess" in n for n in result.notes)
    out = capsys.readouterr().out  # the child's trials, shown as they come
    assert "find_batch_size: trial 4 of at most 16: batch size 24 \u00b7 " in out
    assert "batch size 32 does not fit (out of memory)" in out
    assert out.count("done in") == 1
    assert [t.batch_size for t in result.trials] == [8, 16, 32, 24]
    assert result.largest == 16
    assert model.optimizer.built == opt_built
    for a, w in zip(before, model.weights):
        np.testing.assert_array_equal(a, w.numpy())


def test_invalid_arguments_are_rejected_before_work(capsys):
    model = _model()
    x, y = _data()
    with pytest.raises(ValueError, match="not compiled"):
        find_batch_size(model, (x, y))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="start=0"):
        find_batch_size(model, (x, y), start=0)
    with pytest.raises(ValueError, match=r"memory_fraction=1\.5"):
        find_batch_size(model, (x, y), memory_fraction=1.5)
    with pytest.raises(TypeError, match="data"):
        find_batch_size(model, "not data")
    with pytest.raises(TypeError, match=r"start=2\.5 \(of type float\)"):
        find_batch_size(model, (x, y), start=2.5)
    with pytest.raises(ValueError, match=r"memory_fraction=nan"):
        find_batch_size(model, (x, y), memory_fraction=float("nan"))
    with pytest.raises(TypeError, match=r"in_subprocess='yes'"):
        find_batch_size(model, (x, y), in_subprocess="yes")
    # The memory limit is in MiB, as configure(memory_limit_mib=): a positive finite number.
    for bad, error in ((0, ValueError), (float("inf"), ValueError), ("512", TypeError)):
        with pytest.raises(error, match=r"`memory_limit_mib`.*Expected a finite number of MiB"):
            find_batch_size(model, (x, y), memory_limit_mib=bad)
    for bad, error in (("loud", ValueError), (3, ValueError), (True, TypeError)):
        with pytest.raises(error, match=r"argument `verbose`. Received: verbose="):
            find_batch_size(model, (x, y), verbose=bad)
    assert not model.optimizer.built
    capsys.readouterr()
    result = find_batch_size(
        model, (x, y), start=np.int64(8), max_batch_size=np.int32(8), steps=1, verbose=0
    )
    assert [t.batch_size for t in result.trials] == [8]
    assert capsys.readouterr().out == ""  # verbose=0: quiet


def test_start_above_max_batch_size_is_rejected_before_any_trial():
    model = _model()
    model.compile("sgd", "mse")
    x, y = _data()
    read = []

    def examples():
        read.append(True)
        yield from zip(x, y)

    spec = (tf.TensorSpec(x.shape[1:], tf.float32), tf.TensorSpec(y.shape[1:], tf.float32))
    data = tf.data.Dataset.from_generator(examples, output_signature=spec)
    with pytest.raises(ValueError, match=r"start=64 with max_batch_size=8\. Expected start <="):
        find_batch_size(model, data, start=64, max_batch_size=8)
    assert read == [] and not model.optimizer.built  # no data read, no step trained
    # Equal bounds are a valid single-size search.
    result = find_batch_size(model, (x, y), start=8, max_batch_size=8, steps=1)
    assert [t.batch_size for t in result.trials] == [8]


def test_examples_with_an_unknown_first_dimension_are_not_taken_for_batches():
    # Variable-length examples (shape (None, 4)) look like batches by their spec alone; the
    # dataset's chain says they are examples, so they are not unbatched into rows.
    x, y = _data()
    examples = tf.data.Dataset.from_tensor_slices((x, y)).map(
        lambda a, b: (
            tf.reshape(tf.boolean_mask(a, tf.math.is_finite(a)), [-1, 4]),
            tf.boolean_mask(b, tf.math.is_finite(b)),
        )
    )
    assert examples.element_spec[0].shape.as_list() == [None, 4]
    pool_x, pool_y, _ = DatasetData(examples).examples(16)
    assert pool_x.shape == (16, 2, 4) and pool_y.shape == (16, 1)
    batched_x, _, _ = DatasetData(examples.batch(4).prefetch(1)).examples(16)
    assert batched_x.shape == (16, 2, 4)


def test_the_memory_budget_is_read_from_the_gpu_tensorflow_trains_on(monkeypatch):
    # NVML lists an A100 80GB, a V100 16GB and an H100; CUDA_VISIBLE_DEVICES="2,0" and
    # TensorFlow given only CUDA's GPU 1 (the A100): /GPU:0 is the A100, not NVML's GPU 0's
    # neighbour nor the H100 that CUDA numbers first.
    import sys

    from tests import fake_pynvml
    from tfgpu._internal.adapters import devices
    from tfgpu._internal.adapters.devices import PhysicalGpu

    a100, v100 = fake_pynvml.two_gpus()
    h100 = fake_pynvml.hopper(pci_bus_id="00000000:0F:00.0", memory_total_mib=81559.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make([a100, v100, h100]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = [
        PhysicalGpu(i, f"/physical_device:GPU:{i}", None, None, i == 1, int(i == 1))
        for i in range(2)
    ]
    monkeypatch.setattr(devices, "physical_gpus", lambda: gpus)
    expected = devices.gpu_record(0)
    assert expected is not None and expected.nvml_index == 0  # the A100
    assert trial_module.device_capacity_bytes("GPU:0") == expected.memory_total_bytes
    assert trial_module.device_capacity_bytes("CPU:0") is None


def test_the_childs_progress_lines_are_relayed_by_their_phase():
    from tfgpu.batch_size._subprocess import relayed_phase

    line = "find_batch_size: trial 2 of at most 16: batch size 16 \u00b7 3 s so far\n"
    assert relayed_phase(line) == "trial 2 of at most 16: batch size 16"
    assert relayed_phase("find_batch_size: done in 3 s \u00b7 2 trials\n") is None
    assert relayed_phase("some other output\n") is None
    assert relayed_phase("find_batch_size: reading up to 1024 examples \u00b7 0.1 s so far") is None
