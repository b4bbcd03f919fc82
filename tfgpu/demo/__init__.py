"""`tfgpu demo`: train one reference model naively, then with tfgpu, and compare.

Both sides train the same model on the same data with the same recipe (initial weights,
global batch, steps, learning-rate schedule), checked rather than assumed; only how the work
is done differs. What each side does, what the demo prints and what it writes:
`docs/demo.md`.
"""

# `tfgpu demo` checks its arguments with `check_arguments` before it loads TensorFlow.
from tfgpu.demo._args import check_arguments as check_arguments
from tfgpu.demo._run import run_demo

__all__ = ["run_demo"]
