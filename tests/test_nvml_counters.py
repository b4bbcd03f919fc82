"""The counters GPU utilization hides (issue 15): GPM, PCIe, energy, per-process SM share,
and the driver-generation fallbacks, all against the scripted NVML of `tests/fake_pynvml.py`.

Deterministic: the fake NVML and the readers share one fake clock; nothing sleeps.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.util
import logging
import math
import os
import sys

import pytest

from tests import fake_pynvml
from tfgpu import monitor
from tfgpu._internal.helpers import warn
from tfgpu.monitor import _gpu_reader, _metrics, host, nvml

NAN = float("nan")
GPM_KEYS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct")


class Clock:
    """One fake monotonic clock for the fake NVML (GPM/field timestamps) and the readers."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    warn.forget()
    yield
    warn.forget()


def _install(monkeypatch, gpus, **kwargs):
    fake = fake_pynvml.make(gpus, **kwargs)
    clock = Clock()
    fake.clock, fake.sleep = clock, clock.sleep
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake, clock


class Readers:
    """The sampler's per-GPU readers, driven by hand: `read()` returns one row per GPU."""

    def __init__(self, fake, clock, min_window: float = 0.0):
        self.fake, self.clock = fake, clock
        inventory = nvml.inventory()
        self.nv, self.readers = _gpu_reader.open_readers(inventory.gpus, clock, min_window)

    def read(self, advance: float = 0.0) -> list[dict[str, float]]:
        self.clock.t += advance
        return [dict(zip(nvml.GPU_METRICS, r.read())) for r in self.readers]

    def close(self) -> None:
        _gpu_reader.close_readers(self.nv, self.readers)


def _calls(fake, name):
    return sum(1 for n, _ in fake.calls if n == name)


def _warnings(caplog) -> list[str]:
    return [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING]


# ---------------------------------------------------------------- GPM
def test_gpm_metrics_come_from_two_samples_and_are_freed_at_stop(monkeypatch):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()])
    r = Readers(fake, clock)
    first = r.read()[0]
    assert all(math.isnan(first[k]) for k in GPM_KEYS)  # one sample: nothing to compare yet
    second = r.read(0.2)[0]
    assert second["util_pct"] == 100.0
    assert second["sm_active_pct"] == 60.0 and second["sm_occupancy_pct"] == 30.0
    assert second["tensor_active_pct"] == 40.0 and second["dram_active_pct"] == 25.0
    assert second["fp16_active_pct"] == 1.0 and second["fp32_active_pct"] == 5.0
    assert (second["pcie_tx_mib_s"], second["pcie_rx_mib_s"]) == (100.0, 50.0)
    fake.gpus[0].gpm["any_tensor"] = 2.0  # e.g. float32 without TF32
    assert r.read(0.2)[0]["tensor_active_pct"] == 2.0
    assert fake.gpm_live == 2  # two samples reused, not one per read
    r.close()
    assert fake.gpm_live == 0 and fake.init_count == 0


def test_gpm_with_an_interval_under_100_ms_carries_values(monkeypatch):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()])
    r = Readers(fake, clock)
    rows = [r.read(0.03)[0] for _ in range(20)]  # 0.03 s apart: the fake refuses < 0.1 s
    assert all(row["sm_active_pct"] == 60.0 for row in rows[4:])
    assert _calls(fake, "nvmlGpmSampleGet") == 5  # once per 0.1 s, not per read
    r.close()


def test_gpm_never_asks_for_a_window_of_exactly_100_ms(monkeypatch, caplog):
    # NVML wants the two samples "greater than 100ms" apart; the fake refuses 100 ms itself.
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()])
    clock.t = 0.0  # 0.1 - 0.0 and 0.2 - 0.1 are exactly 0.1 in binary
    r = Readers(fake, clock)
    r.read()
    clock.t = 0.1
    assert math.isnan(r.read()[0]["sm_active_pct"])  # not asked: nothing to carry yet
    assert _calls(fake, "nvmlGpmSampleGet") == 1
    clock.t = 0.2
    assert r.read()[0]["sm_active_pct"] == 60.0  # 200 ms after the first sample
    clock.t = 0.3  # 0.3 - 0.2 is a hair under 0.1: carried
    assert r.read()[0]["sm_active_pct"] == 60.0
    assert _calls(fake, "nvmlGpmSampleGet") == 2
    assert not _warnings(caplog)  # never NVML_ERROR_INVALID_ARGUMENT
    r.close()


