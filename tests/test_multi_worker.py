"""Multi-worker `model.fit` on two local processes: equality, dead workers, kill-and-resume,
and two trainers reading one tf.data service job.

Each test starts two workers on 127.0.0.1 with free ports (`tests/workers/cluster.py`);
every process started is killed in a `finally` if it is still running. The tf.data service's
dispatcher and its two workers run in the test process (`service` fixture).
"""

from __future__ import annotations

import collections
import itertools

import keras
import numpy as np
import pytest

from tests.workers import cluster
from tests.workers.train import train

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def reference():
    """The single-process run: same data, same global batch of 8, 3 epochs."""
    model, _ = train(None, epochs=3, global_batch=8)
    return model.get_weights()


def weights_of(path, n):
    data = np.load(path)
    return int(data["iterations"]), [data[f"arr_{i}"] for i in range(n)]


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def run(tmp_path, args, tag, timeout=150):
    workers = cluster.start(2, args, tmp_path, tag)
    cluster.wait(workers, timeout)
    return workers


@pytest.mark.timeout(200)
def test_two_workers_match_single_process(tmp_path, reference):
    out = str(tmp_path / "w{i}.npz")
    workers = run(tmp_path, ["--out", out, "--strategy", "multi_worker"], "fit")
    assert [w.proc.returncode for w in workers] == [0, 0], workers[0].output()[-3000:]
    results = [weights_of(tmp_path / f"w{i}.npz", len(reference)) for i in range(2)]
    assert [it for it, _ in results] == [24, 24]
    assert max_diff(results[0][1], results[1][1]) == 0.0  # both workers hold the same model
    assert max_diff(results[0][1], reference) < 1e-5  # and it is the single-process model


@pytest.mark.timeout(200)
def test_upstream_keras_still_needs_the_correction(tmp_path):
    """Plain Keras `fit` under two-worker MWMS. When this fails, upstream fixed the bug:
    delete the multi-worker fit section of tfgpu/_internal/adapters/keras_internals.py (with
    `problems_in_trainer`) and its call in tfgpu/distribute.py."""
    out = str(tmp_path / "w{i}.npz")
    workers = run(tmp_path, ["--out", out, "--strategy", "multi_worker", "--no-compat"], "plain")
    outputs = [w.output() for w in workers]
    if all(w.proc.returncode == 0 for w in workers):
        pytest.fail(
            f"Keras {keras.__version__} now trains under MultiWorkerMirroredStrategy without "
            "tfgpu's correction: remove the multi-worker fit section of "
            "tfgpu/_internal/adapters/keras_internals.py (see its comments)."
        )
    known = ("Attempt to convert a value (PerReplica", "Invalid reduction dimension 0")
    assert all(any(k in o for k in known) for o in outputs), outputs[0][-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "save_freq, kill_at",
    [("3", "1:4"), ("epoch", "2:1")],
    ids=["step", "epoch"],
)
def test_dead_worker_stops_the_other_and_restart_resumes(tmp_path, reference, save_freq, kill_at):
    backup = tmp_path / "backup"
    args = ["--out", str(tmp_path / "w{i}.npz"), "--strategy", "multi_worker"]
    args += ["--backup", str(backup), "--save-freq", save_freq]
    workers = run(tmp_path, [*args, "--kill-at", kill_at, "--kill-worker", "1"], "killed")
    survivor, dead = workers
    assert dead.proc.returncode == -9
    out = survivor.output()
    assert survivor.proc.returncode == 3, out[-3000:]  # a clear error, not a hang
    # The coordination service names the dead task ("unhealthy") after its heartbeat timeout,
    # or a collective in flight with it fails at once ("Connection reset by peer", or
    # "Socket closed" when the peer's socket is gone first): the same error either way,
    # whichever comes first on a loaded machine.
    assert "TRAINING FAILED: UnavailableError" in out, out[-3000:]
    dead_peer = ("unhealthy", "Connection reset by peer", "Socket closed")
    assert any(words in out for words in dead_peer), out[-3000:]
    assert (backup / "backup.npz").exists()  # the chief's canonical copy
    assert (backup / ".worker-1" / "backup.npz").exists()  # the other worker's own copy

    workers = run(tmp_path, args, "resumed")  # bounded by run()'s timeout: no hang
    assert [w.proc.returncode for w in workers] == [0, 0], workers[0].output()[-3000:]
    for i in range(2):
        iterations, weights = weights_of(tmp_path / f"w{i}.npz", len(reference))
        assert iterations == 24
        assert max_diff(weights, reference) < 1e-5
    assert not backup.exists()


# ----------------------------------------------- two trainers, one tf.data service job (issue 14)


