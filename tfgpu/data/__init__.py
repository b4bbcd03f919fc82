"""Input pipelines that keep the GPU fed: `pipeline()` builds them, `load_tfds()` reads
TensorFlow Datasets for them, `benchmark()` measures them alone. The guide is docs/data.md."""

from __future__ import annotations

from tfgpu.data._benchmark import PipelineBenchmark, benchmark
from tfgpu.data._pipeline import pipeline
from tfgpu.data._tfds import load_tfds

__all__ = ["PipelineBenchmark", "benchmark", "load_tfds", "pipeline"]
