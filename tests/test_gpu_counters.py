"""tfgpu._internal.adapters.gpu_counters: the rules `diagnose` and `tfgpu report` share (pure, TF-free)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from tfgpu._internal.adapters import gpu_counters as gc

NAN = math.nan


def _c(**kw) -> gc.Counters:
    """A busy, healthy GPU with every counter measured."""
    base = dict(
        util_pct_mean=90.0, sm_active_pct_mean=85.0, tensor_active_pct_mean=40.0,
        pcie_mib_s_mean=10.0, power_w_mean=350.0, power_limit_w_max=400.0,
        throttle_reasons_any=float(0x1 | 0x4), sm_clock_mhz_mean=1410.0,
    )  # fmt: skip
    return gc.Counters(**{**base, **kw})


def test_importing_it_loads_neither_tensorflow_nor_keras():
    code = (
        "import sys, tfgpu._internal.adapters.gpu_counters; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('tensorflow', 'keras')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_healthy_gpu_has_no_finding_and_nothing_unseen():
    c = _c()
    assert gc.tensor_cores_idle(c) is None and gc.small_kernels(c) is None
    assert gc.clocks_throttled(c) is None and gc.pcie_traffic(c, 0.1, 2**20) is None
    assert gc.unseen(c) == []


def test_tensor_cores_idle_at_the_thresholds():
    found = gc.tensor_cores_idle(_c(tensor_active_pct_mean=np.float32(1.5)))
    assert found is not None and found.kind == "tensor_cores_idle"
    assert found.detail() == (
        "Tensor-core activity 1.5% (GPM) at 90% utilization: the matmuls and convolutions do "
        "not run on the tensor cores."
    )
    assert "mixed_bfloat16" in found.recommendation and "multiples of 8" in found.recommendation
    assert "tfgpu.diagnose(model, data)" in found.recommendation
    assert gc.tensor_cores_idle(_c(tensor_active_pct_mean=gc.TENSOR_ACTIVE_LOW_PCT)) is None
    assert gc.tensor_cores_idle(_c(tensor_active_pct_mean=1.0, util_pct_mean=49.9)) is None
    assert gc.tensor_cores_idle(_c(tensor_active_pct_mean=NAN)) is None
    assert gc.tensor_cores_idle(_c(tensor_active_pct_mean=1.0, util_pct_mean=NAN)) is None


def test_small_kernels_and_its_fix_with_and_without_the_model():
    found = gc.small_kernels(_c(util_pct_mean=95.0, sm_active_pct_mean=30.0))
    assert found is not None and "95%" in found.measured and "30%" in found.measured
    assert (
        "a larger `steps_per_execution`" in found.recommendation
        and "per replica" in found.recommendation
    )
    fix = gc.small_kernels_fix(32, 2, 16, True)
    assert "now 32" in fix and "steps_per_execution=16)` (now 2)" in fix
    assert "XLA is already on" in fix
    # A knob its own probe measured as no faster is never advised.
    idle = gc.small_kernels_fix(32, 1, 16, False, measured_no_gain=frozenset({"jit_compile"}))
    assert "jit_compile" not in idle and "steps_per_execution=16" in idle
    idle = gc.small_kernels_fix(
        32, 1, 16, False, measured_no_gain=frozenset({"steps_per_execution"})
    )
    assert "steps_per_execution" not in idle and "jit_compile=True" in idle
    assert gc.small_kernels(_c(util_pct_mean=79.9, sm_active_pct_mean=30.0)) is None
    assert gc.small_kernels(_c(util_pct_mean=95.0, sm_active_pct_mean=50.0)) is None
    assert gc.small_kernels(_c(util_pct_mean=95.0, sm_active_pct_mean=NAN)) is None


def test_pcie_judged_only_against_known_batch_bytes():
    # 100 MiB/s x 0.1 s = 10 MiB per step.
    c = _c(pcie_mib_s_mean=100.0)
    assert gc.pcie_per_step_bytes(c, 0.1) == pytest.approx(10 * 2**20)
    found = gc.pcie_traffic(c, 0.1, 2**20)
    assert found is not None and found.severity == "moderate"
    assert found.detail() == (
        "10.0 MiB crossed PCIe per step (100.0 MiB/s sent and received x 100.00 ms per step), "
        "10x the batch's 1.00 MiB."
    )
    assert gc.pcie_traffic(_c(pcie_mib_s_mean=40.0), 0.1, 2**20) is None  # 4x: not above
    assert gc.pcie_traffic(c, 0.1, None) is None and gc.pcie_traffic(c, 0.1, 0) is None
    for step in (NAN, 0.0, -1.0, math.inf):
        assert gc.pcie_traffic(c, step, 2**20) is None and gc.pcie_unjudged(c, step) is None
    info = gc.pcie_unjudged(c, 0.1)
    assert info is not None and info.severity == "info" and "not judged" in info.title
    assert "10.0 MiB crossed PCIe per step" in info.measured
    assert (
        "tfgpu.diagnose(model, data)" in info.recommendation
        and "keep the step on the GPU" in info.recommendation
    )
    assert gc.pcie_unjudged(_c(pcie_mib_s_mean=NAN), 0.1) is None


@pytest.mark.parametrize(
    ("reasons", "severity", "names"),
    [
        (0x1 | 0x40, "high", ["HW thermal slowdown"]),
        (0x4, "moderate", ["SW power cap"]),
        (0x20 | 0x80, "high", ["SW thermal slowdown", "HW power brake slowdown"]),
        (0x1000, "moderate", ["reason bits 0x1000"]),
    ],
)
def test_clocks_throttled_names_each_reason_with_its_fix(reasons, severity, names):
    found = gc.clocks_throttled(_c(power_w_mean=150.0, throttle_reasons_any=float(reasons)))
    assert found is not None and found.severity == severity
    for name in names:
        assert name in found.title and f"{name}:" in found.recommendation
    assert "38% of the 400 W limit at 1410 MHz" in found.measured


@pytest.mark.parametrize(
    "kw",
    [
        dict(power_w_mean=150.0, throttle_reasons_any=1.0),  # idle only
        dict(power_w_mean=150.0, throttle_reasons_any=0.0),
        dict(power_w_mean=240.0, throttle_reasons_any=64.0),  # exactly 60% of the limit
        dict(power_w_mean=150.0, throttle_reasons_any=NAN),
        dict(power_w_mean=150.0, throttle_reasons_any=-64.0),  # not a bitmask
        dict(power_w_mean=150.0, power_limit_w_max=0.0, throttle_reasons_any=64.0),
        dict(power_w_mean=NAN, throttle_reasons_any=64.0),
    ],
)
def test_clocks_throttled_needs_low_power_and_a_real_reason(kw):
    assert gc.clocks_throttled(_c(**kw)) is None


def test_throttle_names_leave_idle_out_and_name_unknown_bits():
    assert gc.throttle_names(0x1) == []
    assert [n for n, _ in gc.throttle_names(0x4 | 0x2000)] == ["SW power cap", "reason bits 0x2000"]


def test_unseen_says_what_a_gpu_without_gpm_cannot_show():
    no_gpm = _c(util_pct_mean=92.0, sm_active_pct_mean=NAN, tensor_active_pct_mean=NAN)
    (note,) = gc.unseen(no_gpm)
    assert note.startswith(gc.GPM_UNSEEN) and "92%" in note
    assert gc.unseen(no_gpm, with_util=False) == [gc.GPM_UNSEEN]
    nothing = _c(
        sm_active_pct_mean=NAN, tensor_active_pct_mean=NAN, pcie_mib_s_mean=NAN,
        power_limit_w_max=NAN,
    )  # fmt: skip
    assert gc.unseen(nothing, with_util=False) == [
        gc.GPM_UNSEEN,
        gc.PCIE_UNSEEN,
        gc.POWER_UNSEEN,
    ]
    assert gc.unseen(_c(util_pct_mean=NAN, sm_active_pct_mean=NAN)) == []  # no monitor