def test_gpm_windows_count_from_when_the_previous_sample_was_taken(monkeypatch, caplog):
    # A slow nvmlGpmSampleGet (5 ms) stamps its sample late: 101 ms after that call began is
    # only 96 ms after the sample, too soon for NVML.
    taking = iter([0.005])
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper(gpm_sample_s=lambda: next(taking, 0))])
    r = Readers(fake, clock)
    start = clock.t
    r.read()
    for late in (0.101, 0.104):  # 96 and 99 ms after the sample
        clock.t = start + late
        assert math.isnan(r.read()[0]["sm_active_pct"])
    assert _calls(fake, "nvmlGpmSampleGet") == 1
    clock.t = start + 0.2
    assert r.read()[0]["sm_active_pct"] == 60.0
    assert not _warnings(caplog)
    r.close()


def test_gpm_unsupported_gpu_is_said_once_and_never_sampled(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.FakeGpu()])  # an A100: no GPM
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(4)]
    assert all(math.isnan(row[k]) for row in rows for k in GPM_KEYS)
    assert rows[-1]["util_pct"] == 50.0  # the rest is unaffected
    said = [m for m in caplog.messages if "Hopper or newer needed" in m]
    assert len(said) == 1 and "sm/tensor/dram activity not recorded" in said[0]
    assert _calls(fake, "nvmlGpmQueryDeviceSupport") == 1
    assert _calls(fake, "nvmlGpmSampleAlloc") == 0
    r.close()


def test_gpm_on_a_driver_without_it_is_off(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()], old_driver=True)
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(3)]
    assert all(math.isnan(row["sm_active_pct"]) for row in rows)
    assert any("does not offer GPM" in m for m in caplog.messages)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    r.close()


def test_gpm_counters_held_by_another_profiler_warn_once_and_recover(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper(gpm_busy=True)])
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(4)]
    assert all(math.isnan(row["sm_active_pct"]) for row in rows)
    assert rows[-1]["util_pct"] == 100.0
    busy = [m for m in caplog.messages if "in use" in m]
    assert len(busy) == 1 and "another profiler" in busy[0]
    fake.gpus[0].gpm_busy = False  # the profiler let go
    assert math.isnan(r.read(0.2)[0]["sm_active_pct"])  # one fresh sample
    assert r.read(0.2)[0]["sm_active_pct"] == 60.0  # two: values again
    r.close()
    assert fake.gpm_live == 0


def test_gpm_on_a_gpu_lost_mid_run_recovers_with_fresh_samples(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()])
    r = Readers(fake, clock)
    r.read()
    assert r.read(0.2)[0]["sm_active_pct"] == 60.0
    fake.gpus[0].lost = True
    lost = [r.read(0.2)[0] for _ in range(3)]
    assert all(math.isnan(row["sm_active_pct"]) and math.isnan(row["util_pct"]) for row in lost)
    fake.gpus[0].lost = False
    r.read(0.2)
    assert r.read(0.2)[0]["sm_active_pct"] == 60.0
    assert len([m for m in caplog.messages if "GPU is lost" in m]) == 1
    r.close()


def _lose(fake, how: str) -> None:
    gpu = fake.gpus[0]
    if how == "lost":
        gpu.lost = True  # Xid 79: every query answers NVML_ERROR_GPU_IS_LOST
    elif how == "reset required":
        gpu.lost = fake.NVML_ERROR_RESET_REQUIRED  # every query asks for a GPU reset
    elif how == "lost mid-row":
        util = gpu.util

        def read_then_lose():
            gpu.lost = True  # utilization answered; the queries after it find the GPU gone
            return util

        gpu.util = read_then_lose
    elif how == "a field says lost":
        gpu.field_errors = {fake.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: fake.NVML_ERROR_GPU_IS_LOST}
    else:  # "nvml shut down": another library's nvmlShutdown took NVML's last reference
        fake.nvmlShutdown()


def _recover(fake, how: str, util: float) -> None:
    gpu = fake.gpus[0]
    gpu.lost, gpu.util, gpu.field_errors = False, util, {}
    if how == "nvml shut down":
        fake.nvmlInit()


