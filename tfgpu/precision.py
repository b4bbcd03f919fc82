"""Which Keras precision policy fits the GPUs, behind `configure(precision="auto")`; the rules:
docs/setup.md, "How `precision="auto"` chooses"."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tfgpu._internal.helpers.checks import invalid_type, invalid_value

__all__ = ["PolicyChoice", "choose_policy", "has_tensor_cores", "supports_bfloat16"]

_TENSOR_CORES = (7, 0)
_BFLOAT16 = (8, 0)


@dataclass(frozen=True)
class PolicyChoice:
    """A chosen Keras precision policy and why it was chosen.

    Args:
        policy: str, `"float32"`, `"mixed_float16"` or `"mixed_bfloat16"`.
        reason: str, one sentence naming the facts behind the choice.
    """

    policy: str
    reason: str

    def __str__(self) -> str:
        return f"{self.policy} ({self.reason})"


def _check_cc(cc: object, name: str = "cc") -> tuple[int, int]:
    """Returns `cc` as a `(major, minor)` tuple or raises a Keras-style error."""
    if (
        not isinstance(cc, Sequence)
        or isinstance(cc, str)
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in cc)
    ):
        raise invalid_type(name, cc, "a compute capability as a tuple of two ints, e.g. (8, 0)")
    if cc[0] < 0 or cc[1] < 0:
        raise invalid_value(name, cc, "non-negative (major, minor) numbers, e.g. (8, 0)")
    return (cc[0], cc[1])


def has_tensor_cores(cc: tuple[int, int]) -> bool:
    """Tells whether a GPU of compute capability `cc` has tensor cores (Volta and newer).

    Args:
        cc: tuple of two ints, `(major, minor)` as `nvidia-smi --query-gpu=compute_cap`.

    Returns:
        bool, True if `cc >= (7, 0)`.

    Raises:
        TypeError: if `cc` is not a pair of ints.
        ValueError: if a number is negative.

    Example:

    >>> has_tensor_cores((7, 5)), has_tensor_cores((6, 1))
    (True, False)
    """
    return _check_cc(cc) >= _TENSOR_CORES


def supports_bfloat16(cc: tuple[int, int]) -> bool:
    """Tells whether a GPU of compute capability `cc` computes bfloat16 on tensor cores.

    Args:
        cc: tuple of two ints, `(major, minor)`, e.g. `(8, 0)` for an A100.

    Returns:
        bool, True if `cc >= (8, 0)` (Ampere and newer).

    Raises:
        TypeError: if `cc` is not a pair of ints.
        ValueError: if a number is negative.

    Example:

    >>> supports_bfloat16((8, 0)), supports_bfloat16((7, 0))
    (True, False)
    """
    return _check_cc(cc) >= _BFLOAT16


def _fmt(ccs: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{major}.{minor}" for major, minor in ccs)


def choose_policy(compute_capabilities: Sequence[tuple[int, int]]) -> PolicyChoice:
    """Chooses the Keras precision policy for GPUs that train together.

    bfloat16 where every GPU has it, float16 with loss scaling where every GPU has tensor
    cores, float32 otherwise. The guide: docs/setup.md, "How `precision="auto"` chooses".

    Args:
        compute_capabilities: sequence of `(major, minor)` tuples, one per GPU (none: CPU).

    Returns:
        `PolicyChoice`, the policy name and the reason.

    Raises:
        TypeError: if `compute_capabilities` is not a sequence of pairs of ints.
        ValueError: if a number is negative.

    Example:

    >>> choose_policy([(9, 0)])
    PolicyChoice(policy='mixed_bfloat16', reason='every GPU has compute capability >= 8.0 (9.0): bfloat16 tensor cores, float32 range, no loss scaling needed')
    """
    given = compute_capabilities
    if isinstance(given, str | bytes) or not isinstance(given, Sequence):
        raise invalid_type(
            "compute_capabilities", given, "a list of (major, minor) tuples, e.g. [(8, 0), (8, 0)]"
        )
    ccs = [_check_cc(cc, "compute_capabilities") for cc in given]
    if not ccs:
        return PolicyChoice(
            "float32", "no GPU: mixed precision has no tensor cores to use and is slower on the CPU"
        )
    if all(cc >= _BFLOAT16 for cc in ccs):
        return PolicyChoice(
            "mixed_bfloat16",
            f"every GPU has compute capability >= 8.0 ({_fmt(ccs)}): "
            "bfloat16 tensor cores, float32 range, no loss scaling needed",
        )
    if all(cc >= _TENSOR_CORES for cc in ccs):
        return PolicyChoice(
            "mixed_float16",
            f"every GPU has tensor cores (compute capability >= 7.0: {_fmt(ccs)}) but not all "
            "have bfloat16 (>= 8.0): float16 with dynamic loss scaling, which Keras applies "
            "at compile",
        )
    return PolicyChoice(
        "float32",
        f"not every GPU has tensor cores (compute capability >= 7.0; found {_fmt(ccs)}): "
        "mixed precision would only add casts",
    )
