"""Input pipelines that keep the GPU fed: build them, load TFDS data for them, measure them.

`pipeline()` builds a `tf.data.Dataset` with the steps in the order that keeps an accelerator
busy (read -> map_fn -> cache -> shuffle -> augment_fn -> batch -> prefetch);
`load_tfds()` reads a TensorFlow Datasets dataset with fast reading options and fails within
seconds, with a hint, when the data is not on disk; `benchmark()` measures a pipeline alone.
The guide is docs/data.md.
"""

from __future__ import annotations

# Where things live (private modules, one job each):
#
# - `_pipeline.py`: `pipeline()` itself, its phases in order.
# - `_arguments.py`: every check of `pipeline()`'s arguments, before any work.
# - `_sources.py`: one adapter per kind of `data` (arrays, a dataset, TFRecord files, a TFDS
#   name), chosen once: its own checks, batches, counts and reading.
# - `_split.py`: `validation_split`: its checks and counts.
# - `_functions.py`: the user's functions: arity, output and random-op checks, the parallel map.
# - `_facts.py` and `_plan.py`: the facts, and the pure `decide()` that makes the plan from them.
# - `_cache.py`: cache checks and the leftovers of an interrupted file cache.
# - `_service.py`: the tf.data service's part; `_tfds.py`: `load_tfds()`; `_benchmark.py`:
#   `benchmark()`; `_limits.py`: shared bounds.
from tfgpu.data._benchmark import PipelineBenchmark, benchmark
from tfgpu.data._pipeline import pipeline
from tfgpu.data._tfds import load_tfds

__all__ = ["PipelineBenchmark", "benchmark", "load_tfds", "pipeline"]