@pytest.mark.parametrize(
    ("source", "how"),
    [
        *[
            (source, how)
            for source in ("gpm", "throughput", "fields")
            for how in ("lost", "reset required", "lost mid-row", "nvml shut down")
        ],
        ("fields", "a field says lost"),
    ],
)
def test_a_lost_gpu_s_row_is_nan_throughout_and_nothing_is_carried_past_it(
    monkeypatch, caplog, source, how
):
    lacks = {"field:197", "field:198"} if source == "throughput" else set()
    gpu = fake_pynvml.FakeGpu(pcie_tx_kb_s=2048, pcie_rx_kb_s=1024)
    if source == "gpm":
        gpu = fake_pynvml.hopper()
    elif source == "fields":
        gpu.pcie_tx_bytes = lambda: clock.t * 2**20 * 10  # 10 MiB/s
    fake, clock = _install(monkeypatch, [gpu], driver_lacks=lacks)
    r = Readers(fake, clock)
    # 60 ms apart: GPM sampled every other read (the last read carries) and carried between,
    # PCIe throughput carried between its calls.
    rows = [r.read(0.06)[0] for _ in range(30)]
    tx = {"gpm": 100.0, "throughput": 2.0, "fields": 10.0}[source]
    assert rows[-1]["pcie_tx_mib_s"] == pytest.approx(tx) and rows[-1]["util_pct"] == gpu.util
    util = gpu.util
    _lose(fake, how)
    lost = [r.read(0.01)[0], r.read(0.06)[0], r.read(0.06)[0]]  # the first: GPM would carry
    assert all(math.isnan(v) for row in lost for v in row.values()), lost[0]
    # What the GPU reads after it is back comes from fresh readings only.
    gpu.pcie_tx_kb_s = 4096
    if source == "fields":  # twice the traffic: a rate across the loss would read neither
        gpu.pcie_tx_bytes = lambda: clock.t * 2**20 * 20 - 1000 * 2**20 * 10
    if gpu.gpm is not None:
        gpu.gpm["pcie_tx"] = gpu.gpm["sm_util"] = 80.0
    _recover(fake, how, util)
    after = [r.read(0.06)[0] for _ in range(30)]
    assert after[0]["util_pct"] == util
    fresh = {"gpm": 80.0, "throughput": 4.0, "fields": 20.0}[source]
    # GPM's PCIe waits for two fresh samples; the byte counters (0 bytes here) stand in.
    allowed = {fresh, 0.0} if source == "gpm" else {fresh}
    for row in after:
        value = row["pcie_tx_mib_s"]
        assert math.isnan(value) or any(value == pytest.approx(v) for v in allowed), value
    assert after[-1]["pcie_tx_mib_s"] == pytest.approx(fresh)
    assert all(math.isnan(row["sm_active_pct"]) or row["sm_active_pct"] == 80.0 for row in after)
    assert len(_warnings(caplog)) == 1  # the loss, once
    r.close()


def test_a_gpm_metric_the_gpu_lacks_is_nan_and_noted_once(monkeypatch, caplog):
    gpu = fake_pynvml.hopper()
    del gpu.gpm["sm_occupancy"], gpu.gpm["pcie_tx"], gpu.gpm["pcie_rx"]
    gpu.pcie_tx_bytes = lambda: clock.t * 2**20 * 10  # 10 MiB/s through the byte counter
    fake, clock = _install(monkeypatch, [gpu])
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(4)]
    assert rows[-1]["sm_active_pct"] == 60.0 and math.isnan(rows[-1]["sm_occupancy_pct"])
    assert rows[-1]["pcie_tx_mib_s"] == pytest.approx(10.0)  # GPM lacks PCIe: field values
    assert len([m for m in caplog.messages if "NVML_GPM_METRIC_SM_OCCUPANCY" in m]) == 1
    r.close()


# ---------------------------------------------------------------- PCIe
def test_pcie_rates_from_the_byte_counters(monkeypatch):
    gpu = fake_pynvml.FakeGpu()
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock)
    gpu.pcie_tx_bytes, gpu.pcie_rx_bytes = 0, 0
    assert math.isnan(r.read()[0]["pcie_tx_mib_s"])  # a counter needs two readings
    gpu.pcie_tx_bytes, gpu.pcie_rx_bytes = 50 * 2**20, 100 * 2**20
    row = r.read(0.5)[0]
    assert row["pcie_tx_mib_s"] == pytest.approx(100.0)
    assert row["pcie_rx_mib_s"] == pytest.approx(200.0)
    gpu.pcie_tx_bytes = 0  # a counter that went back (driver reload): no negative rate
    assert math.isnan(r.read(0.5)[0]["pcie_tx_mib_s"])
    assert _calls(fake, "nvmlDeviceGetPcieThroughput") == 0  # never the blocking call
    r.close()


def test_pcie_throughput_fallback_reads_one_counter_a_second(monkeypatch, caplog):
    gpu = fake_pynvml.FakeGpu(pcie_tx_kb_s=2048, pcie_rx_kb_s=1024)
    fake, clock = _install(monkeypatch, [gpu], driver_lacks={"field:197", "field:198"})
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(12)]  # 2.4 s at 0.2 s
    assert rows[0]["pcie_tx_mib_s"] == 2.0 and math.isnan(rows[0]["pcie_rx_mib_s"])
    assert all(row["pcie_rx_mib_s"] == 1.0 for row in rows[3:])  # KB/s -> MiB/s, carried
    assert all(row["pcie_tx_mib_s"] == 2.0 for row in rows)
    # Each call blocks ~20 ms: one GPU reads each counter at most once a second.
    assert _calls(fake, "nvmlDeviceGetPcieThroughput") <= 2 * 3
    assert any("no PCIe byte counters" in m for m in caplog.messages)
    r.close()


