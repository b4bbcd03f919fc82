"""Checks about the installation and the settings (TensorFlow, Keras, variables, OS): each
`check_*` is a pure function, facts in, findings out, run in the order of `_findings.CHECKS`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tfgpu.env._facts import env_value, section, tf_config_problem, version_tuple
from tfgpu.env._result import AND_CUDA, Finding


def _is_set(facts: dict[str, Any], name: str) -> bool:
    """Whether the variable `name` is set to 1 or true."""
    return (env_value(facts, name) or "").strip().lower() in ("1", "true")


def check_tensorflow(facts: dict[str, Any]) -> Iterator[Finding]:
    tf = section(facts, "tensorflow")
    if not tf.get("importable", True) or "error" in tf:
        yield Finding(
            "error",
            "tensorflow-not-importable",
            f"TensorFlow could not be imported: {tf.get('error')}",
            'pip install "tfgpu" (or "tfgpu[and-cuda]" on a machine with an NVIDIA GPU), '
            "in the same Python environment.",
        )


def check_keras(facts: dict[str, Any]) -> Iterator[Finding]:
    keras = section(facts, "keras")
    version = version_tuple(keras.get("version"))
    if keras.get("error") and not keras.get("version"):
        yield Finding(
            "error",
            "keras-not-importable",
            f"Keras could not be imported: {keras['error']}",
            'pip install "keras>=3"',
        )
    elif version is not None and version < (3,):
        yield Finding(
            "error",
            "keras-2",
            f"Keras {keras.get('version')} is installed; tfgpu needs Keras 3.",
            'pip install "keras>=3"',
        )
    backend = keras.get("backend")
    if backend and backend != "tensorflow":
        yield Finding(
            "error",
            "keras-backend",
            f"Keras uses the {backend!r} backend; tfgpu's strategies, pipelines and "
            "configure() act on TensorFlow.",
            'export KERAS_BACKEND=tensorflow (or set "backend": "tensorflow" in '
            "~/.keras/keras.json) before Python starts.",
        )
    if _is_set(facts, "TF_USE_LEGACY_KERAS"):
        yield Finding(
            "warning",
            "legacy-keras",
            "TF_USE_LEGACY_KERAS is set: tf.keras is Keras 2 (tf_keras), while tfgpu's "
            "callbacks and precision policies are Keras 3's.",
            "unset TF_USE_LEGACY_KERAS and use `import keras` (Keras 3).",
        )


def check_tf_config(facts: dict[str, Any]) -> Iterator[Finding]:
    raw = env_value(facts, "TF_CONFIG")
    problem = None if raw is None else tf_config_problem(raw)
    if problem is not None:
        yield Finding(
            "error",
            "tf-config-malformed",
            f"TF_CONFIG is malformed: {problem}.",
            'Set TF_CONFIG to JSON like {"cluster": {"worker": ["host1:12345", '
            '"host2:12345"]}, "task": {"type": "worker", "index": 0}}, with this '
            "process's own task, or unset it for single-machine training.",
        )


def check_allow_growth(facts: dict[str, Any]) -> Iterator[Finding]:
    value = env_value(facts, "TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None:
        return
    if value not in ("true", "false"):
        yield Finding(
            "warning",
            "allow-growth-invalid",
            f"TF_FORCE_GPU_ALLOW_GROWTH={value!r} is ignored: TensorFlow accepts only "
            "'true' or 'false' (lower case).",
            "export TF_FORCE_GPU_ALLOW_GROWTH=true, or unset it and call "
            "tfgpu.configure() (memory growth is its default).",
        )
    elif env_value(facts, "TF_GPU_ALLOCATOR") == "cuda_malloc_async":
        yield Finding(
            "warning",
            "allow-growth-with-async-allocator",
            f"TF_FORCE_GPU_ALLOW_GROWTH={value} has no effect with "
            "TF_GPU_ALLOCATOR=cuda_malloc_async: the CUDA driver's memory pool "
            "allocates on demand and ignores it.",
            "Unset one of them: keep cuda_malloc_async (less fragmentation) or TensorFlow's "
            "default allocator with growth.",
        )


def check_allocator(facts: dict[str, Any]) -> Iterator[Finding]:
    value = env_value(facts, "TF_GPU_ALLOCATOR")
    if value in ("cuda_malloc", "memory_guard"):
        yield Finding(
            "warning",
            "allocator-debug",
            f"TF_GPU_ALLOCATOR={value} selects a debugging allocator: every tensor goes "
            "through cudaMalloc/cudaFree, which is slow.",
            "unset TF_GPU_ALLOCATOR, or use TF_GPU_ALLOCATOR=cuda_malloc_async "
            "(tfgpu.configure(async_allocator=True)).",
        )
    elif value is not None and value != "cuda_malloc_async":
        yield Finding(
            "warning",
            "allocator-unknown",
            f"TF_GPU_ALLOCATOR={value!r} is not a TensorFlow allocator; it is ignored.",
            "use TF_GPU_ALLOCATOR=cuda_malloc_async, or unset it.",
        )


def check_thread_mode(facts: dict[str, Any]) -> Iterator[Finding]:
    value = env_value(facts, "TF_GPU_THREAD_MODE")
    if value is not None and value not in ("global", "gpu_private", "gpu_shared"):
        yield Finding(
            "warning",
            "thread-mode-invalid",
            f"TF_GPU_THREAD_MODE={value!r} is not one of 'global', 'gpu_private', 'gpu_shared'.",
            "export TF_GPU_THREAD_MODE=gpu_private (dedicated threads launch GPU kernels), or "
            "unset it.",
        )


def check_windows(facts: dict[str, Any]) -> Iterator[Finding]:
    system = section(facts, "os").get("system")
    version = version_tuple(section(facts, "tensorflow").get("version"))
    if system == "Windows" and version and version >= (2, 11):
        yield Finding(
            "warning",
            "windows-native",
            f"TensorFlow {'.'.join(map(str, version))} on native Windows has no GPU support "
            "(it ended with 2.10).",
            f"Use WSL2 (Ubuntu) with the Windows NVIDIA driver, then {AND_CUDA} inside it.",
        )


def check_determinism_env(facts: dict[str, Any]) -> Iterator[Finding]:
    names = [n for n in ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC") if _is_set(facts, n)]
    if names:
        yield Finding(
            "info",
            "determinism-env",
            f"{' and '.join(names)} set: GPU ops run deterministically, which is slower.",
            "Fine for debugging or reproducibility; unset for speed. "
            "tfgpu.configure(deterministic=True, seed=...) does the same from code.",
        )
