"""Bounds and wording shared by the argument checks of `pipeline`, `load_tfds` and `benchmark`."""

from __future__ import annotations

MIB = 1024 * 1024
POSITIVE = "a positive integer"
# Upper bounds that keep every count inside TensorFlow's int64 (with room for products).
MAX_COUNT = 2**62
MAX_SEED = 2**63 - 1
SEED = f"an int in [0, {MAX_SEED}] or None"
# The largest RAM budget TensorFlow's int64 byte count can hold, in MiB.
MAX_RAM_BUDGET_MIB = float(2**63 // MIB - 1)
