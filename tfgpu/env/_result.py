"""What `tfgpu.environment()` returns: `EnvironmentReport` and its `Finding`s."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tfgpu._internal.helpers.jsonable import json_safe
from tfgpu.env._text import render

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

    Print it for the human-readable report (`tfgpu env`), or call `to_dict()` for JSON
    (`tfgpu env --json`).

    Args:
        facts: dict, sections `tfgpu`, `python`, `os`, `host`, `tensorflow`, `keras`,
            `nvml`, `env` (see `docs/setup.md`).
        findings: list of `Finding`, errors first.

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
        return render(self)
