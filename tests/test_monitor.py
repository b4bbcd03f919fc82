"""tfgpu.monitor: NVML inventory, CUDA_VISIBLE_DEVICES mapping, the sampler thread, the timeline.

NVML is the scripted fake in `tests/fake_pynvml.py`; psutil is real.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import sys
import threading
import time
import warnings
from collections import namedtuple
from pathlib import Path

import pytest

from tests import fake_pynvml
from tests.conftest import FullDisk, run_python
from tfgpu import monitor
from tfgpu._internal.helpers import checks, warn
from tfgpu.monitor import _metrics, host, nvml, sampler

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


@pytest.fixture(autouse=True)
def _fresh_once_warnings():
    """Each test sees the once-per-process warnings (no NVML) as a new process would."""
    warn.forget()
    yield
    warn.forget()


class _FakeEvent:
    """Stands in for the sampler's stop event: `wait` advances a fake clock, never sleeps.

    Records each timeout it was asked to wait; reports "stopped" after `waits` waits.
    """

    def __init__(self, clock: list[float], waits: int):
        self.clock, self.left, self.timeouts = clock, waits, []

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        self.clock[0] += timeout
        self.left -= 1
        return self.left < 0

    def set(self) -> None:
        self.left = -1


def _monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tfgpu-monitor"]


def _first_row(s: monitor.Sampler) -> monitor.Sampler:
    """Waits until the sampler's thread took its first row (then it waits an interval):
    samples taken by hand after this come after it. The timeout only turns a hang into a
    failure; it is no claim about speed."""
    assert s._first_row.wait(timeout=120)
    return s


def _started(s: monitor.Sampler) -> monitor.Sampler:
    return _first_row(s.start())


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


def test_inventory_when_nvml_cannot_count_the_gpus_says_why(monkeypatch):
    fake = fake_pynvml.make(driver_lacks={"nvmlDeviceGetCount"})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    inv = nvml.inventory()
    assert not inv.available and inv.gpus == []
    assert "NVML query failed (Function Not Found)" in inv.error and "NVIDIA driver" in inv.error
    assert fake.init_count == 0


@pytest.mark.parametrize(
    "error",
    [
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),  # a name not in UTF-8
        TypeError("nvmlDeviceGetName() takes 0 positional arguments"),  # an old binding
    ],
)
def test_inventory_query_the_binding_fails_leaves_that_field_unknown(fake, error):
    def name(handle):
        raise error

    fake.nvmlDeviceGetName = name
    inv = nvml.inventory()
    assert inv.available and [g.name for g in inv.gpus] == ["unknown", "unknown"]
    assert inv.gpus[1].utilization_pct == 10.0 and fake.init_count == 0


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
    gpu1 = monitor.timeline_columns(2)[27:]
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
            # issue 15: what utilization hides (appended, in this order)
            "sm_active_pct",
            "sm_occupancy_pct",
            "tensor_active_pct",
            "fp16_active_pct",
            "fp32_active_pct",
            "dram_active_pct",
            "pcie_tx_mib_s",
            "pcie_rx_mib_s",
            "energy_j",
            "proc_sm_util_pct",
        )
    ]
    assert monitor.aggregate_keys(1) == [
        "gpu0_util_pct_mean",
        "gpu0_util_pct_max",
        "gpu0_mem_used_mib_mean",
        "gpu0_mem_used_mib_max",
        "gpu0_power_w_mean",
        "gpu0_power_w_max",
        "gpu0_sm_active_pct_mean",
        "gpu0_sm_occupancy_pct_mean",
        "gpu0_tensor_active_pct_mean",
        "gpu0_dram_active_pct_mean",
        "gpu0_pcie_tx_mib_s_mean",
        "gpu0_pcie_rx_mib_s_mean",
        "gpu0_energy_j",
        "gpu0_power_limit_w_max",
        "gpu0_sm_clock_mhz_mean",
        "gpu0_throttle_reasons_any",
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
    with monitor.record(tmp_path, interval=60) as run:  # samples taken by hand: no timing
        _first_row(run)
        run.mark(epoch=0, step=0)
        run._sample()
        run.mark(epoch=1, step=7)
        run._sample()
    assert not run.running and not _monitor_threads()

    header, rows = _read_timeline(tmp_path / "timeline.csv")
    assert header == monitor.timeline_columns(2)
    assert len(rows) == len(run.samples) == 4  # start, two by hand, stop
    times = [r["time"] for r in rows]
    assert times == sorted(times)
    assert [(r["epoch"], r["step"]) for r in rows[1:]] == [(0, 0), (1, 7), (1, 7)]
    last = rows[-1]
    assert math.isnan(rows[0]["epoch"])  # before the first mark
    assert last["gpu0_util_pct"] == 50.0 and last["gpu1_util_pct"] == 10.0
    assert last["gpu0_proc_mem_mib"] == 512.0  # only this process's share
    assert last["gpu1_proc_mem_mib"] == 0.0
    assert last["gpu0_power_w"] == 250.0 and last["gpu0_power_limit_w"] == 400.0
    assert math.isnan(last["gpu1_power_w"]) and math.isnan(last["gpu1_power_limit_w"])
    assert last["gpu0_throttle_reasons"] == 4 and last["gpu0_temp_c"] == 60.0
    assert last["host_rss_mib"] > 10 and 0 <= last["host_mem_used_pct"] <= 100
    assert all(
        0 <= r["host_cpu_pct"] <= 100 for r in rows[1:] if r["host_cpu_pct"] == r["host_cpu_pct"]
    )
    assert "nan" in (tmp_path / "timeline.csv").read_text()  # NaN is written, never empty

    info = json.loads((tmp_path / "run.json").read_text())
    assert {"tfgpu_version", "start_time", "hostname", "worker", "interval", "gpus"} <= set(info)
    assert info["worker"] is None and info["interval"] == 60
    assert info["timeline"] == "timeline.csv" and "earlier_sessions" not in info
    assert [g["name"] for g in info["gpus"]] == ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"]
    assert info["gpus"][0]["compute_capability"] == [8, 0]
    assert fake.init_count == 0


def test_each_row_is_on_disk_as_soon_as_it_is_sampled(fake, tmp_path):
    # What a SIGKILL would find: every row taken so far, complete, without stop().
    s = _started(monitor.Sampler(interval=60, log_dir=tmp_path))
    try:
        for expected in (2, 3, 4):
            s._sample()
            _, rows = _read_timeline(tmp_path / "timeline.csv")  # read by another handle
            assert len(rows) == expected
    finally:
        s.stop()


def test_a_short_run_still_has_a_sample_at_start_and_at_stop(fake):
    s = monitor.Sampler(interval=60)
    _started(s)
    assert len(s.samples) == 1  # taken by the thread as it starts
    s.stop()
    s.stop()  # idempotent
    assert len(s.samples) == 2 and not s.running


@pytest.mark.parametrize(
    "gpus",
    [
        # every PCIe reading blocks (nvmlDeviceGetPcieThroughput, ~20 ms on a real GPU)
        lambda: [fake_pynvml.FakeGpu(pcie_tx_kb_s=1024)],
        # GPM to set up, and a GPU without byte counters beside it
        lambda: [fake_pynvml.hopper(), fake_pynvml.FakeGpu(pcie_tx_kb_s=1024)],
    ],
)
def test_start_never_waits_on_nvml(monkeypatch, gpus):
    module = fake_pynvml.make(gpus(), driver_lacks={"field:197", "field:198"})
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    inside, release = threading.Event(), threading.Event()

    def blocked(seconds):  # a blocking NVML call that returns only when the test says so
        inside.set()
        release.wait(timeout=120)  # the timeout only turns a hang into a failure

    module.sleep = blocked
    s = monitor.Sampler(interval=60)
    caller, before = threading.get_ident(), len(module.calls)
    s.start()  # had it sampled here, it would hang until `release`
    assert inside.wait(timeout=120)  # the sampler's thread is in the blocking call
    assert not release.is_set() and s.samples == []
    assert all(thread != caller for _, thread in module.calls[before:])  # nvmlInit included
    release.set()
    _first_row(s)
    s.stop()
    assert len(s.samples) == 2 and s.samples[0]["gpu0_util_pct"] == module.gpus[0].util
    assert module.init_count == 0


def test_samples_come_at_the_interval_waiting_on_an_event(fake):
    # The sampler thread's loop, run here with a fake clock and stop event: deterministic.
    s = monitor.Sampler(interval=0.5)
    clock = [1000.0]
    s._monotonic = lambda: clock[0]
    event = _FakeEvent(clock, waits=10)
    s._run(event)
    assert len(s.samples) == 1 + 10 + 1  # one at once, one per interval, one when stopped
    assert event.timeouts == [0.5] * 11  # waits a whole interval each time: no busy loop


def test_after_a_slow_sample_the_next_wait_is_never_zero():
    # A sample that overran the interval (a hung NVML call): keep going, at >= interval/10.
    assert sampler._next_deadline(10.0, 10.1, 0.2) == pytest.approx(10.2)
    assert sampler._next_deadline(10.0, 13.0, 0.2) == pytest.approx(13.02)


def test_aggregate_covers_the_rows_since_a_time(fake):
    s = monitor.Sampler(interval=60, gpus=[0])
    values = iter(range(0, 1000, 10))
    fake.gpus[0].util = lambda: float(next(values))
    _started(s)
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
    agg = _metrics.aggregate_columns(columns, 1)
    assert agg["gpu0_util_pct_mean"] == 50.0 and agg["gpu0_util_pct_max"] == 60.0
    assert math.isnan(agg["gpu0_power_w_max"]) and math.isnan(agg["host_cpu_pct_mean"])


def test_samples_are_safe_to_read_while_sampling(fake):
    with monitor.record(interval=checks.MIN_INTERVAL) as run:
        _first_row(run)
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
    info = json.loads((tmp_path / "run.json").read_text())
    assert len(info["earlier_sessions"]) == 1
    assert info["earlier_sessions"][0]["timeline"] == info["timeline"] == "timeline.csv"


@pytest.mark.parametrize(
    ("environ", "timeline", "record"),
    [
        ({}, "timeline", "run.json"),
        (
            {
                "TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
                '"task": {"type": "worker", "index": 1}}'
            },
            "timeline-worker1",
            "run-worker1.json",
        ),
    ],
)
def test_a_timeline_with_other_columns_is_rotated_never_truncated(
    fake, tmp_path, monkeypatch, environ, timeline, record
):
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    with monitor.record(tmp_path, interval=60):  # two GPUs
        pass
    first = (tmp_path / f"{timeline}.csv").read_text()
    with monitor.record(tmp_path, interval=60, gpus=[1]):  # one GPU: other columns
        pass
    with monitor.record(tmp_path, interval=60, gpus=[0]):  # one GPU again: appended
        pass
    assert (tmp_path / f"{timeline}.1.csv").read_text() == first  # kept, byte for byte
    header, rows = _read_timeline(tmp_path / f"{timeline}.csv")
    assert header == monitor.timeline_columns(1) and len(rows) == 4
    info = json.loads((tmp_path / record).read_text())
    assert info["timeline"] == f"{timeline}.csv" and len(info["gpus"]) == 1
    earlier = info["earlier_sessions"]
    assert [e["timeline"] for e in earlier] == [f"{timeline}.1.csv", f"{timeline}.csv"]
    assert [len(e["gpus"]) for e in earlier] == [2, 1]


def test_a_timeline_cut_by_a_crash_or_damaged_is_moved_aside(fake, tmp_path):
    header = ",".join(monitor.timeline_columns(2))
    cut = f"{header}\n1.0,0.0,nan,nan,1,2"  # a SIGKILL in the middle of a row
    (tmp_path / "timeline.csv").write_text(cut)
    with monitor.record(tmp_path, interval=60):
        pass
    assert (tmp_path / "timeline.1.csv").read_text() == cut
    assert len(_read_timeline(tmp_path / "timeline.csv")[1]) == 2
    damaged = b"\xff\xfe\x00garbage"
    (tmp_path / "timeline.csv").write_bytes(damaged)
    (tmp_path / "run.json").write_text("{not json")
    with monitor.record(tmp_path, interval=60):
        pass
    assert (tmp_path / "timeline.2.csv").read_bytes() == damaged
    assert (tmp_path / "run.1.json").read_text() == "{not json"
    assert json.loads((tmp_path / "run.json").read_text())["timeline"] == "timeline.csv"


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


def test_without_nvml_the_warning_is_given_once_per_process(monkeypatch, recwarn):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    for _ in range(3):  # three runs, e.g. three fits: one warning
        with monitor.record(interval=60):
            pass
    (warning,) = [w for w in recwarn if "records no GPU metrics" in str(w.message)]
    assert warning.filename == __file__  # the user's line, not tfgpu's (nor contextlib's)


@pytest.mark.parametrize(
    ("pynvml", "gpus"),
    [
        (None, [99]),  # the binding missing
        (fake_pynvml.make(library_missing=True), [0, 5]),  # the driver missing
        (None, [0]),  # even an index that would exist
    ],
)
def test_without_nvml_gpu_indices_are_said_unchecked_when_given(monkeypatch, pynvml, gpus):
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    match = rf"Argument `gpus` cannot be checked.*Received: gpus={re.escape(repr(gpus))}"
    with pytest.warns(RuntimeWarning, match=match) as caught:
        s = monitor.Sampler(interval=60, gpus=gpus)  # at construction, at this line
    (warning,) = [w for w in caught if "`gpus`" in str(w.message)]
    assert warning.filename == __file__ and "NVIDIA driver" in str(warning.message)
    assert s.gpus == []
    with pytest.warns(RuntimeWarning, match="cannot be checked"):
        monitor.record(gpus=gpus)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no `gpus` given: nothing to say at construction
        monitor.Sampler(interval=60)
    with pytest.warns(RuntimeWarning, match="records no GPU metrics"):
        s.start()  # then, as without `gpus`: not fatal, host metrics recorded
    s.stop()
    assert s.samples[-1]["host_rss_mib"] > 0


def test_a_gpu_lost_mid_run_is_logged_once_and_sampling_goes_on(fake, caplog):
    caplog.set_level(logging.WARNING, logger="tfgpu.monitor")
    s = _started(monitor.Sampler(interval=60))
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
    s = _started(monitor.Sampler(interval=60, gpus=[1]))
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
@pytest.mark.parametrize("interval", [0, -1, 0.001, 0.0099, float("nan"), float("inf")])
def test_bad_interval_raises_keras_style(fake, interval):
    with pytest.raises(ValueError, match=r"argument `interval`.*Received: interval=.*>= 0.01"):
        monitor.Sampler(interval=interval)
    with pytest.raises(ValueError, match=r"argument `interval`"):
        monitor.record(interval=interval).__enter__()
    assert not _monitor_threads()


@pytest.mark.parametrize("interval", [True, "0.2", None, [0.2]])
def test_interval_of_the_wrong_type_is_a_type_error(fake, interval):
    with pytest.raises(TypeError, match=r"argument `interval`.*Expected a number of seconds"):
        monitor.Sampler(interval=interval)


def test_interval_accepts_numpy_scalars_and_the_lower_bound(fake):
    np = pytest.importorskip("numpy")
    assert monitor.Sampler(interval=np.float32(0.5)).interval == 0.5
    assert monitor.Sampler(interval=checks.MIN_INTERVAL).interval == 0.01
    assert monitor.Sampler(interval=np.int64(2), gpus=[np.int64(1)]).gpus[0].index == 1


def test_unknown_gpu_index_raises(fake):
    with pytest.raises(ValueError, match=r"Received: gpus=\[2\].*sees 2 GPU.*one of \[0, 1\]"):
        monitor.Sampler(gpus=[2])
    with pytest.raises(ValueError, match=r"Received: gpus=\[0, 99\]"):
        monitor.record(gpus=[0, 99]).__enter__()


def test_unknown_gpu_index_under_cuda_visible_devices_names_it(fake, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match=r"sees 1 GPU.*CUDA_VISIBLE_DEVICES='1'"):
        monitor.Sampler(gpus=[1])


@pytest.mark.parametrize(
    ("gpus", "error"),
    [
        ("0", TypeError),
        (0, TypeError),
        ([0, 0], ValueError),
        ([-1], ValueError),
        ([0.5], TypeError),
        ([True], TypeError),
        (["0"], TypeError),
    ],
)
def test_bad_gpu_lists_raise(fake, gpus, error):
    with pytest.raises(error, match="argument `gpus`"):
        monitor.Sampler(gpus=gpus)


def test_unwritable_path_raises_before_sampling(fake, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"argument `log_dir`.*a-file/run.*is under the file"):
        monitor.Sampler(log_dir=blocker / "run")
    with pytest.raises(ValueError, match=r"argument `log_dir`.*a-file.*is a file"):
        monitor.record(blocker).__enter__()
    with pytest.raises(ValueError, match=r"argument `log_dir`.*a-file/x/y.*is under the file"):
        monitor.record(str(blocker / "x" / "y")).__enter__()
    with pytest.raises(TypeError, match="argument `log_dir`"):
        monitor.Sampler(log_dir=3)
    with pytest.raises(ValueError, match="argument `log_dir`"):
        monitor.Sampler(log_dir="")
    # The run directory is `log_dir` everywhere; the other arguments are keywords.
    with pytest.raises(TypeError, match="unexpected keyword argument 'path'"):
        monitor.Sampler(path=tmp_path)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional argument"):
        monitor.record(tmp_path, 0.5)  # type: ignore[misc]
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


# ---------------------------------------------------------------- hostile conditions
def test_a_failing_disk_mid_run_is_logged_once_and_samples_stay_in_memory(fake, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tfgpu.monitor")
    s = _started(monitor.Sampler(interval=60, log_dir=tmp_path))
    s._sample()
    s._csv.file = FullDisk(s._csv.file)
    for _ in range(3):
        s._sample()
    s.stop()
    assert len(s.samples) == 6 and s.aggregate()["gpu0_util_pct_max"] == 50.0
    _, rows = _read_timeline(tmp_path / "timeline.csv")
    assert len(rows) == 2  # what was written before the disk filled up is intact
    failed = [r for r in caplog.records if "writing the timeline failed" in r.getMessage()]
    assert len(failed) == 1 and "No space left" in failed[0].getMessage()


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("the binding's __str__ itself fails")


@pytest.mark.parametrize(
    "error", [RuntimeError("ctypes"), KeyError("gpu"), _Unprintable(), OSError(5, "I/O")]
)
def test_nvml_raising_unexpected_exception_types_gives_nan_not_a_crash(fake, caplog, error):
    caplog.set_level(logging.WARNING, logger="tfgpu.monitor")

    def broken():
        raise error

    s = _started(monitor.Sampler(interval=60))
    fake.gpus[0].util = broken
    s._sample()
    s._sample()
    s.stop()
    rows = s.samples
    assert len(rows) == 4 and all(math.isnan(r["gpu0_util_pct"]) for r in rows[1:])
    assert all(r["gpu0_mem_used_mib"] == 1024.0 for r in rows)  # other queries unaffected
    assert len([r for r in caplog.records if "NVML error" in r.getMessage()]) == 1


def test_an_nvml_module_that_fails_to_import_means_no_nvml(monkeypatch):
    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError("broken install")

    monkeypatch.setitem(sys.modules, "pynvml", Exploding())
    inv = nvml.inventory()
    assert not inv.available and "NVIDIA driver" in inv.error


def test_mark_rejects_labels_that_are_not_numbers(fake):
    s = monitor.Sampler(interval=60)
    with pytest.raises(TypeError, match="argument `epoch`"):
        s.mark(epoch="1")
    with pytest.raises(TypeError, match="argument `step`"):
        s.mark(step=[3])
    s.mark(epoch=2, step=5)
    s.start()
    s.stop()
    assert (s.samples[-1]["epoch"], s.samples[-1]["step"]) == (2, 5)


def test_a_timeline_that_is_a_directory_is_refused_and_sampling_goes_on(fake, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="tfgpu.monitor")
    (tmp_path / "timeline.csv").mkdir()
    with monitor.record(tmp_path, interval=60) as run:
        pass
    assert len(run.samples) == 2 and (tmp_path / "timeline.csv").is_dir()
    assert any("cannot write to" in r.getMessage() for r in caplog.records)


def test_record_checks_its_arguments_at_the_call(tmp_path):
    from tfgpu import monitor

    with pytest.raises(TypeError, match=r"Received: interval='1' \(of type str\)"):
        monitor.record(interval="1")
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"Invalid value for argument `log_dir`.*is a file"):
        monitor.record(tmp_path / "f")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no NVML here: warned once per process
        with monitor.record(interval=0.5) as run:
            assert run.running
    assert not run.running
