"""`tfgpu.find_batch_size()`: the largest per-replica batch that fits, and the fastest one.

The search is a pure function of the trials made so far: powers of two from `start` until a
trial fails, then a binary search between the largest size that fitted and the smallest that
failed (midpoints rounded down to a multiple of `multiple_of`, 8 by default, the size tensor
cores like). A trial fails when TensorFlow raises `tf.errors.ResourceExhaustedError` (caught
by type) or when the peak device memory it used
(`tf.config.experimental.get_memory_info(device)["peak"]`) passes the memory budget. Each
trial runs real training steps (`Model.train_on_batch` on a batch already in memory) and
measures throughput, and the model's weights, optimizer state and metrics are put back
afterwards. While it runs, `verbose=` shows each trial, its size and its outcome
(`tfgpu._internal.helpers.progress`), as `fit` shows its epochs; under `in_subprocess=True` the child's trial
lines are relayed as they come.

Where the memory figure comes from: TensorFlow's allocator statistics. GPUs always keep
them. On the CPU, TensorFlow keeps them only with its BFC CPU allocator, which is on by
default on some CPUs and off on others (`TF_CPU_ALLOCATOR_USE_BFC=true` turns it on, read
when TensorFlow starts). Without statistics the search stops at out-of-memory errors alone,
the result says so (`memory_source=None`), and a `memory_limit_mib` that cannot be
enforced is refused; `in_subprocess=True` turns the statistics on for the trials.

The rooms, in reading order:

- `_find`: `find_batch_size()` itself: check the arguments (the model and the data through
  `tfgpu._internal.adapters.workload.check_model_and_data`, as `diagnose` and `tune`), read
  the pool of examples, work out the memory budget, run the trials under
  `tfgpu._internal.adapters.model_state.preserved`, build the result;
- `_search`: the pure decisions (the next size to try, why the search ended, the fastest
  size, the gradient-accumulation plan), tested without hardware;
- `_trial`: one trial: a batch cut from the pool of examples, the device and its memory
  statistics, the timed steps, the agreement between workers;
- `_subprocess`: `in_subprocess=True`: the trials in a fresh Python process, and that
  process's entry point;
- `_result`: what it returns (`BatchSizeResult`, `BatchSizeTrial`), its text and JSON.
"""

from __future__ import annotations

from tfgpu.batch_size._find import find_batch_size
from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial

__all__ = ["BatchSizeResult", "BatchSizeTrial", "find_batch_size"]
