"""The tf.data service's pure decisions, shared by `tfgpu.data` and `diagnose` (no TensorFlow).

- `parse_address`: what a `service=` address may look like, and its normal form.
- `job_name`: the one job every trainer of a run reads from, chosen without talking to the
  others (explicit, else derived from the Slurm job, else fresh for a lone process).
- `consumers`: coordinated reads (`consumer_index`, `num_consumers`) for multi-worker runs
  over a repeated dataset.
- `service_advice`: when `diagnose` should recommend the service, and how many workers.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from tfgpu._checks import invalid_type, invalid_value
from tfgpu._cluster import Cluster

_ADDRESS = "a str 'grpc://host:port' or 'host:port' (the dispatcher's address), or None"
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class Address:
    """A dispatcher's address: `target` ("grpc://host:port") for tf.data, `host`, `port`."""

    host: str
    port: int

    @property
    def target(self) -> str:
        return f"grpc://{self.host}:{self.port}"

    @property
    def connect_host(self) -> str:
        """The host as a socket takes it (IPv6 without its brackets)."""
        return self.host[1:-1] if self.host.startswith("[") else self.host


def parse_address(value: Any, name: str = "service") -> Address:
    """Checks a dispatcher address and returns it parsed.

    Args:
        value: str, `"grpc://host:port"` or `"host:port"` (`"[::1]:5050"` for IPv6).
        name: str, the argument's name for the message. Defaults to `"service"`.

    Returns:
        An `Address`.

    Raises:
        TypeError: if `value` is not a str.
        ValueError: for another protocol, a missing or out-of-range port, or a malformed host.

    Example:

    >>> parse_address("grpc://localhost:5050").target
    'grpc://localhost:5050'
    >>> parse_address("10.0.0.7:5050").port
    5050
    """
    if not isinstance(value, str):
        raise invalid_type(name, value, _ADDRESS)
    rest = value.strip()
    if "://" in rest:
        protocol, _, rest = rest.partition("://")
        if protocol != "grpc":
            raise invalid_value(
                name, value, f"{_ADDRESS}; the tf.data service speaks 'grpc', not {protocol!r}"
            )
    host, sep, port = rest.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise invalid_value(name, value, f"{_ADDRESS}, with a port from 1 to 65535")
    if not _HOST.match(host):
        raise invalid_value(name, value, f"{_ADDRESS}, with a host name or IP address")
    return Address(host=host, port=int(port))


def check_job_name(value: Any) -> str | None:
    """Checks `service_job_name`: None, or 1-128 letters, digits, `.`, `_`, `-`.

    Example:

    >>> check_job_name("run-2024-06-01")
    'run-2024-06-01'
    """
    expected = "a str of 1 to 128 letters, digits, '.', '_' or '-' (a run id), or None"
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_type("service_job_name", value, expected)
    if not _JOB_NAME.match(value):
        raise invalid_value("service_job_name", value, expected)
    return value


def job_name(
    explicit: str | None,
    *,
    cluster: Cluster,
    environ: Mapping[str, str],
    serial: int,
    token: str,
) -> str:
    """The job name every trainer of one run agrees on, without talking to the others. Pure.

    All trainers of a run must read one job (the service then splits its data between
    them), and no other run may use that name while the dispatcher lives (a finished job's
    name yields end of input at once). So: the name the user gave; else, for a lone process,
    a fresh name (`token`, random per process); else, for several trainers under Slurm, the
    Slurm job and step ids (the same on every task, new for every run). Several trainers
    without Slurm (a `TF_CONFIG` cluster) have nothing unique that they share, so the user
    must name the run. `serial` counts the service pipelines this process built (every
    trainer runs the same script, so the n-th pipeline of each gets the same name).

    Args:
        explicit: str or None, `service_job_name` as checked by `check_job_name`.
        cluster: `Cluster`, where this process sits (`tfgpu._cluster.resolve_cluster`).
        environ: mapping, the environment (`SLURM_JOB_ID`, `SLURM_STEP_ID`).
        serial: int, 0 for the first service pipeline this process builds, then 1, ...
        token: str, random per process (e.g. `uuid.uuid4().hex[:12]`).

    Returns:
        The job name.

    Raises:
        ValueError: for several trainers outside Slurm without `service_job_name`.

    Example:

    >>> from tfgpu._cluster import Cluster
    >>> job_name(None, cluster=Cluster("none", 1), environ={}, serial=0, token="ab12")
    'tfgpu-ab12-0'
    """
    if explicit is not None:
        return explicit if serial == 0 else f"{explicit}-{serial}"
    if cluster.num_tasks <= 1:
        return f"tfgpu-{token}-{serial}"
    slurm_job = environ.get("SLURM_JOB_ID")
    if slurm_job:
        step = environ.get("SLURM_STEP_ID", "0")
        return f"tfgpu-slurm-{slurm_job}.{step}-{serial}"
    raise ValueError(
        "Invalid value for argument `service_job_name`. Received: service_job_name=None in "
        f"a {cluster.num_tasks}-trainer cluster ({cluster.source}). Expected a name for this "
        "run that every trainer passes alike and no earlier run used on this dispatcher "
        "(e.g. your launcher's run id: service_job_name=os.environ['RUN_ID']): the trainers "
        "must all read one job, and a finished job's name gives end of input at once."
    )


