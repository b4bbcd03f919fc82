"""tfgpu.monitor: NVML inventory, CUDA_VISIBLE_DEVICES mapping, the sampler thread, the timeline.

NVML is the scripted fake in `tests/fake_pynvml.py`; psutil is real.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import os
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest

from tests import fake_pynvml
from tests.conftest import run_python
from tfgpu import monitor
from tfgpu.monitor import host, nvml, sampler

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(monkeypatch):
    """Two scripted GPUs: an A100 and a V100 without power readings."""
    module = fake_pynvml.make()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    return module


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tfgpu-monitor"]


def _read_timeline(path: Path) -> tuple[list[str], list[dict[str, float]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    for row in body:
        assert len(row) == len(header), row
    return header, [{k: float(v) for k, v in zip(header, row)} for row in body]


# ---------------------------------------------------------------- inventory
def test_inventory_lists_the_scripted_gpus(fake):
    inv = nvml.inventory()
    assert inv.available and inv.error is None
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_driver_version == "12.4"
    assert [g.name for g in inv.gpus] == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]
    a100, v100 = inv.gpus
    assert a100.index == 0 and v100.index == 1
    assert a100.compute_capability == (8, 0) and v100.compute_capability == (7, 0)
    assert a100.memory_total_mib == 81920.0 and v100.memory_used_mib == 1024.0
    assert a100.pci_bus_id == "00000000:07:00.0"
    assert v100.utilization_pct == 10.0
    assert fake.init_count == 0  # every nvmlInit was matched by nvmlShutdown
    assert json.loads(json.dumps(inv.to_dict()))["gpus"][1]["uuid"].startswith("GPU-9999")


def test_inventory_without_the_driver_says_nvml_ships_with_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make(library_missing=True))
    inv = nvml.inventory()
    assert not inv.available and inv.gpus == []
    assert "NVML Shared Library Not Found" in inv.error
    assert "ships with the NVIDIA driver" in inv.error


def test_inventory_without_the_python_module_gives_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    inv = nvml.inventory()
    assert not inv.available
    assert "pip install nvidia-ml-py" in inv.error and "NVIDIA driver" in inv.error


def test_inventory_skips_a_gpu_that_cannot_be_opened(fake):
    fake.gpus[0].lost = True
    inv = nvml.inventory()
    assert inv.available and [g.index for g in inv.gpus] == [1]


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES
def _gpus(n: int = 3) -> list[nvml.GpuInfo]:
    return [
        nvml.GpuInfo(
            i,
            f"gpu{i}",
            f"GPU-{i}{i}aa-{i}",
            f"00000000:{0x10 * (i + 1):02X}:00.0",
            1.0,
            0.0,
            None,
            0,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("2,0", [2, 0]),
        (" 1 , 2 ", [1, 2]),
        ("GPU-22aa-2", [2]),  # full UUID
        ("GPU-11", [1]),  # unique prefix
        ("GPU-", []),  # ambiguous prefix: CUDA rejects it, and stops there
        ("0000:30:00.0,10:00.0", [2, 0]),  # PCI bus ids, short and lower-case forms
        ("00000000:20:00.0", [1]),
        ("1,7,0", [1]),  # parsing stops at the first entry naming no GPU
        ("1,1,0", [1, 0]),  # repeats dropped
        ("MIG-abc", []),
    ],
)
def test_visible_gpus_follows_cuda_visible_devices(value, expected):
    assert [g.index for g in nvml.visible_gpus(_gpus(), value)] == expected


def test_sampler_samples_the_gpu_cuda_visible_devices_names(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake.gpus[1].uuid[:12])
    s = monitor.Sampler()
    assert [g.name for g in s.gpus] == ["Tesla V100-SXM2-16GB"]
    s.start()
    s.stop()
    assert s.samples[0]["gpu0_util_pct"] == 10.0  # gpu0 = this process's first GPU
    assert "gpu1_util_pct" not in s.samples[0]


# ---------------------------------------------------------------- names and files
def test_columns_and_aggregate_keys_follow_the_contract():
    assert monitor.timeline_columns(0) == [
        "time",
        "elapsed_s",
        "epoch",
        "step",
        "host_cpu_pct",
        "host_rss_mib",
        "host_mem_used_pct",
    ]
    gpu1 = monitor.timeline_columns(2)[17:]
    assert gpu1 == [
        f"gpu1_{m}"
        for m in (
            "util_pct",
            "mem_util_pct",
            "mem_used_mib",
            "mem_total_mib",
            "proc_mem_mib",
            "power_w",
            "power_limit_w",
            "temp_c",
            "sm_clock_mhz",
            "throttle_reasons",
        )
    ]
    assert monitor.aggregate_keys(1) == [
        "gpu0_util_pct_mean",
        "gpu0_util_pct_max",
        "gpu0_mem_used_mib_mean",
        "gpu0_mem_used_mib_max",
        "gpu0_power_w_mean",
        "gpu0_power_w_max",
        "host_cpu_pct_mean",
        "host_rss_mib_max",
    ]
    for metric in monitor.METRICS.values():
        assert metric.unit is not None and metric.source and metric.description


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, "timeline.csv"),
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}'
            },
            "timeline-worker1.csv",
        ),
        (
            {
                "TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}'
            },
            "timeline-chief0.csv",
        ),
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
            },
            "timeline.csv",
        ),
        ({"TF_CONFIG": "not json"}, "timeline.csv"),
        ({"SLURM_NTASKS": "4", "SLURM_PROCID": "3"}, "timeline-worker3.csv"),
        ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, "timeline.csv"),
    ],
)
def test_artifact_name_carries_the_worker_task(environ, expected):
    assert monitor.artifact_name("timeline", ".csv", environ=environ) == expected


def test_docs_table_lists_every_key_with_its_nvidia_smi_query():
    text = (REPO / "docs" / "metrics.md").read_text()
    for name, metric in monitor.METRICS.items():
        key = f"gpu{{i}}_{name}" if name in nvml.GPU_METRICS else name
        assert f"`{key}`" in text, key
        if metric.nvidia_smi:
            assert metric.nvidia_smi.split()[0] in text, metric.nvidia_smi
    for key in monitor.aggregate_keys(1):
        assert f"`{key.replace('gpu0_', 'gpu{i}_')}`" in text, key
    for key in (
        "step_time_median_s",
        "step_time_p90_s",
        "first_step_time_s",
        "examples_per_s",
        "epoch_time_s",
        "mfu",
        "step_time_s",
    ):
        assert f"`{key}`" in text, key


# ---------------------------------------------------------------- sampling
def test_sampler_writes_a_parseable_timeline_and_run_json(fake, tmp_path):
    fake.gpus[0].processes = [(os.getpid(), 512.0), (1, 9999.0)]
    fake.gpus[0].throttle_reasons = 0x4
    with monitor.record(tmp_path, interval=0.02) as run:
        run.mark(epoch=0, step=0)
        time.sleep(0.15)
        run.mark(epoch=1, step=7)
        time.sleep(0.1)
    assert not run.running and not _monitor_threads()

    header, rows = _read_timeline(tmp_path / "timeline.csv")
    assert header == monitor.timeline_columns(2)
    assert len(rows) == len(run.samples) >= 5
    times = [r["time"] for r in rows]
    assert times == sorted(times)
    last = rows[-1]
    assert (last["epoch"], last["step"]) == (1, 7)
    assert math.isnan(rows[0]["epoch"])  # before the first mark
    assert last["gpu0_util_pct"] == 50.0 and last["gpu1_util_pct"] == 10.0
    assert last["gpu0_proc_mem_mib"] == 512.0  # only this process's share
    assert last["gpu1_proc_mem_mib"] == 0.0
    assert last["gpu0_power_w"] == 250.0 and last["gpu0_power_limit_w"] == 400.0
    assert math.isnan(last["gpu1_power_w"]) and math.isnan(last["gpu1_power_limit_w"])
    assert last["gpu0_throttle_reasons"] == 4 and last["gpu0_temp_c"] == 60.0
    assert last["host_rss_mib"] > 10 and 0 <= last["host_mem_used_pct"] <= 100
    assert 0 <= rows[-1]["host_cpu_pct"] <= 100
    assert "nan" in (tmp_path / "timeline.csv").read_text()  # NaN is written, never empty

    info = json.loads((tmp_path / "run.json").read_text())
    assert {"tfgpu_version", "start_time", "hostname", "worker", "interval", "gpus"} <= set(info)
    assert info["worker"] is None and info["interval"] == 0.02
    assert [g["name"] for g in info["gpus"]] == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]
    assert info["gpus"][0]["compute_capability"] == [8, 0]
    assert fake.init_count == 0


def test_a_short_run_still_has_a_sample_at_start_and_at_stop(fake):
    s = monitor.Sampler(interval=60)
    s.start()
    assert len(s.samples) == 1  # taken in start()
    s.stop()
    s.stop()  # idempotent
    assert len(s.samples) == 2 and not s.running


def test_samples_come_at_the_interval(fake):
    with monitor.record(interval=0.05) as run:
        time.sleep(0.5)
    n = len(run.samples)
    assert 4 <= n <= 14, n  # ~11 expected; loose because CI cores are shared
    elapsed = [r["elapsed_s"] for r in run.samples]
    gaps = sorted(b - a for a, b in itertools.pairwise(elapsed[:-1]))  # last: at stop()
    assert 0.04 <= gaps[len(gaps) // 2] <= 0.2  # waits on an Event, not a busy loop


def test_aggregate_covers_the_rows_since_a_time(fake):
    s = monitor.Sampler(interval=60, gpus=[0])
    values = iter(range(0, 1000, 10))
    fake.gpus[0].util = lambda: float(next(values))
    s.start()
    s._sample()  # two more rows, deterministically
    middle = time.time()
    s._sample()
    s.stop()
    utils = [r["gpu0_util_pct"] for r in s.samples]
    assert utils == [0.0, 10.0, 20.0, 30.0]
    everything = s.aggregate()
    assert everything["gpu0_util_pct_mean"] == 15.0 and everything["gpu0_util_pct_max"] == 30.0
    recent = s.aggregate(since=middle)
    assert recent["gpu0_util_pct_mean"] == 25.0 and recent["gpu0_util_pct_max"] == 30.0
    assert set(recent) == set(monitor.aggregate_keys(1))
    # nothing that recent: the newest row stands in
    assert s.aggregate(since=time.time() + 100)["gpu0_util_pct_max"] == 30.0


def test_aggregate_ignores_nan_and_is_nan_when_nothing_is_known():
    columns = {
        "gpu0_util_pct": [float("nan"), 40.0, 60.0],
        "gpu0_power_w": [float("nan")] * 3,
        "host_cpu_pct": [],
    }
    agg = sampler._aggregate(columns, 1)
    assert agg["gpu0_util_pct_mean"] == 50.0 and agg["gpu0_util_pct_max"] == 60.0
    assert math.isnan(agg["gpu0_power_w_max"]) and math.isnan(agg["host_cpu_pct_mean"])


def test_samples_are_safe_to_read_while_sampling(fake):
    with monitor.record(interval=0.001) as run:
        seen = [len(run.samples) for _ in range(50)]
        agg = run.aggregate()
    assert seen == sorted(seen) and seen[-1] > 0
    assert agg["gpu0_util_pct_mean"] == 50.0
    for row in run.samples:
        assert list(row) == monitor.timeline_columns(2)


def test_a_second_session_appends_to_the_timeline(fake, tmp_path):
    for _ in range(2):
        with monitor.record(tmp_path, interval=60):
            pass
    text = (tmp_path / "timeline.csv").read_text().splitlines()
    assert text[0].startswith("time,") and sum(line.startswith("time,") for line in text) == 1
    assert len(text) == 1 + 4


def test_the_sampler_can_restart_after_stop(fake):
    s = monitor.Sampler(interval=60)
    for _ in range(2):
        s.start()
        s.stop()
    assert len(s.samples) == 4 and not _monitor_threads()


def test_record_stops_the_thread_when_the_block_raises(fake):
    with pytest.raises(KeyError), monitor.record(interval=0.01) as run:
        raise KeyError("boom")
    assert not run.running and not _monitor_threads()


def test_bind_to_frame_stops_sampling_when_the_function_returns(fake):
    def train():
        s = monitor.Sampler(interval=0.01).start()
        s.bind_to_frame(sys._getframe())
        time.sleep(0.05)
        assert s.running
        return s

    s = train()  # nobody calls stop()
    s._thread.join(timeout=5)
    assert not s.running


# ---------------------------------------------------------------- failures
def test_without_nvml_one_warning_then_host_metrics(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make(library_missing=True))
    s = monitor.Sampler(interval=60)
    assert s.gpus == []
    with pytest.warns(RuntimeWarning, match="ships with the NVIDIA driver") as caught:
        s.start()
    s.stop()
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert list(s.samples[-1]) == monitor.timeline_columns(0)
    assert s.samples[-1]["host_rss_mib"] > 0
    assert set(s.aggregate()) == {"host_cpu_pct_mean", "host_rss_mib_max"}


def test_without_nvml_gpu_indices_cannot_be_checked_and_are_not_fatal(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = monitor.Sampler(interval=60, gpus=[0])
    assert s.gpus == []


def test_a_gpu_lost_mid_run_is_logged_once_and_sampling_goes_on(fake, caplog):
    caplog.set_level(logging.WARNING, logger="tfgpu.monitor")
    s = monitor.Sampler(interval=60).start()
    fake.gpus[1].lost = True
    for _ in range(3):
        s._sample()
    fake.gpus[1].lost = False  # the driver came back
    s._sample()
    s.stop()
    rows = s.samples
    assert len(rows) == 6
    assert all(math.isnan(r["gpu1_util_pct"]) for r in rows[1:4])
    assert all(r["gpu0_util_pct"] == 50.0 for r in rows)  # the other GPU is unaffected
    assert rows[4]["gpu1_util_pct"] == 10.0
    lost = [r for r in caplog.records if "GPU is lost" in r.getMessage()]
    assert len(lost) == 1 and "GPU 1" in lost[0].getMessage()


def test_unsupported_metrics_are_nan_and_not_asked_again(fake):
    s = monitor.Sampler(interval=60, gpus=[1]).start()
    s._sample()
    s.stop()
    assert all(math.isnan(r["gpu0_power_w"]) for r in s.samples)
    asked = [name for name, _ in fake.calls if name == "nvmlDeviceGetPowerUsage"]
    assert len(asked) == 1


def test_older_drivers_throttle_reason_function_is_used(monkeypatch):
    module = fake_pynvml.make([fake_pynvml.FakeGpu(throttle_reasons=0x40)], old_api=True)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with monitor.record(interval=60) as run:
        pass
    assert run.samples[0]["gpu0_throttle_reasons"] == 0x40


def test_nvml_dying_between_construction_and_start_gives_nan_columns(fake):
    s = monitor.Sampler(interval=60)
    fake.nvmlInit = lambda: (_ for _ in ()).throw(fake.NVMLError(fake.NVML_ERROR_DRIVER_NOT_LOADED))
    s.start()
    s.stop()
    assert list(s.samples[0]) == monitor.timeline_columns(2)
    assert math.isnan(s.samples[0]["gpu0_util_pct"]) and s.samples[0]["host_rss_mib"] > 0


def test_cpu_percent_from_cpu_times_deltas():
    T = namedtuple("T", "user nice system idle iowait guest guest_nice")
    a, b = T(10, 0, 5, 80, 5, 0, 0), T(40, 0, 15, 130, 15, 0, 0)
    assert host._cpu_pct(a, b) == pytest.approx(100 * 40 / 100)
    assert math.isnan(host._cpu_pct(a, a))


# ---------------------------------------------------------------- arguments
@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf"), True, "0.2", None])
def test_bad_interval_raises_keras_style(fake, interval):
    with pytest.raises(ValueError, match=r"argument `interval`.*Received: interval=.*positive"):
        monitor.Sampler(interval=interval)


def test_unknown_gpu_index_raises(fake):
    with pytest.raises(ValueError, match=r"Received: gpus=\[2\].*sees 2 GPU"):
        monitor.Sampler(gpus=[2])


def test_unknown_gpu_index_under_cuda_visible_devices_names_it(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match=r"sees 1 GPU.*CUDA_VISIBLE_DEVICES='1'"):
        monitor.Sampler(gpus=[1])


@pytest.mark.parametrize(
    ("gpus", "error"),
    [("0", TypeError), ([0, 0], ValueError), ([-1], ValueError), ([0.5], ValueError)],
)
def test_bad_gpu_lists_raise(fake, gpus, error):
    with pytest.raises(error, match="argument `gpus`"):
        monitor.Sampler(gpus=gpus)


def test_unwritable_path_raises_before_sampling(fake, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"argument `path`.*a-file/run.*can create and write"):
        monitor.Sampler(path=blocker / "run")
    with pytest.raises(TypeError, match="argument `path`"):
        monitor.Sampler(path=3)
    assert not _monitor_threads()


# ---------------------------------------------------------------- isolation
def test_monitor_never_imports_tensorflow_or_keras(tmp_path):
    code = (
        "import sys, json, time\n"
        "import tfgpu.monitor as m\n"
        f"with m.record({str(tmp_path)!r}, interval=0.05) as run:\n"
        "    time.sleep(0.15)\n"
        "heavy = [k for k in ('tensorflow', 'keras') if k in sys.modules]\n"
        "print(json.dumps({'heavy': heavy, 'rows': len(run.samples)}))\n"
    )
    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["heavy"] == [] and out["rows"] >= 2
    assert (tmp_path / "timeline.csv").exists()
