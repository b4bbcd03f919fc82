"""`find_batch_size(..., in_subprocess=True)`: the trials in a fresh Python process (this
process's device memory stays untouched), and that process's entry point, `subprocess_main`."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import tempfile
from pathlib import Path

import keras

from tfgpu._internal.helpers.checks import invalid_value
from tfgpu._internal.helpers.processes import death, run_python
from tfgpu._internal.helpers.progress import Progress
from tfgpu.batch_size._result import BatchSizeResult, trial_from_dict

# The child's progress lines (verbose=2) start with this; the parent shows their phase.
_PREFIX = "find_batch_size: "
_SEPARATOR = " \u00b7 "

# The child (its process group) is ended after this long.
_TIMEOUT_S = 3600.0


def relayed_phase(line: str) -> str | None:
    """The phase of one of the child's progress lines, without the title and the time; None
    for other lines, and for the child's reading and summary (this process shows its own)."""
    line = line.rstrip("\r\n")
    if not line.startswith(_PREFIX):
        return None
    phase = line[len(_PREFIX) :].rsplit(_SEPARATOR, 1)[0]
    return None if phase.startswith(("done in ", "reading ")) else phase


def find_in_subprocess(model, pool, kwargs, progress: Progress) -> BatchSizeResult:
    """The search with the checked `kwargs` in a fresh process, its phases relayed to
    `progress`; a RuntimeError with its last output when it fails."""
    if int(model.distribute_strategy.num_replicas_in_sync) > 1:
        received = "in_subprocess=True for a model under a distribution strategy"
        raise invalid_value("in_subprocess", True, "in_subprocess=False there", received=received)
    with tempfile.TemporaryDirectory(prefix="tfgpu-bs-") as tmp:
        tmpdir = Path(tmp)
        model.save(tmpdir / "model.keras")
        (tmpdir / "pool.pkl").write_bytes(pickle.dumps(pool))
        # The child shows its progress one line per phase; this process relays the phases.
        (tmpdir / "kwargs.json").write_text(json.dumps({**kwargs, "verbose": 2}))
        (tmpdir / "modules.json").write_text(json.dumps(_custom_modules(model)))
        code = (  # `die_with_parent` first thing, before TensorFlow is imported
            "from tfgpu._internal.helpers.processes import die_with_parent; "
            f"die_with_parent({os.getpid()}); "
            "from tfgpu.batch_size._subprocess import subprocess_main; "
            f"subprocess_main({str(tmpdir)!r})"
        )
        # A fresh TensorFlow: turn on the CPU allocator statistics the memory budget needs.
        env = {"TF_CPU_ALLOCATOR_USE_BFC": "true", **os.environ}
        progress.phase("starting the trials in a subprocess")

        def relay(line: str) -> None:
            phase = relayed_phase(line)
            if phase is not None:
                progress.phase(phase)

        status, _, stderr = run_python(["-c", code], env, _TIMEOUT_S, relay)
        out = tmpdir / "result.json"
        if status != 0 or not out.exists():
            how = f"timed out after {_TIMEOUT_S:g} s" if status is None else death(status)
            raise RuntimeError(
                f"The batch-size search in a subprocess failed (it {how}). Its last "
                f"output:\n{stderr[-2000:]}"
            )
        d = json.loads(out.read_text())
    note = (
        "trials ran in a subprocess (in_subprocess=True): this process's device memory was "
        "not used by the search"
    )
    record = {k: v for k, v in d.items() if k in BatchSizeResult.__dataclass_fields__}
    record.update(
        trials=[trial_from_dict(t) for t in d["trials"]],
        notes=[note, *d["notes"]],  # the child's own, its notes on why the search ended too
        in_subprocess=True,
    )
    return BatchSizeResult(**record)


def _custom_modules(model) -> list[str]:
    """Modules defining the model's custom classes, imported in the subprocess first."""
    layers = [model, *model._flatten_layers(include_self=False)]
    names = {type(obj).__module__ for obj in layers}
    return sorted(n for n in names if n.split(".")[0] not in ("keras", "tf_keras", "__main__"))


def subprocess_main(tmpdir: str) -> None:
    """The child: the search on the model and examples in `tmpdir`, its result written there."""
    from tfgpu.batch_size._find import find_batch_size  # _find imports this module

    path = Path(tmpdir)
    for name in json.loads((path / "modules.json").read_text()):
        importlib.import_module(name)
    model = keras.models.load_model(path / "model.keras")
    pool = pickle.loads((path / "pool.pkl").read_bytes())
    kwargs = json.loads((path / "kwargs.json").read_text())
    result = find_batch_size(model, tuple(pool), **kwargs)
    (path / "result.json").write_text(json.dumps(result.to_dict()))
