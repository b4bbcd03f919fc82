"""A call that may block for ever (a dataset that never yields), given a bound: TensorFlow cannot
interrupt a `get_next`, so it runs in a daemon thread, left to end with the call or the process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def call_bounded(
    fn: Callable[[], T],
    *,
    timeout_s: float,
    timeout_error: Callable[[int], Exception],
    progress: Callable[[], int] = lambda: 0,
    name: str = "tfgpu-read",
) -> T:
    """`fn()`, raising `timeout_error(progress())` when `progress()` did not move for
    `timeout_s` seconds; an error `fn` raises is raised here, in the caller."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as e:  # not handled here: raised again in the caller
            outcome["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    seen = progress()
    thread.join(timeout_s)
    while thread.is_alive():
        now = progress()
        if now == seen:
            raise timeout_error(now)
        seen = now
        thread.join(timeout_s)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
