"""``TaskqBackend``: a ``django.tasks`` backend whose ``enqueue()`` joins the caller's transaction.

Configured with::

    TASKS = {
        "default": {
            "BACKEND": "taskq.contrib.django.tasks.TaskqBackend",
            "QUEUES": ["default", "emails"],          # taskq queues; "default" is TASKQ's
            "OPTIONS": {"database": "default",         # the DATABASES alias of the outbox
                        "max_retries": 3, "autoretry_for": (ConnectionError,)},
        }
    }

Each ``@task`` function is registered in the project's taskq App (``settings.TASKQ["app"]``)
under its ``module_path`` when Django builds the ``Task`` (at import), so a worker runs only
what its own code defines. ``enqueue()`` inside ``transaction.atomic(using=database)`` adds
the :class:`~taskq.contrib.django.models.TaskRecord` and the outbox row in that transaction
(the relay publishes it after the commit, also when the broker was down then); outside one it
publishes at once with publisher confirms.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone

from taskq.contrib.django.tasks._api import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    task_enqueued,
)
from taskq.contrib.django.tasks._json import json_value
from taskq.contrib.django.tasks.registration import TASK_OPTION_NAMES, registered_task
from taskq.errors import ConfigurationError
from taskq.message import new_task_id
from taskq.task import TaskOptions

logger = logging.getLogger(__name__)

DATABASE_OPTION = "database"
# Django's priorities, and the span each of taskq's ten levels (0..9) covers.
_DJANGO_MIN_PRIORITY, _DJANGO_SPAN = -100, 201
# Django's default task priority (django.tasks DEFAULT_TASK_PRIORITY).
_DJANGO_DEFAULT_PRIORITY = 0


def taskq_priority(priority: int) -> int:
    """Map a ``django.tasks`` priority (-100..100, higher sooner) onto taskq's 0..9.

    Ten equal bands of about 20, in order: -100..-81 is 0, ..., -1 and 0 (the default) are
    4, 1..20 is 5, ..., 81..100 is 9. Monotonic: a higher Django priority never gets a
    lower taskq priority, so a task above the default always runs before default ones.
    """
    return (int(priority) - _DJANGO_MIN_PRIORITY) * 10 // _DJANGO_SPAN


def priority_for_queue(priority: int, *, takes_priorities: bool, task: str, queue: str) -> int:
    """The taskq priority of a Django ``priority`` for a queue, asked of the queue itself.

    A queue with priorities gets :func:`taskq_priority`. A quorum or ordered queue takes
    none: Django's default priority (0) is sent without one, any other is refused, since
    that queue would run it in arrival order all the same.

    Raises:
        InvalidTask: a priority other than the default for a queue without priorities.
    """
    if takes_priorities:
        return taskq_priority(priority)
    if priority == _DJANGO_DEFAULT_PRIORITY:
        return 0
    raise InvalidTask(
        f"task {task}: priority {priority} for taskq queue {queue!r}, which runs tasks in "
        "arrival order (a quorum or ordered queue takes no priorities); leave the priority "
        "at its default, or send prioritised work to a classic queue (QUEUES and "
        "app.queue(name, type='classic'))"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskqTask(Task):
    """A ``django.tasks`` Task with taskq's per-task options (``@task(max_retries=3)``).

    Django 6.1 and the backport pass ``@task(**kwargs)`` on to the backend's ``task_class``.
    ``None`` takes the backend's ``OPTIONS``, then taskq's defaults (see
    :class:`~taskq.task.TaskOptions` for what each means).
    """

    max_retries: int | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    retry_jitter: bool | None = None
    autoretry_for: tuple[type[BaseException], ...] | None = None
    dont_autoretry_for: tuple[type[BaseException], ...] | None = None
    time_limit_s: float | None = None
    soft_time_limit_s: float | None = None
    idempotent: bool | None = None

    def taskq_options(self) -> dict[str, Any]:
        """The options this task sets (the others come from the backend)."""
        values = {name: getattr(self, name) for name in TASK_OPTION_NAMES}
        return {name: value for name, value in values.items() if value is not None}


class TaskqBackend(BaseTaskBackend):
    """Runs ``django.tasks`` on taskq: transactional enqueue, retries, a real worker.

    Args:
        alias: The ``TASKS`` alias.
        params: Its settings: ``QUEUES`` (taskq queue names; ``"default"`` stands for the
            App's ``default_queue``) and ``OPTIONS`` (``database``: the ``DATABASES``
            alias whose transactions ``enqueue()`` joins, by default ``TASKQ["database"]``;
            and any of taskq's retry, time-limit and idempotency task options as defaults).

    Raises:
        ImproperlyConfigured: an unknown or invalid option.
    """

    task_class = TaskqTask
    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = False  # the worker is synchronous

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        self.database: str = options.pop(DATABASE_OPTION, None) or _taskq_database()
        unknown = sorted(set(options) - set(TASK_OPTION_NAMES))
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown option(s) {', '.join(unknown)}; known: "
                f"{DATABASE_OPTION}, {', '.join(TASK_OPTION_NAMES)}"
            )
        try:
            TaskOptions(**options)  # validated now, not at the first task
        except (ConfigurationError, TypeError) as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from exc
        self.task_defaults: dict[str, Any] = options

    # -- validation --------------------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """Django's checks, then taskq's: aware ``run_after``, valid options; registers it.

        Raises:
            InvalidTask: the task cannot run on taskq (the message says why).
        """
        super().validate_task(task)
        run_after = task.run_after
        if run_after is not None and (
            not isinstance(run_after, datetime) or timezone.is_naive(run_after)
        ):
            raise InvalidTask(
                f"task {task.module_path}: run_after must be an aware datetime (taskq's eta), "
                f"e.g. django.utils.timezone.now() + timedelta(minutes=5); got {run_after!r}"
            )
        try:
            registered_task(self, task)
        except ConfigurationError as exc:
            raise InvalidTask(f"task {task.module_path}: {exc}") from exc

    def taskq_queue(self, queue_name: str) -> str:
        """The taskq queue of a Django ``queue_name`` (``"default"``: the App's default)."""
        if queue_name == "default":
            return str(_app().settings.default_queue)
        return queue_name

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Enqueue one call; inside ``atomic()`` on :attr:`database`, in that transaction.

        ``task_enqueued`` is sent once the task exists: after the commit inside an atomic
        block (never on rollback), at once otherwise.

        Returns:
            A ``TaskResult`` in status READY whose ``id`` is the taskq task id.

        Raises:
            InvalidTask: the task is invalid for this backend.
            TypeError, ValueError: an argument JSON cannot hold exactly (``_json``).
            PublishError: outside a transaction, the broker did not confirm the message.
            OutboxError: the outbox row could not be written (tables not migrated?).
        """
        self.validate_task(task)
        call = self._call(task, args, kwargs)
        connection = connections[self.database]
        if connection.in_atomic_block:
            self._enqueue_in_transaction(call, connection)
        else:
            self._publish(call)
        return call.result

    def _call(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _Call:
        from taskq.contrib.django.models import TaskRecord

        args = json_value(list(args), what=f"task {task.module_path}: args")
        kwargs = json_value(dict(kwargs), what=f"task {task.module_path}: kwargs")
        result = self._ready_result(task, new_task_id(), args, kwargs)
        record = TaskRecord(
            id=result.id, task_path=task.module_path, backend=self.alias,
            queue_name=task.queue_name, priority=task.priority, run_after=task.run_after,
            args=args, kwargs=kwargs, enqueued_at=result.enqueued_at,
        )
        taskq_task = registered_task(self, task)
        app = taskq_task.app
        queue = self.taskq_queue(task.queue_name)
        priority = priority_for_queue(
            task.priority, takes_priorities=app.road.takes_priorities(queue),
            task=task.module_path, queue=queue,
        )
        outgoing = app.road.build(
            taskq_task, args, kwargs, queue=queue, priority=priority, task_id=result.id,
            eta=task.run_after,
        )
        return _Call(result, record, outgoing, app)

    def _enqueue_in_transaction(self, call: _Call, connection: Any) -> None:
        from taskq.contrib.django.outbox import DjangoOutbox

        # The outbox row first: a call too large to send raises before anything is written,
        # so a caller that catches it and commits leaves no record behind.
        call.app.enqueue(DjangoOutbox(connection), call.outgoing)
        call.record.save(using=self.database, force_insert=True)
        transaction.on_commit(partial(self._send_enqueued, call.result), using=self.database)

    def _publish(self, call: _Call) -> None:
        # The record first, so that a worker quick to start the task finds it.
        call.record.save(using=self.database, force_insert=True)
        try:
            call.app.send(call.outgoing)
        except BaseException:
            # The caller gets the error and no task id. Should an unconfirmed message still
            # arrive, the worker runs it without a record (nobody can ask for its result).
            call.record.delete(using=self.database)
            raise
        self._send_enqueued(call.result)

    def _ready_result(self, task: Any, task_id: str, args: Any, kwargs: Any) -> Any:
        return TaskResult(
            task=task, id=task_id, status=TaskResultStatus.READY, enqueued_at=timezone.now(),
            started_at=None, finished_at=None, last_attempted_at=None, args=args,
            kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[],
        )

    def _send_enqueued(self, result: Any) -> None:
        task_enqueued.send(type(self), task_result=result)

    # -- results -----------------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of ``result_id``, from its record and its ``taskq_results`` row.

        Raises:
            TaskResultDoesNotExist: no task of this backend has that id.
        """
        from taskq.contrib.django.tasks.results import read_result

        return read_result(self, result_id)

    # -- checks ------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[Any]:
        """System checks: the database alias exists and is the one taskq's outbox uses."""
        from taskq.contrib.django.tasks.checks import check_backend

        return [*super().check(**kwargs), *check_backend(self)]


@dataclass(frozen=True, slots=True)
class _Call:
    """One ``enqueue()``: what Django gets back, what is stored and what is sent."""

    result: Any
    record: Any
    outgoing: Any
    app: Any


def _taskq_setting() -> Mapping[str, Any]:
    from django.conf import settings

    config = getattr(settings, "TASKQ", None)
    return config if isinstance(config, Mapping) else {}


def _taskq_database() -> str:
    return str(_taskq_setting().get("database") or "default")


def _app() -> Any:
    from taskq.contrib.django.tasks.registration import project_app

    return project_app()
