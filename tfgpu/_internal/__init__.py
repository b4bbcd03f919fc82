"""What several features share; nothing here is public.

`helpers/` holds small generic tools with no TensorFlow: argument errors, run-directory files,
warnings, statistics, JSON values, optional imports, progress lines. `adapters/` holds the
layer between tfgpu and TensorFlow, Keras, NVML and the host: devices, Keras internals, model
state, datasets, the timing engine, the cluster and the tf.data service's TF-free rules.
A part used by one feature only lives inside that feature's package instead.
"""
