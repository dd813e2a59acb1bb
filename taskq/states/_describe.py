"""Sentences of :mod:`taskq.states.lookup`: a stored record or a message seen -> TaskStatus."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from taskq.results import ResultRecord, ResultState

if TYPE_CHECKING:
    from taskq.broker.browse import Sighting
    from taskq.states.model import StateSource, TaskStatus
    from taskq.states.store import StateRow


def when(value: datetime | None) -> str:
    """``2026-12-03 10:04:05 UTC`` (``?`` when unknown)."""
    if value is None:
        return "?"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def from_result(task_id: str, record: ResultRecord, row: StateRow | None) -> TaskStatus:
    """A ``taskq_results`` row (a task that keeps results), with the worker's record."""
    from taskq.states.model import TaskStatus

    worker = row.worker if row is not None else None
    on = f" on {worker}" if worker else ""
    state, attempt = record.state, record.retries + 1
    dlq = _dlq(row) if state in (ResultState.FAILURE, ResultState.DEAD) else None
    summary = {
        ResultState.STARTED: f"started at {when(record.started_at)}{on} (attempt {attempt})",
        ResultState.RETRY: f"attempt {attempt} failed: {record.error}; "
                           f"{_next(row)}",
        ResultState.SUCCESS: f"succeeded at {when(record.finished_at)}{on}"
                             + (f"; {record.error}" if record.error else ""),
        ResultState.FAILURE: f"failed at {when(record.finished_at)}{on} after {attempt} "
                             f"attempt(s): {record.error}" + _parked(dlq),
        ResultState.DEAD: f"dead-lettered at {when(record.finished_at)}{on}: "
                          f"{record.error}" + _parked(dlq),
    }[state]
    return TaskStatus(
        task_id, state, summary, task=record.task, queue=row.queue if row else None,
        attempt=attempt, worker=worker, started_at=record.started_at,
        finished_at=record.finished_at, due_at=row.next_at if row else None,
        dead_letter_queue=dlq, error=record.error, traceback=record.traceback,
        result=record.result, has_result=state is ResultState.SUCCESS and record.error is None,
        sources=("results", "states") if row else ("results",),
    )


def from_state_row(task_id: str, row: StateRow, record: ResultRecord | None) -> TaskStatus:
    """A ``taskq_task_states`` row: the last event a worker saw (no value kept)."""
    from taskq.states.model import NO_VALUE_KEPT, TaskStatus

    on = f" on {row.worker}" if row.worker else ""
    state = ResultState(row.state)
    dlq = _dlq(row) if state in (ResultState.FAILURE, ResultState.DEAD) else None
    if state is ResultState.SKIPPED and row.idempotency_key == task_id:
        # A redelivered copy of a task that had succeeded (its own key): a success.
        state = ResultState.SUCCESS
    summary = {
        ResultState.STARTED: f"started at {when(row.started_at)}{on} (attempt {row.attempt})",
        ResultState.RETRY: f"attempt {row.attempt} failed: {row.error}; {_next(row)}",
        ResultState.SUCCESS: f"succeeded at {when(row.updated_at)}{on}; {NO_VALUE_KEPT}",
        ResultState.FAILURE: f"failed at {when(row.updated_at)}{on} after {row.attempt} "
                             f"attempt(s): {row.error}" + _parked(dlq),
        ResultState.DEAD: f"dead-lettered at {when(row.updated_at)}{on}: {row.error}"
                          + _parked(dlq),
        ResultState.SKIPPED: f"skipped at {when(row.updated_at)}{on}: a duplicate of "
                             f"idempotency key {row.idempotency_key!r}, which another task "
                             "finished already; it did not run",
    }[state]
    finished = row.updated_at if state.is_ready else None
    return TaskStatus(
        task_id, state, summary, task=row.task, queue=row.queue, attempt=row.attempt,
        worker=row.worker, started_at=row.started_at, finished_at=finished,
        due_at=row.next_at, dead_letter_queue=dlq, error=row.error,
        idempotency_key=row.idempotency_key, sources=("states",),
    )


def from_sighting(app: StateSource, task_id: str, seen: Sighting) -> TaskStatus:
    """A message found in the broker: a ``Q.dlq``, a work queue or a delay tier."""
    from taskq.broker import topology as topo
    from taskq.message import (
        ATTEMPTS,
        ERROR,
        ERROR_TYPE,
        ETA,
        FAILED_AT,
        RETRIES,
        TASK,
        TRACEBACK,
    )
    from taskq.states.model import TaskStatus

    headers: dict[str, Any] = seen.message.headers
    task = _text(headers.get(TASK))
    retries = headers.get(RETRIES)
    attempt = retries + 1 if isinstance(retries, int) else None
    where = f"{seen.queue}, position {seen.position}"
    if seen.queue.endswith(".dlq"):
        failed_at = _from_ms(headers.get(FAILED_AT))
        error = f"{_text(headers.get(ERROR_TYPE))}: {_text(headers.get(ERROR))}"
        traceback = _text(headers.get(TRACEBACK))
        state = ResultState.FAILURE if traceback else ResultState.DEAD
        verb = "failed" if traceback else "dead-lettered"
        return TaskStatus(
            task_id, state, f"{verb} at {when(failed_at)} after "
            f"{_text(headers.get(ATTEMPTS)) or '?'} attempt(s): {error}; parked in {where} "
            "(taskq dlq replay puts it back)", task=task, attempt=attempt,
            finished_at=failed_at, dead_letter_queue=seen.queue, error=error,
            traceback=traceback, sources=("broker",),
        )
    if seen.queue.startswith(topo.delay_tier_prefix(app.settings.namespace)):
        due = _from_ms(headers.get(ETA))
        if attempt is not None and attempt > 1:
            return TaskStatus(task_id, ResultState.RETRY,
                              f"retrying: attempt {attempt} runs at {when(due)} (waiting in "
                              f"delay tier {seen.queue})", task=task, attempt=attempt,
                              due_at=due, sources=("broker",))
        return TaskStatus(task_id, ResultState.DELAYED,
                          f"delayed until {when(due)} (waiting in delay tier {seen.queue})",
                          task=task, attempt=attempt, due_at=due, sources=("broker",))
    return TaskStatus(task_id, ResultState.QUEUED,
                      f"queued in {where} of the ready messages"
                      + (f" (attempt {attempt})" if attempt and attempt > 1 else ""),
                      task=task, queue=seen.queue, attempt=attempt, sources=("broker",))


def _dlq(row: StateRow | None) -> str | None:
    from taskq.broker.topology import dlq_name

    return dlq_name(row.queue) if row is not None else None


def _parked(dlq: str | None) -> str:
    return f"; its message is in {dlq} (taskq dlq list/replay)" if dlq else ""


def _next(row: StateRow | None) -> str:
    if row is None or row.next_at is None:
        return "a retry is scheduled"
    return f"attempt {row.attempt + 1} runs at {when(row.next_at)}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _from_ms(value: Any) -> datetime | None:
    if not isinstance(value, (int, float)):
        return None
    return datetime.fromtimestamp(value / 1000, tz=timezone.utc)
