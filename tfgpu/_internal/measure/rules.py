"""The measuring core's thresholds and verdicts, defined once for every front end: a `Gain`
with its interval, the stop rule (`decided`), the `verdict`, the predicted `bottleneck`. Pure;
each threshold's source: docs/architecture.md, "The measuring core", and docs/diagnosis.md."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from tfgpu._internal.helpers import stats

# Rounds per comparison: at least (fewer cannot tell a gain from noise), at most (a
# borderline variant never takes the next ones' budget); the coverage of the median's
# confidence interval.
MIN_ROUNDS = 3
MAX_ROUNDS = 7
CONFIDENCE = 0.90

# A variant helps (tune keeps it, diagnose advises it) when the low end of its gain's
# interval clears this margin.
MARGIN = 1.05

# One round settles a variant this much slower, or (undoing a setting the model has) this
# much faster: rounds of one step on a loaded 2-core CPU differed by up to 1.7x.
CLEARLY = 2.0

# A call of the train function (its `steps_per_execution` steps) shorter than this may lose a
# share worth winning to dispatch (Python, the iterator, kernel launches: 0.3-1 ms a call,
# more on a loaded host): `steps_per_execution` is tried first by `tune` and probed by
# `diagnose` (the ladder stops at its first value not kept, so a miss costs one trial).
HOST_BOUND_STEP_S = 0.05

# The input holds the step when the pipeline alone takes this share of it (its batches are
# read beside the step: reading one in half a step leaves little slack on a loaded host).
INPUT_SHARE = 0.5

# The all-reduce of the gradients holds the step when it takes this share of it.
ALL_REDUCE_SHARE = 0.25

# Default budgets (seconds): observing one configuration (`diagnose`), trying variants in this
# process (`tune`, `scaling`, `find_batch_size`), or in fresh processes (`tfgpu tune SCRIPT`).
OBSERVE_BUDGET_S = 60.0
SEARCH_BUDGET_S = 300.0
PROCESS_BUDGET_S = 900.0

# The verdicts, one vocabulary (docs/tuning.md, "Verdicts").
KEPT = "kept"
BORDERLINE = "borderline"
SLOWER = "slower"
NO_GAIN = "no measurable gain"
UNSAFE = "unsafe numerics"
UNTRIED = "untried"
FAILED = "failed"
STATUSES = (KEPT, BORDERLINE, SLOWER, NO_GAIN, UNSAFE, UNTRIED, FAILED)

BUDGET_SPENT = "time budget spent"

# The settings a variant changes (`measure.variants`), by where they apply.
COMPILE_KEYS = ("steps_per_execution", "jit_compile")
PIPELINE_KEYS = (
    "drop_remainder", "cache", "private_threadpool_size", "batch_augment", "prefetch", "batch_size",
)  # fmt: skip
MODEL_KEYS = ("precision", "strategy")
STRATEGY_KEYS = ("all_reduce",)
# The settings that change the traced train step (the others change only the data).
STEP_KEYS = (*COMPILE_KEYS, *MODEL_KEYS, *STRATEGY_KEYS)


@dataclasses.dataclass(frozen=True)
class Gain:
    """A measured gain (baseline time over variant time: 2.0 is twice as fast) and its
    confidence interval, the one shape of every interval tfgpu reports.

    Attributes:
        value: float, the gain: the ratio of the two median times.
        low: float, the low end of its interval (`CONFIDENCE` coverage).
        high: float, its high end.
    """

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, rounds: Sequence[tuple[float, float]]) -> Gain | None:
        """The gain of paired rounds (baseline s, variant s): the ratio of the medians, with
        the interval of the per-round ratios; None without a round."""
        ratios = [b / v for b, v in rounds if v > 0]
        if not ratios:
            return None
        base, variant = medians(rounds)
        g = base / variant
        low, high, _ = median_interval(ratios)
        return cls(g, min(low, g), max(high, g))

    def text(self) -> str:
        """The gain with its interval, e.g. `"x1.32 (1.25-1.40)"` (no interval: `"x1.32"`)."""
        interval = math.isfinite(self.low) and math.isfinite(self.high)
        if interval and (self.low, self.high) != (self.value, self.value):
            return f"x{self.value:.2f} ({self.low:.2f}-{self.high:.2f})"
        return f"x{self.value:.2f}"


def gain_text(gain: Gain | None) -> str:
    """`gain.text()`, or `"-"` when nothing was measured."""
    return "-" if gain is None else gain.text()


def medians(rounds: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(median of the first values, median of the second) of paired rounds."""
    return stats.median(a for a, _ in rounds), stats.median(b for _, b in rounds)


