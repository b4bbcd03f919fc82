"""`tfgpu.find_batch_size()`: the largest per-replica batch that fits, and the fastest one.

Powers of two from `start`, then a binary search, each trial real training steps; a trial
fails on `ResourceExhaustedError` or a peak device memory over the budget. The guide
(the memory budget, the CPU's allocator statistics, `in_subprocess`) is the
`find_batch_size` section of docs/diagnosis.md; the rooms are in docs/architecture.md.
"""

from __future__ import annotations

from tfgpu.batch_size._find import find_batch_size
from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial

__all__ = ["BatchSizeResult", "BatchSizeTrial", "find_batch_size"]
