"""tfgpu.env: facts without initializing TensorFlow, and every finding decided from facts."""

from __future__ import annotations

import copy
import json
import math
import re
import sys
import types

import pytest

import tfgpu
from tests.conftest import run_python
from tfgpu.env import EnvironmentReport, Finding, _facts, _findings, _gather, _gpu_checks
from tfgpu.monitor.nvml import GpuInfo, NvmlInventory


def _a100(index=0, **kw):
    gpu = {
        "index": index,
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": f"GPU-aaaa{index}000-1111-2222-3333-444455556666",
        "pci_bus_id": f"00000000:0{index}:00.0",
        "memory_total_mib": 81920.0,
        "memory_used_mib": 4.0,
        "compute_capability": [8, 0],
        "utilization_pct": 0.0,
    }
    gpu.update(kw)
    return gpu


def _healthy(n_gpus=1):
    """Facts of a working single-machine GPU setup: no finding expected."""
    return {
        "tfgpu": {"version": "0.1.0"},
        "python": {"version": "3.11.7", "implementation": "CPython", "executable": "python"},
        "os": {"system": "Linux", "release": "6.1", "machine": "x86_64", "wsl": False},
        "host": {"cpus_logical": 16, "memory_total_mib": 65536.0},
        "tensorflow": {
            "importable": True,
            "version": "2.21.0",
            "is_cuda_build": True,
            "is_rocm_build": False,
            "cuda_version": "12.5.1",
            "cudnn_version": "9",
            "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
            "runtime_initialized": False,
            "gpus": [
                {
                    "name": f"/physical_device:GPU:{i}",
                    "device_name": "NVIDIA A100-SXM4-80GB",
                    "compute_capability": [8, 0],
                }
                for i in range(n_gpus)
            ],
        },
        "keras": {"version": "3.15.1", "backend": "tensorflow"},
        "nvml": {
            "available": True,
            "error": None,
            "driver_version": "560.35",
            "cuda_driver_version": "12.6",
            "gpus": [_a100(i) for i in range(n_gpus)],
        },
        "env": dict.fromkeys(_facts.ENV_VARS),
    }


def _with(facts, **sections):
    """A deep copy of `facts` with `section={key: value}` merged in."""
    out = copy.deepcopy(facts)
    for name, values in sections.items():
        out[name].update(values)
    return out


def _kinds(facts):
    return [f.kind for f in _findings.findings(facts)]


def _one(facts, kind):
    found = [f for f in _findings.findings(facts) if f.kind == kind]
    assert len(found) == 1, _kinds(facts)
    return found[0]


# --- pure helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cc, kind, arch",
    [
        ((8, 0), "native", "sm_80"),
        ((8, 6), "native", "sm_80"),  # sm_80 binaries run on 8.6
        ((8, 9), "native", "sm_89"),
        ((7, 5), "native", "sm_70"),
        ((9, 0), "ptx", "compute_90"),
        ((12, 0), "ptx", "compute_90"),  # newer GPUs: the driver JIT-compiles the PTX
        ((5, 2), "unsupported", None),
    ],
)
def test_cc_support(cc, kind, arch):
    compiled = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]
    assert _gpu_checks.cc_support(cc, compiled) == (kind, arch)


def test_cc_support_parses_other_spellings():
    assert _gpu_checks.cc_support((10, 0), ["sm_100a", "compute_120"]) == ("native", "sm_100")
    assert _gpu_checks.cc_support((7, 5), ["7.0", "8.0"]) == ("native", "sm_70")
    assert _gpu_checks.cc_support((7, 5), ["bogus", "sm_8"]) == ("unsupported", None)


@pytest.mark.parametrize(
    "value, count",
    [
        (None, 2),
        ("0,1", 2),
        ("1", 1),
        ("", 0),
        ("-1", 0),
        ("none", 0),
        ("2", 0),  # no such GPU: CUDA stops at the first invalid entry
        ("0,5,1", 1),
        ("GPU-aaaa1", 1),
        ("GPU-ffff", 0),
        ("0,0", 1),
        ("0,\u00b2", 1),  # a superscript two is no index (it used to raise in int())
        ("00000000:01:00.0", 1),  # a PCI bus id
    ],
)
def test_visible_gpu_count_follows_cuda_rules(value, count):
    assert _gpu_checks.visible_gpu_count(value, [_a100(0), _a100(1)]) == count


