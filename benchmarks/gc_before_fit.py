"""The collection before each timed fit: the whole heap against the young generations.

A long-lived process (a notebook, a test worker) holds many live objects. Each timed fit of
`tune`, `diagnose`, `scaling` and the batch-size finder is preceded by a collection (none runs
inside the window). This times one fit's worth of garbage (reference cycles the size of a
distributed iterator's) collected in a heap of `--live` live objects, by `gc.collect()` and by
`gc.collect(1)` (what `timing.collected_before` runs), alternating, and prints the ratio.

Run: `.venv/bin/python benchmarks/gc_before_fit.py [--live 2000000] [--rounds 7]`
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def _garbage(cycles: int) -> None:
    for _ in range(cycles):  # each a small cycle, as a fit's iterator and callbacks leave
        a: dict = {}
        b = [a]
        a["b"] = b


def _timed(generation: int, cycles: int) -> float:
    gc.disable()  # as inside a timed fit: what the fit allocates stays young
    _garbage(cycles)
    t0 = time.perf_counter()
    gc.collect(generation)
    seconds = time.perf_counter() - t0
    gc.enable()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=2_000_000, help="live objects in the heap")
    parser.add_argument("--cycles", type=int, default=20_000, help="garbage cycles per fit")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    live = [[k] for k in range(args.live)]  # tracked containers, alive throughout
    gc.collect()
    full, young = [], []
    for _ in range(args.rounds):
        full.append(_timed(2, args.cycles))
        young.append(_timed(1, args.cycles))
    f, y = statistics.median(full), statistics.median(young)
    print(
        f"{args.live:,} live objects, {args.cycles:,} garbage cycles per fit, {args.rounds} rounds"
    )
    print(f"gc.collect():  {f * 1e3:8.1f} ms (median)")
    print(f"gc.collect(1): {y * 1e3:8.1f} ms (median)")
    print(f"full / young: x{f / y:.1f}")
    del live


if __name__ == "__main__":
    main()
