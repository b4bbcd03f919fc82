"""The tf.data service's TensorFlow-free part: the rules shared with `tfgpu.data`, and `tfgpu
data-service` whose supervisor restarts a dead server at its port (docs/data_service.md)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tfgpu._internal.helpers.checks import check_int, check_number, invalid_type, invalid_value
from tfgpu._internal.helpers.cluster import Cluster
from tfgpu._internal.helpers.files import writable_dir
from tfgpu._internal.helpers.processes import death, die_with_parent

_ADDRESS = "a str 'grpc://host:port' or 'host:port' (the dispatcher's address), or None"
_ADDRESS_FLAG = "host:port or grpc://host:port (the dispatcher's address)"  # --dispatcher
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


def parse_address(value: Any, name: str = "service", *, expected: str = _ADDRESS) -> Address:
    """Checks a dispatcher address ("grpc://host:port", "host:port", "[::1]:5050"); parses it."""
    if not isinstance(value, str):
        raise invalid_type(name, value, expected)
    rest = value.strip()
    if "://" in rest:
        protocol, _, rest = rest.partition("://")
        if protocol != "grpc":
            raise invalid_value(
                name, value, f"{expected}; the tf.data service speaks 'grpc', not {protocol!r}"
            )
    host, sep, port = rest.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise invalid_value(name, value, f"{expected}, with a port from 1 to 65535")
    if not _HOST.match(host):
        raise invalid_value(name, value, f"{expected}, with a host name or IP address")
    return Address(host=host, port=int(port))


def check_job_name(value: Any) -> str | None:
    """Checks `service_job_name`: None, or 1-128 letters, digits, `.`, `_`, `-`."""
    expected = "a str of 1 to 128 letters, digits, '.', '_' or '-' (a run id), or None"
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_type("service_job_name", value, expected)
    if not _JOB_NAME.match(value):
        raise invalid_value("service_job_name", value, expected)
    return value


def job_name(
    explicit: str | None, *, cluster: Cluster, environ: Mapping[str, str], serial: int, token: str
) -> str:
    """The job name every trainer of one run agrees on alone (docs/data_service.md, "Several
    trainers"); `serial`: this process's service pipelines so far, `token`: random per process."""
    if explicit is not None:
        return explicit if serial == 0 else f"{explicit}-{serial}"
    if cluster.num_tasks <= 1:
        return f"tfgpu-{token}-{serial}"
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID", "0")
        return f"tfgpu-slurm-{environ['SLURM_JOB_ID']}.{step}-{serial}"
    raise invalid_value(
        "service_job_name",
        None,
        "a name for this run that every trainer passes alike and no earlier run used on this "
        "dispatcher (e.g. your launcher's run id: service_job_name=os.environ['RUN_ID']): the "
        "trainers must all read one job, and a finished job's name gives end of input at once",
        received=f"service_job_name=None in a {cluster.num_tasks}-trainer cluster "
        f"({cluster.source})",
    )


def consumers(cluster: Cluster, *, repeat: bool) -> tuple[int | None, int | None]:
    """`(consumer_index, num_consumers)` of trainers' round-robin reads (`repeat`), or Nones."""
    if cluster.num_tasks <= 1 or not repeat or cluster.task_type not in ("chief", "worker"):
        return None, None
    index = cluster.task_index or 0
    if cluster.task_type == "worker" and "chief" in cluster.spec:
        index += 1  # the chief trains as task 0
    return index, cluster.num_tasks


# A server that died this many times within the window is given up on (exit status 1).
MAX_RESTARTS = 5
RESTART_WINDOW_S = 300.0
_STOP_TIMEOUT_S = 60.0  # a server stopped with SIGTERM still running after this is killed
EXIT_CANNOT_START = 2  # bad arguments, a port in use: starting it again would fail the same way
MAX_WORKER_TIMEOUT_S = 86400.0  # the longest --worker-timeout-s: a worker silent for a day


# What every start line and `--help` say: TensorFlow binds every interface, plain gRPC.
SECURITY = (
    "on all interfaces, unauthenticated and unencrypted: reachable by anyone who reaches this "
    'port (docs/data_service.md, "Security")'
)
_SECURITY_HELP = (
    "Security: TensorFlow's servers listen on every interface of the machine, unauthenticated "
    "and unencrypted (TensorFlow takes no bind address and speaks plain gRPC only). Anyone who "
    "reaches the dispatcher can register a dataset graph that the workers run as your user, "
    "file reads and writes included. Run them on a private network or VPC, firewall their "
    "ports to the trainers' addresses, never on a public interface (Kubernetes: a "
    'NetworkPolicy; docs/data_service.md, "Security").'
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfgpu data-service",
        description="Run a tf.data service dispatcher or worker until stopped (SIGTERM, "
        "Ctrl-C). The server runs in a child process that is started again at the same "
        "port when it dies (--no-restart: no child, no restarts).",
        epilog=_SECURITY_HELP,
    )
    restart = argparse.ArgumentParser(add_help=False)
    restart.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # its supervisor's
    restart.add_argument(
        "--restart",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the server again at the same port when it dies: up to "
        f"{MAX_RESTARTS} times in {RESTART_WINDOW_S:g} s (default: --restart; "
        "--no-restart when systemd, Kubernetes or Slurm restarts it)",
    )
    sub = parser.add_subparsers(dest="role", metavar="ROLE", required=True)
    d = sub.add_parser(
        "dispatcher",
        parents=[restart],
        help="the dispatcher: hands out the work, one per run",
        epilog=_SECURITY_HELP,
    )
    d.add_argument("--port", type=int, default=5050, help="port to serve on (default 5050)")
    d.add_argument(
        "--work-dir",
        help="directory for the dispatcher's journal: restarted with the same one, it keeps "
        "its jobs (fault tolerant). Default: none, state lost on restart",
    )
    d.add_argument(
        "--worker-timeout-s",
        type=float,
        default=30.0,
        help="seconds without a heartbeat before a worker counts as lost (default 30, at most "
        f"{MAX_WORKER_TIMEOUT_S:g})",
    )
    d.set_defaults(role_parser=d)
    w = sub.add_parser(
        "worker",
        parents=[restart],
        help="a worker: runs the pipelines, streams their batches",
        epilog=_SECURITY_HELP,
    )
    w.add_argument("--dispatcher", required=True, help="the dispatcher's host:port")
    w.add_argument("--port", type=int, default=0, help="port to serve on (default: any free)")
    w.add_argument(
        "--host", help="the name trainers reach this worker by (default: this machine's host name)"
    )
    w.set_defaults(role_parser=w)
    return parser


def _check(args: argparse.Namespace) -> None:
    """Every argument checked before any work (no TensorFlow): an error naming the flag under the
    role's usage line, exit status 2. Creates the dispatcher's --work-dir to prove it writable."""
    try:
        if args.role == "dispatcher":
            check_int("--port", args.port, minimum=1, maximum=65535, expected="a port, 1 to 65535")
            check_number(
                "--worker-timeout-s",
                args.worker_timeout_s,
                minimum=0.001,
                maximum=MAX_WORKER_TIMEOUT_S,
                expected=f"a number of seconds from 0.001 to {MAX_WORKER_TIMEOUT_S:g} (a day)",
            )
            if args.work_dir is not None:
                if not args.work_dir.strip():
                    raise invalid_value("--work-dir", args.work_dir, "a directory path")
                writable_dir(args.work_dir, "--work-dir")
        else:
            check_int(
                "--port", args.port, minimum=0, maximum=65535, expected="a port, 0 (any) to 65535"
            )
            parse_address(args.dispatcher, "--dispatcher", expected=_ADDRESS_FLAG)
            if args.host is not None and not _HOST.match(args.host):
                raise invalid_value(
                    "--host", args.host, "the host name or IP address trainers reach it by"
                )
    except (TypeError, ValueError) as e:
        args.role_parser.error(str(e))


def _log(message: str) -> None:
    print(f"tfgpu data-service: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a dispatcher or worker (`argv` after `tfgpu data-service`) until SIGTERM or SIGINT;
    returns 0 after a clean stop, 1 when it kept dying, 2 for bad arguments or a failed start."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
        _check(args)
    except SystemExit as e:  # argparse: usage printed
        return int(e.code or 0)
    if not args.restart:
        return _serve(args)
    port = args.port or _free_port()  # a worker's restarts keep the port it first had
    if args.role == "dispatcher" and not args.work_dir:
        _log("no --work-dir: a restarted dispatcher has lost its jobs, and trainers fail")
    command = [sys.executable, "-m", "tfgpu", "data-service", *argv, "--port", str(port)]
    command += ["--no-restart", "--parent-pid", str(os.getpid())]  # it dies with this process
    with _stop_on_signals() as stop:
        return supervise(command, what=args.role, port=port, stop=stop)


@contextlib.contextmanager
def _stop_on_signals(catch: bool = True) -> Iterator[threading.Event]:
    """An event SIGTERM and SIGINT set during the block (`catch=False`: they end the process)."""
    stop = threading.Event()
    handler = (lambda *_: stop.set()) if catch else signal.SIG_DFL
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def restart_delay(deaths: Sequence[float], now: float) -> float | None:
    """Seconds to wait before a restart: 1, 2, 4, 8, 16 for 1 to 5 recent `deaths`, else None."""
    recent = sum(1 for t in deaths if now - t <= RESTART_WINDOW_S)
    if recent > MAX_RESTARTS:
        return None
    return 2.0 ** max(0, recent - 1)


def supervise(
    command: Sequence[str],
    *,
    what: str,
    port: int,
    stop: threading.Event,
    delays: Callable[[Sequence[float], float], float | None] = restart_delay,
) -> int:
    """Runs `command` (a server at `port`) until `stop` is set, starting it again when it dies.
    Returns 0 after a stop, `EXIT_CANNOT_START` when it could not start, 1 when `delays` gave up."""
    deaths: list[float] = []
    while True:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL)
        _log(f"{what}: process {proc.pid} started (port {port}, restarted when it dies)")
        started = time.monotonic()
        while proc.poll() is None and not stop.wait(0.2):
            pass
        if proc.poll() is None:  # stop asked: the server stops itself cleanly, or is killed
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return 0
        status = proc.returncode
        if stop.is_set():
            return 0
        if status == EXIT_CANNOT_START:
            _log(f"{what}: process {proc.pid} could not start (its message above); giving up")
            return EXIT_CANNOT_START
        deaths.append(time.monotonic())
        ended = f"{what}: process {proc.pid} {death(status)} after {deaths[-1] - started:.1f} s"
        delay = delays(deaths, deaths[-1])
        if delay is None:
            _log(
                f"{ended}, the {len(deaths)}th time; more than {MAX_RESTARTS} deaths in "
                f"{RESTART_WINDOW_S:g} s: giving up"
            )
            return 1
        _log(f"{ended}; starting it again at port {port} in {delay:g} s")
        if stop.wait(delay):
            return 0


def _free_port() -> int:
    """A port free now on every interface (a worker's restarts must keep one port)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _port_in_use(port: int) -> OSError | None:
    """Why `port` cannot be served, or None. gRPC binds with SO_REUSEPORT, so a second server
    would start without a word; a plain bind (SO_REUSEADDR only) fails where one listens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            return e
    return None


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3.0):
            return True
    except OSError:
        return False


