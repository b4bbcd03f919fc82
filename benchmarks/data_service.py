"""tf.data service throughput: 1, 2, 4 workers against the local pipeline, and the feed ratio.

The per-example work is a stand-in that waits without using the CPU
(TensorFlow's test helper `testing.sleep`, a serial stage: one pipeline makes 1/SLEEP examples per
second, as one host's CPUs would), so that more workers scale on a 2-core machine. The
dispatcher and the workers run in this process on 127.0.0.1 (each worker a separate
`WorkerServer` with its own pipeline); the trainer reads through
`tfgpu.data.pipeline(..., service=...)`.

Two measures per setting:
- throughput: batches/s read as fast as possible (after a warm-up);
- feed ratio: with a device stand-in that takes `--step-ms` per batch (a sleep, like a GPU
  step the host only waits for), the share of the time the device is busy (1.0: never
  waits for data).

    python benchmarks/data_service.py              # the table in benchmarks/RESULTS.md
    python benchmarks/data_service.py --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from tensorflow.python.data.experimental.ops.testing import sleep as _sleep

import tfgpu

SERVICE = tf.data.experimental.service


def make_data(sleep_us: int) -> tf.data.Dataset:
    # A splittable source (range) and a slow per-example stage that waits, no CPU.
    return tf.data.Dataset.range(10**9).apply(_sleep(sleep_us))


def measure(ds: tf.data.Dataset, batches: int, warmup: int, step_s: float) -> float:
    """batches/s over `batches` after `warmup`, with a device stand-in of `step_s` per batch."""
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
        if step_s:
            time.sleep(step_s)
    return batches / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sleep-us", type=int, default=500, help="per example (default 500)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.workers, args.batches = [1, 2], 60
    warmup = max(10, args.batches // 10)
    ideal = 1e6 / args.sleep_us / args.batch_size  # batches/s of one pipeline

    def build(service=None):
        return tfgpu.data.pipeline(
            make_data(args.sleep_us),
            batch_size=args.batch_size,
            shuffle=False,
            repeat=False,
            service=service,
        )

    rows = []
    local = build()
    rows.append(
        (
            "local",
            measure(local, args.batches, warmup, 0.0),
            measure(local, args.batches, warmup, args.step_ms / 1000),
        )
    )
    dispatcher = SERVICE.DispatchServer(SERVICE.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    workers = []
    for n in sorted(args.workers):
        while len(workers) < n:
            workers.append(
                SERVICE.WorkerServer(
                    SERVICE.WorkerConfig(
                        dispatcher_address=address, worker_address="127.0.0.1:%port%"
                    )
                )
            )
        time.sleep(1.0)  # the workers' first heartbeat
        ds = build(dispatcher.target)
        rows.append(
            (
                f"{n} worker(s)",
                measure(ds, args.batches, warmup, 0.0),
                measure(build(dispatcher.target), args.batches, warmup, args.step_ms / 1000),
            )
        )

    device_rate = 1000 / args.step_ms
    print(
        f"per example {args.sleep_us} us (serial, no CPU), batch {args.batch_size}: one "
        f"pipeline makes at most {ideal:.1f} batches/s; device stand-in {args.step_ms:g} ms "
        f"= {device_rate:.0f} batches/s"
    )
    print("| setting | batches/s | vs local | linear | feed ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    base = rows[0][1]
    for name, rate, fed in rows:
        n = 1 if name == "local" else int(name.split()[0])
        ratio = fed / device_rate
        print(
            f"| {name} | {rate:.1f} | {rate / base:.2f}x | {rate / (n * base):.0%} | "
            f"{min(ratio, 1.0):.2f} |"
        )


if __name__ == "__main__":
    main()
