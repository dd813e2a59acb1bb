"""``TaskResult`` values: built from a :class:`TaskRecord` and the task's ``taskq_results`` row.

The record (written at enqueue, in the caller's transaction) holds what Django's result
shows of the call: arguments, enqueue time, the worker id of each attempt and the error of
each failed one. ``taskq_results`` (written by taskq's worker, before the ack) holds the
status, the return value and ``finished_at``. taskq's states map onto Django's:

========================  ==============
taskq_results.state       TaskResultStatus
========================  ==============
(no row yet), RETRY       READY (waiting for its first or its next attempt)
STARTED                   RUNNING
SUCCESS                   SUCCESSFUL
FAILURE, DEAD             FAILED
========================  ==============
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.utils.module_loading import import_string

from taskq.contrib.django.tasks._api import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)

logger = logging.getLogger(__name__)

#: module_path -> the Django Task registered under it (filled by registration; get_result
#: rebuilds a result's task from it, or imports it in a process that has not registered it).
django_tasks: dict[str, Any] = {}

_STATUS = {
    "PENDING": TaskResultStatus.READY,
    "RETRY": TaskResultStatus.READY,
    "STARTED": TaskResultStatus.RUNNING,
    "SUCCESS": TaskResultStatus.SUCCESSFUL,
    "FAILURE": TaskResultStatus.FAILED,
    "DEAD": TaskResultStatus.FAILED,
}


def read_result(backend: Any, result_id: str) -> Any:
    """The ``TaskResult`` of ``result_id`` as stored now.

    Raises:
        TaskResultDoesNotExist: no record with that id (never enqueued, rolled back, or
            enqueued through another backend).
    """
    from taskq.contrib.django.models import TaskRecord
    from taskq.contrib.django.models import TaskResult as ResultRow

    record = TaskRecord.objects.using(backend.database).filter(pk=result_id).first()
    if record is None or record.backend != backend.alias:
        raise TaskResultDoesNotExist(f"no task result with id {result_id!r}")
    row = ResultRow.objects.using(backend.database).filter(pk=result_id).first()
    status = _STATUS[row.state] if row is not None else TaskResultStatus.READY
    errors = list(record.errors)
    if status == TaskResultStatus.FAILED and row is not None and len(errors) < len(
        record.worker_ids
    ):
        # The last attempt ended outside the task function (time limit, crash loop,
        # dead-lettered by the worker): taskq_results has its reason.
        errors.append(_worker_error(row.error, row.traceback))
    return build_result(
        backend, record, status=status, errors=errors,
        finished_at=row.finished_at if row is not None and status in _FINISHED else None,
        return_value=_value(row) if status == TaskResultStatus.SUCCESSFUL else None,
    )


_FINISHED = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)


def build_result(
    backend: Any,
    record: Any,
    *,
    status: Any,
    errors: list[dict[str, str]],
    finished_at: Any = None,
    return_value: Any = None,
) -> Any:
    """A ``TaskResult`` of ``record`` (a TaskRecord, saved or not) in ``status``."""
    result = TaskResult(
        task=call_task(record),
        id=record.id,
        status=status,
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        finished_at=finished_at,
        last_attempted_at=record.last_attempted_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=backend.alias,
        errors=[TaskError(**error) for error in errors],
        worker_ids=list(record.worker_ids),
    )
    object.__setattr__(result, "_return_value", return_value)  # how Django's backends set it
    return result


def call_task(record: Any) -> Any:
    """The Django Task of the call: its function, with the call's priority, queue, run_after."""
    task = django_tasks.get(record.task_path)
    if task is None:  # registered in another process (get_result in a web process)
        task = import_string(record.task_path)
        if not isinstance(task, Task):
            raise TaskResultDoesNotExist(
                f"task result {record.id}: {record.task_path!r} is no longer a django.tasks "
                "Task"
            )
    if (task.priority, task.queue_name, task.run_after) == (
        record.priority, record.queue_name, record.run_after
    ):
        return task
    return dataclasses.replace(
        task, priority=record.priority, queue_name=record.queue_name, run_after=record.run_after
    )


def task_error(exc: BaseException, traceback_text: str) -> dict[str, str]:
    """A ``TaskError`` (as stored in the record) for an exception the task function raised."""
    kind = type(exc)
    return {"exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
            "traceback": traceback_text}


def _worker_error(error: str | None, traceback: str | None) -> dict[str, str]:
    import builtins

    import taskq.errors

    kind = (error or "").partition(":")[0].strip()
    if hasattr(taskq.errors, kind):  # taskq's own reasons: TimeLimitExceeded, Reject...
        path = f"taskq.errors.{kind}"
    elif hasattr(builtins, kind):
        path = f"builtins.{kind}"
    else:  # a reason without a class (a crash loop...): the text says which
        path = "taskq.errors.TaskqError"
    return {"exception_class_path": path, "traceback": traceback or error or ""}


def _value(row: Any) -> Any:
    from taskq.codec import decode_body

    if row.result is None:
        return None
    return decode_body(bytes(row.result))[0][0]
