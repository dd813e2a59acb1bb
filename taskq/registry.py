"""TaskRegistry: the only way a task name in a message becomes code to run.

A worker looks task names up here and never imports or evaluates a name it received.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from taskq.errors import DuplicateTaskName, TaskNotRegistered

if TYPE_CHECKING:
    from taskq.task import Task


class TaskRegistry:
    """Maps task names to :class:`~taskq.task.Task` objects of one app."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}

    def add(self, task: Task[Any, Any]) -> None:
        """Register ``task`` under ``task.name``.

        Re-registering the same function (a module imported twice) is accepted.

        Raises:
            DuplicateTaskName: another function already has that name.
        """
        existing = self._tasks.get(task.name)
        if existing is not None and not _same_function(existing.fn, task.fn):
            raise DuplicateTaskName(
                f"task name {task.name!r} is already registered for "
                f"{existing.fn.__module__}.{existing.fn.__qualname__}; give one of them "
                "another name with @app.task(name=...)",
                task=task.name,
            )
        self._tasks[task.name] = task

    def get(self, name: str) -> Task[Any, Any]:
        """Return the task registered as ``name``.

        Raises:
            TaskNotRegistered: no such task in this app.
        """
        try:
            return self._tasks[name]
        except KeyError:
            raise TaskNotRegistered(
                f"task {name!r} is not registered in this app; make sure the module that "
                "defines it is imported by the app the worker runs (-A module:app)",
                task=name,
            ) from None

    def lookup(self, name: str) -> Task[Any, Any] | None:
        """Return the task registered as ``name``, or ``None`` (hot path, no exception)."""
        return self._tasks.get(name)

    def names(self) -> list[str]:
        """Return every registered name, sorted."""
        return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task[Any, Any]]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)


def _same_function(a: Any, b: Any) -> bool:
    return bool(
        a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)
    )
