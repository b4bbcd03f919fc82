"""tfgpu.data.pipeline(service=...), the data-service servers, and the pure rules behind them.

The servers run in this process (`DispatchServer`/`WorkerServer` on 127.0.0.1), except the
console command's tests, which run them as `tfgpu data-service` would: a dispatcher in a
subprocess (SIGTERM, a restart from its work directory), a supervised worker whose server
process is SIGKILLed mid-epoch, and the supervisor itself on tiny stand-in servers.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

# A dataset step that waits per element without using the CPU (TensorFlow's test helper).
from tensorflow.python.data.experimental.ops.testing import sleep as _sleep

import tfgpu
from tests.conftest import run_python
from tests.test_processes import ended, ended_within
from tfgpu._internal.adapters.data_service import (
    EXIT_CANNOT_START,
    MAX_RESTARTS,
    _port_in_use,
    check_job_name,
    consumers,
    job_name,
    main,
    parse_address,
    restart_delay,
    supervise,
)
from tfgpu._internal.helpers.cluster import Cluster
from tfgpu.data._plan import Facts, decide
from tfgpu.data._service import chunk_size
from tfgpu.diagnosis._advice import service_advice

SERVICE = tf.data.experimental.service
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether `host:port` accepts a connection within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


# ------------------------------------------------------------------ pure rules (fast)


@pytest.mark.parametrize(
    "value, target",
    [
        ("grpc://localhost:5050", "grpc://localhost:5050"),
        ("10.0.0.7:5050", "grpc://10.0.0.7:5050"),
        ("[::1]:5050", "grpc://[::1]:5050"),
        ("dispatcher.svc.cluster.local:1", "grpc://dispatcher.svc.cluster.local:1"),
    ],
)
def test_address_forms(value, target):
    assert parse_address(value).target == target


@pytest.mark.parametrize(
    "value, match",
    [
        ("http://host:5050", "speaks 'grpc', not 'http'"),
        ("host", "with a port from 1 to 65535"),
        ("host:0", "with a port from 1 to 65535"),
        ("host:70000", "with a port from 1 to 65535"),
        (":5050", "with a host name"),
        ("ho st:5050", "with a host name"),
    ],
)
def test_address_errors(value, match):
    with pytest.raises(ValueError, match=r"argument `service`.*" + match):
        parse_address(value)
    with pytest.raises(TypeError, match="Invalid type for argument `service`"):
        parse_address(5050)


def test_job_name_choice():
    lone = Cluster("none", 1)
    assert job_name(None, cluster=lone, environ={}, serial=0, token="t") == "tfgpu-t-0"
    assert job_name(None, cluster=lone, environ={}, serial=1, token="t") == "tfgpu-t-1"
    two = Cluster("TF_CONFIG", 2, "worker", 1, {"worker": ["a:1", "b:1"]})
    # Explicit: the same on every trainer; a second pipeline of the run gets a suffix.
    for cluster in (lone, two):
        assert job_name("run7", cluster=cluster, environ={}, serial=0, token="x") == "run7"
        assert job_name("run7", cluster=cluster, environ={}, serial=2, token="y") == "run7-2"
    # Slurm: job and step ids, the same on every task, new for every run.
    slurm = Cluster("slurm", 4, "worker", 3)
    env = {"SLURM_JOB_ID": "991", "SLURM_STEP_ID": "2"}
    names = {job_name(None, cluster=slurm, environ=env, serial=0, token=t) for t in "abcd"}
    assert names == {"tfgpu-slurm-991.2-0"}
    # Several trainers with nothing unique they share: the user must name the run.
    with pytest.raises(ValueError, match=r"service_job_name=None in a 2-trainer cluster"):
        job_name(None, cluster=two, environ={}, serial=0, token="t")


def test_job_name_checks():
    assert check_job_name(None) is None
    with pytest.raises(TypeError, match="service_job_name"):
        check_job_name(7)
    for bad in ("", "a b", "-x", "x" * 129, "a/b"):
        with pytest.raises(ValueError, match="service_job_name"):
            check_job_name(bad)


def test_coordinated_reads_only_for_repeated_multi_worker_data():
    spec = {"chief": ["c:1"], "worker": ["a:1", "b:1"]}
    assert consumers(Cluster("TF_CONFIG", 3, "chief", 0, spec), repeat=True) == (0, 3)
    assert consumers(Cluster("TF_CONFIG", 3, "worker", 1, spec), repeat=True) == (2, 3)
    assert consumers(Cluster("TF_CONFIG", 3, "worker", 1, spec), repeat=False) == (None, None)
    assert consumers(Cluster("TF_CONFIG", 3, "evaluator", 0, spec), repeat=True) == (None, None)
    assert consumers(Cluster("slurm", 2, "worker", 1), repeat=True) == (1, 2)
    assert consumers(Cluster("none", 1), repeat=True) == (None, None)


def test_service_advice_rule():
    base = dict(
        input_bound=True,
        host_cpu_busy=0.97,
        cpu_count=8,
        parallel=True,
        cached=True,
        pipeline_batches_per_s=30.0,
        step_batches_per_s=100.0,
    )
    advice = service_advice(**base)
    assert advice is not None and (advice.workers, advice.cores) == (4, 31)
    assert "4 with 8 cores each" in advice.text and "service='grpc://HOST:5050'" in advice.text
    # Any setting left on this host, or no shortage: no advice.
    for change in (
        {"input_bound": False},
        {"host_cpu_busy": 0.5},
        {"parallel": False},
        {"cached": False},
        {"pipeline_batches_per_s": 120.0},
        {"step_batches_per_s": float("nan")},
    ):
        assert service_advice(**{**base, **change}) is None


def _facts(**kw):
    base = dict(
        kind="memory",
        num_examples=1000,
        element_bytes=16,
        num_files=None,
        has_map_fn=True,
        map_fn_random_ops=(),
        replicas=2,
        workers=2,
        on_gpu=True,
        cpu_count=8,
        ram_budget_bytes=2**30,
        free_disk_bytes=None,
    )
    return Facts(**{**base, **kw})


def test_plan_under_the_service():
    wishes = dict(
        batch_size=8,
        per_replica_batch_size=None,
        cache="auto",
        shuffle=True,
        shuffle_buffer=None,
        drop_remainder=None,
        deterministic=None,
        seed=None,
        has_strategy=True,
        private_threadpool_size=None,
    )
    local = decide(_facts(), **wishes)
    assert (local.shard_policy, local.deterministic, local.cache) == ("DATA", True, "memory")
    plan = decide(_facts(service=True), **wishes)
    assert plan.shard_policy == "OFF"  # the service's job shares the data, not auto-sharding
    assert plan.deterministic is False and plan.shuffle_seed is None
    assert plan.cache is None and any("tf.data service" in n for n in plan.notes)
    assert plan.private_threadpool_size == 0  # the workers' machines are not this one
    assert plan.drop_remainder is True and plan.global_batch_size == 8


def test_chunks_are_splits_not_examples():
    assert chunk_size(10) == 1
    assert chunk_size(3_200) == 100
    assert chunk_size(10**7) == 256


XY = (np.arange(96, dtype=np.float32).reshape(96, 1), np.arange(96))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(service="ftp://h:1"), ValueError, "speaks 'grpc'"),
        (dict(service=1), TypeError, "argument `service`"),
        (dict(service="h:1", cache=True), ValueError, "Conflicting arguments: cache=True"),
        (dict(service="h:1", cache="/tmp/c"), ValueError, "a file cache would be written"),
        (dict(service="h:1", deterministic=True), ValueError, "never reproducible"),
        (dict(service_job_name="r1"), ValueError, "service_job_name='r1' and service=None"),
        (dict(service="h:1", service_job_name="a b"), ValueError, "service_job_name"),
    ],
)
def test_pipeline_arguments_checked_before_any_work(kwargs, error, match):
    with pytest.raises(error, match=match):
        tfgpu.data.pipeline(XY, batch_size=8, **kwargs)


def test_dispatcher_unreachable_fails_fast_naming_the_address():
    port = _free_port()  # bound then closed: nothing listens there
    with pytest.raises(ConnectionError, match=rf"dispatcher at grpc://127\.0\.0\.1:{port} is not"):
        tfgpu.data.pipeline(XY, batch_size=8, service=f"127.0.0.1:{port}")


def _listening(reply: bytes | None) -> tuple[socket.socket, list[socket.socket]]:
    """A TCP server on 127.0.0.1 that accepts connections and answers each with `reply` (None:
    says nothing, keeps them open); closing the returned socket stops it."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed by the test
                return
            accepted.append(conn)
            if reply is not None:
                conn.recv(1024)
                conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return server, accepted


