"""Start a local multi-worker cluster: N processes on 127.0.0.1, free ports, TF_CONFIG each."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "tests" / "workers" / "train.py"
SERVICE_TRAIN = REPO / "tests" / "workers" / "service_train.py"


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports: list[int], index: int, chief: bool = False) -> str:
    """Process `index`'s TF_CONFIG: all workers, or (`chief`) process 0 the chief."""
    addresses = [f"127.0.0.1:{p}" for p in ports]
    if not chief:
        spec, task = {"worker": addresses}, {"type": "worker", "index": index}
    else:
        spec = {"chief": addresses[:1], "worker": addresses[1:]}
        task = (
            {"type": "chief", "index": 0} if index == 0 else {"type": "worker", "index": index - 1}
        )
    return json.dumps({"cluster": spec, "task": task})


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen
    log: Path
    ended: float | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(
    n: int,
    args: list[str],
    workdir: Path,
    tag: str = "run",
    *,
    script: Path = TRAIN,
    chief: bool = False,
) -> list[Worker]:
    """Starts `n` processes running `script args` (default `tests/workers/train.py`; `{i}` in
    an argument becomes the process's index), all workers or (`chief`) process 0 the chief."""
    ports = free_ports(n)
    workers = []
    for i in range(n):
        log = workdir / f"{tag}-worker{i}.log"
        env = {
            **os.environ,
            "TF_CONFIG": tf_config(ports, i, chief),
            "PYTHONPATH": str(REPO),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        out = [a.replace("{i}", str(i)) for a in args]
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [sys.executable, str(script), *out],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO),
                start_new_session=True,
            )
        workers.append(Worker(i, proc, log))
    return workers


def wait(workers: list[Worker], timeout: float) -> None:
    """Waits for all workers (recording when each ended); kills all of them on timeout."""
    deadline = time.monotonic() + timeout
    try:
        while any(w.ended is None for w in workers):
            for w in workers:
                if w.ended is None and w.proc.poll() is not None:
                    w.ended = time.monotonic()
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- worker {w.index}\n{w.output()[-3000:]}" for w in workers)
                raise TimeoutError(f"workers still running after {timeout} s\n{logs}")
            time.sleep(0.05)
    finally:
        kill(workers)


def kill(workers: list[Worker]) -> None:
    """SIGKILLs every worker process group still alive (only the ones started here)."""
    for w in workers:
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait(timeout=30)
