"""The text of `tfgpu env`: `str(EnvironmentReport)`, section by section, then the findings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tfgpu.env._facts import ENV_VARS, cc_str, section

if TYPE_CHECKING:
    from tfgpu.env._result import EnvironmentReport


def _fmt_mib(mib: Any) -> str:
    if not isinstance(mib, int | float) or not math.isfinite(mib):
        return "n/a"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [title, *(f"  {k.ljust(width)}  {v}" for k, v in rows), ""]


def render(report: EnvironmentReport) -> str:
    f = report.facts
    tfgpu_, py, os_ = section(f, "tfgpu"), section(f, "python"), section(f, "os")
    host, tf, keras = section(f, "host"), section(f, "tensorflow"), section(f, "keras")
    nvml, env = section(f, "nvml"), section(f, "env")

    if tf.get("importable"):
        if tf.get("is_cuda_build"):
            build = (
                f"CUDA build: CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}, "
                f"for {' '.join(tf.get('cuda_compute_capabilities') or []) or 'unknown'}"
            )
        elif tf.get("is_rocm_build"):
            build = "ROCm build"
        else:
            build = "CPU-only build"
        tf_text = f"{tf.get('version')} ({build})"
    else:
        tf_text = f"not importable: {tf.get('error')}"
    keras_text = f"{keras.get('version')} (backend: {keras.get('backend')})"
    if keras.get("error"):
        keras_text += f"; import failed: {keras['error']}"
    lines = [f"tfgpu {tfgpu_.get('version')} environment report", ""]
    lines += _rows(
        "Software",
        [
            ("tfgpu", str(tfgpu_.get("version"))),
            ("Python", f"{py.get('version')} ({py.get('implementation')}, {py.get('executable')})"),
            (
                "OS",
                f"{os_.get('system')} {os_.get('release')} {os_.get('machine')}"
                + (" (WSL)" if os_.get("wsl") else ""),
            ),
            ("TensorFlow", tf_text),
            ("Keras", keras_text),
        ],
    )
    cpus = f"{host.get('cpus_logical')} logical"
    if host.get("cpus_physical"):
        cpus += f", {host['cpus_physical']} physical"
    if host.get("cpus_available") is not None:
        cpus += f", {host['cpus_available']} available to this process"
    memory = (
        f"{_fmt_mib(host.get('memory_total_mib'))} total, "
        f"{_fmt_mib(host.get('memory_available_mib'))} available"
    )
    lines += _rows("Host", [("CPUs", cpus), ("Memory", memory)])

    if nvml.get("available"):
        rows = [
            ("Driver", f"{nvml.get('driver_version')} (CUDA {nvml.get('cuda_driver_version')})")
        ]
        for g in nvml.get("gpus") or []:
            util = g.get("utilization_pct")
            util_text = (
                f"{util:.0f}% util"
                if isinstance(util, int | float) and math.isfinite(util)
                else "util n/a"
            )
            rows.append(
                (
                    f"GPU {g.get('index')}",
                    f"{g.get('name')}, cc {cc_str(g.get('compute_capability'))}, "
                    f"{_fmt_mib(g.get('memory_used_mib'))} / "
                    f"{_fmt_mib(g.get('memory_total_mib'))} used, {util_text}",
                )
            )
        if not nvml.get("gpus"):
            rows.append(("GPUs", "none"))
    else:
        rows = [("Driver", f"not available: {nvml.get('error')}")]
    lines += _rows("NVIDIA driver (NVML)", rows)

    if tf.get("importable"):
        gpu_rows = [
            (
                str(g.get("name")),
                f"{g.get('device_name') or 'unknown'}, cc {cc_str(g.get('compute_capability'))}",
            )
            for g in tf.get("gpus") or []
        ] or [("GPUs", "none: TensorFlow runs on the CPU")]
        if tf.get("runtime_initialized"):
            gpu_rows.append(("Runtime", "already initialized in this process"))
        lines += _rows("GPUs TensorFlow sees", gpu_rows)

    set_vars = [
        (k, v if len(v) <= 200 else v[:197] + "...") for k, v in env.items() if v is not None
    ]
    lines += _rows(
        "Environment variables",
        set_vars or [("(none)", f"none of the {len(ENV_VARS)} variables tfgpu checks is set")],
    )

    lines.append("Findings")
    if not report.findings:
        lines.append("  No problems found.")
    for finding in report.findings:
        lines.append(f"  [{finding.severity}] {finding.detail}")
        lines.append(f"  {' ' * (len(finding.severity) + 2)} fix: {finding.recommendation}")
    return "\n".join(lines)
