"""The tf.data service: `pipeline(..., service=...)`'s part, and `tfgpu data-service` servers.

The pipeline's part: the dispatcher checked reachable (a short socket connect, so a wrong
address fails in seconds, naming it, instead of hanging in tf.data), in-memory arrays read
in chunks the dispatcher can hand out (one split per chunk, not per example: a split is an
RPC to the dispatcher), the job name and coordinated reads (`tfgpu._data_service`), and the
`distribute` step itself (dynamic sharding: every example at most once per epoch, exactly
once while no worker fails).

The servers: `main(["dispatcher", ...])` and `main(["worker", ...])` run a
`tf.data.experimental.service` server until SIGTERM or SIGINT, log what they serve, and stop
cleanly. `tfgpu/cli.py` wires them as `tfgpu data-service dispatcher|worker`.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfgpu._cluster import resolve_cluster
from tfgpu._data_service import Address, consumers, job_name, parse_address

# How long the reachability check waits for the dispatcher's port.
CONNECT_TIMEOUT_S = 3.0
# In-memory examples per split: big enough that the dispatcher's RPCs cost nothing next to
# the work, small enough that several workers share a small dataset.
_MAX_CHUNK = 256
_MIN_SPLITS = 32

_serial = itertools.count()
_TOKEN = uuid.uuid4().hex[:12]


def check_reachable(address: Address, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raises `ConnectionError` naming `address` unless its port accepts a connection.

    Example:

    >>> check_reachable(parse_address("localhost:1"))  # doctest: +SKIP
    """
    try:
        with socket.create_connection((address.connect_host, address.port), timeout=timeout_s):
            return
    except OSError as e:
        raise ConnectionError(
            f"tfgpu.data.pipeline: the tf.data service dispatcher at {address.target} is not "
            f"reachable ({type(e).__name__}: {e.strerror or e}, after at most {timeout_s:g} s). "
            f"Start one there (`tfgpu data-service dispatcher --port {address.port}` on "
            f"{address.host}) or pass the right `service` address."
        ) from e


