"""The worker side of ``taskq_task_states``: remember each task's last event, write in batches.

:class:`StateRecorder` is an observer of the worker loop. Its hooks only put a row in a dict
keyed by task id (a later event of the same task replaces the earlier one), and a daemon
thread writes what gathered about every ``task_states_flush_s`` in one upsert
(:mod:`taskq.states.store`). The task's own path does no I/O for it. A write that fails
(database unreachable, table missing) is logged, at most once a minute, and its rows are
dropped: a state record is an aid for humans, never a reason to hold a task.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from taskq.db import utcnow
from taskq.states.store import ERROR_MAX_CHARS, StateRow, TaskStateStore
from taskq.worker.events import Observer, TaskEvent

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)

# At most this many rows wait for the writer; past it the oldest are dropped (a database
# that cannot keep up must not grow the worker's memory).
_PENDING_MAX = 50_000
# A failing write is logged at most this often.
_COMPLAINT_INTERVAL_S = 60.0


class StateRecorder(Observer):
    """Gathers task events and writes them to ``taskq_task_states`` from a thread.

    Args:
        app: Its engine is written to; ``task_states_flush_s`` sets the interval.
    """

    def __init__(self, app: App) -> None:
        self._store = TaskStateStore(app.engine)
        self._interval_s = app.settings.task_states_flush_s
        self._worker = f"{socket.gethostname()} pid {os.getpid()}"
        self._pending: dict[str, StateRow] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._complained_at = -_COMPLAINT_INTERVAL_S
        self._thread: threading.Thread | None = None

    def _put(self, event: TaskEvent, state: str, *, error: str | None = None,
             next_in_s: float | None = None, started: bool = False,
             key: str | None = None) -> None:
        if not event.task_id:
            return  # a message without an id: nothing could ever look it up
        now = utcnow()
        row = StateRow(
            event.task_id, event.task, event.queue, state, event.retries, key, self._worker,
            error[:ERROR_MAX_CHARS] if error else None,
            now + timedelta(seconds=next_in_s) if next_in_s is not None else None,
            now if started else None, now,
        )
        with self._lock:
            earlier = self._pending.pop(event.task_id, None)
            if earlier is not None and earlier.state == "SUCCESS":
                row = earlier  # as in the table: a success is never replaced
            elif earlier is not None and earlier.started_at is not None and not started:
                row = StateRow(**{**_fields(row), "started_at": earlier.started_at})
            self._pending[event.task_id] = row
            if len(self._pending) > _PENDING_MAX:
                self._pending.pop(next(iter(self._pending)))
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="taskq-task-states", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self.flush()
        self.flush()  # what came in during the last write

    def flush(self) -> None:
        """Write what gathered (one statement); log and drop it when that fails."""
        with self._lock:
            rows, self._pending = list(self._pending.values()), {}
        if not rows:
            return
        try:
            self._store.write(rows)
        except Exception as exc:  # SQLAlchemy or driver errors: never the task's business
            now = time.monotonic()
            if now - self._complained_at >= _COMPLAINT_INTERVAL_S:
                self._complained_at = now
                logger.warning(
                    "cannot record the states of %d tasks in taskq_task_states (%s: %s); "
                    "`taskq inspect` falls back on what else it finds. Is the database up, "
                    "and was `taskq db create` run since taskq was upgraded?",
                    len(rows), type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "",
                )

    def close(self) -> None:
        """Stop the thread after a last write."""
        self._stopping = True
        self._wake.set()
        if self._thread is None:
            self.flush()
        else:  # the thread writes last; a second writer would only wait on the first
            self._thread.join(10.0)

    def started(self, event: TaskEvent) -> None:  # noqa: D102 - see Observer
        self._put(event, "STARTED", started=True, key=event.key)

    def succeeded(self, event: TaskEvent, duration_s: float, result: Any) -> None:  # noqa: D102
        self._put(event, "SUCCESS", key=event.key)

    def retrying(self, event: TaskEvent, delay_s: float, error: str, traceback: str) -> None:  # noqa: D102
        self._put(event, "RETRY", error=error, next_in_s=delay_s, key=event.key)

    def dead_lettered(  # noqa: D102
        self, event: TaskEvent, error_type: str, error: str, traceback: str | None
    ) -> None:
        # FAILURE: the task raised and no retry was left; DEAD: parked for another reason.
        state = "FAILURE" if traceback else "DEAD"
        self._put(event, state, error=f"{error_type}: {error}", key=event.key)

    def duplicate(self, event: TaskEvent) -> None:  # noqa: D102
        self._put(event, "SKIPPED", key=event.key)


def _fields(row: StateRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in StateRow.__slots__}
