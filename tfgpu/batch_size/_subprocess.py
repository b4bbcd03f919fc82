"""`find_batch_size(..., in_subprocess=True)`: the trials in a fresh Python process (this
process's device memory stays untouched), and that process's entry point, `_subprocess_main`."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial, _build_result


def _find_in_subprocess(model, pool, kwargs) -> BatchSizeResult:
    if int(model.distribute_strategy.num_replicas_in_sync) > 1:
        raise ValueError(
            "Invalid value for argument `in_subprocess`. Received: in_subprocess=True for a "
            "model under a distribution strategy. Expected in_subprocess=False there."
        )
    with tempfile.TemporaryDirectory(prefix="tfgpu-bs-") as tmp:
        tmpdir = Path(tmp)
        model.save(tmpdir / "model.keras")
        with open(tmpdir / "pool.pkl", "wb") as f:
            pickle.dump(pool, f)
        (tmpdir / "kwargs.json").write_text(json.dumps(kwargs))
        (tmpdir / "modules.json").write_text(json.dumps(_custom_modules(model)))
        code = (
            "from tfgpu.batch_size._subprocess import _subprocess_main; "
            f"_subprocess_main({str(tmpdir)!r})"
        )
        env = {**os.environ}
        # A fresh TensorFlow: turn on the CPU allocator statistics the memory budget needs.
        env.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
        root = str(Path(__file__).resolve().parents[2])  # the directory holding `tfgpu/`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600
        )
        out = tmpdir / "result.json"
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(
                "The batch-size search in a subprocess failed (exit status "
                f"{proc.returncode}). Its last output:\n{proc.stderr[-2000:]}"
            )
        d = json.loads(out.read_text())
    nan = float("nan")
    trials = [
        BatchSizeTrial(
            **{
                **t,
                "step_time_s": nan if t["step_time_s"] is None else t["step_time_s"],
                "examples_per_second": nan
                if t["examples_per_second"] is None
                else t["examples_per_second"],
            }
        )
        for t in d["trials"]
    ]
    note = (
        "trials ran in a subprocess (in_subprocess=True): this process's device memory was "
        "not used by the search"
    )
    return _build_result(
        trials,
        d["num_replicas"],
        d["memory_budget_bytes"],
        d["device"],
        d["target_global_batch_size"],
        [note, *d["notes"]],
        in_subprocess=True,
        memory_source=d.get("memory_source"),
        stopped_by=d.get("stopped_by", "limit"),
    )


def _custom_modules(model) -> list[str]:
    """Modules defining the model's custom classes, imported in the subprocess first."""
    layers = [model, *model._flatten_layers(include_self=False)]
    names = {type(obj).__module__ for obj in layers}
    return sorted(n for n in names if n.split(".")[0] not in ("keras", "tf_keras", "__main__"))


def _subprocess_main(tmpdir: str) -> None:
    """The child process: loads the model and examples from `tmpdir`, runs the search in
    this process, and writes `result.json` there."""
    import importlib

    import keras

    from tfgpu.batch_size._find import find_batch_size  # _find imports this module

    path = Path(tmpdir)
    for name in json.loads((path / "modules.json").read_text()):
        importlib.import_module(name)
    model = keras.models.load_model(path / "model.keras")
    with open(path / "pool.pkl", "rb") as f:
        pool = pickle.load(f)
    kwargs = json.loads((path / "kwargs.json").read_text())
    result = find_batch_size(model, tuple(pool), **kwargs)
    (path / "result.json").write_text(json.dumps(result.to_dict()))
