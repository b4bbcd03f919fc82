"""Environment facts and findings: what `tfgpu env` prints and `tfgpu.environment()` returns.

Each finding is a pure function of the facts (docs/setup.md, section 1)."""

from __future__ import annotations

from tfgpu.env._findings import findings
from tfgpu.env._gather import gather_facts
from tfgpu.env._result import EnvironmentReport, Finding

__all__ = ["EnvironmentReport", "Finding", "environment"]


def environment() -> EnvironmentReport:
    """Collects facts about TensorFlow, CUDA, the driver, the GPUs and the host, with findings.

    Does not initialize TensorFlow's devices: `tfgpu.configure()` still works afterwards.
    Never raises for a broken environment; what could not be read is a fact and a finding.
    The guide: docs/setup.md, section 1.

    Returns:
        `EnvironmentReport`: `str(report)` is the `tfgpu env` output, `to_dict()` its `--json`.

    Example:

    >>> import tfgpu
    >>> report = tfgpu.environment()  # doctest: +SKIP
    >>> print(report)  # doctest: +SKIP
    """
    facts = gather_facts()
    return EnvironmentReport(facts=facts, findings=findings(facts))
