"""Run one task function and describe what happened as an :data:`Outcome` value.

This module decides nothing about the broker and knows nothing of pika: the worker loop turns
each outcome into exactly one broker action (ack; retry later, see :mod:`taskq.retry`; or
dead-letter then ack). While the task runs, :data:`taskq.request.current_request` holds its
:class:`~taskq.request.Request`, which is how task code reads ``self.request``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from taskq.errors import Reject, Retry
from taskq.request import Request, current_request
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
    """The task raised; the retry policy decides between a retry and a dead letter.

    For a :class:`~taskq.errors.Retry` that carries the failure behind it, the type, message
    and traceback describe that failure (what a dead letter should show).

    Args:
        exc_type: Name of the exception class (``ValueError``, ``SoftTimeLimitExceeded``).
        message: ``str()`` of the exception.
        traceback: The formatted traceback text.
        duration_s: Wall time until the exception.
        exc: The exception itself, for the retry policy (``None`` when not known).
    """

    exc_type: str
    message: str
    traceback: str
    duration_s: float
    exc: BaseException | None = None


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
    request: Request | None = None,
) -> Outcome:
    """Call ``fn(*args, **kwargs)`` and return what happened; never raises for task errors.

    Args:
        fn: The task function.
        args: Positional arguments from the envelope.
        kwargs: Keyword arguments from the envelope.
        soft_time_limit_s: Raise ``SoftTimeLimitExceeded`` inside the task after this long.
        soft_limit: The process's SIGALRM timer; required when ``soft_time_limit_s`` is set.
        request: What task code sees as ``self.request`` while it runs.

    Returns:
        :class:`Succeeded`, :class:`Failed` or :class:`Rejected`.
    """
    token = current_request.set(request)
    try:
        return _call(fn, args, kwargs, soft_time_limit_s, soft_limit)
    finally:
        current_request.reset(token)


def _call(
    fn: Callable[..., Any],
    args: list[Any],
    kwargs: dict[str, Any],
    soft_time_limit_s: float | None,
    soft_limit: SoftTimeLimit | None,
) -> Outcome:
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
    shown = exc
    if isinstance(exc, Retry) and exc.exc is not None:
        # A dead letter after the last retry should name the real failure, not "Retry".
        shown = exc.exc
    tb = shown.__traceback__
    # Start at the task's own frame: taskq's frames above it say nothing to the reader.
    while tb is not None and tb.tb_frame.f_globals.get("__name__") == __name__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(shown), shown, tb))
    return Failed(type(shown).__name__, str(shown), text, duration_s, exc)


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


def in_task_context(
    fn: Callable[..., Any],
    factories: Sequence[Callable[[], contextlib.AbstractContextManager[Any]]],
) -> Callable[..., Any]:
    """Return ``fn`` wrapped so that each call runs inside ``factories``' context managers.

    The app's ``task_context`` (e.g. a Flask application context) is applied this way,
    outermost first. With no factories ``fn`` itself is returned: the hot path pays nothing.
    """
    if not factories:
        return fn
    frozen = tuple(factories)

    def call(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for factory in frozen:
                stack.enter_context(factory())
            return fn(*args, **kwargs)

    return call
