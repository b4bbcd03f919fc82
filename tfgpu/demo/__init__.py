"""`tfgpu demo`: train one reference model naively, then with tfgpu, and compare.

The same small image classifier trains twice on the same JPEG-encoded data, the same way:
the same initial weights (seeded just before each model is built), the same augmentation, the
same global batch, the same number of steps and the same learning-rate schedule (Adam, cosine
decay to zero over the run, so the final weights do not depend on where the last epoch
happened to stop in a noisy descent). Only how the work is done differs:

1. **naive**, as a typical Keras user writes it: float32, `Dataset.from_tensor_slices(...)
   .shuffle(...).map(decode_and_augment).batch(...)` (no `num_parallel_calls`, no
   `prefetch`, every image decoded again every epoch; TensorFlow's default tf.data
   rewrites stay on, as they would for that user), `steps_per_execution=1`, no strategy
   (one device takes the whole global batch).
   `tfgpu.diagnose()` measures this setup first and says what holds it back.
2. **tfgpu**: `tfgpu.configure()` (memory growth, the precision policy for the GPU),
   `tfgpu.strategy()` (all GPUs), `tfgpu.data.pipeline(...)` (parallel decode, cache of the
   decoded images, shuffle, parallel augmentation, prefetch), then `tfgpu.tune()` tries the
   speed settings on this machine (`steps_per_execution`, `jit_compile`, the pipeline's
   settings, the precision policy, ...) and the side trains with what it kept; its table
   and a waterfall (what each kept setting gave) are printed. `tfgpu.diagnose()` runs again
   after training to measure what is left.

Both sides run with `GPUMonitor` and `StepTimer`. `demo.json` records each side's recipe
(global batch, steps trained, learning rate, a digest of the initial weights), so that the
sameness is checked, not assumed. The demo prints a side-by-side table
(examples/s, step time, input-wait share, GPU utilization and MFU where a GPU exists, final
test accuracy, speedup) and writes a run directory:

```
LOG_DIR/demo.json            the table and every figure behind it, the settings applied
LOG_DIR/naive/, LOG_DIR/tfgpu/
    run.json, timeline.csv   GPUMonitor (GPU and host samples)
    steps.csv                StepTimer (per-step times)
    diagnosis.json           tfgpu.diagnose()
    tune.json, tune.png      tfgpu.tune() (tfgpu/ only): the table and the waterfall
    report.md, *.png         tfgpu.report.write_report()
```

The data is generated offline (`tfgpu.demo._synthetic`: ten learnable stripe patterns, stored as
JPEG bytes so the input pipeline does real decode work), or read from TensorFlow Datasets
with `dataset=` (e.g. `"cifar10"`, when prepared on disk). Sizes scale with the hardware:
small on the CPU, larger data and model on GPUs, tiny with `quick=True`. How long a full run
takes, and the speedups it measured: `benchmarks/RESULTS.md`.
"""

# `tfgpu demo` checks its arguments with `check_arguments` before it loads TensorFlow.
from tfgpu.demo._args import check_arguments as check_arguments
from tfgpu.demo._run import run_demo

# The rooms: _args (argument checks, the run directory; no TensorFlow), _plan (pure: sizes,
# tune's budget), _workload (data, model, learning rate, the recipe read back), _results
# (pure: figures, speedups, the table, tune's waterfall), _run (run_demo and its phases).

__all__ = ["run_demo"]
