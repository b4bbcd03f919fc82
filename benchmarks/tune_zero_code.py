"""Zero code against in code: `tfgpu tune SCRIPT.py` on a user script, next to `tfgpu.tune`
added to the same script, and the claim checked by the script's next run.

The scripts are the test suite's (tests/keras_examples/: written in the shape of the keras.io
examples, our own code), with offline stand-in data of the real sizes (random pixels: a step
costs the same): MNIST at 60,000 + 10,000. For each example:

1. zero code: `tfgpu tune --time-budget-s B --log-dir ... EXAMPLE.py` (B: its default, 900 s:
   it starts the script again for every run): its verified speedup, what it kept, its time;
2. in code: the example with one line put before its first `fit`, the call docs/tuning.md
   shows, with what the example has at hand there (`CASES` below), at `tfgpu.tune`'s default
   budget (300 s): the same figures;
3. the claim: the example unchanged and with `tune.diff` applied (`patch -p1`), each run
   by `tfgpu run --no-diagnose` with `KERAS_MAX_EPOCHS=2`, alternating, `--pairs` times; the
   first fit's examples/s (StepTimer's, the median of its epochs) of each, the ratio of
   medians next to the claim.

Command: `.venv/bin/python benchmarks/tune_zero_code.py [--budget 900] [--in-code-budget 300]
[--pairs 2] [--only mnist,guide]` (about 25 minutes an example on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_keras_examples import EXAMPLES, OFFLINE, _mnist  # noqa: E402

# Each example: its file, the stand-in data it needs, and the in-code line put before its
# first `fit` (`{budget}`, `{log}` filled in; the script stops there: only tune is measured).
CASES = {
    "mnist": (
        "mnist_convnet.py",
        lambda home: _mnist(home / "datasets" / "mnist.npz", 60_000, 10_000),
        "model.fit(x_train, y_train, batch_size=BATCH",
        "import tfgpu; print(tfgpu.tune(model, (x_train, y_train), batch_size=BATCH, "
        "time_budget_s={budget}, log_dir={log!r})); raise SystemExit",
    ),
    "guide": (
        "distributed_training_with_tensorflow.py",
        lambda home: _mnist(home / "datasets" / "mnist.npz", 60_000, 10_000),
        "model.fit(train_ds, epochs=EPOCHS",
        "import tfgpu; print(tfgpu.tune(model, train_ds, time_budget_s={budget}, "
        "log_dir={log!r})); raise SystemExit",
    ),
}


def _env(home: Path, epochs: int | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(OFFLINE), str(REPO)]),
        "KERAS_HOME": str(home),
        "MPLBACKEND": "Agg",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if epochs:
        env["KERAS_MAX_EPOCHS"] = str(epochs)
    return env


def _tfgpu(*args: str, cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tfgpu", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    return proc, time.monotonic() - start


def _tuned(log: Path) -> dict:
    saved = json.loads((log / "tune.json").read_text())
    kept = [t["name"] for t in saved["trials"] if t["status"] == "kept"]
    borderline = [t["name"] for t in saved["trials"] if t["status"] == "borderline"]
    return {
        "speedup": saved["speedup"],
        "kept": kept,
        "borderline": borderline,
        "time_s": saved["time_s"],
    }


def _rate(summary: str) -> float:
    """fit 1's examples/s in `tfgpu run`'s summary."""
    match = re.search(r"fit 1 \([^)]*\): .*? · ([\d,]+) examples/s", summary)
    if match is None:
        raise RuntimeError(f"no throughput in:\n{summary}")
    return float(match.group(1).replace(",", ""))


def _text(gain: dict | None) -> str:
    if not gain:
        return "-"
    return f"x{gain['value']:.2f} ({gain['low']:.2f}-{gain['high']:.2f})"


def case(name: str, budget: float, in_budget: float, pairs: int, root: Path) -> None:
    example, data, fit_line, in_code = CASES[name]
    work = root / name
    home = work / "keras"
    work.mkdir(parents=True)
    data(home)
    script = work / example
    shutil.copy(EXAMPLES / example, script)

    zero_log = work / "zero"
    proc, wall = _tfgpu(
        "tune", "--time-budget-s", str(budget), "--log-dir", str(zero_log), str(script),
        cwd=work, env=_env(home),
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    zero = _tuned(zero_log)
    print(proc.stdout)

    in_log = work / "in_code"
    source = script.read_text()
    assert fit_line in source, fit_line
    line = in_code.format(budget=in_budget, log=str(in_log))
    edited = work / f"in_code_{example}"
    edited.write_text(source.replace(fit_line, f"{line}\n{fit_line}", 1))
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(edited)], cwd=work, env=_env(home), capture_output=True, text=True
    )
    in_wall = time.monotonic() - start
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    in_code_result = _tuned(in_log)

    applied = work / "applied"
    applied.mkdir()
    shutil.copy(script, applied / example)
    diff = zero_log / "tune.diff"
    if diff.exists():
        subprocess.run(["patch", "-p1", "-i", str(diff)], cwd=applied, check=True)
    rates: dict[str, list[float]] = {"unchanged": [], "applied": []}
    for _ in range(pairs):
        for side, path in (("unchanged", script), ("applied", applied / example)):
            log = work / f"run_{side}_{len(rates[side])}"
            proc, _ = _tfgpu("run", "--no-diagnose", "--log-dir", str(log), str(path),
                             cwd=path.parent, env=_env(home, 2))  # fmt: skip
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            rates[side].append(_rate((log / "summary.md").read_text()))
    ratio = statistics.median(rates["applied"]) / statistics.median(rates["unchanged"])
    claim = zero["speedup"]["value"] if zero["speedup"] else 1.0
    load = os.getloadavg()[0]
    print(
        f"| {name} | zero code | {_text(zero['speedup'])} | {', '.join(zero['kept']) or 'nothing'} "
        f"| {', '.join(zero['borderline']) or '-'} | {zero['time_s']:.0f} s (wall {wall:.0f} s) "
        f"| x{ratio:.2f} | {ratio / claim:.2f} |"
    )
    print(
        f"| {name} | in code | {_text(in_code_result['speedup'])} | "
        f"{', '.join(in_code_result['kept']) or 'nothing'} | "
        f"{', '.join(in_code_result['borderline']) or '-'} | {in_code_result['time_s']:.0f} s "
        f"(the script: {in_wall:.0f} s) | | |"
    )
    print(f"  unchanged {rates['unchanged']}, applied {rates['applied']}; load average {load:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=900.0, help="zero code's, seconds")
    parser.add_argument("--in-code-budget", type=float, default=300.0, help="in code's, seconds")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--only", default=",".join(CASES))
    args = parser.parse_args()
    print(
        "| example | how | verified speedup | kept | borderline | tuning time | next run | run / claim |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as root:
        for name in args.only.split(","):
            case(name, args.budget, args.in_code_budget, args.pairs, Path(root))


if __name__ == "__main__":
    main()