def test_pcie_throughput_calls_are_spread_over_many_gpus(monkeypatch):
    gpus = [fake_pynvml.FakeGpu(pcie_tx_kb_s=1024, pcie_rx_kb_s=2048) for _ in range(8)]
    fake, clock = _install(monkeypatch, gpus, driver_lacks={"field:197", "field:198"})
    r = Readers(fake, clock)
    per_sample = []
    for _ in range(20):  # 4 s at 0.2 s
        before = _calls(fake, "nvmlDeviceGetPcieThroughput")
        rows = r.read(0.2)
        per_sample.append(_calls(fake, "nvmlDeviceGetPcieThroughput") - before)
    assert max(per_sample) == 1  # never 8 GPUs x 20 ms in one sample
    assert sum(per_sample) == 20
    assert sum(row["pcie_tx_mib_s"] == 1.0 for row in rows) == 8  # each GPU read once
    r.close()


@pytest.mark.parametrize(
    "error",
    [
        "NVML_ERROR_INVALID_ARGUMENT",
        "NVML_ERROR_NO_PERMISSION",
        "NVML_ERROR_UNKNOWN",
        "NVML_ERROR_NOT_SUPPORTED",
    ],
)
@pytest.mark.parametrize("where", ["in a field", "from the call"])
def test_pcie_byte_counters_refused_with_any_error_fall_back_to_the_throughput_call(
    monkeypatch, caplog, error, where
):
    gpu = fake_pynvml.FakeGpu(pcie_tx_kb_s=2048, pcie_rx_kb_s=1024)
    fake, clock = _install(monkeypatch, [gpu])
    code = getattr(fake, error)
    if where == "in a field":
        gpu.field_errors = {fake.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: code}
    else:

        def refuse(h, field_ids):
            fake.calls.append(("nvmlDeviceGetFieldValues", 0))
            raise fake.NVMLError(code)

        monkeypatch.setattr(fake, "nvmlDeviceGetFieldValues", refuse)
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(8)]
    assert all(row["pcie_tx_mib_s"] == 2.0 for row in rows)
    assert all(row["pcie_rx_mib_s"] == 1.0 for row in rows[3:])
    assert _calls(fake, "nvmlDeviceGetFieldValues") == 1  # decided once
    noted = [m for m in caplog.messages if "no PCIe byte counters" in m]
    assert len(noted) == 1 and str(fake.NVMLError(code)) in noted[0]
    assert not _warnings(caplog)
    r.close()


def test_pcie_byte_counters_that_worked_and_fail_once_are_nan_then_read_again(monkeypatch, caplog):
    gpu = fake_pynvml.FakeGpu(pcie_tx_bytes=lambda: clock.t * 2**20 * 10)
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0]["pcie_tx_mib_s"] for _ in range(2)]
    gpu.field_errors = {fake.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: fake.NVML_ERROR_UNKNOWN}
    rows.append(r.read(0.2)[0]["pcie_tx_mib_s"])
    gpu.field_errors = {}
    rows += [r.read(0.2)[0]["pcie_tx_mib_s"] for _ in range(2)]
    assert [round(v, 6) if v == v else "nan" for v in rows] == ["nan", 10.0, "nan", "nan", 10.0]
    assert _calls(fake, "nvmlDeviceGetPcieThroughput") == 0  # no fallback for a passing error
    (warning,) = _warnings(caplog)
    assert "pcie_tx_mib_s" in warning and "Unknown Error" in warning
    r.close()


def test_a_counter_rate_needs_the_minimum_window(monkeypatch):
    gpu = fake_pynvml.FakeGpu()
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock, min_window=0.1)
    assert math.isnan(r.read()[0]["pcie_rx_mib_s"])  # the base
    gpu.pcie_rx_bytes = 3 * 2**20  # a burst of 3 MiB, then nothing
    assert math.isnan(r.read(0.003)[0]["pcie_rx_mib_s"])  # 3 ms: would read 1000 MiB/s
    assert math.isnan(r.read(0.096)[0]["pcie_rx_mib_s"])  # 99 ms: still too short
    assert r.read(0.101)[0]["pcie_rx_mib_s"] == pytest.approx(15.0)  # 3 MiB over 0.2 s
    assert r.read(0.15)[0]["pcie_rx_mib_s"] == 0.0  # over the window: a rate
    r.close()


