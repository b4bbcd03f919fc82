"""The checks table: every check, in order, run over the facts; findings errors first (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfgpu.env._gpu_checks import (
    check_compute_capability,
    check_cuda_build,
    check_cuda_visible_devices,
    check_driver,
    check_driver_cuda_version,
    check_gpu_busy,
    check_mixed_gpus,
    check_tf_sees_no_gpu,
)
from tfgpu.env._result import Finding
from tfgpu.env._setup_checks import (
    check_allocator,
    check_allow_growth,
    check_determinism_env,
    check_keras,
    check_tensorflow,
    check_tf_config,
    check_thread_mode,
    check_windows,
)

_SEVERITIES = ("error", "warning", "info")

CHECKS: tuple[Callable[[dict[str, Any]], list[Finding]], ...] = (
    check_tensorflow,
    check_keras,
    check_driver,
    check_cuda_build,
    check_tf_sees_no_gpu,
    check_cuda_visible_devices,
    check_compute_capability,
    check_driver_cuda_version,
    check_tf_config,
    check_allow_growth,
    check_allocator,
    check_thread_mode,
    check_windows,
    check_gpu_busy,
    check_mixed_gpus,
    check_determinism_env,
)


def findings(facts: dict[str, Any]) -> list[Finding]:
    """All findings for `facts`, errors first (pure; a failing check becomes a finding)."""
    out: list[Finding] = []
    for check in CHECKS:
        try:
            out.extend(check(facts))
        except Exception as e:  # odd facts, any error: `tfgpu env` never crashes on a check
            out.append(
                Finding(
                    "info",
                    "check-failed",
                    f"The check {check.__name__.removeprefix('check_')} failed: "
                    f"{type(e).__name__}: {e}",
                    "Please report this with the output of `tfgpu env --json`.",
                )
            )
    return sorted(out, key=lambda f: _SEVERITIES.index(f.severity))
