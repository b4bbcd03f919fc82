"""`tfgpu report LOG_DIR`: plots and a Markdown summary of a run directory (`write_report`).

The guide: docs/diagnosis.md, "tfgpu report LOG_DIR"; damaged files: docs/guarantees.md."""

from __future__ import annotations

# The public names; `write_report_and_problems` is for front ends (the CLI).
from tfgpu.report._show import ReportPath as ReportPath
from tfgpu.report._write import write_report as write_report
from tfgpu.report._write import write_report_and_problems as write_report_and_problems

__all__ = ["ReportPath", "write_report"]
