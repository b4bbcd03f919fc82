"""tfgpu: make Keras/TensorFlow training use the GPU well.

A few calls before `model.fit` and callbacks during it:

```python
import tfgpu
tfgpu.configure()                       # memory growth, precision policy
strategy = tfgpu.strategy()             # one GPU, several, or several machines
train = tfgpu.data.pipeline((x, y), batch_size=tfgpu.global_batch_size(128, strategy),
                            strategy=strategy)
model.fit(train, callbacks=[tfgpu.callbacks.GPUMonitor(log_dir="runs/exp1")])
print(tfgpu.diagnose(model, train))
```

Importing `tfgpu` is fast: no TensorFlow, no NVML. Each name below is loaded the first
time it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The public names, declared here once: name -> module that defines it (submodules map to
# themselves). `__all__` is derived from it; the TYPE_CHECKING imports below repeat it for type
# checkers and IDEs, and tests/test_public_api.py checks that both say the same.
_EXPORTS: dict[str, str] = {
    "configure": "tfgpu.config",
    "Configuration": "tfgpu.config",
    "environment": "tfgpu.env",
    "EnvironmentReport": "tfgpu.env",
    "strategy": "tfgpu.distribute",
    "global_batch_size": "tfgpu.distribute",
    "scale_learning_rate": "tfgpu.distribute",
    "diagnose": "tfgpu.diagnosis",
    "Diagnosis": "tfgpu.diagnosis",
    "tune": "tfgpu.tuning",
    "TuneResult": "tfgpu.tuning",
    "scaling": "tfgpu.scalability",
    "ScalingResult": "tfgpu.scalability",
    "find_batch_size": "tfgpu.batch_size",
    "BatchSizeResult": "tfgpu.batch_size",
    "callbacks": "tfgpu.callbacks",
    "data": "tfgpu.data",
    "monitor": "tfgpu.monitor",
    "flops": "tfgpu.flops",
    "precision": "tfgpu.precision",
    "report": "tfgpu.report",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tfgpu' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"tfgpu.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs (names used via _EXPORTS)
    from tfgpu import callbacks, data, flops, monitor, precision, report  # noqa: F401
    from tfgpu.batch_size import BatchSizeResult, find_batch_size  # noqa: F401
    from tfgpu.config import Configuration, configure  # noqa: F401
    from tfgpu.diagnosis import Diagnosis, diagnose  # noqa: F401
    from tfgpu.distribute import global_batch_size, scale_learning_rate, strategy  # noqa: F401
    from tfgpu.env import EnvironmentReport, environment  # noqa: F401
    from tfgpu.scalability import ScalingResult, scaling  # noqa: F401
    from tfgpu.tuning import TuneResult, tune  # noqa: F401
