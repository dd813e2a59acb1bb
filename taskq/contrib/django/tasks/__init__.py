"""A ``django.tasks`` backend: ``TASKS = {"default": {"BACKEND": "...tasks.TaskqBackend"}}``.

Functions decorated with ``django.tasks.task`` (Django 6.0+) or the ``django-tasks`` backport's
``django_tasks.task`` (Django 4.2 to 5.2) run on taskq's workers. Inside
``transaction.atomic()``, ``enqueue()`` writes the task's outbox row in that transaction: a
rollback leaves no task, a commit runs it once, even if the broker is down at that moment.
See ``docs/integrations.md`` for the options and what maps onto what.

Nothing is imported here until ``TaskqBackend`` (or ``TaskqTask``) is asked for: taskq's
Django app autodiscovers ``tasks`` modules, this package included, and a project without
``django.tasks`` must still start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TaskqBackend", "TaskqTask"]


def __getattr__(name: str) -> Any:
    if name == "TaskqBackend":
        from taskq.contrib.django.tasks.backend import TaskqBackend

        return TaskqBackend
    if name == "TaskqTask":
        from taskq.contrib.django.tasks.backend import TaskqTask

        return TaskqTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
