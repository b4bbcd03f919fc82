"""Generic helpers, TensorFlow-free: checks, files, warn, stats, jsonable, lazy, progress, cluster."""
