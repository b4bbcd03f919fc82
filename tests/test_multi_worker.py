"""Multi-worker `model.fit` on two local processes: equality, dead workers, kill-and-resume.

Each test starts two workers on 127.0.0.1 with free ports (`tests/workers/cluster.py`);
every process started is killed in a `finally` if it is still running.
"""

from __future__ import annotations

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
    delete the multi-worker fit section of tfgpu/_keras_internals.py (with
    `problems_in_trainer`) and its call in tfgpu/distribute.py."""
    out = str(tmp_path / "w{i}.npz")
    workers = run(tmp_path, ["--out", out, "--strategy", "multi_worker", "--no-compat"], "plain")
    outputs = [w.output() for w in workers]
    if all(w.proc.returncode == 0 for w in workers):
        pytest.fail(
            f"Keras {keras.__version__} now trains under MultiWorkerMirroredStrategy without "
            "tfgpu's correction: remove the multi-worker fit section of "
            "tfgpu/_keras_internals.py (see its comments)."
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
    assert "TRAINING FAILED" in out and "unhealthy" in out, out[-3000:]
    assert (backup / "backup.npz").exists()  # the chief's canonical copy
    assert (backup / ".worker-1" / "backup.npz").exists()  # the other worker's own copy

    workers = run(tmp_path, args, "resumed")  # bounded by run()'s timeout: no hang
    assert [w.proc.returncode for w in workers] == [0, 0], workers[0].output()[-3000:]
    for i in range(2):
        iterations, weights = weights_of(tmp_path / f"w{i}.npz", len(reference))
        assert iterations == 24
        assert max_diff(weights, reference) < 1e-5
    assert not backup.exists()
