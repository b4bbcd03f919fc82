"""tf.data service throughput: 1 to 8 workers against the local pipeline, and the feed ratio.

The per-example work is a stand-in that waits without using the CPU
(TensorFlow's test helper `testing.sleep`, a serial stage: one pipeline makes 1/SLEEP examples per
second, as one host's CPUs would), so that more workers scale on a 2-core machine. The
dispatcher and the workers run in this process on 127.0.0.1 (each worker a separate
`WorkerServer` with its own pipeline); the trainer reads through
`tfgpu.data.pipeline(..., service=...)`.

The source is chunked as `pipeline` chunks in-memory arrays (`tfgpu.data._service.memory_source`):
a range of chunk ids, each mapped to its range of examples, then unbatched. Under dynamic
sharding each element of the source is a split, one dispatcher RPC: a source of single
examples (`--source examples`, the first version of this benchmark) measures those RPCs,
not the service.

Two measures per setting:
- throughput: batches/s read as fast as possible (after a warm-up);
- feed ratio: with a device stand-in that takes `--step-ms` per batch (a sleep, like a GPU
  step the host only waits for), the share of the time the device is busy (1.0: never
  waits for data). This Python loop fetches each batch itself (`next`, about 0.3-0.6 ms on
  2 loaded cores) and a sleep overshoots, so even batches that are always ready do not
  reach 1.0: the table gives that ceiling, and each feed ratio as a share of it.

    python benchmarks/data_service.py              # 1, 2, 4 workers
    python benchmarks/data_service.py --many       # 1, 2, 4, 6, 8 workers (RESULTS.md)
    python benchmarks/data_service.py --arrays     # pipeline((x, y), service=...): splits
    python benchmarks/data_service.py --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops.testing import sleep as _sleep

import tfgpu

SERVICE = tf.data.experimental.service
CHUNK = 256  # examples per split, as `memory_source` for large arrays
EXAMPLES = 10**9  # more than any run reads: the epoch never ends
# Every server started, kept until `os._exit`: a WorkerServer stops when garbage collected,
# and destroying servers that still hold tasks can wait for ever (seen with `--source
# examples`, once the table was printed).
_SERVERS: list = []


def make_data(sleep_us: int, source: str) -> tf.data.Dataset:
    """A splittable source and a slow per-example stage that waits, no CPU."""
    if source == "examples":  # one split (one dispatcher RPC) per example
        ds = tf.data.Dataset.range(EXAMPLES)
    else:  # one split per chunk of CHUNK examples

        def chunk(i: tf.Tensor) -> tf.Tensor:
            return tf.range(i * CHUNK, (i + 1) * CHUNK)

        ds = tf.data.Dataset.range(EXAMPLES // CHUNK).map(chunk).unbatch()
    return ds.apply(_sleep(sleep_us))


def measure(ds: tf.data.Dataset, batches: int, warmup: int, step_s: float) -> tuple[float, float]:
    """(batches/s, busy share) over `batches` after `warmup`, with a device stand-in of `step_s`
    per batch. The busy share is the time spent in the stand-in's steps (as measured: a sleep
    overshoots) over the wall time; the rest is the loop waiting for, or fetching, data."""
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    busy = 0.0
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
        if step_s:
            t = time.perf_counter()
            time.sleep(step_s)
            busy += time.perf_counter() - t
    wall = time.perf_counter() - start
    return batches / wall, busy / wall


def dispatcher() -> tuple[str, str]:
    """A dispatcher on a free port: (its target, its host:port)."""
    server = SERVICE.DispatchServer(SERVICE.DispatcherConfig(port=0))
    _SERVERS.append(server)
    return server.target, server.target.split("://")[1]


def start_workers(address: str, workers: list, n: int) -> None:
    while len(workers) < n:
        workers.append(
            SERVICE.WorkerServer(
                SERVICE.WorkerConfig(dispatcher_address=address, worker_address="127.0.0.1:%port%")
            )
        )
    _SERVERS.extend(workers)
    time.sleep(1.0)  # the workers' first heartbeat


def ready(batch_size: int) -> tf.data.Dataset:
    """Batches that are always ready: the feed ratio this loop reaches with no input work."""
    batch = tf.zeros([batch_size], tf.int64)
    return tf.data.Dataset.from_tensors(batch).repeat().prefetch(tf.data.AUTOTUNE)


def scaling(args: argparse.Namespace) -> None:
    warmup = max(10, args.batches // 10)
    ideal = 1e6 / args.sleep_us / args.batch_size  # batches/s of one pipeline
    step_s = args.step_ms / 1000

    def build(service=None):
        return tfgpu.data.pipeline(
            make_data(args.sleep_us, args.source),
            batch_size=args.batch_size,
            shuffle=False,
            repeat=False,
            service=service,
        )

    def row(name: str, n: int, service: str | None = None) -> tuple[str, int, float, float]:
        rate, _ = measure(build(service), args.batches, warmup, 0.0)
        _, fed = measure(build(service), args.batches, warmup, step_s)
        return name, n, rate, fed

    _, ceiling = measure(ready(args.batch_size), args.batches, warmup, step_s)
    rows = [row("local", 0)]
    target, address = dispatcher()
    workers: list = []
    for n in sorted(args.workers):
        start_workers(address, workers, n)
        rows.append(row(f"{n} worker{'s' if n > 1 else ''}", n, target))

    splits = "one split per example" if args.source == "examples" else f"{CHUNK} examples per split"
    print(
        f"source: {args.source} ({splits}); per example {args.sleep_us} us (serial, no CPU), "
        f"batch {args.batch_size}: one pipeline makes at most {ideal:.1f} batches/s; device "
        f"stand-in {args.step_ms:g} ms = {1000 / args.step_ms:.0f} batches/s; feed ratio with "
        f"batches always ready (this loop's ceiling): {ceiling:.2f}"
    )
    head = ["setting", "batches/s", "vs local", "vs 1 worker", "of linear (1 worker)"]
    head += ["of linear (local)", "feed ratio", "of ceiling"]
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    local = rows[0][2]
    one = next((rate for _, n, rate, _ in rows if n == 1), float("nan"))
    for name, n, rate, fed in rows:
        k = max(n, 1)
        cells = [name, f"{rate:.1f}", f"{rate / local:.2f}x"]
        cells += ["-", "-"] if n == 0 else [f"{rate / one:.2f}x", f"{rate / (k * one):.0%}"]
        cells += [f"{rate / (k * local):.0%}", f"{fed:.2f}", f"{fed / ceiling:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


def arrays(args: argparse.Namespace) -> None:
    """The real pipeline on in-memory arrays (chunked by `pipeline`) against a dataset of
    single examples (one split each), one worker, no slow stage: what the splits cost."""
    n = 1 << 18
    x = np.random.default_rng(0).normal(size=(n, 8)).astype("float32")
    y = np.arange(n)
    target, address = dispatcher()
    start_workers(address, [], 1)
    batches = args.batches
    warmup = max(10, batches // 10)
    settings = {
        "local, arrays": lambda: tfgpu.data.pipeline((x, y), batch_size=args.batch_size),
        "1 worker, arrays (chunks)": lambda: tfgpu.data.pipeline(
            (x, y), batch_size=args.batch_size, service=target
        ),
        "1 worker, from_tensor_slices (one split per example)": lambda: tfgpu.data.pipeline(
            tf.data.Dataset.from_tensor_slices((x, y)),
            batch_size=args.batch_size,
            service=target,
        ),
    }
    print(f"{n} in-memory examples of 8 floats, batch {args.batch_size}, no slow stage")
    print("| setting | batches/s | examples/s |")
    print("| --- | ---: | ---: |")
    for name, build in settings.items():
        rate, _ = measure(build(), batches, warmup, 0.0)
        print(f"| {name} | {rate:.1f} | {rate * args.batch_size:,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--many", action="store_true", help="1, 2, 4, 6 and 8 workers")
    parser.add_argument("--source", choices=("chunks", "examples"), default="chunks")
    parser.add_argument("--arrays", action="store_true", help="pipeline(arrays): the splits")
    parser.add_argument("--sleep-us", type=int, default=500, help="per example (default 500)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--step-ms", type=float, default=4.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.many:
        args.workers = [1, 2, 4, 6, 8]
    if args.quick:
        args.workers, args.batches = [1, 2], 60
    if args.arrays:
        arrays(args)
    else:
        scaling(args)
    # The servers in `_SERVERS` are never destroyed: leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
