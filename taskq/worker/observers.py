"""Observers a worker process registers: the result store and Prometheus metrics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from taskq.errors import ResultError
from taskq.results import ResultState
from taskq.worker.events import Observer, TaskEvent

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)

# Successes held in memory because the database was unreachable (oldest dropped past this).
_HELD_MAX = 1000


class ResultRecorder(Observer):
    """Writes ``taskq_results`` for tasks that store results (one upsert per event).

    ``SUCCESS`` is written in :meth:`completed`, before the ack: once the broker forgets the
    message, its result is stored. When the database cannot be reached the value is held here
    and the error raised, so the loop returns the delivery to the queue; if the redelivery
    comes back to this process, :meth:`held` hands the value over and the task is not run
    again. Other states are written after their broker action, best effort; the store's
    rules (:mod:`taskq.results`) keep a late or duplicate write from undoing a final state.

    Args:
        app: Its ``results`` store is used; ``store_result`` (task) or ``store_results``
            (app) decides which tasks are recorded.
    """

    def __init__(self, app: App) -> None:
        self._app = app
        default = app.settings.store_results
        self._wanted = {
            task.name: default if task.options.store_result is None else task.options.store_result
            for task in app.registry
        }
        self._held: dict[str, tuple[TaskEvent, float, Any]] = {}

    def _stores(self, task: str) -> bool:
        return self._wanted.get(task, False)

    def started(self, event: TaskEvent) -> None:  # noqa: D102 - see Observer
        if self._stores(event.task):
            self._app.results.started(event.task_id, event.task, event.retries)

    def completed(self, event: TaskEvent, duration_s: float, result: Any) -> None:  # noqa: D102
        if not self._stores(event.task):
            return
        try:
            self._app.results.succeeded(event.task_id, event.task, event.retries, result)
        except ResultError as exc:
            if getattr(exc, "unavailable", False):
                self._hold(event, duration_s, result)
                raise
            # Refused, not unreachable: retrying cannot help, so the message is acked.
            logger.error(
                "task %s[%s] from %s succeeded but its result cannot be stored: %s; its "
                "message is acked and no result is kept (does the taskq_results table exist, "
                "`taskq db create`, and does the row fit its columns?)",
                event.task, event.task_id, event.queue, exc,
            )

    def held(self, event: TaskEvent) -> tuple[float, Any] | None:  # noqa: D102
        entry = self._held.pop(event.task_id, None) if self._held else None
        return None if entry is None else (entry[1], entry[2])

    def _hold(self, event: TaskEvent, duration_s: float, result: Any) -> None:
        self._held[event.task_id] = (event, duration_s, result)
        if len(self._held) > _HELD_MAX:
            dropped = self._held.pop(next(iter(self._held)))[0]
            logger.warning(
                "more than %d results wait for the database; the value of task %s[%s] from %s "
                "is no longer held: if it comes back here it is stored without its value "
                "(idempotent) or runs again (idempotent=False)",
                _HELD_MAX, dropped.task, dropped.task_id, dropped.queue,
            )

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:  # noqa: D102
        if self._stores(event.task):
            self._app.results.failed(event.task_id, event.task, event.retries,
                                     state=ResultState.RETRY, error=error, traceback=traceback)

    def duplicate(self, event: TaskEvent) -> None:  # noqa: D102
        if not self._stores(event.task):
            return
        # The key is done, so a run succeeded; store it unless a final state is there already
        # (the run's own write may have been lost to an outage, or it had another task id).
        held = self.held(event)
        if held is not None:
            self._app.results.succeeded(event.task_id, event.task, event.retries, held[1])
        else:
            self._app.results.already_done(event.task_id, event.task, event.retries)

    def dead_lettered(  # noqa: D102
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        if self._stores(event.task):
            # FAILURE: the task raised and no retry was left (a traceback exists); DEAD: the
            # message was parked for another reason (rejected, time limit, crash loop...).
            state = ResultState.FAILURE if traceback else ResultState.DEAD
            self._app.results.failed(event.task_id, event.task, event.retries, state=state,
                                     error=f"{error_type}: {error}", traceback=traceback)


def wants_results(app: App) -> bool:
    """Whether any task of ``app`` stores results (else no recorder is registered)."""
    default = app.settings.store_results
    return any(
        default if task.options.store_result is None else task.options.store_result
        for task in app.registry
    )


class MetricsObserver(Observer):
    """Counts task events in Prometheus metrics (multiprocess mode, see taskq.worker.metrics)."""

    def __init__(self) -> None:
        from taskq.worker import metrics

        self._m = metrics.task_metrics()

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:  # noqa: D102
        self._m.tasks.labels(event.task, event.queue, "succeeded").inc()
        self._m.duration.labels(event.task, event.queue).observe(duration_s)

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:  # noqa: D102
        self._m.tasks.labels(event.task, event.queue, "retried").inc()
        self._m.retries.labels(event.task, event.queue).inc()

    def dead_lettered(  # noqa: D102
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        self._m.tasks.labels(event.task, event.queue, "dead_lettered").inc()
        self._m.dead_letters.labels(event.queue, error_type).inc()

    def duplicate(self, event: TaskEvent) -> None:  # noqa: D102
        self._m.tasks.labels(event.task, event.queue, "duplicate").inc()
        self._m.duplicates.labels(event.task, event.queue).inc()
