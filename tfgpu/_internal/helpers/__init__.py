"""Generic helpers, TensorFlow-free, one concept each (the list: docs/architecture.md)."""