@pytest.fixture(scope="module")
def service():
    """A dispatcher and two service workers on 127.0.0.1, in this process; its target."""
    import tensorflow as tf

    api = tf.data.experimental.service
    dispatcher = api.DispatchServer(api.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = [
        api.WorkerServer(
            api.WorkerConfig(
                dispatcher_address=address,
                worker_address="127.0.0.1:%port%",
                heartbeat_interval_ms=200,
            )
        )
        for _ in range(2)
    ]
    yield dispatcher.target
    for server in [*workers, dispatcher]:
        server._stop()


def run_service(tmp_path, service, job, args, tag, chief=False):
    """Two trainers of `tests/workers/service_train.py` on `service`; their .npz results."""
    out = str(tmp_path / f"{tag}{{i}}.npz")
    command = ["--out", out, "--service", service, "--job-name", job, *args]
    trainers = cluster.start(2, command, tmp_path, tag, script=cluster.SERVICE_TRAIN, chief=chief)
    cluster.wait(trainers, 150)  # a hang guard: kills both and fails after 150 s
    assert [t.proc.returncode for t in trainers] == [0, 0], trainers[0].output()[-3000:]
    return [np.load(tmp_path / f"{tag}{i}.npz") for i in range(2)]


def per_epoch(result):
    """The ids one trainer trained on, epoch by epoch, and its steps' batch sizes."""
    bounds = np.concatenate([[0], np.cumsum(result["step_sizes"])])
    steps = np.concatenate([[0], result["epoch_ends"]])
    ids = [result["ids"][bounds[a] : bounds[b]] for a, b in itertools.pairwise(steps)]
    return ids, result["step_sizes"]


def same_model(results):
    """Both trainers hold the same weights, step count and losses (synchronous training)."""
    n = len([k for k in results[0].files if k.startswith("arr_")])
    weights = [[r[f"arr_{i}"] for i in range(n)] for r in results]
    assert max_diff(weights[0], weights[1]) == 0.0
    assert int(results[0]["iterations"]) == int(results[1]["iterations"]) > 0
    np.testing.assert_array_equal(results[0]["loss"], results[1]["loss"])
    assert np.all(np.isfinite(results[0]["loss"]))


@pytest.mark.timeout(200)
def test_two_trainers_read_one_service_job(tmp_path, service):
    """`fit` on a finite dataset: the trainers share each epoch first come, first served."""
    examples, per_replica, epochs = 200, 4, 2
    args = ["--examples", str(examples), "--per-replica-batch", str(per_replica)]
    results = run_service(tmp_path, service, "mw-finite", [*args, "--epochs", str(epochs)], "fin")
    same_model(results)
    epochs_seen = [per_epoch(r) for r in results]
    for epoch in range(epochs):
        ids = np.concatenate([seen[0][epoch] for seen in epochs_seen])
        counts = collections.Counter(ids.tolist())
        assert max(counts.values()) == 1  # no example twice in an epoch, across both trainers
        assert set(counts) <= set(range(examples))
        if epoch == 0:
            # Each service worker drops its own last partial batch of 2 x 4: at most 2 x 7
            # examples sit out. Only the first epoch is sure to read the rest: Keras fixes an
            # epoch's step count from the first one (`EpochIterator`, the data's cardinality
            # being unknown), and the trainers split each epoch anew, first come, first served,
            # so a later, more lopsided split can be cut short (20 of 200 examples seen).
            assert len(ids) >= examples - 2 * (2 * per_replica - 1)
    for _, sizes in epochs_seen:
        # A step's batch is a replica's whole share of a global batch, or nothing at all: a
        # trainer whose share of the epoch ran out steps on with an empty batch until the
        # other's runs out too (tf.distribute's partial-batch handling), so both stop together.
        assert set(sizes.tolist()) <= {0, per_replica}
    assert [len(r["step_sizes"]) for r in results] == [len(results[0]["step_sizes"])] * 2


@pytest.mark.timeout(200)
def test_repeated_data_coordinated_reads_with_a_chief(tmp_path, service):
    """`repeat=True` + `steps_per_epoch`: coordinated reads, every step a batch for both."""
    steps, epochs = 6, 2
    args = ["--repeat", "--steps-per-epoch", str(steps), "--epochs", str(epochs)]
    results = run_service(tmp_path, service, "mw-repeat", args, "rep", chief=True)
    same_model(results)
    for r in results:
        assert int(r["iterations"]) == steps * epochs
        _, sizes = per_epoch(r)
        assert sizes.tolist() == [4] * (steps * epochs)  # no empty step: none ran ahead
    ids = np.concatenate([r["ids"] for r in results])
    assert len(ids) == 2 * steps * epochs * 4 and set(ids.tolist()) <= set(range(256))


def test_trainers_without_a_job_name_are_refused(service, monkeypatch):
    """Under a multi-trainer TF_CONFIG, `service=` without `service_job_name=` is refused."""
    import tfgpu

    monkeypatch.setenv("TF_CONFIG", cluster.tf_config([1, 2], 1))
    x = np.zeros((16, 2), "float32")
    with pytest.raises(ValueError, match=r"service_job_name=None in a 2-trainer cluster"):
        tfgpu.data.pipeline((x, x), batch_size=4, service=service)
