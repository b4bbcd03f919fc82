"""What `tfgpu.environment()` returns: `EnvironmentReport` (its text: `tfgpu env`), `Finding`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tfgpu._internal.helpers.checks import is_finite_number
from tfgpu._internal.helpers.jsonable import json_safe
from tfgpu.env._facts import ENV_VARS, cc_str, section

AND_CUDA = 'pip install "tfgpu[and-cuda]"'


@dataclass(frozen=True)
class Finding:
    """One problem (or notable fact) about the environment, and how to fix it.

    Args:
        severity: str, `"error"` (GPU training will not work as intended), `"warning"`
            (it works, but slower or surprisingly) or `"info"`.
        kind: str, a stable short identifier, e.g. `"tf-sees-no-gpu"`.
        detail: str, what is wrong, with the facts that show it.
        recommendation: str, what to do about it.
    """

    severity: str
    kind: str
    detail: str
    recommendation: str


@dataclass
class EnvironmentReport:
    """Facts about TensorFlow, CUDA, the driver, the GPUs and the host, with findings.

    Print it for `tfgpu env`'s text, or call `to_dict()` for `tfgpu env --json`'s. The guide:
    docs/setup.md, section 1.

    Args:
        facts: dict, one section per kind of fact (the table in docs/setup.md).
        findings: list of `Finding`, errors first. Defaults to `[]`.

    Example:

    >>> report = tfgpu.environment()  # doctest: +SKIP
    >>> [f.kind for f in report.findings if f.severity == "error"]  # doctest: +SKIP
    []
    """

    facts: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """bool, True when no finding has severity `"error"`."""
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as a JSON-safe dict (NaN becomes None, tuples become lists).

        Returns:
            dict with keys `"facts"` and `"findings"` (a list of dicts with `severity`,
            `kind`, `detail`, `recommendation`).
        """
        return json_safe(
            {"facts": self.facts, "findings": [dataclasses.asdict(f) for f in self.findings]}
        )

    def __str__(self) -> str:
        """The `tfgpu env` text: section by section, then the findings."""
        f = self.facts
        tf = section(f, "tensorflow")
        lines = [f"tfgpu {section(f, 'tfgpu').get('version')} environment report", ""]
        lines += _rows("Software", _software(f))
        lines += _rows("Host", _host(section(f, "host")))
        lines += _rows("NVIDIA driver (NVML)", _driver(section(f, "nvml")))
        if tf.get("importable"):
            lines += _rows("GPUs TensorFlow sees", _tensorflow_gpus(tf))
        lines += _rows("Environment variables", _variables(section(f, "env")))
        lines.append("Findings")
        if not self.findings:
            lines.append("  No problems found.")
        for finding in self.findings:
            lines.append(f"  [{finding.severity}] {finding.detail}")
            lines.append(f"  {' ' * (len(finding.severity) + 2)} fix: {finding.recommendation}")
        return "\n".join(lines)


def _fmt_mib(mib: Any) -> str:
    if not is_finite_number(mib):
        return "n/a"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _rows(title: str, rows: list[tuple[str, str]]) -> list[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [title, *(f"  {k.ljust(width)}  {v}" for k, v in rows), ""]


def _software(f: dict[str, Any]) -> list[tuple[str, str]]:
    tfgpu_, py, os_ = section(f, "tfgpu"), section(f, "python"), section(f, "os")
    keras = section(f, "keras")
    keras_text = f"{keras.get('version')} (backend: {keras.get('backend')})"
    wsl = " (WSL)" if os_.get("wsl") else ""
    if keras.get("error"):
        keras_text += f"; import failed: {keras['error']}"
    return [
        ("tfgpu", str(tfgpu_.get("version"))),
        ("Python", f"{py.get('version')} ({py.get('implementation')}, {py.get('executable')})"),
        ("OS", f"{os_.get('system')} {os_.get('release')} {os_.get('machine')}{wsl}"),
        ("TensorFlow", _tensorflow(section(f, "tensorflow"))),
        ("Keras", keras_text),
    ]


def _tensorflow(tf: dict[str, Any]) -> str:
    if not tf.get("importable"):
        return f"not importable: {tf.get('error')}"
    if tf.get("is_cuda_build"):
        build = (
            f"CUDA build: CUDA {tf.get('cuda_version')}, cuDNN {tf.get('cudnn_version')}, "
            f"for {' '.join(tf.get('cuda_compute_capabilities') or []) or 'unknown'}"
        )
    elif tf.get("is_rocm_build"):
        build = "ROCm build"
    else:
        build = "CPU-only build"
    return f"{tf.get('version')} ({build})"


def _host(host: dict[str, Any]) -> list[tuple[str, str]]:
    cpus = f"{host.get('cpus_logical')} logical"
    if host.get("cpus_physical"):
        cpus += f", {host['cpus_physical']} physical"
    if host.get("cpus_available") is not None:
        cpus += f", {host['cpus_available']} available to this process"
    memory = (
        f"{_fmt_mib(host.get('memory_total_mib'))} total, "
        f"{_fmt_mib(host.get('memory_available_mib'))} available"
    )
    return [("CPUs", cpus), ("Memory", memory)]


def _driver(nvml: dict[str, Any]) -> list[tuple[str, str]]:
    if not nvml.get("available"):
        return [("Driver", f"not available: {nvml.get('error')}")]
    rows = [("Driver", f"{nvml.get('driver_version')} (CUDA {nvml.get('cuda_driver_version')})")]
    for g in nvml.get("gpus") or []:
        util = g.get("utilization_pct")
        util_text = f"{util:.0f}% util" if is_finite_number(util) else "util n/a"
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
    return rows


def _tensorflow_gpus(tf: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        (
            str(g.get("name")),
            f"{g.get('device_name') or 'unknown'}, cc {cc_str(g.get('compute_capability'))}",
        )
        for g in tf.get("gpus") or []
    ] or [("GPUs", "none: TensorFlow runs on the CPU")]
    if tf.get("runtime_initialized"):
        rows.append(("Runtime", "already initialized in this process"))
    return rows


def _variables(env: dict[str, Any]) -> list[tuple[str, str]]:
    set_vars = [
        (k, v if len(v) <= 200 else v[:197] + "...") for k, v in env.items() if v is not None
    ]
    return set_vars or [("(none)", f"none of the {len(ENV_VARS)} variables tfgpu checks is set")]
