"""`tfgpu.diagnose()`: what holds the GPU back, and which knob to turn.

A short, bounded, measured run separates the costs of a training step:

1. the input pipeline alone (`tfgpu.data.benchmark`);
2. the model's train step on one batch already on the device (no input cost), run by
   `Model.fit` exactly as in training (same `steps_per_execution`, same `jit_compile`);
3. the two together, as `fit` runs them, with the GPU monitor sampling where a GPU exists.

The share of step time spent waiting for input is `(t3 - t2) / t3`. The classification uses
the TensorFlow Profiler's input-pipeline analyzer thresholds: at least 20% is highly
input-bound, at least 5% moderately, provided the wait is at least 1 ms per step (less is
tf.data's per-batch hand-over, not the pipeline's work). Further probes are measured both
ways rather than assumed: `steps_per_execution=16` (host overhead: dispatching tiny steps one
by one) and `jit_compile` (XLA). Facts about the dataset, read from its graph (NumPy input,
`py_function`/generators, sequential or parallel maps, cache, a final `prefetch`), the
train-step ops that run on the CPU of a GPU host, memory headroom, the precision policy
against the GPU's tensor cores, and a lint of the model under mixed precision complete the
picture. Where the GPU monitor ran, its counters show what utilization hides: tensor cores
idle, SMs idle under a busy GPU (small kernels), PCIe traffic far above the batch's size,
clocks throttled (the reason named); on a GPU without GPM a note says what could not be
seen. The model's training state is put back afterwards. While it runs, `verbose=` shows
each phase and the time left in the budget (`tfgpu._internal.helpers.progress`), as `fit` shows its epochs.

The rooms, in reading order:

- `_diagnose`: `diagnose()` itself: check the arguments, read what needs no training,
  measure under `tfgpu._internal.adapters.model_state.preserved`, classify, write `diagnosis.json`;
- `_result`: what it returns (`Diagnosis`, `Finding`) and the printed report;
- `_facts`: the facts the decision reads (`_Facts`) and every threshold;
- `_classify`: the decision, pure (tested without hardware); `_advice`: its texts;
- `_rounds`: the statistics of the interleaved rounds (medians, intervals, verdicts), pure;
- `_measure`: the timing protocol (timed `fit` calls, rounds, probes, the time budget);
- `_graph`: the dataset's graph and the traced train step's ops, read without running;
- `_lint`: the model's precision: policy, loss scale, layers, the mixed-precision lint.
"""

from __future__ import annotations

from tfgpu.diagnosis._diagnose import diagnose
from tfgpu.diagnosis._facts import PROBE_STEPS_PER_EXECUTION as PROBE_STEPS_PER_EXECUTION
from tfgpu.diagnosis._result import Diagnosis, Finding

__all__ = ["Diagnosis", "Finding", "diagnose"]
