"""Environment facts and findings: what `tfgpu env` prints and `tfgpu.environment()` returns.

Facts are read without initializing TensorFlow's devices; each finding is a pure function
of the facts, and a check that fails is reported, never raised. The findings and what they
mean: `docs/setup.md`.
"""

from __future__ import annotations

# The private modules, one job each: docs/architecture.md, "The rooms".
from tfgpu.env._findings import findings
from tfgpu.env._gather import gather_facts
from tfgpu.env._result import EnvironmentReport, Finding

__all__ = ["EnvironmentReport", "Finding", "environment"]


def environment() -> EnvironmentReport:
    """Collects facts about TensorFlow, CUDA, the driver, the GPUs and the host, with findings.

    Does not initialize TensorFlow's devices: `tfgpu.configure()` still works afterwards.
    Never raises for a broken environment; what could not be read is a fact and a finding.

    Returns:
        `EnvironmentReport`; `str(report)` is the `tfgpu env` output, `report.to_dict()`
        the `tfgpu env --json` output.

    Example:

    >>> import tfgpu
    >>> report = tfgpu.environment()  # doctest: +SKIP
    >>> print(report)  # doctest: +SKIP
    """
    facts = gather_facts()
    return EnvironmentReport(facts=facts, findings=findings(facts))
