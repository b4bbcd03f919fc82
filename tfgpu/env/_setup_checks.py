"""Checks about the installation and the settings (TensorFlow, Keras, variables, OS): each
`check_*` is a pure function, facts in, findings out, run in the order of `_findings.CHECKS`.
"""

from __future__ import annotations

from typing import Any

from tfgpu.env._facts import env_value, section, tf_config_problem, version_tuple
from tfgpu.env._result import AND_CUDA, Finding


def check_tensorflow(facts: dict[str, Any]) -> list[Finding]:
    tf = section(facts, "tensorflow")
    if tf.get("importable", True) and "error" not in tf:
        return []
    return [
        Finding(
            "error",
            "tensorflow-not-importable",
            f"TensorFlow could not be imported: {tf.get('error')}",
            'pip install "tfgpu" (or "tfgpu[and-cuda]" on a machine with an NVIDIA GPU), '
            "in the same Python environment.",
        )
    ]


def check_keras(facts: dict[str, Any]) -> list[Finding]:
    keras = section(facts, "keras")
    out = []
    version = version_tuple(keras.get("version"))
    if keras.get("error") and not keras.get("version"):
        out.append(
            Finding(
                "error",
                "keras-not-importable",
                f"Keras could not be imported: {keras['error']}",
                'pip install "keras>=3"',
            )
        )
    elif version is not None and version < (3,):
        out.append(
            Finding(
                "error",
                "keras-2",
                f"Keras {keras.get('version')} is installed; tfgpu needs Keras 3.",
                'pip install "keras>=3"',
            )
        )
    backend = keras.get("backend")
    if backend and backend != "tensorflow":
        out.append(
            Finding(
                "error",
                "keras-backend",
                f"Keras uses the {backend!r} backend; tfgpu's strategies, pipelines and "
                "configure() act on TensorFlow.",
                'export KERAS_BACKEND=tensorflow (or set "backend": "tensorflow" in '
                "~/.keras/keras.json) before Python starts.",
            )
        )
    if (env_value(facts, "TF_USE_LEGACY_KERAS") or "").strip().lower() in ("1", "true"):
        out.append(
            Finding(
                "warning",
                "legacy-keras",
                "TF_USE_LEGACY_KERAS is set: tf.keras is Keras 2 (tf_keras), while tfgpu's "
                "callbacks and precision policies are Keras 3's.",
                "unset TF_USE_LEGACY_KERAS and use `import keras` (Keras 3).",
            )
        )
    return out


def check_tf_config(facts: dict[str, Any]) -> list[Finding]:
    raw = env_value(facts, "TF_CONFIG")
    if raw is None:
        return []
    problem = tf_config_problem(raw)
    if problem is None:
        return []
    return [
        Finding(
            "error",
            "tf-config-malformed",
            f"TF_CONFIG is malformed: {problem}.",
            'Set TF_CONFIG to JSON like {"cluster": {"worker": ["host1:12345", '
            '"host2:12345"]}, "task": {"type": "worker", "index": 0}}, with this '
            "process's own task, or unset it for single-machine training.",
        )
    ]


def check_allow_growth(facts: dict[str, Any]) -> list[Finding]:
    value = env_value(facts, "TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None:
        return []
    if value not in ("true", "false"):
        return [
            Finding(
                "warning",
                "allow-growth-invalid",
                f"TF_FORCE_GPU_ALLOW_GROWTH={value!r} is ignored: TensorFlow accepts only "
                "'true' or 'false' (lower case).",
                "export TF_FORCE_GPU_ALLOW_GROWTH=true, or unset it and call "
                "tfgpu.configure() (memory growth is its default).",
            )
        ]
    if env_value(facts, "TF_GPU_ALLOCATOR") == "cuda_malloc_async":
        return [
            Finding(
                "warning",
                "allow-growth-with-async-allocator",
                f"TF_FORCE_GPU_ALLOW_GROWTH={value} has no effect with "
                "TF_GPU_ALLOCATOR=cuda_malloc_async: the CUDA driver's memory pool "
                "allocates on demand and ignores it.",
                "Unset one of them: keep cuda_malloc_async (less fragmentation) or TensorFlow's "
                "default allocator with growth.",
            )
        ]
    return []


def check_allocator(facts: dict[str, Any]) -> list[Finding]:
    value = env_value(facts, "TF_GPU_ALLOCATOR")
    if value is None or value == "cuda_malloc_async":
        return []
    if value in ("cuda_malloc", "memory_guard"):
        return [
            Finding(
                "warning",
                "allocator-debug",
                f"TF_GPU_ALLOCATOR={value} selects a debugging allocator: every tensor goes "
                "through cudaMalloc/cudaFree, which is slow.",
                "unset TF_GPU_ALLOCATOR, or use TF_GPU_ALLOCATOR=cuda_malloc_async "
                "(tfgpu.configure(async_allocator=True)).",
            )
        ]
    return [
        Finding(
            "warning",
            "allocator-unknown",
            f"TF_GPU_ALLOCATOR={value!r} is not a TensorFlow allocator; it is ignored.",
            "use TF_GPU_ALLOCATOR=cuda_malloc_async, or unset it.",
        )
    ]


def check_thread_mode(facts: dict[str, Any]) -> list[Finding]:
    value = env_value(facts, "TF_GPU_THREAD_MODE")
    if value is None or value in ("global", "gpu_private", "gpu_shared"):
        return []
    return [
        Finding(
            "warning",
            "thread-mode-invalid",
            f"TF_GPU_THREAD_MODE={value!r} is not one of 'global', 'gpu_private', 'gpu_shared'.",
            "export TF_GPU_THREAD_MODE=gpu_private (dedicated threads launch GPU kernels), or "
            "unset it.",
        )
    ]


def check_windows(facts: dict[str, Any]) -> list[Finding]:
    system = section(facts, "os").get("system")
    version = version_tuple(section(facts, "tensorflow").get("version"))
    if system != "Windows" or not version or version < (2, 11):
        return []
    return [
        Finding(
            "warning",
            "windows-native",
            f"TensorFlow {'.'.join(map(str, version))} on native Windows has no GPU support "
            "(it ended with 2.10).",
            f"Use WSL2 (Ubuntu) with the Windows NVIDIA driver, then {AND_CUDA} inside it.",
        )
    ]


def check_determinism_env(facts: dict[str, Any]) -> list[Finding]:
    names = [
        n
        for n in ("TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC")
        if (env_value(facts, n) or "").strip().lower() in ("1", "true")
    ]
    if not names:
        return []
    return [
        Finding(
            "info",
            "determinism-env",
            f"{' and '.join(names)} set: GPU ops run deterministically, which is slower.",
            "Fine for debugging or reproducibility; unset for speed. "
            "tfgpu.configure(deterministic=True, seed=...) does the same from code.",
        )
    ]
