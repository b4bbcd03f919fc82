"""What several features share; nothing here is public. `helpers/`: small generic tools,
TensorFlow-free; `adapters/`: the layer to TensorFlow, Keras, NVML and the host. Each module
is listed in docs/architecture.md."""