def chunk_size(num_examples: int) -> int:
    """In-memory examples per dispatcher split."""
    return max(1, min(_MAX_CHUNK, num_examples // _MIN_SPLITS))


def memory_source(value: Any, num_examples: int) -> tf.data.Dataset:
    """The first `num_examples` examples of in-memory data, split by chunks.

    Dynamic sharding hands out the source's elements one split (one RPC) at a time;
    `from_tensor_slices` would make every example a split (about 1,000 examples/s
    measured on 2 cores). Here a split is a chunk index; the worker slices the chunk.
    """
    tensors = tf.nest.map_structure(
        lambda a: a if isinstance(a, (tf.Tensor, tf.RaggedTensor)) else tf.convert_to_tensor(a),
        value,
    )
    chunk = chunk_size(num_examples)
    count = -(-num_examples // chunk)

    def slice_chunk(i: tf.Tensor) -> Any:
        start = i * chunk
        stop = tf.minimum(start + chunk, num_examples)
        return tf.nest.map_structure(lambda t: t[start:stop], tensors)

    # No `assert_cardinality`: each worker sees only its share. The plan gets the count.
    return tf.data.Dataset.range(count).map(slice_chunk).unbatch()


def choose_job(explicit: str | None, *, repeat: bool) -> tuple[str, int | None, int | None]:
    """The job name and coordinated reads for the next service pipeline of this process."""
    cluster = resolve_cluster(os.environ, strict=False)
    name = job_name(
        explicit, cluster=cluster, environ=os.environ, serial=next(_serial), token=_TOKEN
    )
    index, count = consumers(cluster, repeat=repeat)
    return name, index, count


def distributed(
    ds: tf.data.Dataset,
    address: Address,
    *,
    name: str,
    consumer_index: int | None,
    num_consumers: int | None,
) -> tf.data.Dataset:
    """`ds` run by the service's workers (dynamic sharding), read by this process."""
    service = tf.data.experimental.service
    return ds.apply(
        service.distribute(
            processing_mode=service.ShardingPolicy.DYNAMIC,
            service=address.target,
            job_name=name,
            consumer_index=consumer_index,
            num_consumers=num_consumers,
        )
    )


# ---------------------------------------------------------------- servers (the console command)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfgpu data-service",
        description="Run a tf.data service dispatcher or worker until stopped (SIGTERM, Ctrl-C).",
    )
    sub = parser.add_subparsers(dest="role", metavar="ROLE", required=True)
    d = sub.add_parser("dispatcher", help="the dispatcher: hands out the work, one per cluster")
    d.add_argument("--port", type=int, default=5050, help="port to serve on (default 5050)")
    d.add_argument(
        "--work-dir",
        default=None,
        help="directory for the dispatcher's journal: restarted with the same one, it keeps "
        "its jobs (fault tolerant). Default: none, state lost on restart",
    )
    d.add_argument(
        "--worker-timeout-s",
        type=float,
        default=30.0,
        help="seconds without a heartbeat before a worker's work goes to others (default 30)",
    )
    w = sub.add_parser("worker", help="a worker: runs the pipelines, streams their batches")
    w.add_argument("--dispatcher", required=True, help="the dispatcher's host:port")
    w.add_argument("--port", type=int, default=0, help="port to serve on (default: any free)")
    w.add_argument(
        "--host",
        default=None,
        help="the name trainers reach this worker by (default: this machine's host name)",
    )
    return parser


def _check_port(parser: argparse.ArgumentParser, port: int, allow_zero: bool) -> None:
    if not (0 if allow_zero else 1) <= port <= 65535:
        parser.error(f"argument --port: {port} is not a port (expected 1 to 65535)")


def _log(message: str) -> None:
    print(f"tfgpu data-service: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a tf.data service dispatcher or worker until SIGTERM or SIGINT.

    `tfgpu data-service dispatcher --port 5050 [--work-dir DIR]` serves the dispatcher
    (fault tolerant with a work directory: restarted with the same one, it keeps its jobs);
    `tfgpu data-service worker --dispatcher HOST:5050 [--port P] [--host NAME]` serves a
    worker. Each logs to stderr what it serves and when its count of workers (dispatcher) or
    tasks (worker) changes, and stops cleanly on SIGTERM or Ctrl-C.

    Args:
        argv: sequence of str, the arguments after `tfgpu data-service`. Defaults to None
            (`sys.argv[1:]`).

    Returns:
        int, the exit status: 0 after a clean stop; 2 for bad arguments (argparse's usage
        line) or a server that could not start (the message says why).

    Example:

    ```python
    main(["dispatcher", "--port", "5050", "--work-dir", "/shared/dispatcher"])
    ```
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage printed
        return int(e.code or 0)
    service = tf.data.experimental.service
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        if args.role == "dispatcher":
            _check_port(parser, args.port, allow_zero=False)
            if args.worker_timeout_s <= 0:
                parser.error("argument --worker-timeout-s: expected a number of seconds > 0")
            work_dir = os.path.abspath(os.path.expanduser(args.work_dir)) if args.work_dir else None
            if work_dir:
                os.makedirs(work_dir, exist_ok=True)
            server = service.DispatchServer(
                service.DispatcherConfig(
                    port=args.port,
                    work_dir=work_dir,
                    fault_tolerant_mode=work_dir is not None,
                    worker_timeout_ms=int(args.worker_timeout_s * 1000),
                )
            )
            mode = f"fault tolerant, journal in {work_dir}" if work_dir else "no work dir"
            _log(f"dispatcher serving grpc://{socket.gethostname()}:{args.port} ({mode})")
            count = getattr(server, "_num_workers", None)
            what = "worker(s) registered"
        else:
            _check_port(parser, args.port, allow_zero=True)
            try:
                dispatcher = parse_address(args.dispatcher, "--dispatcher")
            except (TypeError, ValueError) as e:
                parser.error(str(e))
            host = args.host or socket.gethostname()
            server = service.WorkerServer(
                service.WorkerConfig(
                    dispatcher_address=f"{dispatcher.host}:{dispatcher.port}",
                    worker_address=f"{host}:%port%",
                    port=args.port,
                )
            )
            port = getattr(server, "_address", f"?:{args.port}").rpartition(":")[2]
            _log(f"worker serving {host}:{port} for dispatcher {dispatcher.target}")
            count = getattr(server, "_num_tasks", None)
            what = "task(s) running"
    except SystemExit as e:
        _restore(previous)
        return int(e.code or 0)
    except Exception as e:  # a port in use, a dispatcher's journal it cannot read
        _restore(previous)
        _log(f"error: {args.role} could not start: {type(e).__name__}: {e}")
        return 2
    last = None
    while not stop.wait(1.0):
        try:
            now = count() if count is not None else None
        except Exception:  # private counters: the log is a side feature
            now, count = None, None
        if now is not None and now != last:
            _log(f"{now} {what}")
            last = now
    _log(f"{args.role} stopping")
    try:
        server._stop()  # the servers' own shutdown (the public API has only `join`)
    except Exception as e:  # pragma: no cover - stopping is best effort
        _log(f"{args.role} stop: {type(e).__name__}: {e}")
    _restore(previous)
    _log(f"{args.role} stopped")
    return 0


def _restore(previous: dict[Any, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether `host:port` accepts a connection within `timeout_s` (for scripts and tests)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False