def test_pcie_unsupported_everywhere_is_nan_and_not_asked_again(monkeypatch):
    gpu = fake_pynvml.FakeGpu(not_supported={"nvmlDeviceGetPcieThroughput"})
    fake, clock = _install(monkeypatch, [gpu], driver_lacks={"field:197", "field:198"})
    r = Readers(fake, clock)
    rows = [r.read(0.5)[0] for _ in range(6)]
    assert all(math.isnan(row["pcie_tx_mib_s"]) for row in rows)
    assert _calls(fake, "nvmlDeviceGetPcieThroughput") == 1
    r.close()


# ---------------------------------------------------------------- energy, process SM share
def test_energy_is_cumulative_joules_and_the_aggregate_is_the_difference(monkeypatch):
    gpu = fake_pynvml.FakeGpu(energy_j=lambda: 5000.0 + 300.0 * (clock.t - 1000.0))
    fake, clock = _install(monkeypatch, [gpu, fake_pynvml.two_gpus()[1]])
    fake.gpus[1].not_supported.add("nvmlDeviceGetTotalEnergyConsumption")  # a pre-Volta GPU
    s = monitor.Sampler(interval=0.5, host=False)
    s._monotonic = clock
    s._nv, s._readers = _gpu_reader.open_readers(s._gpus, lambda: s._monotonic())
    for _ in range(5):
        s._sample()
        clock.t += 0.5
    s._close()
    assert [row["gpu0_energy_j"] for row in s.samples][:2] == [5000.0, 5150.0]
    assert all(math.isnan(row["gpu1_energy_j"]) for row in s.samples)
    agg = s.aggregate()
    assert agg["gpu0_energy_j"] == pytest.approx(600.0)  # 300 W for 2 s
    assert math.isnan(agg["gpu1_energy_j"])


def test_this_process_sm_share_from_per_process_samples(monkeypatch):
    me = os.getpid()
    gpu = fake_pynvml.FakeGpu(process_util=[(me, 70), (me + 1, 20)])
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock)
    assert r.read(0.2)[0]["proc_sm_util_pct"] == 70.0
    gpu.process_util = []  # no newer sample (NVML_ERROR_NOT_FOUND): carried a second
    assert r.read(0.2)[0]["proc_sm_util_pct"] == 70.0
    assert r.read(1.0)[0]["proc_sm_util_pct"] == 0.0  # then: idle
    gpu.process_util = [(me + 1, 90)]  # only another process ran
    assert r.read(0.2)[0]["proc_sm_util_pct"] == 0.0
    r.close()


