"""What `tune` found: `Trial`, `TuneResult`, its table, `apply`, JSON and the waterfall plot."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from tfgpu._internal.helpers.warn import warn_at_user_code
from tfgpu._internal.measure import rules
from tfgpu._internal.measure.result import Result, save_figure
from tfgpu.tuning._candidates import HALTED, NONE


@dataclasses.dataclass
class Trial:
    """One candidate setting and what its measurement said (docs/tuning.md, "How it decides").

    Args:
        name: str, the candidate, e.g. `"steps_per_execution=16"`.
        change: dict, the setting it changes. Defaults to `{}`.
        gain: `Gain` or None, the best so far's time per example over the candidate's, with
            its interval (`value`, `low`, `high`); None when not measured. Defaults to None.
        status: str, `"kept"`, `"borderline"`, `"slower"`, `"no measurable gain"`,
            `"unsafe numerics"`, `"untried"` or `"failed"`. Defaults to `"untried"`.
        reason: str, why, with the numbers. Defaults to `""`.
        line: str, the code line that makes the change. Defaults to `""`.

    Example:

    >>> Trial("jit_compile=True", {"jit_compile": True}, status="untried",
    ...       reason="Keras refuses jit_compile for this model")
    """

    name: str
    change: dict[str, Any] = dataclasses.field(default_factory=dict)
    gain: rules.Gain | None = None
    status: str = "untried"
    reason: str = ""
    line: str = ""

    @property
    def gain_text(self) -> str:
        """The gain with its interval, e.g. `"x1.32 (1.25-1.40)"`, or `"-"`."""
        return rules.gain_text(self.gain)


@dataclasses.dataclass
class TuneResult(Result):
    """What `tfgpu.tune` measured and kept: print it for the table, the verified speedup and
    the lines to change (how to read them: docs/tuning.md, "Reading the table").

    Args:
        trials: list of `Trial`, in the order they ran (untried ones too).
        baseline_examples_per_s: float, the throughput as it was (NaN: not measured).
        tuned_examples_per_s: float, with every kept setting (the baseline's when none).
        speedup: `Gain`, the verified gain of the kept settings together (1.0: none kept).
        settings: dict, the kept settings, e.g. `{"steps_per_execution": 16}`.
        lines: list of str, the lines to change in your code.
        dataset: the tuned dataset when pipeline settings were kept, else the data passed in.
        notes: list of str, remarks (e.g. a setting dropped at the verification).
        time_s: float, seconds `tune` took.
        compared_with: str, `"the best so far"` (`tune`), or what `tfgpu tune SCRIPT.py`'s
            gains are against: what each trial's gain is against.
        diff: str, `tfgpu tune SCRIPT.py`: a unified diff of the script with the kept
            settings, where the edit is unambiguous ("": none).
        verified: bool, whether `speedup` was measured with the kept settings together
            (False: the budget ran out first, and it is the search's gains multiplied).
        validation_data: the arrays `validation_split` held out, as `fit(validation_data=)`
            takes them (None: none held out).

    Example:

    >>> result = tfgpu.tune(model, train, time_budget_s=60)
    >>> print(result)
    >>> result.apply(model).fit(result.dataset, epochs=10)
    """

    trials: list[Trial]
    baseline_examples_per_s: float = math.nan
    tuned_examples_per_s: float = math.nan
    speedup: rules.Gain = NONE
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    lines: list[str] = dataclasses.field(default_factory=list)
    dataset: Any = None
    notes: list[str] = dataclasses.field(default_factory=list)
    time_s: float = math.nan
    compared_with: str = "the best so far"
    verified: bool = True
    validation_data: Any = None
    diff: str = ""

    json_name = "tune.json"
    png_name = "tune.png"
    unsaved = ("dataset", "validation_data")

    def trial(self, name: str) -> Trial | None:
        """The trial named `name`, or None.

        Args:
            name: str, a trial's name, e.g. `"jit_compile=True"`.
        """
        return next((t for t in self.trials if t.name == name), None)

    def apply(self, model: Any) -> Any:
        """Applies the kept compile settings (`steps_per_execution`, `jit_compile`) to `model`.

        The others (the pipeline's, the precision policy, the all-reduce, the batch size) are
        named in a warning that says how; a `StepTimer` in the next `fit` checks the claim
        (docs/tuning.md, "How it decides").

        Args:
            model: keras.Model, compiled: the one tuned, or one built the same way.

        Returns:
            The same model, so that `result.apply(model).fit(...)` reads well.

        Raises:
            TypeError: if `model` is not a compiled Keras model.

        Example:

        >>> result.apply(model).fit(result.dataset, epochs=10)
        """
        import keras

        from tfgpu._internal.adapters.model_state import note_tuned
        from tfgpu._internal.helpers.checks import invalid_type

        expected = "a compiled `keras.Model`"
        if not isinstance(model, keras.Model):
            raise invalid_type("model", model, expected)
        if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
            # `compile()` after `apply` would put `steps_per_execution` back to 1 silently.
            raise invalid_type(
                "model",
                model,
                f"{expected}: call `model.compile(...)` first, then `result.apply(model)` "
                "(compile sets `steps_per_execution` and `jit_compile` again)",
                received=f"a model that is not compiled ({model.name!r})",
            )
        compiled = {k: v for k, v in self.settings.items() if k in rules.COMPILE_KEYS}
        for key, value in compiled.items():
            setattr(model, key, value)
        if compiled:
            model.train_function = None  # the next fit compiles with the new settings
        if math.isfinite(self.tuned_examples_per_s):  # StepTimer compares its epochs with it
            note_tuned(model, self.tuned_examples_per_s)
        rest = [f"{k}={v!r}" for k, v in self.settings.items() if k not in rules.COMPILE_KEYS]
        if rest:
            precision = self.settings.get("precision")
            how = []
            if precision:
                how.append(f"build the model again after tfgpu.configure(precision={precision!r})")
            if "strategy" in self.settings:
                how.append("build the model again under strategy = tfgpu.strategy()")
            if "all_reduce" in self.settings:
                how.append(
                    "build the model again under tfgpu.strategy(..., "
                    f"all_reduce={self.settings['all_reduce']!r})"
                )
            if any(k not in rules.STEP_KEYS for k in self.settings):
                how.append("train on result.dataset (or change the pipeline as the lines say)")
            warn_at_user_code(
                f"TuneResult.apply: {', '.join(rest)} cannot be applied to a model: "
                f"{'; '.join(how)}."
            )
        return model

    def __str__(self) -> str:
        rows = [("candidate", "gain", "verdict")]
        rows += [
            (t.name, t.gain_text, t.status + (f": {t.reason}" if t.reason else ""))
            for t in self.trials
        ]
        w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
        out = [f"tune: each setting against {self.compared_with} (kept above x{rules.MARGIN:.2f})"]
        out += [f"  {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
        base, tuned = self.baseline_examples_per_s, self.tuned_examples_per_s
        if math.isfinite(base):
            how = "verified together" if self.verified else "not verified together (see the note)"
            out.append(
                f"baseline {base:,.1f} examples/s -> tuned {tuned:,.1f} examples/s: "
                f"{self.speedup.text()}, {how}"
            )
        elif not any(t.reason.startswith(HALTED) for t in self.trials):
            out.append("baseline not measured (time budget spent)")
        unmeasured = self.unmeasured()
        if self.lines:
            out.append("change in your code:")
            out += [f"  {line}" for line in self.lines]
        elif not unmeasured:
            out.append("nothing to change: no setting helped beyond the noise")
        if self.diff:
            out.append("the same as a diff (`git apply` or `patch -p1` in the script's directory):")
            out += [f"  {line}" for line in self.diff.splitlines()]
        if unmeasured:  # never "nothing helped" about candidates that never ran
            out.append(unmeasured)
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def unmeasured(self) -> str:
        """What the budget or a stop left untried, and about how long would try it ("": none)."""
        halted = [t for t in self.trials if t.status == "untried" and t.reason.startswith(HALTED)]
        if halted:
            return (
                f"not measured: {len(halted)} of {len(self.trials)} candidates untried "
                f"({HALTED}: see the note)"
            )
        left = [
            t
            for t in self.trials
            if t.status == "untried" and t.reason.startswith(rules.BUDGET_SPENT)
        ]
        if not left:
            return ""
        ran = [t for t in self.trials if t.status != "untried"]
        each = self.time_s / (len(ran) + 1)  # the baseline is timed once more
        more = f", about {len(left) * each:,.0f} s more would try them" if each > 0 else ""
        return (
            f"not measured: {len(left)} of {len(self.trials)} candidates untried (time budget "
            f"spent{more}: give a larger budget, `time_budget_s=` or `tfgpu tune "
            "--time-budget-s`)"
        )

    def contributions(self) -> list[tuple[str, float]]:
        """(name, gain) of each kept trial, in order: each against the best before it."""
        return [(t.name, t.gain.value) for t in self.trials if t.status == rules.KEPT and t.gain]

    def plot(self, path: Path) -> None:
        """Draws the waterfall of `waterfall_steps` into `path` (PNG, atomically)."""
        from matplotlib.figure import Figure  # no pyplot: the user's backend is left alone

        bars = waterfall_steps(self)
        fig = Figure(figsize=(max(4.0, 1.3 * len(bars) + 1), 3.6))
        ax = fig.subplots()
        for i, (label, bottom, top) in enumerate(bars):
            color = {"baseline": "tab:gray", "tuned": "tab:blue"}.get(label, "tab:green")
            ax.bar(i, top - bottom, bottom=bottom, color=color)
            ax.text(i, top, f"{top:,.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("examples/s")
        ax.set_title(f"tune: x{self.speedup.value:.2f} verified against the baseline", fontsize=10)
        save_figure(fig, path)


def waterfall_steps(result: TuneResult) -> list[tuple[str, float, float]]:
    """(label, bottom, top) bars in examples/s: the baseline, each kept setting's step (scaled
    so the steps end at the verified total), and the tuned total. Pure."""
    base = result.baseline_examples_per_s
    if not math.isfinite(base):
        return []
    parts = result.contributions()
    bars = [("baseline", 0.0, base)]
    product = math.prod(g for _, g in parts) if parts else 1.0
    # Scale each step's log-gain so that together they reach the verified speedup.
    speedup = result.speedup.value
    scale = math.log(speedup) / math.log(product) if product > 1 and speedup > 1 else 0.0
    level = base
    for name, g in parts:
        top = level * math.exp(math.log(g) * scale)
        bars.append((name, level, top))
        level = top
    bars.append(("tuned", 0.0, result.tuned_examples_per_s))
    return bars
