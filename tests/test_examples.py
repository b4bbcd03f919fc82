"""Every example in `examples/` runs headless, in its quick mode, and does what it says.

Scripts run in a subprocess with `TFGPU_QUICK=1`; notebooks run through `nbclient` on a
Python kernel of this interpreter (jupyter_client starts the `python3` kernel with
`sys.executable`), in a temporary working directory. Each example has a check of what it
produced (printed results, files in its run directory); a new example without a check fails
`test_every_example_has_a_check`, so none runs unchecked.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

EXAMPLES = REPO / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
NOTEBOOKS = sorted(p.name for p in EXAMPLES.glob("*.ipynb"))
TIMEOUT = 300


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "TFGPU_QUICK": "1",
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "MPLBACKEND": "Agg",
    }


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


# ---- checks: what each example must have produced (stdout text, files under cwd) ----------


def _check_mixed_precision(out: str, cwd: Path) -> None:
    assert "Tesla T4    cc 7.5: mixed_float16" in out
    assert "A100        cc 8.0: mixed_bfloat16" in out
    assert "Tesla P100  cc 6.0: float32" in out
    assert "probs    computes in float32" in out  # the output layer stays float32
    if "global policy: mixed_float16" in out:
        assert "optimizer: LossScaleOptimizer" in out
        assert "dynamic loss scale now" in out
    assert "The output layer `probs` computes in float16" in out  # the lint finds it


def _check_multi_gpu(out: str, cwd: Path) -> None:
    assert "2 replicas on" in out or "GPU(s): MirroredStrategy" in out
    assert "global batch 64 (32 per replica)" in out
    rows = _rows(cwd / "runs" / "multi_gpu" / "steps.csv")
    assert rows and all(float(r["step_time_s"]) > 0 for r in rows)


def _check_multi_worker(out: str, cwd: Path) -> None:
    results = [line for line in out.splitlines() if "RESULT task" in line]
    assert len(results) == 2, out
    assert all("exit 0" in line and "2 replicas, global batch 32" in line for line in results)
    # Both workers applied the same all-reduced updates: the same final loss.
    losses = {line.rsplit("final loss ", 1)[1] for line in results}
    assert len(losses) == 1, results
    run = cwd / "runs" / "multi_worker"
    for k in (0, 1):
        assert len(_rows(run / f"timeline-worker{k}.csv")) >= 1


def _check_batch_size_finder(out: str, cwd: Path) -> None:
    assert "largest that fits: 32 - not a limit" in out
    # The plan accumulates over the *fastest* batch, a timing (8, 16 or 32 on a loaded CPU):
    # check that it reaches the recipe's batch per update, not which batch won the race.
    fastest = int(re.search(r"fastest: +(\d+)\n", out).group(1))
    plan = re.search(r"gradient_accumulation_steps=(\d+)\) and batch_size=(\d+)\n", out)
    assert plan, out
    steps, batch = map(int, plan.groups())
    assert steps * batch == 1024 and batch <= fastest <= 32, out
    assert f"training with batch_size={fastest}" in out


def _check_quickstart(out: str, cwd: Path) -> None:
    run = cwd / "runs" / "quickstart"
    report = (run / "report.md").read_text()
    assert "steps.csv" in report and "timeline.csv" in report
    assert _rows(run / "timeline.csv") and _rows(run / "steps.csv")
    assert "'accuracy'" in out and "'examples_per_s'" in out


def _check_input_pipeline_tuning(out: str, cwd: Path) -> None:
    # What the notebook shows, not how fast this machine ran it: the verdicts and the wait
    # shares depend on the load (they are checked on scripted clocks in test_diagnosis.py;
    # the speed-up is measured in benchmarks/data_pipeline.py).
    assert "bottleneck = " in out
    assert "py_function" in out  # the slow pipeline's Python step is named
    line = next(x for x in out.splitlines() if x.startswith("input wait"))
    before, after = (float(s.rstrip("%")) for s in line.split(";")[0].split()[2::2])
    assert 0 <= before <= 100 and 0 <= after <= 100, line
    assert "steps_per_execution=" in out and "accuracy" in out


def _check_scaling_check(out: str, cwd: Path) -> None:
    # The table and a reason for every point; the speedups depend on the load and on logical
    # CPU devices sharing the cores (tests/test_scaling.py builds the bottlenecks in).
    assert "Scaling on " in out and "worst point:" in out
    record = json.loads((cwd / "runs" / "scaling_check" / "scaling.json").read_text())
    keys = {(p["replicas"], p["mode"]) for p in record["points"]}
    assert {(1, "both"), (2, "weak"), (2, "strong")} <= keys
    assert all(p["reason"] for p in record["points"])
    assert (cwd / "runs" / "scaling_check" / "scaling.png").stat().st_size > 0


CHECKS = {
    "mixed_precision.py": _check_mixed_precision,
    "multi_gpu.py": _check_multi_gpu,
    "multi_worker.py": _check_multi_worker,
    "batch_size_finder.py": _check_batch_size_finder,
    "scaling_check.py": _check_scaling_check,
    "quickstart.ipynb": _check_quickstart,
    "input_pipeline_tuning.ipynb": _check_input_pipeline_tuning,
}


def test_every_example_has_a_check():
    assert set(SCRIPTS) | set(NOTEBOOKS) == set(CHECKS)
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_committed_without_outputs(name):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs(name, tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    CHECKS[name](result.stdout, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for key, value in _env().items():
        monkeypatch.setenv(key, value)  # the kernel inherits this environment
    # ...but keeps its own matplotlib backend: ipykernel picks the inline one (figures become
    # image outputs) only when MPLBACKEND is unset, as in a user's Jupyter.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
    text, markdown, images = [], [], 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", output
            if "text" in output:
                text.append(output["text"])
            data = output.get("data", {})
            if "text/plain" in data:
                text.append(data["text/plain"])
            if "text/markdown" in data:
                markdown.append(data["text/markdown"])
            if output.output_type in ("display_data", "execute_result") and "image/png" in data:
                images += 1
    CHECKS[name]("\n".join(text), tmp_path)
    # Pictures where people would rather look than read: the report's plots (quick start),
    # the before/after chart (input pipeline).
    assert images >= 1, f"{name} showed no image"
    if name == "quickstart.ipynb":  # the report rendered, not printed as raw Markdown
        assert any(m.startswith("# tfgpu run report") for m in markdown), markdown
        assert not any("![" in t for t in text), "the report was printed, not shown"


def test_quick_mode_is_read_from_the_environment():
    """Every example honours TFGPU_QUICK (the tests rely on it to stay fast)."""
    for name in SCRIPTS:
        assert 'os.environ.get("TFGPU_QUICK") == "1"' in (EXAMPLES / name).read_text(), name
    for name in NOTEBOOKS:
        source = json.loads((EXAMPLES / name).read_text())
        joined = "".join("".join(c["source"]) for c in source["cells"])
        assert 'os.environ.get("TFGPU_QUICK") == "1"' in joined, name
