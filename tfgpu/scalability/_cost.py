"""The cost model behind `scaling()`'s predictions, pure arithmetic: a step of `n` replicas is
`max(compute(n) + all_reduce(n) + update(n) + other, input(n))`, each term fitted on the 1- and
2-replica measurements. The model written out: docs/scaling.md, "The cost model".
"""

from __future__ import annotations

import dataclasses
import math

RING = "ring"
THROUGH_ONE = "through one device"


def all_reduce_factor(kind: str, n: int) -> tuple[float, int]:
    """(bytes moved per device, in gradients; latency steps) of an all-reduce over `n`. Pure."""
    if n <= 1:
        return 0.0, 0
    if kind == RING:
        return 2.0 * (n - 1) / n, 2 * (n - 1)
    return 2.0 * (n - 1), 2 * (n - 1)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """An all-reduce of `kind` (`RING`, `THROUGH_ONE`): seconds per latency step and bytes per
    second per device (inf: too fast to tell), from two measurements at `n` replicas: `full_s`
    (the gradients, `gradient_bytes`) and `latency_s` (one element per tensor). Pure."""

    kind: str
    latency_s: float
    bandwidth_bytes_s: float

    @classmethod
    def from_measurements(
        cls, kind: str, n: int, gradient_bytes: float, full_s: float, latency_s: float
    ) -> Calibration:
        factor, steps = all_reduce_factor(kind, n)
        per_step = max(0.0, latency_s) / max(1, steps)
        moving = full_s - max(0.0, latency_s)
        bandwidth = factor * gradient_bytes / moving if moving > 0 else math.inf
        return cls(kind, per_step, bandwidth)

    def seconds(self, n: int, gradient_bytes: float) -> float:
        """Predicted all-reduce seconds per step over `n` devices."""
        factor, steps = all_reduce_factor(self.kind, n)
        moving = 0.0 if math.isinf(self.bandwidth_bytes_s) else factor * gradient_bytes
        return steps * self.latency_s + moving / self.bandwidth_bytes_s


def fit_compute(mode: str, c1: float, c2: float) -> tuple[float, float]:
    """(a, b) through the 1- and 2-replica compute: weak `a + b n`, strong `a + b / n`. Pure."""
    # Weak: the same work per replica never takes less with more replicas, so a 2-replica
    # time below the 1-replica one is noise.
    b = max(0.0, c2 - c1) if mode == "weak" else 2.0 * (c1 - c2)
    return c1 - b, b


def compute_at(mode: str, a: float, b: float, n: int) -> float:
    """Compute seconds per step at `n` replicas from `fit_compute`'s (a, b), never below 0."""
    return max(0.0, a + b * n if mode == "weak" else a + b / n)


def ring_s(devices: int, gradient_bytes: float, bandwidth_bytes_s: float) -> float:
    """Seconds of a ring all-reduce of `gradient_bytes` across `devices` (GPUs, or machines on
    a network) over links of `bandwidth_bytes_s` per direction, latency left out."""
    factor, _ = all_reduce_factor(RING, devices)
    return factor * gradient_bytes / bandwidth_bytes_s


def step_time(compute_s: float, all_reduce_s: float, other_s: float, input_s: float) -> float:
    """Compute, all-reduce and update in sequence, the input prefetched beside them. Pure."""
    return max(compute_s + all_reduce_s + other_s, input_s)
