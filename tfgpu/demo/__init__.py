"""`tfgpu demo`: train one reference model naively, then with tfgpu, and compare.

The same model, data and recipe on both sides, checked rather than assumed (docs/demo.md)."""

# `tfgpu demo` checks its arguments with `check_arguments` before it loads TensorFlow.
from tfgpu.demo._args import check_arguments as check_arguments
from tfgpu.demo._run import run_demo

__all__ = ["run_demo"]
