"""The worker side: run one attempt of a ``django.tasks`` function, as Django expects.

:class:`DjangoTaskRunner` is the function taskq registers for a Django Task. For each
attempt it adds this worker's id to the task's record, sends ``task_started`` (status
RUNNING), calls the function (with a ``TaskContext`` first when ``takes_context``), and
normalises the return value to JSON as Django requires. ``task_finished`` is sent once per
task: after the attempt that succeeded, or after the failed attempt that taskq's retry
policy will not retry (a failed attempt that will be retried returns the task to READY).
It is sent before taskq stores the result and acks the message, from inside the worker.
A receiver that raises in the worker is logged; it does not fail the task.

Record writes are best effort: when the database cannot be reached the task still runs
(taskq's own result write, before the ack, decides what happens to the delivery), and
``get_result()`` shows fewer attempts.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import traceback
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from taskq.contrib.django.tasks._api import (
    TaskContext,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from taskq.contrib.django.tasks._json import json_value
from taskq.contrib.django.tasks.results import build_result, task_error
from taskq.errors import Reject, Retry
from taskq.request import current_request

logger = logging.getLogger(__name__)


def _call_signature(task: Any) -> inspect.Signature | None:
    try:
        signature = inspect.signature(task.func)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    return signature.replace(parameters=parameters[1:] if task.takes_context else parameters)


def worker_id() -> str:
    """This worker process's id in ``TaskResult.worker_ids``: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class DjangoTaskRunner:
    """The taskq task function of one Django Task.

    Args:
        task: The Django Task (its function, ``takes_context``).
        backend_alias: The ``TASKS`` alias of its backend.
    """

    def __init__(self, task: Any, backend_alias: str) -> None:
        self.task = task
        self.backend_alias = backend_alias
        self.__name__ = task.func.__name__
        self.__qualname__ = task.func.__qualname__
        self.__module__ = task.func.__module__
        self.__doc__ = task.func.__doc__
        # What a call of the Django function takes (its context parameter is ours to pass):
        # taskq's road checks every enqueued call against it (inspect reads __signature__).
        self.__signature__ = _call_signature(task)
        #: The taskq task that runs this (set when it is registered).
        self.taskq_task: Any = None

    def __repr__(self) -> str:
        return f"<DjangoTaskRunner {self.task.module_path}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run one attempt; raises what the function raised (taskq retries or parks it)."""
        backend = task_backends[self.backend_alias]
        sender = type(backend)
        request = current_request.get()
        task_id = request.task_id if request is not None else ""
        record = _start_attempt(backend, self.task, task_id, args, kwargs)
        running = build_result(backend, record, status=TaskResultStatus.RUNNING,
                               errors=record.errors)
        _send(task_started, sender, running)
        try:
            if self.task.takes_context:
                value = self.task.call(TaskContext(task_result=running), *args, **kwargs)
            else:
                value = self.task.call(*args, **kwargs)
            value = json_value(value, what=f"task {self.task.module_path}: the return value")
        except BaseException as exc:
            retries = request.retries if request is not None else 0
            self._failed(backend, record, exc, retries)
            raise
        _send(task_finished, sender, build_result(
            backend, record, status=TaskResultStatus.SUCCESSFUL, errors=record.errors,
            finished_at=timezone.now(), return_value=value,
        ))
        return value

    def _failed(self, backend: Any, record: Any, exc: BaseException, retries: int) -> None:
        shown = exc.exc if isinstance(exc, Retry) and exc.exc is not None else exc
        record.errors = [*record.errors, task_error(shown, "".join(
            traceback.format_exception(type(shown), shown, shown.__traceback__)
        ))]
        _save(backend, record, ["errors"])
        if self._retried(exc, retries):
            return
        _send(task_finished, type(backend), build_result(
            backend, record, status=TaskResultStatus.FAILED, errors=record.errors,
            finished_at=timezone.now(),
        ))

    def _retried(self, exc: BaseException, retries: int) -> bool:
        """Whether taskq's worker will retry after ``exc`` (the same decision it takes)."""
        from taskq.retry import GiveUp, RetryOverrides, RetryPolicy, decide, resolve_policy

        taskq_task = self.taskq_task
        if isinstance(exc, (Reject, KeyboardInterrupt, SystemExit)) or taskq_task is None:
            return False
        policy = resolve_policy(
            RetryPolicy.from_settings(taskq_task.app.settings),
            taskq_task.options.retry_overrides(),
        )
        if isinstance(exc, Retry) and exc.max_retries is not None:
            policy = resolve_policy(policy, RetryOverrides(max_retries=exc.max_retries))
        return not isinstance(decide(policy, exc, retries), GiveUp)


def _send(signal: Any, sender: Any, result: Any) -> None:
    """Send a signal; a receiver that raises is logged and changes nothing about the task.

    In the worker a failing receiver must not turn a task that succeeded into a retry.
    """
    for receiver, outcome in signal.send_robust(sender, task_result=result):
        if isinstance(outcome, Exception):
            logger.error(
                "task %s[%s]: receiver %r of a django.tasks signal raised %s: %s",
                result.task.module_path, result.id, receiver, type(outcome).__name__, outcome,
                exc_info=(type(outcome), outcome, outcome.__traceback__),
            )


def _start_attempt(backend: Any, task: Any, task_id: str, args: Any, kwargs: Any) -> Any:
    """The task's record with this attempt added (saved if the database answers)."""
    from taskq.contrib.django.models import TaskRecord

    now = timezone.now()
    try:
        record = TaskRecord.objects.using(backend.database).filter(pk=task_id).first()
    except DatabaseError as exc:
        logger.warning("task %s[%s]: cannot read its record (%s); running it anyway",
                       task.module_path, task_id, exc)
        record = None
    if record is None:  # not enqueued through TaskqBackend (or unreadable): keep it in memory
        record = TaskRecord(
            id=task_id, task_path=task.module_path, backend=backend.alias,
            queue_name=task.queue_name, priority=task.priority, run_after=task.run_after,
            args=list(args), kwargs=dict(kwargs), enqueued_at=None,
        )
        record._state.adding = True  # never saved: _save() skips it
    record.worker_ids = [*record.worker_ids, worker_id()]
    record.started_at = record.started_at or now
    record.last_attempted_at = now
    _save(backend, record, ["worker_ids", "started_at", "last_attempted_at"])
    return record


def _save(backend: Any, record: Any, fields: list[str]) -> None:
    if record._state.adding:
        return
    try:
        record.save(using=backend.database, update_fields=fields)
    except DatabaseError as exc:
        logger.warning("task %s[%s]: cannot update its record (%s); get_result() will miss "
                       "this attempt", record.task_path, record.id, exc)
