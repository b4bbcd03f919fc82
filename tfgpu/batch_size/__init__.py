"""`tfgpu.find_batch_size()`: the largest batch that fits, and the fastest. The guide (the
memory budget, the CPU's allocator statistics, `in_subprocess`): the `find_batch_size`
section of docs/diagnosis.md; this package's rooms: docs/architecture.md.
"""

from __future__ import annotations

from tfgpu.batch_size._find import find_batch_size
from tfgpu.batch_size._result import BatchSizeResult, BatchSizeTrial

__all__ = ["BatchSizeResult", "BatchSizeTrial", "find_batch_size"]
