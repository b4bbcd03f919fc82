"""The sampler's run-directory files, one set per worker, never truncated (docs/guarantees.md)."""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfgpu import __version__
from tfgpu._internal.helpers import files
from tfgpu._internal.helpers.cluster import Cluster, resolve_cluster
from tfgpu.monitor.nvml import GpuInfo, NvmlInventory


def _cluster(environ: Mapping[str, str]) -> Cluster | None:
    """This process's task in a multi-worker cluster (`TF_CONFIG`, else a Slurm step), or None
    for a lone process; a malformed value means a lone process: naming files never fails."""
    try:
        cluster = resolve_cluster(environ, strict=False)
    except ValueError:
        return None
    lone = cluster.source == "TF_CONFIG" and sum(map(len, cluster.spec.values())) <= 1
    return None if lone or cluster.task_type is None or cluster.task_index is None else cluster


def artifact_name(
    stem: str, suffix: str = ".csv", *, environ: Mapping[str, str] | None = None
) -> str:
    """Returns a run-directory file name, carrying the worker's task in multi-worker runs.

    Args:
        stem: str, e.g. `"timeline"` or `"steps"`.
        suffix: str, the extension with its dot. Defaults to `".csv"`.
        environ: mapping or None, holding `TF_CONFIG` or Slurm's. Defaults to `os.environ`.

    Returns:
        `"timeline.csv"` alone; `"timeline-worker1.csv"` for worker 1 of a cluster.

    Example:

    >>> artifact_name("steps", environ={})
    'steps.csv'
    """
    task = _cluster(os.environ if environ is None else environ)
    return (
        f"{stem}{suffix}" if task is None else f"{stem}-{task.task_type}{task.task_index}{suffix}"
    )


# What run.json records of each sampled GPU (a compute capability as a list: JSON has no tuple).
_GPU_FIELDS = ("index", "name", "uuid", "pci_bus_id", "memory_total_mib", "compute_capability")


def session_record(
    start_time: float,
    interval: float,
    inventory: NvmlInventory,
    gpus: Sequence[GpuInfo],
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """This sampling session's entry of `run.json` (keys listed in `docs/metrics.md`)."""
    task = _cluster(environ)
    return {
        "tfgpu_version": __version__,
        "start_time": start_time,
        "hostname": socket.gethostname(),
        "worker": None if task is None else task.task_index,
        "task_type": None if task is None else task.task_type,
        "pid": os.getpid(),
        "interval": interval,
        "timeline": artifact_name("timeline", ".csv", environ=environ),
        "nvml_error": inventory.error,
        "driver_version": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "gpus": [{field: getattr(g, field) for field in _GPU_FIELDS} for g in gpus],
    }


def add_session(
    directory: Path, info: dict[str, Any], rotated: Path | None, environ: Mapping[str, str]
) -> None:
    """Adds `info` to this process's `run.json` (a chief's to `run.json` too), first pointing
    earlier sessions naming its timeline to `rotated` where it was rotated. Raises OSError."""
    task = _cluster(environ)
    names = [artifact_name("run", ".json", environ=environ)]
    if task is not None and task.is_chief:
        names.append("run.json")
    for name in names:
        if rotated is not None:
            _rename_timeline(directory / name, info["timeline"], rotated.name)
        files.add_session(directory / name, info)


def _format(column: str, value: float) -> str:
    """One timeline value as written: 3 decimals, ints for epoch/step/bitmasks, `nan`."""
    if value != value:  # NaN
        return "nan"
    if column in ("time", "elapsed_s"):
        return f"{value:.3f}"
    if column in ("epoch", "step") or column.endswith("throttle_reasons"):
        return str(int(value)) if math.isfinite(value) else repr(value)
    return repr(round(value, 3))


def format_row(columns: Sequence[str], row: Sequence[float]) -> str:
    """One timeline line (without its newline) for the values `row` of `columns`."""
    return ",".join(_format(c, v) for c, v in zip(columns, row))


def _rename_timeline(record: Path, old: str, new: str) -> None:
    """Points the sessions of `record` (a run.json) that name timeline `old` to `new`; a missing
    or damaged record is left to `files.add_session` (which moves a damaged one aside)."""
    try:
        data = files.read_json_object(record)
    except (OSError, ValueError):
        return
    sessions = [data, *(data.get(files.EARLIER_SESSIONS) or [])]
    named = [s for s in sessions if isinstance(s, dict) and s.get("timeline") == old]
    for session in named:
        session["timeline"] = new
    if named:
        files.write_text_atomic(record, json.dumps(data, indent=2, default=str) + "\n")
