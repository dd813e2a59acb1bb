"""Wait for a condition with a deadline instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Raises:
        AssertionError: the deadline passed; the message says what was awaited.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s:.1f}s: {text}")
        time.sleep(interval_s)
