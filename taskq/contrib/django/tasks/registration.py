"""Each ``django.tasks`` function becomes a taskq task of the project's App, once.

The backend registers a function when Django builds its ``Task`` (``validate_task``, at
import): the worker imports the same ``tasks`` modules when Django is set up, so it finds
every task in its registry and never imports a name that arrives in a message.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.task import Task as TaskqTask

#: taskq task options a ``django.tasks`` function may set (``@task(...)`` or ``OPTIONS``).
TASK_OPTION_NAMES = (
    "max_retries", "retry_backoff", "retry_backoff_max", "retry_jitter", "autoretry_for",
    "dont_autoretry_for", "time_limit_s", "soft_time_limit_s", "idempotent",
)

_lock = threading.Lock()


def project_app() -> App:
    """The App named by ``settings.TASKQ["app"]`` (imported; configured once Django is ready).

    Raises:
        ImproperlyConfigured: ``settings.TASKQ`` names no App.
    """
    from django.conf import settings

    from taskq.worker.process import load_app

    config = getattr(settings, "TASKQ", None)
    if not isinstance(config, Mapping) or not config.get("app"):
        raise ImproperlyConfigured(
            "TaskqBackend runs tasks on the project's taskq App: add 'taskq.contrib.django' "
            'to INSTALLED_APPS and set TASKQ = {"app": "proj.taskq:app", ...}'
        )
    try:
        return load_app(str(config["app"]))
    except ConfigurationError as exc:
        raise ImproperlyConfigured(f"settings.TASKQ['app']: {exc}") from exc


def registered_task(backend: Any, task: Any) -> TaskqTask[..., Any]:
    """The taskq task that runs ``task`` (a Django Task), registered on first use.

    Raises:
        ConfigurationError: an invalid taskq option, or another function already holds the
            name ``task.module_path`` in the App.
    """
    from taskq.contrib.django.tasks.execution import DjangoTaskRunner
    from taskq.contrib.django.tasks.results import django_tasks

    app = project_app()
    name = task.module_path
    with _lock:
        if not getattr(backend, "queues_declared", False):
            _declare_queues(app, backend)
            backend.queues_declared = True
        existing = app.registry.lookup(name)
        if existing is not None:
            runner = existing.fn
            if not isinstance(runner, DjangoTaskRunner) or runner.task.func is not task.func:
                raise ConfigurationError(
                    f"the taskq App already has a task named {name!r} that is not this "
                    "django.tasks function; rename one of them"
                )
            return existing
        options = {**backend.task_defaults, **_own_options(task)}
        runner = DjangoTaskRunner(task, backend.alias)
        decorate: Any = app.task(name=name, store_result=True, **options)
        registered: TaskqTask[..., Any] = decorate(runner)
        runner.taskq_task = registered
        django_tasks[name] = task
        return registered


def _own_options(task: Any) -> dict[str, Any]:
    own = getattr(task, "taskq_options", None)
    return dict(own()) if callable(own) else {}


def _declare_queues(app: App, backend: Any) -> None:
    """Make the backend's QUEUES known to the App, so ``taskq worker`` consumes them."""
    known = set(app.queue_names())
    for name in sorted(backend.queues):
        if name != "default" and name not in known:
            app.queue(name)
