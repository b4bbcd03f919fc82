"""Input pipelines that keep the GPU fed: build them, load TFDS data for them, measure them.

The GPU is only as fast as the data that reaches it. `pipeline()` builds a `tf.data.Dataset`
with the steps in the order that keeps an accelerator busy:

```
read (files: interleaved in parallel, shuffled by file)
  -> map_fn          per-example decode/preprocess, parallel, AUTOTUNE  (deterministic work)
  -> cache           memory or file; after the deterministic work, before any randomness
  -> shuffle         buffer sized from the data and the RAM budget; reshuffled every epoch
  -> [repeat]        only when asked (Keras `fit` iterates a finite dataset once per epoch)
  -> augment_fn      per-example random augmentation, parallel, AUTOTUNE  (new every epoch)
  -> batch           global batch; drop_remainder=True by default under a strategy
  -> batch_augment_fn  optional vectorized per-batch augmentation
  -> prefetch        AUTOTUNE, last
```

`load_tfds()` reads a TensorFlow Datasets dataset with fast reading options and fails within
seconds, with a hint, when the data is not on disk. `benchmark()` measures a pipeline alone.
"""

from __future__ import annotations

# Where things live (private modules, one job each):
#
# - `_pipeline.py`: `pipeline()` itself, its phases in order.
# - `_arguments.py`: every check of `pipeline()`'s arguments, before any work.
# - `_sources.py`: what the `data` argument is (arrays, a dataset, TFRecord files, a TFDS name).
# - `_read.py`: reading each kind of source; the validation split taken off before any shuffle.
# - `_split.py`: `validation_split`: its checks and counts.
# - `_functions.py`: the user's functions: arity, output and random-op checks, the parallel map.
# - `_facts.py` and `_plan.py`: the facts, and the pure `decide()` that makes the plan from them.
# - `_cache.py`: cache checks and the leftovers of an interrupted file cache.
# - `_tfds.py`: `load_tfds()`; `_benchmark.py`: `benchmark()`; `_limits.py`: shared bounds.
from tfgpu.data._benchmark import PipelineBenchmark, benchmark
from tfgpu.data._pipeline import pipeline
from tfgpu.data._tfds import load_tfds

__all__ = ["PipelineBenchmark", "benchmark", "load_tfds", "pipeline"]
