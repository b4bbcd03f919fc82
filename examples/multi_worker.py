"""Multi-worker training: `MultiWorkerMirroredStrategy` across processes or machines.

Run: `python examples/multi_worker.py` starts two local workers on 127.0.0.1 (free ports,
a `TF_CONFIG` each), waits for both and prints their results. `--workers N` starts N.
`--worker` runs one worker: that is the command to start on each machine of a real cluster.

Every worker runs the same program. `tfgpu.strategy()` finds the cluster and returns a
`MultiWorkerMirroredStrategy`; gradients are all-reduced across workers every step (NCCL
between GPUs, ring on the CPU); `tfgpu.data.pipeline` shards the data so each worker sees
its share. Worker 0 is the chief: it alone should save checkpoints and models.

On your own machines, set `TF_CONFIG` on each (same cluster, own index), then run
`python examples/multi_worker.py --worker` on each:

    export TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]},
                       "task": {"type": "worker", "index": 0}}'     # index 1 on host2

Under Slurm, no TF_CONFIG is needed: `tfgpu.strategy()` reads the job step (through
TensorFlow's `SlurmClusterResolver`: one task per GPU or per node, ports from 8888):

    #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4
    srun python examples/multi_worker.py --worker

A worker that dies stops the others at the next all-reduce (TensorFlow's coordination
service notices within about 10 s); restart them all and resume with
`tfgpu.callbacks.BackupAndRestore`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
QUICK = os.environ.get("TFGPU_QUICK") == "1"  # the test suite runs every example quickly


def free_ports(n: int) -> list[int]:
    """`n` TCP ports that were free on 127.0.0.1 a moment ago."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(num_workers: int, timeout: float) -> int:
    """Starts `num_workers` local workers with their TF_CONFIG; returns 0 if all succeed."""
    ports = free_ports(num_workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    os.makedirs("runs/multi_worker", exist_ok=True)
    workers = []
    for index in range(num_workers):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        log = open(f"runs/multi_worker/worker{index}.log", "w")  # noqa: SIM115
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"]
        workers.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        print(f"started worker {index}: TF_CONFIG={json.dumps(tf_config)}")
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p, _ in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p, log in workers:
            if p.poll() is None:  # timed out: stop the whole cluster
                p.kill()
            p.wait()
            log.close()
    for index, (p, _) in enumerate(workers):
        with open(f"runs/multi_worker/worker{index}.log") as f:
            result = [line for line in f if line.startswith("RESULT")]
        print(
            f"worker {index}: exit {p.returncode}; {result[-1].strip() if result else 'no result'}"
        )
    return 0 if all(p.returncode == 0 for p, _ in workers) else 1


def worker() -> None:
    """One worker of the cluster: the same code on every worker."""
    import keras
    import numpy as np

    import tfgpu

    tfgpu.configure(seed=0)
    strategy = tfgpu.strategy()  # auto: MultiWorkerMirroredStrategy from TF_CONFIG / Slurm
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    global_batch = tfgpu.global_batch_size(16, strategy)

    rng = np.random.default_rng(0)  # the same data on every worker; the pipeline shards it
    x = rng.normal(size=(512 if QUICK else 8192, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")
    train = tfgpu.data.pipeline((x, y), batch_size=global_batch, strategy=strategy, seed=0)

    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
        model.compile(
            keras.optimizers.Adam(tfgpu.scale_learning_rate(1e-2, strategy, rule="sqrt")), "mse"
        )
    history = model.fit(
        train,
        epochs=2 if QUICK else 10,
        verbose=2,
        callbacks=[tfgpu.callbacks.GPUMonitor(log_dir="runs/multi_worker")],  # per worker
    )
    print(
        f"RESULT task {task.get('index')}: {strategy.num_replicas_in_sync} replicas, global "
        f"batch {global_batch}, final loss {history.history['loss'][-1]:.4f}",
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="run one worker (uses TF_CONFIG)")
    parser.add_argument("--workers", type=int, default=2, help="local workers to launch")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before giving up")
    args = parser.parse_args()
    if args.worker:
        worker()
    else:
        sys.exit(launch(args.workers, args.timeout))