def median_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(low, high, confidence) of a distribution-free confidence interval of the median: the
    k-th smallest to the k-th largest value, k the largest with binomial coverage >=
    `CONFIDENCE` (the full range below 5 values)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, 0.0

    def coverage(k: int) -> float:
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= n // 2 and coverage(k + 1) >= CONFIDENCE:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def drift(base_seconds: Sequence[float]) -> float:
    """How far the baseline itself moved between adjacent rounds: the median, over adjacent
    pairs of its own runs, of the larger time over the smaller (1.0 below two runs). A gain
    the baseline's own drift can explain is not shown by the rounds, however they agree."""
    pairs = [max(a, b) / min(a, b) for a, b in itertools.pairwise(base_seconds) if min(a, b) > 0]
    return stats.median(pairs) if pairs else 1.0


def keep_bar(rounds: Sequence[tuple[float, float]], margin: float = MARGIN) -> float:
    """The least low end of a gain's interval that keeps a variant: `margin`, or the
    baseline's own drift over these rounds when it is larger."""
    return max(margin, drift([b for b, _ in rounds]))


def decided(rounds: Sequence[tuple[float, float]], margin: float = MARGIN) -> bool:
    """Whether more rounds cannot change a variant's verdict much: its interval clears the
    keep bar (`margin`, or the baseline's drift) or lies below `margin`, or its median gain is
    below it (the interval could then clear the margin only by luck). The stop rule of every
    comparison: while the rounds disagree, or agree only within the drift, more rounds run."""
    g = Gain.of(rounds)
    if g is None or g.high < margin or g.value < margin:
        return True
    return g.low >= keep_bar(rounds, margin)


def verdict(
    rounds: Sequence[tuple[float, float]], stopped: str | None, margin: float = MARGIN
) -> tuple[str, str]:
    """(status, reason) of a variant measured in `rounds` (baseline, variant seconds) that
    `compare` stopped for `stopped` ("slower", "faster", "budget" or None). No verdict but
    untried from fewer than `MIN_ROUNDS` rounds, unless the first one was clear (`CLEARLY`).
    The verdicts: docs/tuning.md, "How it decides"."""
    g, n = Gain.of(rounds), len(rounds)
    if stopped == "slower" and n >= 1:
        return SLOWER, f"the first round was clearly slower ({gain_text(g)})"
    if stopped == "faster" and n >= 1:
        return KEPT, f"the first round was clearly faster ({gain_text(g)})"
    if g is None:
        return UNTRIED, BUDGET_SPENT
    if n < MIN_ROUNDS:
        return UNTRIED, f"{BUDGET_SPENT} after {n} of {MIN_ROUNDS} rounds ({g.text()})"
    bar = keep_bar(rounds, margin)
    if g.low >= bar:
        return KEPT, f"over {n} rounds"
    if g.high < 1.0:
        return SLOWER, f"over {n} rounds"
    if g.value < margin:
        return NO_GAIN, f"over {n} rounds, the median gain is below the x{margin:.2f} margin"
    if g.low >= margin:
        return BORDERLINE, (
            f"over {n} rounds its interval clears the x{margin:.2f} margin, but the baseline "
            f"itself moved x{bar:.2f} between rounds, which explains a gain this small: not "
            "kept (a quieter machine or a larger time_budget_s settles it)"
        )
    return BORDERLINE, (
        f"over {n} rounds the median gain clears the x{margin:.2f} margin, its interval does "
        "not: not kept, and it may come and go from run to run (a larger time_budget_s "
        "settles it)"
    )


def bottleneck(
    step_s: float | None, input_s: float | None = None, steps_per_execution: int = 1
) -> str:
    """What a measured step predicts holds it back: `"input"` (the pipeline alone takes
    `INPUT_SHARE` of a step or more), `"host"` (a call of the train function is shorter than
    `HOST_BOUND_STEP_S`), `"compute"`, or "" before the step is measured. `tune` orders its
    candidates by it and `diagnose` probes by it."""
    if step_s is None or not math.isfinite(step_s):
        return ""
    if input_s is not None and input_s >= INPUT_SHARE * step_s:
        return "input"
    if step_s * steps_per_execution < HOST_BOUND_STEP_S:
        return "host"
    return "compute"