# ---------------------------------------------------------------- driver generations
def test_throttle_reasons_fall_back_when_the_driver_lacks_the_new_name(monkeypatch, caplog):
    # nvidia-ml-py 13 has nvmlDeviceGetCurrentClocksEventReasons; a pre-R535 driver does not.
    gpu = fake_pynvml.FakeGpu(throttle_reasons=0x4)
    fake, clock = _install(
        monkeypatch, [gpu], driver_lacks={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    r = Readers(fake, clock)
    assert [r.read(0.2)[0]["throttle_reasons"] for _ in range(3)] == [4.0, 4.0, 4.0]
    assert _calls(fake, "nvmlDeviceGetCurrentClocksEventReasons") == 1  # not asked again
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    r.close()


def test_process_memory_falls_back_on_a_library_mismatch(monkeypatch, caplog):
    me = os.getpid()
    gpu = fake_pynvml.FakeGpu(processes=[(me, 512.0), (me + 1, 64.0)])
    fake, clock = _install(monkeypatch, [gpu], old_driver=True)
    assert not issubclass(fake.NVMLLibraryMismatchError, fake.NVMLError)
    r = Readers(fake, clock)
    assert [r.read(0.2)[0]["proc_mem_mib"] for _ in range(3)] == [512.0] * 3
    assert _calls(fake, "nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    r.close()


# ---------------------------------------------------------------- one failed call at a time
def test_a_gpu_lost_before_its_first_read_is_nan_until_it_answers(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.FakeGpu()])
    r = Readers(fake, clock)
    fake.gpus[0].lost = True  # after the inventory, before the reader opens its handle
    rows = [r.read(0.5)[0] for _ in range(3)]
    assert all(math.isnan(v) for row in rows for v in row.values())
    fake.gpus[0].lost = False
    assert r.read(0.5)[0]["util_pct"] == 50.0
    warned = _warnings(caplog)
    assert len(warned) == 1 and "GPU is lost" in warned[0]
    r.close()


def test_an_nvml_error_on_one_counter_is_nan_warned_once_and_retried(monkeypatch, caplog):
    failing = True

    def tx_kb_s():
        if failing:
            raise fake.NVMLError(fake.NVML_ERROR_UNKNOWN)
        return 2048

    gpu = fake_pynvml.FakeGpu(pcie_tx_kb_s=tx_kb_s)
    fake, clock = _install(monkeypatch, [gpu], driver_lacks={"field:197", "field:198"})
    r = Readers(fake, clock)
    rows = [r.read(0.5)[0] for _ in range(6)]
    assert all(math.isnan(row["pcie_tx_mib_s"]) for row in rows)
    assert rows[-1]["util_pct"] == 50.0  # the other queries are unaffected
    failing = False
    assert [r.read(0.5)[0]["pcie_tx_mib_s"] for _ in range(4)][-1] == 2.0  # asked again
    warned = _warnings(caplog)
    assert len(warned) == 1 and "Unknown Error" in warned[0] and "pcie_tx_mib_s" in warned[0]
    r.close()


def test_gpm_sampling_the_driver_refuses_turns_gpm_off_once(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper(not_supported={"nvmlGpmSampleGet"})])
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    rows = [r.read(0.2)[0] for _ in range(4)]
    assert all(math.isnan(row[k]) for row in rows for k in GPM_KEYS)
    assert len([m for m in caplog.messages if "GPM sampling is not supported here" in m]) == 1
    assert _calls(fake, "nvmlGpmSampleGet") == 1 and fake.gpm_live == 0
    assert not _warnings(caplog)
    r.close()


def test_gpm_samples_are_freed_when_one_cannot_be_allocated(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper()])
    alloc, allocs = fake.nvmlGpmSampleAlloc, []

    def second_fails():
        allocs.append(1)
        if len(allocs) == 2:
            raise fake.NVMLError(fake.NVML_ERROR_UNKNOWN)
        return alloc()

    monkeypatch.setattr(fake, "nvmlGpmSampleAlloc", second_fails)
    r = Readers(fake, clock)
    assert math.isnan(r.read()[0]["sm_active_pct"]) and fake.gpm_live == 0  # none kept
    r.read(0.2)  # allocated again, and the first sample taken
    assert r.read(0.2)[0]["sm_active_pct"] == 60.0
    warned = _warnings(caplog)
    assert len(warned) == 1 and "Unknown Error" in warned[0]
    r.close()
    assert fake.gpm_live == 0


def test_a_process_sm_share_the_gpu_does_not_give_is_nan_and_not_asked_again(monkeypatch, caplog):
    gpu = fake_pynvml.FakeGpu(not_supported={"nvmlDeviceGetProcessUtilization"})
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock)
    rows = [r.read(0.5)[0] for _ in range(3)]
    assert all(math.isnan(row["proc_sm_util_pct"]) for row in rows)
    assert _calls(fake, "nvmlDeviceGetProcessUtilization") == 1
    assert not _warnings(caplog)
    r.close()


def test_a_binding_without_either_throttle_reasons_call_reads_nan_quietly(monkeypatch, caplog):
    fake, clock = _install(monkeypatch, [fake_pynvml.FakeGpu()], old_api=True)
    monkeypatch.delattr(fake, "nvmlDeviceGetCurrentClocksThrottleReasons")
    r = Readers(fake, clock)
    rows = [r.read(0.5)[0] for _ in range(3)]
    assert all(math.isnan(row["throttle_reasons"]) for row in rows)
    assert rows[-1]["util_pct"] == 50.0 and not _warnings(caplog)
    r.close()


def test_memory_used_matches_nvidia_smi_where_the_driver_allows(monkeypatch, caplog):
    gpu = fake_pynvml.FakeGpu(memory_used_mib=1000.0, memory_reserved_mib=512.0)
    fake, clock = _install(monkeypatch, [gpu])
    r = Readers(fake, clock)
    assert r.read()[0]["mem_used_mib"] == 1000.0  # v2 struct: reserved memory left out
    assert nvml.inventory().gpus[0].memory_used_mib == 1000.0
    r.close()
    fake, clock = _install(monkeypatch, [gpu], old_driver=True)
    caplog.set_level(logging.INFO, logger="tfgpu.monitor")
    r = Readers(fake, clock)
    assert [r.read()[0]["mem_used_mib"] for _ in range(2)] == [1512.0, 1512.0]  # v1
    assert len([m for m in caplog.messages if "counts reserved memory" in m]) == 1
    r.close()


