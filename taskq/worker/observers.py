"""Observers a worker process registers: the result store and Prometheus metrics."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from taskq.results import ResultState
from taskq.worker.events import Observer, TaskEvent

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)


class ResultRecorder(Observer):
    """Writes ``taskq_results`` for tasks that store results (one upsert per event).

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

    def _stores(self, task: str) -> bool:
        return self._wanted.get(task, False)

    def started(self, event: TaskEvent) -> None:  # noqa: D102 - see Observer
        if self._stores(event.task):
            self._app.results.started(event.task_id, event.task, event.retries)

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:  # noqa: D102
        if self._stores(event.task):
            self._app.results.succeeded(event.task_id, event.task, event.retries, result)

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:  # noqa: D102
        if self._stores(event.task):
            self._app.results.failed(event.task_id, event.task, event.retries,
                                     state=ResultState.RETRY, error=error, traceback=traceback)

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
