"""Where this process sits in a training cluster: `TF_CONFIG` and Slurm, parsed once, pure and
TF-free (`tfgpu.monitor` names its files by it). Callers decide what a problem means to them:
`tfgpu.strategy()` raises it, `tfgpu env` reports it, the monitor treats the process as alone."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_JOBS = ("chief", "worker", "evaluator", "ps")
_EXAMPLE = (
    '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", '
    '"index": 0}}'
)


class TFConfigError(ValueError):
    """A malformed `TF_CONFIG`; `problem` says what is wrong, in a few words."""

    def __init__(self, problem: str, raw: str):
        shown = raw if len(raw) <= 300 else raw[:300] + "..."
        super().__init__(
            f"Invalid `TF_CONFIG` environment variable: {problem}. Received: "
            f"TF_CONFIG={shown!r}. Expected JSON like {_EXAMPLE}."
        )
        self.problem = problem


@dataclass(frozen=True)
class Cluster:
    """Where this process sits in a training cluster (pure data)."""

    source: str  # "TF_CONFIG", "slurm" or "none"
    num_tasks: int  # the tasks that train (chief + workers)
    task_type: str | None = None  # this process's job, e.g. "worker"
    task_index: int | None = None  # its index within its job
    spec: dict[str, list[str]] = field(default_factory=dict)  # job -> addresses (TF_CONFIG)

    @property
    def is_chief(self) -> bool:
        """Whether this process writes what only one task should (TensorFlow's rule)."""
        if self.task_type in (None, "chief"):
            return True  # a lone process, or the chief
        return "chief" not in self.spec and self.task_type == "worker" and self.task_index == 0


def _addresses(job: str, addresses: Any, raw: str) -> tuple[list[str], list[int]]:
    """A job's addresses in task order and its task ids; TF also accepts {"0": "h:p"}."""
    if isinstance(addresses, dict):
        try:
            ids = sorted(int(k) for k in addresses)
            addresses = [addresses[k] for k in sorted(addresses, key=int)]
        except ValueError as e:
            raise TFConfigError(f"job {job!r} maps non-integer task ids", raw) from e
    else:
        ids = list(range(len(addresses))) if isinstance(addresses, list) else []
    if not isinstance(addresses, list) or not addresses:
        raise TFConfigError(f'job "{job}" must be a non-empty list of "host:port" strings', raw)
    for address in addresses:
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
            raise TFConfigError(
                f'job {job!r} has the address {address!r}, expected "host:port"', raw
            )
    return addresses, ids


def parse_tf_config(raw: str | None, *, strict: bool = True) -> Cluster | None:
    """Parses a `TF_CONFIG` (None: unset or blank) or raises `TFConfigError`; `strict`: what
    `strategy()` needs (a "task", chief/worker/evaluator jobs, one chief), else what TF accepts."""
    if raw is None or not raw.strip():
        return None  # TensorFlow treats an empty TF_CONFIG as unset
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TFConfigError(f"it is not valid JSON ({e.msg} at position {e.pos})", raw) from e
    if not isinstance(config, dict):
        kind = type(config).__name__
        raise TFConfigError(
            f"it must be a JSON object, got a {kind} (its top level is a {kind})", raw
        )
    if not config and not strict:
        return None
    cluster = config.get("cluster")
    if cluster is None:
        raise TFConfigError(
            '"cluster" is missing: it has no "cluster" key (expected {"cluster": {"worker": '
            '["host:port", ...]}, ...})',
            raw,
        )
    if not isinstance(cluster, dict) or not cluster:
        raise TFConfigError(
            '"cluster" must be a non-empty object mapping job names to lists of "host:port"', raw
        )
    spec: dict[str, list[str]] = {}
    ids: dict[str, list[int]] = {}
    for job, addresses in cluster.items():
        if strict and job not in _JOBS:
            raise TFConfigError(
                f'unknown job {job!r} in "cluster" (expected one of {list(_JOBS)})', raw
            )
        spec[job], ids[job] = _addresses(job, addresses, raw)
    if strict and "ps" in spec:
        raise TFConfigError(
            'it has a "ps" job: parameter-server training is not supported by tfgpu.strategy() '
            "(use tf.distribute.experimental.ParameterServerStrategy directly)",
            raw,
        )
    if strict and len(spec.get("chief", [])) > 1:
        raise TFConfigError('"chief" may hold only one address', raw)
    num_tasks = len(spec.get("chief", [])) + len(spec.get("worker", []))
    task = config.get("task")
    if task is None:
        if strict or sum(map(len, spec.values())) > 1:
            raise TFConfigError(
                '"task" is missing: it has no "task" key, so this process does not know which '
                "worker it is",
                raw,
            )
        return Cluster("TF_CONFIG", num_tasks, None, None, spec)
    if not isinstance(task, dict):
        raise TFConfigError('"task" must be an object like {"type": "worker", "index": 0}', raw)
    task_type, index = task.get("type"), task.get("index")
    if not isinstance(task_type, str):
        raise TFConfigError(
            f'"task" has type={task_type!r}, expected a job name such as "worker"', raw
        )
    if task_type not in spec and (strict or task_type != "evaluator"):
        raise TFConfigError(
            f'task type "{task_type}" is not a job of "cluster" (jobs: {", ".join(spec)})', raw
        )
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise TFConfigError(f'"task" has index={index!r}, expected an integer >= 0', raw)
    if task_type in spec and index not in ids[task_type]:
        raise TFConfigError(
            f'"task"."index" is {index} but job {task_type!r} has {len(spec[task_type])} '
            "task(s): the index is out of range",
            raw,
        )
    if strict and "chief" not in spec and "worker" not in spec:
        raise TFConfigError('"cluster" has no "chief" or "worker" job', raw)
    return Cluster("TF_CONFIG", num_tasks, task_type, index, spec)


def slurm_num_tasks(environ: Mapping[str, str]) -> int:
    """Tasks in the current Slurm job step (`srun`), 0 outside one; ValueError if not an int."""
    if "SLURM_PROCID" not in environ:
        return 0
    raw = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    try:
        return int(raw)
    except ValueError as e:
        raise ValueError(
            f"Invalid Slurm environment. Received: SLURM_STEP_NUM_TASKS={raw!r}. "
            "Expected an integer (set by srun)."
        ) from e


def resolve_cluster(environ: Mapping[str, str], *, strict: bool = True) -> Cluster:
    """Reads the cluster from `TF_CONFIG`, else a Slurm job step (only detected: the hosts come
    from `SlurmClusterResolver` later), else `Cluster("none", 1)`. ValueError if malformed."""
    parsed = parse_tf_config(environ.get("TF_CONFIG"), strict=strict)
    if parsed is not None:
        return parsed
    num_tasks = slurm_num_tasks(environ)
    if num_tasks > 1:
        return Cluster("slurm", num_tasks, "worker", int(environ["SLURM_PROCID"]))
    return Cluster("none", 1)
