"""Adapters to TensorFlow, Keras, NVML and the host, shared by several features."""
