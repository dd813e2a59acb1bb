"""``-A taskq.contrib.django.worker:app``: the project's App, with Django set up.

``python manage.py taskq worker`` passes this path to ``taskq worker``. Each worker process
is a fresh interpreter: reading ``app`` here runs ``django.setup()`` (with the inherited
``DJANGO_SETTINGS_MODULE``), which configures the App and imports every ``tasks`` module,
and adds the hook that closes stale database connections around each task. Without
``manage.py``: ``DJANGO_SETTINGS_MODULE=proj.settings taskq worker -A
taskq.contrib.django.worker:app``.
"""

from __future__ import annotations

from typing import Any

from taskq.errors import ConfigurationError

APP_PATH = f"{__name__}:app"


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return worker_app()


def worker_app() -> Any:
    """Set Django up (once) and return the configured App, with the worker hook added."""
    import django
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    from taskq.contrib.django import get_app
    from taskq.contrib.django.middleware import fresh_connections

    if not apps.ready:
        try:
            django.setup()
        except ImproperlyConfigured as exc:
            raise ConfigurationError(
                f"cannot set Django up for the taskq worker: {exc}; run it with "
                "`python manage.py taskq worker` or set DJANGO_SETTINGS_MODULE"
            ) from exc
    app = get_app()
    if fresh_connections not in app.task_context:
        app.task_context.insert(0, fresh_connections)
    return app
