"""Run one task function and describe what happened as an :data:`Outcome` value.

This module decides nothing about the broker and knows nothing of pika: the worker loop turns
each outcome into exactly one broker action (ack, or dead-letter then ack).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskq.errors import Reject, Retry
from taskq.worker.time_limits import SoftTimeLimit

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The task returned.

    Args:
        duration_s: Wall time the task function ran.
        result: What it returned (kept for the result store of a later release).
    """

    duration_s: float
    result: Any = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The task raised; until retry policies exist the message is dead-lettered.

    Args:
        exc_type: Name of the exception class (``ValueError``, ``SoftTimeLimitExceeded``).
        message: ``str()`` of the exception.
        traceback: The formatted traceback text.
        duration_s: Wall time until the exception.
    """

    exc_type: str
    message: str
    traceback: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class Rejected:
    """The task raised :class:`~taskq.errors.Reject`: dead-letter with its reason, no retry.

    Args:
        reason: The reason the task gave.
        duration_s: Wall time until the rejection.
    """

    reason: str
    duration_s: float


Outcome = Succeeded | Failed | Rejected


def execute(
    fn: Callable[..., Any],
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    soft_time_limit_s: float | None = None,
    soft_limit: SoftTimeLimit | None = None,
) -> Outcome:
    """Call ``fn(*args, **kwargs)`` and return what happened; never raises for task errors.

    Args:
        fn: The task function.
        args: Positional arguments from the envelope.
        kwargs: Keyword arguments from the envelope.
        soft_time_limit_s: Raise ``SoftTimeLimitExceeded`` inside the task after this long.
        soft_limit: The process's SIGALRM timer; required when ``soft_time_limit_s`` is set.

    Returns:
        :class:`Succeeded`, :class:`Failed` or :class:`Rejected`.
    """
    started = time.perf_counter()
    try:
        if soft_time_limit_s is None or soft_limit is None:
            result = fn(*args, **kwargs)
        else:
            result = _call_with_soft_limit(fn, args, kwargs, soft_time_limit_s, soft_limit)
    except Reject as exc:
        return Rejected(exc.message, time.perf_counter() - started)
    except BaseException as exc:  # SoftTimeLimitExceeded, and sys.exit() in task code
        return failure(exc, time.perf_counter() - started)
    return Succeeded(time.perf_counter() - started, result)


def failure(exc: BaseException, duration_s: float) -> Failed:
    """Describe ``exc`` (being handled) as a :class:`Failed` outcome."""
    if isinstance(exc, Retry):
        # Retry policies arrive in a later release; until then a retry request cannot be
        # honoured, and dead-lettering it is the only outcome that loses nothing.
        message = "the task asked for a retry, but this taskq version has no retries yet"
    else:
        message = str(exc)
    tb = exc.__traceback__
    # Start at the task's own frame: taskq's frames above it say nothing to the reader.
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == __name__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return Failed(type(exc).__name__, message, text, duration_s)


def _call_with_soft_limit(
    fn: Callable[..., Any],
    args: list[Any],
    kwargs: dict[str, Any],
    limit_s: float,
    soft_limit: SoftTimeLimit,
) -> Any:
    soft_limit.arm(limit_s)
    try:
        return fn(*args, **kwargs)
    finally:
        soft_limit.disarm()