@pytest.mark.parametrize(
    "raw, problem",
    [
        ("{not json", r"not valid JSON"),
        ("[1, 2]", r"must be a JSON object, got a list"),
        ('{"task": {"type": "worker", "index": 0}}', r'no "cluster" key'),
        ('{"cluster": []}', r'"cluster" must be a non-empty object'),
        ('{"cluster": {"worker": []}}', r'job "worker" must be a non-empty list'),
        ('{"cluster": {"worker": ["host1"]}}', r"address 'host1', expected \"host:port\""),
        ('{"cluster": {"worker": ["a:1", "b:1"]}}', r'no "task" key'),
        ('{"cluster": {"worker": ["a:1"]}, "task": "worker"}', r'"task" must be an object'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}', r"type=None"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}', r'"ps" is not'),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}', "'0'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}', "-1"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', "out of"),
    ],
)
def test_tf_config_problems_are_named(raw, problem):
    found = _facts.tf_config_problem(raw)
    assert found is not None
    assert re.search(problem, found), found


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "{}",
        '{"cluster": {"worker": ["a:1"]}}',
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}',
        '{"cluster": {"chief": ["a:1"], "worker": ["b:2"]}, "task": {"type": "chief", "index": 0}}',
        '{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}',
    ],
)
def test_valid_tf_config_is_accepted(raw):
    assert _facts.tf_config_problem(raw) is None


# --- findings: one test per branch ------------------------------------------------------


def test_healthy_setup_has_no_findings():
    assert _findings.findings(_healthy(2)) == []


def test_tensorflow_not_importable():
    facts = _healthy()
    facts["tensorflow"] = {"importable": False, "error": "ImportError: No module named x"}
    f = _one(facts, "tensorflow-not-importable")
    assert f.severity == "error" and "No module named x" in f.detail
    assert "pip install" in f.recommendation


def test_nvml_sees_gpus_but_tensorflow_none_says_and_cuda():
    facts = _with(_healthy(2), tensorflow={"gpus": []})
    f = _one(facts, "tf-sees-no-gpu")
    assert f.severity == "error"
    assert "sees 2 GPU(s) but TensorFlow sees none" in f.detail
    assert 'pip install "tfgpu[and-cuda]"' in f.recommendation


def test_tensorflow_sees_fewer_gpus_than_visible():
    facts = _with(_healthy(2), tensorflow={"gpus": _healthy(1)["tensorflow"]["gpus"]})
    assert _one(facts, "tf-sees-fewer-gpus").severity == "warning"


def test_cpu_only_tensorflow_build_with_gpus_is_an_error():
    facts = _with(_healthy(), tensorflow={"is_cuda_build": False, "gpus": []})
    f = _one(facts, "tf-not-cuda-build")
    assert f.severity == "error" and 'tfgpu[and-cuda]"' in f.recommendation
    assert "tf-sees-no-gpu" not in _kinds(facts)  # one cause, one finding


def test_cpu_only_build_without_gpu_is_only_info():
    facts = _with(_healthy(), tensorflow={"is_cuda_build": False, "gpus": []})
    facts["nvml"] = {"available": False, "error": "NVML Shared Library Not Found", "gpus": []}
    assert _one(facts, "tf-not-cuda-build").severity == "info"


def test_no_nvidia_driver():
    facts = _with(_healthy(), tensorflow={"gpus": []})
    facts["nvml"] = {"available": False, "error": "NVML Shared Library Not Found", "gpus": []}
    f = _one(facts, "no-nvidia-driver")
    assert "NVML Shared Library Not Found" in f.detail and "nvidia-smi" in f.recommendation
    assert "tf-sees-no-gpu" not in _kinds(facts)


def test_nvml_missing_while_tensorflow_has_gpus_is_info_about_monitoring():
    facts = _healthy()
    facts["nvml"] = {"available": False, "error": "libnvidia-ml.so not found", "gpus": []}
    f = _one(facts, "nvml-unavailable")
    assert f.severity == "info" and "ships with the NVIDIA driver" in f.recommendation


def test_compute_capability_not_compiled_and_no_ptx():
    old = _a100(name="Tesla M60", compute_capability=[5, 2])
    facts = _with(_healthy(), nvml={"gpus": [old]}, tensorflow={"gpus": []})
    f = _one(facts, "compute-capability-unsupported")
    assert f.severity == "error" and "Tesla M60 (compute capability 5.2)" in f.detail
    assert "sm_60 sm_70 sm_80 sm_89 compute_90" in f.detail
    assert "tf-sees-no-gpu" not in _kinds(facts)  # explained by the capability


