"""Input pipelines that keep the GPU fed: build them, load TFDS data for them, measure them.

`pipeline()` builds a `tf.data.Dataset` with the steps in the order that keeps an accelerator
busy (read -> map_fn -> cache -> shuffle -> augment_fn -> batch -> prefetch);
`load_tfds()` reads a TensorFlow Datasets dataset with fast reading options and fails within
seconds, with a hint, when the data is not on disk; `benchmark()` measures a pipeline alone.
The guide is docs/data.md.
"""

from __future__ import annotations

from tfgpu.data._benchmark import PipelineBenchmark, benchmark
from tfgpu.data._pipeline import pipeline
from tfgpu.data._tfds import load_tfds

__all__ = ["PipelineBenchmark", "benchmark", "load_tfds", "pipeline"]
