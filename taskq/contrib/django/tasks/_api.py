"""The ``django.tasks`` names, from Django 6.0+ or from the ``django-tasks`` backport.

Both define the same classes and signals; the backport spells two exceptions differently
(``InvalidTaskError`` for ``InvalidTask``). Everything else in this package imports them
from here.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
except ImportError:  # Django < 6: the backport, if installed
    try:
        from django_tasks import (  # type: ignore[no-redef, unused-ignore]
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef, unused-ignore]
        from django_tasks.base import Task, TaskError  # type: ignore[no-redef, unused-ignore]
        from django_tasks.exceptions import (  # type: ignore[no-redef, unused-ignore]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef, unused-ignore]
        from django_tasks.signals import (  # type: ignore[no-redef, unused-ignore]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef, unused-ignore]
    except ImportError as exc:
        raise ImproperlyConfigured(
            "taskq.contrib.django.tasks.TaskqBackend needs django.tasks: Django 6.0 or "
            "newer, or on Django 4.2 to 5.2 the backport (pip install 'taskq[django-tasks]')"
        ) from exc
    SOURCE = "django_tasks"

__all__ = [
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