def test_newer_gpu_runs_through_ptx_jit_with_startup_caveat():
    h200 = _a100(name="NVIDIA H200", compute_capability=[9, 0])
    facts = _with(_healthy(), nvml={"gpus": [h200]})
    facts["tensorflow"]["gpus"][0].update(device_name="NVIDIA H200", compute_capability=[9, 0])
    f = _one(facts, "compute-capability-ptx")
    assert f.severity == "info"
    assert "compute_90 PTX" in f.detail and "minutes" in f.recommendation
    assert _kinds(facts) == ["compute-capability-ptx"]


def test_cuda_visible_devices_hiding_every_gpu():
    facts = _with(_healthy(2), tensorflow={"gpus": []}, env={"CUDA_VISIBLE_DEVICES": "-1"})
    f = _one(facts, "cuda-visible-devices-hides-all")
    assert f.severity == "error" and "driver sees 2" in f.detail
    assert _kinds(facts) == ["cuda-visible-devices-hides-all"]


def test_cuda_visible_devices_empty_without_driver_is_info():
    facts = _with(_healthy(), tensorflow={"gpus": []}, env={"CUDA_VISIBLE_DEVICES": ""})
    facts["nvml"] = {"available": False, "error": "no driver", "gpus": []}
    assert _one(facts, "cuda-visible-devices-hides-all").severity == "info"


def test_driver_major_cuda_older_than_build():
    facts = _with(_healthy(), nvml={"cuda_driver_version": "11.8", "driver_version": "520.61"})
    f = _one(facts, "driver-too-old")
    assert f.severity == "error" and "CUDA 11.8" in f.detail and "12.5.1" in f.detail


def test_driver_minor_cuda_older_than_build():
    facts = _with(_healthy(), nvml={"cuda_driver_version": "12.2"})
    f = _one(facts, "driver-older-than-build")
    assert f.severity == "warning" and "minor-version compatibility" in f.detail


