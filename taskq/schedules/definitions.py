"""Periodic task definitions: what ``app.add_periodic_task`` and ``@app.periodic`` record.

Everything is checked when the definition is made: the schedule (a bad cron string or time
zone raises ``ConfigurationError`` with the reason), the task (registered in this app), the
name (unique per app, short enough for the idempotency key), the queue, the priority, the
``missed`` policy and the arguments (encoded once, so a ``SerializationError`` comes at
definition rather than at the first tick).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from taskq._suggest import did_you_mean
from taskq.broker.topology import validate_queue_name
from taskq.errors import ConfigurationError
from taskq.message import SCHEDULE, SCHEDULE_TICK, Envelope
from taskq.registry import TaskRegistry
from taskq.road import Outgoing
from taskq.schedules.catchup import validate_missed
from taskq.schedules.spec import Crontab, Every, to_schedule
from taskq.settings import Settings
from taskq.task import Task, validate_priority

# Longest schedule name: its idempotency key ("taskq-schedule:<name>@<tick>") fits 255.
NAME_MAX_CHARS = 200
_TASK_IDS = uuid.UUID("5d0b7a3e-4f3c-4b8e-9c51-2f6d1e7a9b40")


class ScheduleApp(Protocol):
    """What the definitions need of their app (:class:`~taskq.app.App` provides it)."""

    name: str
    registry: TaskRegistry
    settings: Settings


@dataclass(frozen=True)
class PeriodicTask:
    """One schedule of an app: which task runs when, with which arguments.

    Args:
        name: Unique per app; part of every tick's idempotency key.
        task: The task that runs.
        schedule: :class:`~taskq.schedules.spec.Every` or a crontab.
        args: Positional arguments of each run.
        kwargs: Keyword arguments of each run.
        queue: Overrides the task's queue.
        priority: Overrides the task's priority.
        missed: ``"once"``, ``"skip"`` or ``"all"`` (see :mod:`taskq.schedules.catchup`).
    """

    name: str
    task: Task[Any, Any]
    schedule: Every | Crontab
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    missed: str = "once"

    @property
    def target_queue(self) -> str:
        """The queue each run is sent to."""
        return self.queue or self.task.queue

    def idempotency_key(self, tick_at: datetime) -> str:
        """``taskq-schedule:<name>@<tick in ISO 8601 UTC>``: one per tick, everywhere."""
        return f"taskq-schedule:{self.name}@{iso_utc(tick_at)}"

    def outgoing(self, tick_at: datetime) -> Outgoing:
        """The message of the run for ``tick_at``, built by the app's road (checked and
        routed like any call); its task id is derived from the key too.

        Raises:
            TypeError, ConfigurationError, SerializationError, MessageTooLarge: as the road.
        """
        key = self.idempotency_key(tick_at)
        return self.task.app.road.build(
            self.task,
            self.args,
            self.kwargs,
            queue=self.queue,
            priority=self.priority,
            task_id=str(uuid.uuid5(_TASK_IDS, key)),
            idempotency_key=key,
            headers={SCHEDULE: self.name, SCHEDULE_TICK: iso_utc(tick_at)},
        )

    def envelope(self, tick_at: datetime) -> Envelope:
        """The envelope of :meth:`outgoing`."""
        return self.outgoing(tick_at).envelope

    def check(self) -> None:
        """Build one run's message now, so a run that could never be enqueued (arguments
        that do not fit the function, a priority or ordering key its queue refuses, a size
        over the limit) is refused when the schedule is defined, not at every tick.

        Raises:
            ConfigurationError: naming the periodic task, with the road's reason.
            TypeError: the arguments do not fit the task function.
        """
        try:
            self.outgoing(datetime.now(timezone.utc))
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"periodic task {self.name!r}: {exc.message}", task=self.task.name,
                queue=self.target_queue,
            ) from None
        except TypeError as exc:
            raise TypeError(f"periodic task {self.name!r}: {exc}") from None


def iso_utc(moment: datetime) -> str:
    """``2026-12-01T11:40:05Z`` (microseconds only when there are some)."""
    text = moment.astimezone(timezone.utc).replace(tzinfo=None).isoformat()
    return f"{text}Z"


class Schedules:
    """The periodic tasks of one app, by name."""

    def __init__(self, app: ScheduleApp) -> None:
        self._app = app
        self._by_name: dict[str, PeriodicTask] = {}

    def __iter__(self) -> Iterator[PeriodicTask]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> PeriodicTask | None:
        """The definition called ``name``, if any."""
        return self._by_name.get(name)

    def add(
        self,
        schedule: object,
        task: Task[Any, Any] | str,
        *,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        missed: str = "once",
    ) -> PeriodicTask:
        """Define a periodic task (see :meth:`taskq.app.App.add_periodic_task`)."""
        resolved = self._task(task)
        self._check_name(name)
        if not isinstance(args, (list, tuple)):
            raise ConfigurationError(
                f"periodic task {name!r}: args must be a list or tuple, not {type(args).__name__}"
            )
        if queue is not None:
            validate_queue_name(queue)
        if priority is not None:
            validate_priority(priority)
        definition = PeriodicTask(
            name=name,
            task=resolved,
            schedule=_schedule(name, schedule),
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            queue=queue,
            priority=priority,
            missed=_missed(name, missed),
        )
        definition.check()
        self._by_name[name] = definition
        return definition

    def decorator(
        self, schedule: object, *, name: str | None = None, **options: Any
    ) -> Callable[[Any], Any]:
        """``@app.periodic(schedule, name=...)`` over a task (or a function, registered
        as a task with default options); returns it unchanged."""

        def define(target: Any) -> Any:
            task = target if isinstance(target, Task) else self._register(target)
            self.add(schedule, task, name=name or task.name, **options)
            return task

        return define

    def _register(self, fn: Any) -> Task[Any, Any]:
        task_decorator = getattr(self._app, "task", None)
        if not callable(fn) or task_decorator is None:
            raise ConfigurationError(f"@app.periodic needs a task or a function, got {fn!r}")
        task: Task[Any, Any] = task_decorator(fn)
        return task

    def _task(self, task: Task[Any, Any] | str) -> Task[Any, Any]:
        if isinstance(task, str):
            found = self._app.registry.lookup(task)
            if found is None:
                names = self._app.registry.names()
                raise ConfigurationError(
                    f"periodic task: task {task!r} is not registered in app "
                    f"{self._app.name!r}{did_you_mean(task, names)}; register it with "
                    "@app.task before the schedule that names it, or pass the task itself"
                )
            return found
        if not isinstance(task, Task):
            raise ConfigurationError(f"periodic task needs a task or a task name, not {task!r}")
        if not _same(task.app, self._app):
            raise ConfigurationError(
                f"task {task.name!r} belongs to another app; add its schedule to that app"
            )
        return task

    def _check_name(self, name: object) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"a periodic task needs a non-empty name, not {name!r}")
        if len(name) > NAME_MAX_CHARS:
            raise ConfigurationError(
                f"periodic task name {name[:40]!r}... is longer than {NAME_MAX_CHARS} "
                "characters (it is part of each run's idempotency key)"
            )
        if name in self._by_name:
            raise ConfigurationError(
                f"a periodic task named {name!r} is already defined in app "
                f"{self._app.name!r}; names are unique per app"
            )


def _schedule(name: str, schedule: object) -> Every | Crontab:
    try:
        return to_schedule(schedule)
    except ConfigurationError as exc:
        raise ConfigurationError(f"periodic task {name!r}: {exc}") from None


def _missed(name: str, missed: object) -> str:
    try:
        return validate_missed(missed)
    except ConfigurationError as exc:
        raise ConfigurationError(f"periodic task {name!r}: {exc}") from None


def _same(a: object, b: object) -> bool:
    return a is b
