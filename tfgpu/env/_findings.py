"""The checks table: every check, in order, run over the facts; findings errors first (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tfgpu.env import _gpu_checks as gpu
from tfgpu.env import _setup_checks as setup
from tfgpu.env._result import Finding

_SEVERITIES = ("error", "warning", "info")

CHECKS: tuple[Callable[[dict[str, Any]], Iterable[Finding]], ...] = (
    setup.check_tensorflow, setup.check_keras, gpu.check_driver, gpu.check_cuda_build,
    gpu.check_tf_sees_no_gpu, gpu.check_cuda_visible_devices, gpu.check_compute_capability,
    gpu.check_driver_cuda_version, setup.check_tf_config, setup.check_allow_growth,
    setup.check_allocator, setup.check_thread_mode, setup.check_windows, gpu.check_gpu_busy,
    gpu.check_mixed_gpus, setup.check_determinism_env,
)  # fmt: skip


def findings(facts: dict[str, Any]) -> list[Finding]:
    """All findings for `facts`, errors first (pure; a failing check becomes a finding)."""
    out: list[Finding] = []
    for check in CHECKS:
        try:
            out += list(check(facts))  # all of a check's findings, or none if it fails
        except Exception as e:  # odd facts, any error: `tfgpu env` never crashes on a check
            name = check.__name__.removeprefix("check_")
            detail = f"The check {name} failed: {type(e).__name__}: {e}"
            fix = "Please report this with the output of `tfgpu env --json`."
            out.append(Finding("info", "check-failed", detail, fix))
    return sorted(out, key=lambda f: _SEVERITIES.index(f.severity))