def test_an_old_driver_loses_only_what_it_lacks(monkeypatch, caplog):
    gpu = fake_pynvml.hopper(throttle_reasons=0x1, pcie_tx_kb_s=1024)
    fake, _ = _install(monkeypatch, [gpu], old_driver=True)
    with monitor.record(interval=60) as run:
        pass
    row = run.samples[-1]
    assert row["gpu0_util_pct"] == 100.0 and row["gpu0_throttle_reasons"] == 1.0
    assert row["gpu0_energy_j"] == 1000.0
    assert math.isnan(row["gpu0_sm_active_pct"])
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    assert fake.init_count == 0


# ---------------------------------------------------------------- through the sampler
def test_the_timeline_carries_the_new_columns(monkeypatch, tmp_path):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper(), fake_pynvml.FakeGpu()])
    s = monitor.Sampler(interval=0.2, log_dir=tmp_path, host=False)
    s._monotonic = clock

    class Event:  # the stop event of the sampler thread, advancing the fake clock
        left = 5

        def wait(self, timeout):
            clock.t += timeout
            self.left -= 1
            return self.left < 0

    s._open_files()
    s._run(Event())  # the thread's body: opens the readers, samples, closes
    assert fake.gpm_live == 0 and fake.init_count == 0  # freed, then NVML shut down
    header, *rows = (tmp_path / "timeline.csv").read_text().splitlines()
    assert header.split(",") == monitor.timeline_columns(2)
    parsed = [dict(zip(header.split(","), map(float, line.split(",")))) for line in rows]
    assert len(parsed) == 7  # one at once, five intervals, the last sample at stop
    assert [p["gpu0_sm_active_pct"] for p in parsed][1:] == [60.0] * 6
    assert all(math.isnan(p["gpu1_tensor_active_pct"]) for p in parsed)
    agg = s.aggregate()
    assert agg["gpu0_tensor_active_pct_mean"] == 40.0
    assert agg["gpu0_pcie_tx_mib_s_mean"] == 100.0
    assert math.isnan(agg["gpu1_sm_active_pct_mean"])