def consumers(cluster: Cluster, *, repeat: bool) -> tuple[int | None, int | None]:
    """`(consumer_index, num_consumers)` for coordinated reads, or `(None, None)`. Pure.

    Several trainers of a repeated (infinite) dataset read the job in strict round-robin, so
    every trainer gets its next batch from the same service worker at each step and none
    runs ahead; tf.data needs an infinite dataset for that. A finite dataset (Keras `fit`
    without `repeat`) is read first come, first served: the service balances the epoch's
    data so the trainers reach its end at about the same time.

    Example:

    >>> from tfgpu._cluster import Cluster
    >>> consumers(Cluster("TF_CONFIG", 2, "worker", 1, {"worker": ["a:1", "b:1"]}), repeat=True)
    (1, 2)
    """
    if cluster.num_tasks <= 1 or not repeat or cluster.task_type not in ("chief", "worker"):
        return None, None
    index = cluster.task_index or 0
    if cluster.task_type == "worker" and "chief" in cluster.spec:
        index += 1  # the chief trains as task 0
    return index, cluster.num_tasks


@dataclasses.dataclass(frozen=True)
class ServiceAdvice:
    """What `diagnose` says when the host cannot feed the GPU however the pipeline is set.

    Attributes:
        workers: int, service workers with as many cores as this host.
        cores: int, the CPU cores they add up to (for smaller worker machines).
        text: str, the advice in one paragraph.
    """

    workers: int
    cores: int
    text: str


# Below this host CPU use, the pipeline is short of settings (or of I/O), not of CPU.
CPU_SATURATED = 0.85
# Workers are sized for this much more than the GPU consumes, so they keep ahead.
HEADROOM = 1.15


def service_advice(
    *,
    input_bound: bool,
    host_cpu_busy: float,
    cpu_count: int,
    parallel: bool,
    cached: bool,
    pipeline_batches_per_s: float,
    step_batches_per_s: float,
) -> ServiceAdvice | None:
    """Whether to move the input work to tf.data service workers, and how many. Pure.

    The rule: the run is input-bound, the host's CPUs are saturated (at least
    `CPU_SATURATED` of all cores busy), and the pipeline already runs its maps in parallel
    and caches what it can (or has nothing to cache): no setting is left on this host, so
    the work must move to other CPUs. One worker on a machine like this host produces what
    the pipeline produced here (`pipeline_batches_per_s`, measured alone with every core);
    the device takes `step_batches_per_s` (its step on a batch already in its memory); workers =
    ceil(`HEADROOM` x GPU rate / pipeline rate).

    Args:
        input_bound: bool, whether the diagnosis found the run input-bound.
        host_cpu_busy: float, the host's CPU use while training, 0 to 1 (all cores).
        cpu_count: int, this host's cores.
        parallel: bool, whether the pipeline's maps run in parallel (AUTOTUNE).
        cached: bool, whether the deterministic work is cached, or nothing can be.
        pipeline_batches_per_s: float, the pipeline alone, batches per second.
        step_batches_per_s: float, the training step on a batch already in device memory,
            batches per second.

    Returns:
        A `ServiceAdvice`, or None when the rule does not apply (or a rate is not a
        positive finite number).

    Example:

    >>> a = service_advice(input_bound=True, host_cpu_busy=0.97, cpu_count=16, parallel=True,
    ...                    cached=True, pipeline_batches_per_s=40.0, step_batches_per_s=100.0)
    >>> a.workers, a.cores
    (3, 46)
    """
    rates = (pipeline_batches_per_s, step_batches_per_s)
    if not all(math.isfinite(r) and r > 0 for r in rates):
        return None
    if not (input_bound and parallel and cached and host_cpu_busy >= CPU_SATURATED):
        return None
    if pipeline_batches_per_s >= step_batches_per_s:
        return None
    need = HEADROOM * step_batches_per_s / pipeline_batches_per_s
    workers = max(1, math.ceil(need))
    cores = max(1, math.ceil(need * cpu_count))
    text = (
        f"The host cannot feed the training step: its {cpu_count} CPU cores are "
        f"{host_cpu_busy:.0%} busy and the pipeline, already parallel and cached, makes "
        f"{pipeline_batches_per_s:.3g} batches/s while the step could take "
        f"{step_batches_per_s:.3g} (on a batch already in device memory). No setting is left "
        f"on this host: run the input work on tf.data service workers, about {workers} with "
        f"{cpu_count} cores each ({cores} cores in all): `tfgpu data-service dispatcher "
        "--port 5050` on one machine, `tfgpu data-service worker --dispatcher HOST:5050` on "
        "each worker machine, then `tfgpu.data.pipeline(..., service='grpc://HOST:5050')` "
        "(docs/data_service.md)."
    )
    return ServiceAdvice(workers=workers, cores=cores, text=text)
