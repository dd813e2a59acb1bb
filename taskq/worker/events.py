"""Task lifecycle events of a worker process, for observers (results, metrics).

The loop reports each task event once to :class:`Observers`; with no observer registered
the cost on the hot path is one truthiness check. An observer that raises is logged and
never changes what happens to the message.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """Which task a lifecycle event is about."""

    task_id: str
    task: str
    queue: str
    retries: int

    @property
    def attempt(self) -> int:
        """The attempt number for humans (``retries + 1``)."""
        return self.retries + 1


class Observer:
    """Base observer: every hook is a no-op; override the ones you need."""

    def started(self, event: TaskEvent) -> None:
        """The task function is about to run."""

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:
        """The task returned and its message was acked."""

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:
        """The attempt failed; the next one is published to run in ``delay_s``."""

    def dead_lettered(
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        """The message went to ``Q.dlq`` (failures, bad input, crash loops, time limits)."""

    def duplicate(self, event: TaskEvent) -> None:
        """The idempotency key was already done: acked without running."""


class Observers(Observer):
    """Fans each event out to several observers, isolating their failures."""

    def __init__(self, observers: list[Observer] | None = None) -> None:
        self._observers = list(observers or [])

    def __bool__(self) -> bool:
        return bool(self._observers)

    def add(self, observer: Observer) -> None:
        """Register ``observer`` for every later event."""
        self._observers.append(observer)

    def _each(self, hook: str, *args: Any) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                logger.exception("observer %r failed in %s", observer, hook)

    def started(self, event: TaskEvent) -> None:  # noqa: D102 - see Observer
        self._each("started", event)

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:  # noqa: D102
        self._each("succeeded", event, duration_s, result)

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:  # noqa: D102
        self._each("retrying", event, delay_s, error, traceback)

    def dead_lettered(  # noqa: D102
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        self._each("dead_lettered", event, error_type, error, traceback)

    def duplicate(self, event: TaskEvent) -> None:  # noqa: D102
        self._each("duplicate", event)