def test_host_cpu_percent_needs_the_minimum_window(monkeypatch):
    psutil = pytest.importorskip("psutil")
    T = collections.namedtuple("T", "user system idle")
    times = iter([T(10.0, 0.0, 90.0), T(10.01, 0.0, 90.0), T(12.0, 0.0, 92.0), T(12.0, 0.0, 94.0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(times))
    clock = Clock()
    reader = host.HostReader(clock, min_window=0.1)
    assert math.isnan(reader.read()[0])  # the base
    clock.t += 0.002
    assert math.isnan(reader.read()[0])  # 2 ms, one tick of one core: would read 100%
    clock.t += 0.2
    assert reader.read()[0] == pytest.approx(50.0)  # 2 s busy of 4 since the base
    clock.t += 0.1
    assert reader.read()[0] == 0.0


def test_the_last_row_at_stop_has_no_rate_over_a_few_milliseconds(monkeypatch):
    psutil = pytest.importorskip("psutil")
    gpu = fake_pynvml.FakeGpu(pcie_tx_bytes=lambda: clock.t * 2**20 * 10)
    fake, clock = _install(monkeypatch, [gpu])
    T = collections.namedtuple("T", "user system idle")
    monkeypatch.setattr(psutil, "cpu_times", lambda: T(clock.t / 2, 0.0, clock.t / 2))
    s = monitor.Sampler(interval=0.2)
    s._monotonic = clock

    class Event:  # stop() comes 2 ms after the fourth interval's sample
        left = 4

        def wait(self, timeout):
            self.left -= 1
            clock.t += timeout if self.left >= 0 else 0.002
            return self.left < 0

    s._run(Event())
    rows = s.samples
    assert len(rows) == 6
    assert [r["gpu0_pcie_tx_mib_s"] for r in rows[1:-1]] == [pytest.approx(10.0)] * 4
    assert [r["host_cpu_pct"] for r in rows[1:-1]] == [pytest.approx(50.0)] * 4
    assert math.isnan(rows[-1]["gpu0_pcie_tx_mib_s"]) and math.isnan(rows[-1]["host_cpu_pct"])
    assert rows[-1]["gpu0_util_pct"] == 50.0  # the rest of the row is read as usual
    assert fake.init_count == 0  # the thread's body closed what it opened


# ---------------------------------------------------------------- aggregates (pure)
def test_aggregates_of_counters_and_bitmasks():
    columns = {
        "gpu0_energy_j": [NAN, 100.0, 150.0, NAN, 400.0],
        "gpu0_throttle_reasons": [0.0, 4.0, NAN, 32.0],
        "gpu0_power_limit_w": [700.0, 350.0],
        "gpu0_sm_clock_mhz": [1000.0, 2000.0],
        "gpu0_sm_active_pct": [NAN, 20.0, 40.0],
    }
    agg = _metrics.aggregate_columns(columns, 1)
    assert agg["gpu0_energy_j"] == 300.0
    assert agg["gpu0_throttle_reasons_any"] == 36.0
    assert agg["gpu0_power_limit_w_max"] == 700.0
    assert agg["gpu0_sm_clock_mhz_mean"] == 1500.0
    assert agg["gpu0_sm_active_pct_mean"] == 30.0
    assert math.isnan(agg["gpu0_tensor_active_pct_mean"])
    one = _metrics.aggregate_columns({"gpu0_energy_j": [5.0], "gpu0_throttle_reasons": [NAN]}, 1)
    assert math.isnan(one["gpu0_energy_j"]) and math.isnan(one["gpu0_throttle_reasons_any"])
    reset = _metrics.aggregate_columns({"gpu0_energy_j": [500.0, 10.0]}, 1)  # driver reloaded
    assert math.isnan(reset["gpu0_energy_j"])


# ---------------------------------------------------------------- the fake keeps NVML's rules
def test_the_fake_refuses_gpm_calls_nvml_would_refuse(monkeypatch):
    fake, clock = _install(monkeypatch, [fake_pynvml.hopper(), fake_pynvml.hopper()])
    fake.nvmlInit()
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    a, b = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    request = fake.c_nvmlGpmMetricsGet_t()
    request.version = fake.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.metrics[0].metricId = fake.NVML_GPM_METRIC_SM_UTIL
    request.sample1, request.sample2 = a, b
    with pytest.raises(fake.NVMLError_InvalidArgument):  # not filled yet
        fake.nvmlGpmMetricsGet(request)
    fake.nvmlGpmSampleGet(h0, a)
    clock.t += 0.2
    fake.nvmlGpmSampleGet(h1, b)
    with pytest.raises(fake.NVMLError_InvalidArgument):  # two GPUs
        fake.nvmlGpmMetricsGet(request)
    fake.nvmlGpmSampleGet(h0, b)
    request.sample1, request.sample2 = b, a
    with pytest.raises(fake.NVMLError_InvalidArgument):  # out of time order
        fake.nvmlGpmMetricsGet(request)
    clock.t = 0.0
    fake.nvmlGpmSampleGet(h0, a)
    clock.t = 0.1
    fake.nvmlGpmSampleGet(h0, b)
    request.sample1, request.sample2 = a, b
    with pytest.raises(fake.NVMLError_InvalidArgument):  # 100 ms: not "greater than 100ms"
        fake.nvmlGpmMetricsGet(request)
    clock.t = 0.2
    fake.nvmlGpmSampleGet(h0, b)
    request.sample1, request.sample2 = a, b
    request.version = 2
    with pytest.raises(fake.NVMLError_ArgumentVersionMismatch):
        fake.nvmlGpmMetricsGet(request)
    request.version = fake.NVML_GPM_METRICS_GET_VERSION
    assert fake.nvmlGpmMetricsGet(request).metrics[0].value == 60.0
    fake.nvmlGpmSampleFree(a)
    with pytest.raises(fake.NVMLError_InvalidArgument):  # a freed sample
        fake.nvmlGpmMetricsGet(request)
    with pytest.raises(TypeError):  # structs go by reference, as ctypes.byref wants
        fake.nvmlGpmMetricsGet({"version": 1})
    fake.nvmlGpmSampleFree(b)
    fake.nvmlShutdown()


def test_the_fake_structs_match_nvidia_ml_py(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None or "site-packages" not in spec.origin:
        pytest.skip("nvidia-ml-py is not installed")
    real = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", real)  # it looks itself up there
    spec.loader.exec_module(real)  # loads no library: that happens at nvmlInit
    assert not issubclass(real.NVMLLibraryMismatchError, real.NVMLError)
    for name in (
        "c_nvmlMemory_t",
        "c_nvmlMemory_v2_t",
        "c_nvmlFieldValue_t",
        "c_nvmlProcessUtilizationSample_t",
        "c_nvmlGpmMetric_t",
        "c_nvmlGpmMetricsGet_t",
        "c_nvmlGpmSupport_t",
    ):
        fake_struct, real_struct = getattr(fake_pynvml, name), getattr(real, name)
        assert [f[0] for f in fake_struct._fields_] == [f[0] for f in real_struct._fields_], name
        assert ctypes.sizeof(fake_struct) == ctypes.sizeof(real_struct), name
    for name in dir(fake_pynvml):
        if name.startswith(("NVML_", "nvmlMemory_")) and hasattr(real, name):
            assert getattr(fake_pynvml, name) == getattr(real, name), name