def test_malformed_tf_config_names_the_problem():
    facts = _with(_healthy(), env={"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}}'})
    f = _one(facts, "tf-config-malformed")
    assert f.severity == "error" and 'no "task" key' in f.detail


@pytest.mark.parametrize("value", ["1", "True", "yes"])
def test_allow_growth_values_tensorflow_ignores(value):
    facts = _with(_healthy(), env={"TF_FORCE_GPU_ALLOW_GROWTH": value})
    assert (
        f"TF_FORCE_GPU_ALLOW_GROWTH={value!r} is ignored"
        in _one(facts, "allow-growth-invalid").detail
    )


def test_allow_growth_contradicted_by_async_allocator():
    facts = _with(
        _healthy(),
        env={"TF_FORCE_GPU_ALLOW_GROWTH": "true", "TF_GPU_ALLOCATOR": "cuda_malloc_async"},
    )
    assert "no effect" in _one(facts, "allow-growth-with-async-allocator").detail


@pytest.mark.parametrize(
    "value, kind", [("cuda_malloc", "allocator-debug"), ("bfc", "allocator-unknown")]
)
def test_gpu_allocator_values(value, kind):
    assert _one(_with(_healthy(), env={"TF_GPU_ALLOCATOR": value}), kind).severity == "warning"
    assert not _findings.findings(_with(_healthy(), env={"TF_GPU_ALLOCATOR": "cuda_malloc_async"}))


def test_gpu_thread_mode_invalid():
    facts = _with(_healthy(), env={"TF_GPU_THREAD_MODE": "private"})
    assert "gpu_private" in _one(facts, "thread-mode-invalid").recommendation
    assert not _findings.findings(_with(_healthy(), env={"TF_GPU_THREAD_MODE": "gpu_private"}))


@pytest.mark.parametrize(
    "keras_facts, env_vars, kind, severity",
    [
        ({"backend": "jax"}, {}, "keras-backend", "error"),
        ({"version": "2.15.0"}, {}, "keras-2", "error"),
        ({"version": None, "error": "ImportError: x"}, {}, "keras-not-importable", "error"),
        ({}, {"TF_USE_LEGACY_KERAS": "1"}, "legacy-keras", "warning"),
    ],
)
def test_keras_findings(keras_facts, env_vars, kind, severity):
    facts = _with(_healthy(), keras=keras_facts, env=env_vars)
    assert _one(facts, kind).severity == severity


def test_native_windows_has_no_gpu_support():
    facts = _with(_healthy(), os={"system": "Windows"})
    assert "WSL2" in _one(facts, "windows-native").recommendation
    old_tf = _with(facts, tensorflow={"version": "2.10.1"})
    assert "windows-native" not in _kinds(old_tf)


def test_gpu_used_by_another_process():
    busy = _a100(memory_used_mib=60000.0, utilization_pct=97.0)
    facts = _with(_healthy(), nvml={"gpus": [busy]})
    f = _one(facts, "gpu-busy")
    assert "60000 of 81920 MiB" in f.detail and "97%" in f.detail
    mine = _with(facts, tensorflow={"runtime_initialized": True})
    assert "gpu-busy" not in _kinds(mine)  # after init the memory may be ours


def test_unsupported_utilization_nan_does_not_trip_busy():
    facts = _with(_healthy(), nvml={"gpus": [_a100(utilization_pct=math.nan)]})
    assert _findings.findings(facts) == []


def test_mixed_gpu_models():
    t4 = _a100(1, name="Tesla T4", compute_capability=[7, 5], memory_total_mib=15360.0)
    facts = _with(_healthy(2), nvml={"gpus": [_a100(0), t4]})
    assert "Tesla T4" in _one(facts, "mixed-gpus").detail


def test_determinism_variables():
    facts = _with(_healthy(), env={"TF_DETERMINISTIC_OPS": "1"})
    assert _one(facts, "determinism-env").severity == "info"


def test_findings_are_sorted_errors_first():
    facts = _with(
        _healthy(),
        env={"TF_GPU_THREAD_MODE": "x", "TF_CONFIG": "{", "TF_DETERMINISTIC_OPS": "1"},
    )
    assert [f.severity for f in _findings.findings(facts)] == ["error", "warning", "info"]


def test_a_failing_check_becomes_a_finding(monkeypatch):
    def broken(facts):
        raise KeyError("boom")

    monkeypatch.setattr(_findings, "CHECKS", (broken, *_findings.CHECKS))
    f = _one(_healthy(), "check-failed")
    assert "broken failed: KeyError" in f.detail


def test_garbage_facts_never_raise():
    for facts in ({}, {"tensorflow": None, "nvml": "x", "env": {}}, {"nvml": {"available": True}}):
        assert isinstance(_findings.findings(facts), list)


# --- the report object and the real machine ---------------------------------------------


def test_report_text_and_json_are_readable_and_strict():
    facts = _with(_healthy(), nvml={"gpus": [_a100(utilization_pct=math.nan)]})
    facts["env"]["TF_CONFIG"] = "{"
    report = EnvironmentReport(facts, _findings.findings(facts))
    text = str(report)
    for heading in ("Software", "Host", "NVIDIA driver (NVML)", "GPUs TensorFlow sees"):
        assert f"\n{heading}\n" in text
    assert "Environment variables\n  TF_CONFIG  {" in text
    assert re.search(r"GPU 0 +NVIDIA A100-SXM4-80GB, cc 8.0, 4 MiB / 80.0 GiB used, util n/a", text)
    assert "[error] TF_CONFIG is malformed" in text and "fix: Set TF_CONFIG" in text
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["facts"]["nvml"]["gpus"][0]["utilization_pct"] is None
    assert d["findings"][0]["kind"] == "tf-config-malformed"
    assert not report.ok


def _tf_section(report) -> str:
    return str(report).split("GPUs TensorFlow sees\n", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("initialized", [False, True], ids=["fresh", "runtime-up"])
def test_cpu_only_row_reads_the_same_whether_or_not_the_runtime_is_up(initialized):
    facts = _with(_healthy(0), tensorflow={"runtime_initialized": initialized})
    section = _tf_section(EnvironmentReport(facts, _findings.findings(facts)))
    assert re.search(r"^  GPUs +none: TensorFlow runs on the CPU$", section, re.M), section
    assert ("Runtime" in section) is initialized
    if initialized:
        assert re.search(r"^  Runtime +already initialized in this process$", section, re.M)


def test_environment_on_this_machine():
    report = tfgpu.environment()
    assert isinstance(report, EnvironmentReport)
    tf = report.facts["tensorflow"]
    assert tf["importable"] and tf["version"].startswith("2.")
    assert isinstance(tf["cuda_compute_capabilities"], list)
    assert report.facts["keras"]["backend"] == "tensorflow"
    assert report.facts["host"]["cpus_logical"] >= 1
    assert set(report.facts["env"]) == set(_facts.ENV_VARS)
    json.dumps(report.to_dict(), allow_nan=False)
    assert all(isinstance(f, Finding) for f in report.findings)
    if not tf["gpus"]:
        # The label column is as wide as the section's longest label: with the runtime already
        # up (as under pytest) a "Runtime" row widens it, so match the row, not the padding.
        section = _tf_section(report)
        assert re.search(r"^  GPUs +none: TensorFlow runs on the CPU$", section, re.M), section
        if tf["runtime_initialized"]:
            assert re.search(r"^  Runtime +already initialized in this process$", section, re.M)


def test_environment_reads_nvml_through_the_monitor_inventory(monkeypatch):
    gpu = GpuInfo(0, "NVIDIA L4", "GPU-1234", "00000000:01:00.0", 23034.0, 1.0, (8, 9), math.nan)
    fake = types.ModuleType("tfgpu.monitor.nvml")
    fake.inventory = lambda: NvmlInventory(True, None, "550.54", "12.4", [gpu])
    monkeypatch.setitem(sys.modules, "tfgpu.monitor.nvml", fake)
    report = tfgpu.environment()
    nvml = report.facts["nvml"]
    assert nvml["driver_version"] == "550.54"
    assert nvml["gpus"][0]["compute_capability"] == [8, 9]
    assert re.search(r"GPU 0 +NVIDIA L4, cc 8.9, 1 MiB / 22.5 GiB used, util n/a", str(report))
    kinds = [f.kind for f in report.findings]
    if not report.facts["tensorflow"]["gpus"]:  # this machine: the driver "sees" a GPU, TF not
        assert "tf-sees-no-gpu" in kinds
    assert "driver-older-than-build" in kinds  # 12.4 driver, 12.5 build


def test_environment_without_tensorflow_still_reports(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # makes `import tensorflow` fail
    report = tfgpu.environment()
    assert report.facts["tensorflow"]["importable"] is False
    assert report.findings[0].kind == "tensorflow-not-importable"
    assert "TensorFlow  not importable" in str(report)


@pytest.mark.slow
def test_configure_still_works_after_environment_in_a_fresh_process():
    code = """
import json, tfgpu
report = tfgpu.environment()
assert report.facts["tensorflow"]["runtime_initialized"] is False, report.facts["tensorflow"]
cfg = tfgpu.configure(cpu_devices=2, precision="float32")  # logical devices: before init only
import tensorflow as tf
x = tf.constant(1.0)  # the runtime starts here
again = tfgpu.environment().facts["tensorflow"]["runtime_initialized"]
print(json.dumps({"logical": len(tf.config.list_logical_devices("CPU")), "again": again,
                  "cfg": cfg.to_dict()}))
"""
    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["logical"] == 2
    assert out["again"] is True
    assert out["cfg"]["cpu_devices"] == 2


def test_environment_with_the_fake_pynvml_two_gpus(monkeypatch):
    from tests import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make())
    report = tfgpu.environment()
    nvml = report.facts["nvml"]
    assert nvml["available"] and nvml["driver_version"] == "550.54.15"
    assert nvml["cuda_driver_version"] == "12.4"
    assert [g["compute_capability"] for g in nvml["gpus"]] == [[8, 0], [7, 0]]
    kinds = [f.kind for f in report.findings]
    assert "mixed-gpus" in kinds and "no-nvidia-driver" not in kinds
    if not report.facts["tensorflow"]["gpus"]:
        assert "tf-sees-no-gpu" in kinds
    json.dumps(report.to_dict(), allow_nan=False)


def test_environment_with_the_nvml_library_missing(monkeypatch):
    from tests import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.make(library_missing=True))
    report = tfgpu.environment()
    assert report.facts["nvml"]["available"] is False
    if not report.facts["tensorflow"]["gpus"]:
        f = next(f for f in report.findings if f.kind == "no-nvidia-driver")
        assert "NVML could not be initialized" in f.detail


def test_tensorflow_facts_list_the_gpus_tensorflow_lists(monkeypatch):
    from tfgpu._internal.adapters import devices
    from tfgpu._internal.adapters.devices import PhysicalGpu

    listed = [
        PhysicalGpu(0, "/physical_device:GPU:0", "NVIDIA L4", (8, 9), True, 1),
        PhysicalGpu(1, "/physical_device:GPU:1", None, None, False, 0, "ValueError: no details"),
    ]
    monkeypatch.setattr(devices, "physical_gpus", lambda: listed)
    assert _gather._tensorflow_facts()["gpus"] == [
        {
            "name": "/physical_device:GPU:0",
            "device_name": "NVIDIA L4",
            "compute_capability": [8, 9],
        },
        {
            "name": "/physical_device:GPU:1",
            "device_name": None,
            "compute_capability": None,
            "error": "ValueError: no details",
        },
    ]