def _serve(args: argparse.Namespace) -> int:
    """Runs the server in this process until SIGTERM or SIGINT (or its supervisor's death)."""
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    in_use = _port_in_use(args.port) if args.port else None
    if in_use is not None:
        _log(
            f"error: {args.role} could not start: port {args.port} is in use "
            f"({in_use.strerror or in_use}): another server there? Pick another --port."
        )
        return EXIT_CANNOT_START
    import tensorflow as tf

    # Starting blocks in TensorFlow (a worker waits there for its dispatcher), where no
    # Python handler runs: until the server is up, SIGTERM and Ctrl-C end the process.
    with _stop_on_signals(catch=False):
        server, count, what = _start(args, tf.data.experimental.service)
    if server is None:
        return EXIT_CANNOT_START
    with _stop_on_signals() as stop:
        _log_until(stop, count, what)
    _log(f"{args.role} stopping")
    try:
        server._stop()  # the servers' own shutdown (the public API has only `join`)
    except (AttributeError, RuntimeError, tf.errors.OpError) as e:  # pragma: no cover - best effort
        _log(f"{args.role} stop: {type(e).__name__}: {e}")
    _log(f"{args.role} stopped")
    return 0


def _start(args: argparse.Namespace, service: Any) -> tuple[Any, Any, str]:
    """The started server, its count of workers or tasks (a callable or None), its unit."""
    import tensorflow as tf

    try:
        if args.role == "dispatcher":
            work_dir = os.path.abspath(os.path.expanduser(args.work_dir)) if args.work_dir else None
            if work_dir:
                os.makedirs(work_dir, exist_ok=True)
            config = service.DispatcherConfig(
                port=args.port,
                work_dir=work_dir,
                fault_tolerant_mode=work_dir is not None,
                worker_timeout_ms=int(args.worker_timeout_s * 1000),
            )
            server = service.DispatchServer(config)
            mode = f"fault tolerant, journal in {work_dir}" if work_dir else "no work dir"
            _log(
                f"dispatcher serving grpc://{socket.gethostname()}:{args.port} {SECURITY} ({mode})"
            )
            return server, getattr(server, "_num_workers", None), "worker(s) registered"
        else:
            dispatcher = parse_address(args.dispatcher, "--dispatcher")
            host = args.host or socket.gethostname()
            if not _reachable(dispatcher.connect_host, dispatcher.port):  # the worker waits
                _log(
                    f"the dispatcher {dispatcher.target} is not reachable yet: the worker "
                    "starts serving once it is (start it, or check --dispatcher)"
                )
            config = service.WorkerConfig(
                dispatcher_address=f"{dispatcher.host}:{dispatcher.port}",
                worker_address=f"{host}:%port%",
                port=args.port,
            )
            server = service.WorkerServer(config)
            port = getattr(server, "_address", f"?:{args.port}").rpartition(":")[2]
            _log(f"worker serving {host}:{port} {SECURITY} (dispatcher {dispatcher.target})")
            return server, getattr(server, "_num_tasks", None), "task(s) running"
    # A bad --dispatcher (TypeError, ValueError), a work dir it cannot make (OSError), a port
    # taken since the check or a dispatcher's journal it cannot read (TensorFlow's errors).
    except (OSError, TypeError, ValueError, RuntimeError, tf.errors.OpError) as e:
        _log(f"error: {args.role} could not start: {type(e).__name__}: {e}")
        return None, None, ""


def _log_until(stop: threading.Event, count: Any, what: str) -> None:
    """Logs the server's count of workers or tasks when it changes, until `stop` is set."""
    import tensorflow as tf

    last = None
    while not stop.wait(1.0):
        try:
            now = count() if count is not None else None
        except (TypeError, RuntimeError, tf.errors.OpError):  # private counters: a side feature
            now, count = None, None
        if now is not None and now != last:
            _log(f"{now} {what}")
            last = now
