"""Task lifecycle events of a worker process, for observers (results, metrics).

The loop reports each task event once to :class:`Observers`; with no observer registered
the cost on the hot path is one truthiness check. An observer that raises is logged and
never changes what happens to the message, with one exception: :meth:`Observer.completed`
runs before the ack, and when it cannot reach its database (a
:class:`~taskq.errors.ResultError` with ``unavailable=True``) the delivery goes back to the
queue instead (docs/reliability.md), and :meth:`Observer.held` lets its redelivery be settled
without running the task again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from taskq.errors import ResultError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """Which task a lifecycle event is about."""

    task_id: str
    task: str
    queue: str
    retries: int
    #: The idempotency key, where it matters (a duplicate: the key found done).
    key: str | None = None

    @property
    def attempt(self) -> int:
        """The attempt number for humans (``retries + 1``)."""
        return self.retries + 1


class Observer:
    """Base observer: every hook is a no-op; override the ones you need."""

    def started(self, event: TaskEvent) -> None:
        """The task function is about to run."""

    def completed(self, event: TaskEvent, duration_s: float, result: Any) -> None:
        """The task returned; called *before* its message is acked.

        What this hook writes is durable before the broker forgets the message, so a crash
        just after the ack cannot lose it. Raise :class:`~taskq.errors.ResultError` with
        ``unavailable=True`` when the database cannot be reached: the delivery then goes back
        to the queue (and :meth:`held` should answer for its redelivery).
        """

    def held(self, event: TaskEvent) -> tuple[float, Any] | None:
        """A redelivery came in: ``(duration_s, result)`` of this task's earlier run here.

        Only for a run whose :meth:`completed` could not reach the database; the loop then
        calls :meth:`completed` again with it instead of running the task a second time.
        """
        return None

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:
        """The task returned and its message was acked."""

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:
        """The attempt failed; the next one is published to run in ``delay_s``."""

    def dead_lettered(
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        """The message went to ``Q.dlq`` (failures, bad input, crash loops, time limits).

        Called once the dead letter is confirmed and *before* the delivery is acked, so a
        final result written here cannot be lost to a crash between the two.
        """

    def duplicate(self, event: TaskEvent) -> None:
        """The idempotency key was already done: acked without running."""

    def close(self) -> None:
        """The worker process is about to exit: write what is still held."""


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

    def completed(self, event: TaskEvent, duration_s: float, result: Any) -> None:
        """Tell every observer, before the ack.

        Raises:
            ResultError: an observer could not reach its database (``unavailable=True``):
                the delivery must not be acked. Other errors are logged, as for every hook.
        """
        unavailable: ResultError | None = None
        for observer in self._observers:
            try:
                observer.completed(event, duration_s, result)
            except Exception as exc:
                if isinstance(exc, ResultError) and getattr(exc, "unavailable", False):
                    unavailable = exc
                else:
                    logger.exception("observer %r failed in completed", observer)
        if unavailable is not None:
            raise unavailable

    def held(self, event: TaskEvent) -> tuple[float, Any] | None:  # noqa: D102
        for observer in self._observers:
            try:
                outcome = observer.held(event)
            except Exception:
                logger.exception("observer %r failed in held", observer)
                continue
            if outcome is not None:
                return outcome
        return None

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

    def close(self) -> None:  # noqa: D102
        self._each("close")