@pytest.mark.parametrize(
    "reply, match",
    [
        pytest.param(  # waits out the 5 s
            None, r"accepts connections but nothing answered in 5 s", marks=pytest.mark.slow
        ),
        (
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            r"no dispatcher answered the call \(UNAVAILABLE: .*",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n", r"no dispatcher answered the call \(UNAVAILABLE: .*"),
    ],
)
def test_a_port_that_is_no_dispatcher_is_refused_naming_what_answered(reply, match):
    server, accepted = _listening(reply)
    port = server.getsockname()[1]
    try:
        with pytest.raises(
            ConnectionError,
            match=rf"argument `service`. Received: service='grpc://127\.0\.0\.1:{port}'.*{match}",
        ):
            tfgpu.data.pipeline(XY, batch_size=8, service=f"127.0.0.1:{port}")
    finally:
        server.close()
        for conn in accepted:
            conn.close()


def test_a_workers_port_is_refused_as_no_dispatcher():
    own = _Cluster(workers=1)
    port = own.workers[0]._address.rsplit(":", 1)[1]
    with pytest.raises(
        ConnectionError, match=r"not a dispatcher \(a tf.data service worker's port\?\)"
    ):
        tfgpu.data.pipeline(XY, batch_size=8, service=f"127.0.0.1:{port}")
    # The dispatcher of the same cluster answers: the probe passes, the pipeline is built.
    assert tfgpu.data.pipeline(XY, batch_size=8, service=own.address) is not None


def test_main_rejects_bad_arguments(capsys):
    assert main(["worker"]) == 2  # --dispatcher is required
    assert main(["worker", "--dispatcher", "nohost"]) == 2
    assert main(["dispatcher", "--port", "0"]) == 2
    assert main(["dispatcher", "--worker-timeout-s", "0"]) == 2
    assert main(["worker", "--dispatcher", "h:5050", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "--dispatcher" in err and "Expected a port, 1 to 65535" in err
    assert "Expected a port, 0 (any) to 65535" in err
    assert "usage: tfgpu data-service worker" in err  # the role's own usage line
    assert "started" not in err  # refused before any server process started


@pytest.mark.parametrize("argv", [["--help"], ["dispatcher", "--help"], ["worker", "--help"]])
def test_help_says_the_ports_are_open_to_anyone_who_reaches_them(argv, capsys):
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "listen on every interface of the machine, unauthenticated and unencrypted" in out
    assert "firewall their ports to the trainers' addresses" in out
    assert 'docs/data_service.md, "Security"' in out


@pytest.mark.slow
def test_tensorflow_still_offers_no_narrower_bind_nor_another_protocol():
    """Why `tfgpu data-service` has no --bind or --protocol: TensorFlow's servers take no
    bind address (they listen on `[::]:port`) and know plain `grpc` alone. The day either
    changes, this fails: offer it (docs/data_service.md, "Security"). In a child process: a
    server refused for its protocol crashes the process as it is collected."""
    code = (
        "import sys, tensorflow as tf\n"
        "s = tf.data.experimental.service\n"
        "print(sorted(set(s.DispatcherConfig._fields) | set(s.WorkerConfig._fields)))\n"
        "try:\n"
        "    s.DispatchServer(s.DispatcherConfig(port=0, protocol='grpc+local'))\n"
        "except RuntimeError as e:\n"
        "    print(str(e).splitlines()[-1])\n"
        "sys.stdout.flush()\n"
    )
    out = run_python(code, check=False).stdout  # the crash comes after what it printed
    fields, refused = out.strip().splitlines()[-2:]
    assert not re.search(r"bind|host|listen", fields), fields
    assert refused.endswith("The available types are: [ grpc ]"), refused


_BAD_ARGUMENTS = [
    (["dispatcher", "--worker-timeout-s", "inf"], r"`--worker-timeout-s`\. Received: "
     r"--worker-timeout-s=inf\. Expected a number of seconds from 0\.001 to 86400"),
    (["dispatcher", "--worker-timeout-s", "1e999"], r"--worker-timeout-s=inf\."),
    (["dispatcher", "--worker-timeout-s", "nan"], r"--worker-timeout-s=nan\."),
    (["dispatcher", "--worker-timeout-s", "-1"], r"--worker-timeout-s=-1\.0\."),
    (["dispatcher", "--worker-timeout-s", "1e300"], r"--worker-timeout-s=1e\+300\."),
    (["dispatcher", "--worker-timeout-s", "0.0001"], r"--worker-timeout-s=0\.0001\."),
    (["dispatcher", "--port", "-1"], r"`--port`\. Received: --port=-1\. Expected a port, 1"),
    (["dispatcher", "--port", str(10**30)], r"`--port`"),
    (["dispatcher", "--work-dir", "{file}"], r"`--work-dir`.*Expected a directory; .*file\.txt' "
     r"is a file"),
    (["dispatcher", "--work-dir", "{file}/journal"], r"`--work-dir`.*is under the file"),
    (["dispatcher", "--work-dir", "{unwritable}/journal"], r"`--work-dir`.*Expected a directory "
     r"this process can create and write to \(\w+Error"),
    (["dispatcher", "--work-dir", "{unwritable}/a/b"], r"`--work-dir`.*can create and write to"),
    (["dispatcher", "--work-dir", "{unwritable}"], r"`--work-dir`.*can create and write to"),
    (["dispatcher", "--work-dir", " "], r"`--work-dir`\. Received: --work-dir=' '\. Expected a "
     r"directory path\.$"),
    (["worker", "--dispatcher", "nohost"], r"`--dispatcher`\. Received: --dispatcher='nohost'\. "
     r"Expected host:port or grpc://host:port \(the dispatcher's address\), with a port"),
    (["worker", "--dispatcher", "http://h:1"], r"speaks 'grpc', not 'http'"),
    (["worker", "--dispatcher", "h:1", "--host", "a b"], r"`--host`\. Received: --host='a b'"),
    (["worker", "--dispatcher", "h:1", "--port", "65536"], r"`--port`.*0 \(any\) to 65535"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "match"), _BAD_ARGUMENTS)
def test_each_argument_is_checked_and_named_by_its_flag(argv, match, tmp_path, unwritable, capsys):
    (tmp_path / "file.txt").write_text("kept")
    argv = [a.format(file=tmp_path / "file.txt", unwritable=unwritable) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"usage: tfgpu data-service {argv[0]}" in err
    assert re.search(match, err, re.MULTILINE), err
    for python_only in ("None", "a str", "os.PathLike", "Traceback", "started"):
        assert python_only not in err
    assert (tmp_path / "file.txt").read_text() == "kept"


@pytest.mark.slow
def test_bad_arguments_are_refused_before_tensorflow_is_imported(tmp_path, unwritable):
    (tmp_path / "file.txt").write_text("x")
    argvs = [
        [a.format(file=tmp_path / "file.txt", unwritable=unwritable) for a in argv]
        for argv, _ in _BAD_ARGUMENTS
    ]
    code = (
        "import json, sys; from tfgpu._internal.adapters.data_service import main; "
        "codes = [main(argv) for argv in json.loads(sys.argv[1])]; "
        "print(json.dumps([codes, 'tensorflow' in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argvs)],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    codes, imported = json.loads(proc.stdout)
    assert codes == [2] * len(argvs) and imported is False


def test_a_port_already_served_is_refused_not_shared(capsys):
    # gRPC's SO_REUSEPORT would let a second server share the port with the first.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dispatcher", "--no-restart", "--port", str(port)]) == EXIT_CANNOT_START
        worker = ["worker", "--no-restart", "--dispatcher", "127.0.0.1:1", "--port", str(port)]
        assert main(worker) == EXIT_CANNOT_START
    err = capsys.readouterr().err
    assert err.count(f"could not start: port {port} is in use") == 2


def test_restart_policy():
    assert [restart_delay([0.0] * n, 0.0) for n in range(1, MAX_RESTARTS + 2)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        None,  # the 6th death within the window: given up
    ]
    # Deaths older than the window do not count: a server that dies once a day restarts.
    assert restart_delay([0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0], 6000.0) == 1.0


# A stand-in server for the supervisor: each start appends a line to a file, then does what
# the n-th line of its script says: "kill" (SIGKILL itself), "exit N", or "serve" (run until
# SIGTERM, then exit 0).
_STAND_IN = """
import os, signal, sys, time
starts, script = sys.argv[1], sys.argv[2].split(",")
with open(starts, "a") as f:
    f.write("start\\n")
n = len(open(starts).read().splitlines())
action = script[min(n, len(script)) - 1]
if action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if action.startswith("exit"):
    sys.exit(int(action.split()[1]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with open(starts + ".serving", "w") as f:
    f.write(str(n))
while True:
    time.sleep(0.05)
"""


def _supervised(tmp_path, script, stop=None):
    starts = tmp_path / "starts"
    command = [sys.executable, "-c", _STAND_IN, str(starts), script]
    return supervise(
        command,
        what="worker",
        port=1234,
        stop=stop or threading.Event(),
        delays=lambda deaths, now: None if restart_delay(deaths, now) is None else 0.0,
    ), starts


@pytest.mark.slow
def test_supervisor_restarts_a_killed_server_until_stopped(tmp_path, capfd):
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(_supervised(tmp_path, "kill,exit 1,serve", stop)[0]),
        daemon=True,
    )
    thread.start()
    serving = tmp_path / "starts.serving"
    for _ in range(600):  # the third start serves
        if serving.exists():
            break
        threading.Event().wait(0.1)
    assert serving.read_text() == "3"
    stop.set()
    thread.join(60)
    assert result == [0]
    assert (tmp_path / "starts").read_text().splitlines() == ["start"] * 3
    err = capfd.readouterr().err
    assert "was killed by SIGKILL" in err and "exited with status 1" in err
    assert err.count("starting it again at port 1234") == 2


@pytest.mark.slow
def test_supervisor_gives_up_on_a_server_that_keeps_dying(tmp_path, capfd):
    status, starts = _supervised(tmp_path, "kill")
    assert status == 1
    assert len(starts.read_text().splitlines()) == MAX_RESTARTS + 1
    assert "giving up" in capfd.readouterr().err


@pytest.mark.slow
def test_supervisor_does_not_restart_a_server_that_cannot_start(tmp_path, capfd):
    status, starts = _supervised(tmp_path, f"exit {EXIT_CANNOT_START}")
    assert status == EXIT_CANNOT_START
    assert starts.read_text().splitlines() == ["start"]  # once: it would fail the same way
    assert "could not start" in capfd.readouterr().err


# ------------------------------------------------------------------ with servers (slow)


class _Cluster:
    def __init__(self, workers: int = 2, **dispatcher):
        self.dispatcher = SERVICE.DispatchServer(SERVICE.DispatcherConfig(port=0, **dispatcher))
        self.address = self.dispatcher.target.split("://")[1]
        self.workers = [self.add_worker() for _ in range(workers)]

    def add_worker(self):
        return SERVICE.WorkerServer(
            SERVICE.WorkerConfig(
                dispatcher_address=self.address,
                worker_address="127.0.0.1:%port%",
                heartbeat_interval_ms=200,
            )
        )


@pytest.fixture(scope="module")
def cluster():
    return _Cluster(workers=2)


def _labels(ds) -> list[int]:
    return sorted(int(v) for _, y in ds for v in np.asarray(y))


@pytest.mark.slow
def test_same_examples_as_the_local_pipeline(cluster):
    x = np.arange(200, dtype=np.float32).reshape(200, 1)
    y = np.arange(200)

    def build(**kw):
        return tfgpu.data.pipeline(
            (x, y),
            batch_size=16,
            map_fn=lambda a, b: (a * 2.0, b),
            augment_fn=lambda a, b: (a + tf.random.uniform(()), b),
            validation_split=0.1,
            **kw,
        )

    local_train, local_val = build()
    train, val = build(service=cluster.dispatcher.target)
    expected = _labels(local_train)
    assert expected == list(range(180))
    for _ in range(2):  # every epoch: each training example once, as the local pipeline
        seen = []
        for a, b in train:
            assert a.shape[0] <= 16  # whole batches come from the workers
            np.testing.assert_array_less(np.asarray(b) * 2.0 - 1e-6, a.numpy()[:, 0])
            seen += np.asarray(b).tolist()
        assert sorted(seen) == expected
    # The validation side stays on the trainer, in order.
    assert [int(v) for _, b in val for v in b] == [int(v) for _, b in local_val for v in b]


@pytest.mark.slow
def test_two_replicas_share_each_batch(cluster):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.arange(96, dtype=np.float32).reshape(96, 1)
    ds = tfgpu.data.pipeline(
        (x, np.arange(96)),
        per_replica_batch_size=4,
        strategy=strategy,
        distribute=True,
        service=cluster.dispatcher.target,
    )
    seen = []
    for _, y in ds:
        parts = strategy.experimental_local_results(y)
        assert [p.shape[0] for p in parts] == [4, 4]  # drop_remainder=True under a strategy
        seen += [int(v) for p in parts for v in p]
    counts = collections.Counter(seen)
    assert max(counts.values()) == 1  # no example twice
    # Each worker drops its own partial last batch: at most 2 x 7 examples left out.
    assert len(seen) >= 96 - 2 * 7 and len(seen) % 8 == 0


@pytest.mark.slow
def test_fit_under_a_strategy(cluster):
    import keras

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    train = tfgpu.data.pipeline(
        (x, y), per_replica_batch_size=8, strategy=strategy, service=cluster.dispatcher.target
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    history = model.fit(train, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_does_not_stop_training():
    own = _Cluster(workers=2, worker_timeout_ms=500)
    port = int(own.workers[1]._address.rpartition(":")[2])
    # A slow source (a sleep, no CPU) so the epoch is still running when a worker dies.
    data = tf.data.Dataset.range(300).apply(_sleep(2000))
    ds = tfgpu.data.pipeline(data, batch_size=5, shuffle=False, service=own.dispatcher.target)
    seen: list[int] = []
    for i, b in enumerate(ds):
        seen += np.asarray(b).tolist()
        if i == 5:
            own.workers[1]._stop()  # its task and the examples it held are gone
            # ...and its supervisor starts it again at the same address (as Kubernetes
            # restarts a pod): without that, tf.data 2.21 waits for its task at epoch end.
            own.workers[1] = SERVICE.WorkerServer(
                SERVICE.WorkerConfig(
                    dispatcher_address=own.address,
                    worker_address="127.0.0.1:%port%",
                    port=port,
                    heartbeat_interval_ms=200,
                )
            )
    counts = collections.Counter(seen)
    assert max(counts.values()) == 1  # at most once: nothing twice...
    assert 30 + 200 < len(counts) <= 300  # ...and the epoch went on after the kill
    # The next epoch is whole again: every example once.
    assert sorted(int(v) for b in ds for v in np.asarray(b)) == list(range(300))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_console_worker_killed_mid_epoch_is_restarted_and_training_goes_on():
    own = _Cluster(workers=0)  # the only worker is `tfgpu data-service worker`
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "tfgpu", "data-service", "worker", "--dispatcher"]
    proc = subprocess.Popen(
        [*command, own.address, "--host", "127.0.0.1"], env=env, stderr=subprocess.PIPE, text=True
    )
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()

    def logged(text: str, count: int = 1) -> str:
        for _ in range(1200):
            lines = [line for line in list(log) if text in line]
            if len(lines) >= count:
                return lines[-1]
            threading.Event().wait(0.1)
        raise AssertionError(f"{text!r} not logged {count} time(s): {''.join(log)[-3000:]}")

    def read(ds, out: list[int], after=None) -> None:
        def run() -> None:
            for i, b in enumerate(ds):
                out.extend(np.asarray(b).tolist())
                if after is not None and i == 5:
                    after()
            out.append(-1)  # the end of the epoch was reached

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(240)
        assert out[-1:] == [-1], f"the epoch never ended: {''.join(log)[-3000:]}"
        out.pop()

    try:
        logged("worker serving 127.0.0.1:")
        first = int(logged("started (port").split("process ")[1].split()[0])
        data = tf.data.Dataset.range(200).apply(_sleep(5000))  # still running at the kill
        ds = tfgpu.data.pipeline(data, batch_size=4, shuffle=False, service=own.dispatcher.target)
        seen: list[int] = []
        read(ds, seen, after=lambda: os.kill(first, signal.SIGKILL))  # the OOM killer, say
        assert "was killed by SIGKILL" in logged("starting it again at port")
        logged("worker serving 127.0.0.1:", 2)
        serving = [line for line in log if "worker serving" in line]
        assert "on all interfaces, unauthenticated and unencrypted" in serving[0]
        assert len(serving) == 2 and serving[0] == serving[1]  # the same address again
        counts = collections.Counter(seen)
        assert max(counts.values()) == 1  # at most once: nothing twice...
        assert len(counts) > 6 * 4  # ...and the epoch went on after the kill, to its end
        again: list[int] = []
        read(ds, again)
        assert sorted(again) == list(range(200))  # the next epoch is whole
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0
    logged("worker stopped")


@pytest.mark.slow
def test_console_dispatcher_sigterm_and_restart_keep_the_job(tmp_path):
    port = _free_port()
    work_dir = tmp_path / "dispatcher"
    command = [
        sys.executable,
        "-c",
        "import sys; from tfgpu._internal.adapters.data_service import main; sys.exit(main(sys.argv[1:]))",
        "dispatcher",
        "--port",
        str(port),
        "--work-dir",
        str(work_dir),
    ]
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}

    def start():
        proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        assert wait_for_port("127.0.0.1", port, 120), "the dispatcher did not start"
        return proc

    def stop(proc):
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        return err

    proc = start()
    try:
        worker = SERVICE.WorkerServer(
            SERVICE.WorkerConfig(
                dispatcher_address=f"127.0.0.1:{port}",
                worker_address="127.0.0.1:%port%",
                heartbeat_interval_ms=200,
            )
        )
        data = tf.data.Dataset.range(120).apply(_sleep(2000))
        ds = tfgpu.data.pipeline(
            data, batch_size=4, shuffle=False, service=f"grpc://127.0.0.1:{port}"
        )
        iterator = iter(ds)
        seen = [int(v) for _ in range(3) for v in next(iterator)]
        err = stop(proc)
        assert (
            f"dispatcher serving grpc://{socket.gethostname()}:{port} on all interfaces, "
            "unauthenticated and unencrypted: reachable by anyone who reaches this port" in err
        )
        assert f"fault tolerant, journal in {work_dir}" in err and "dispatcher stopped" in err
        proc = start()  # the same work dir: the job and its splits handed out so far
        seen += [int(v) for b in iterator for v in b]
        counts = collections.Counter(seen)
        assert max(counts.values()) == 1 and len(counts) >= 100
        worker._stop()
    finally:
        if proc.poll() is None:
            stop(proc)


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="parent-death handling: POSIX")
def test_a_killed_supervisor_takes_its_server_with_it_and_frees_the_port():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "tfgpu", "data-service", "dispatcher", "--port", str(port)]
    supervisor = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(supervisor.stderr), daemon=True).start()
    server = None
    try:
        assert wait_for_port("127.0.0.1", port, 240), "".join(log)[-3000:]
        started = next(line for line in log if "started (port" in line)
        server = int(started.split("process ")[1].split()[0])
        supervisor.send_signal(signal.SIGKILL)  # it runs no code: no handler stops the server
        supervisor.wait()
        assert ended_within(server), "the server outlived its supervisor"
        for _ in range(600):  # the kernel closes a killed process's sockets as it ends
            if _port_in_use(port) is None:
                break
            threading.Event().wait(0.05)
        assert _port_in_use(port) is None  # a new dispatcher can start there
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        if server is not None and not ended(server):
            os.kill(server, signal.SIGKILL)
