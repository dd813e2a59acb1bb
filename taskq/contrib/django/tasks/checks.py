"""System checks of ``TaskqBackend`` (``manage.py check``): its database and taskq's app."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core import checks


def check_backend(
    backend: Any, databases: Mapping[str, Any] | None = None
) -> list[checks.CheckMessage]:
    """Errors that would make ``enqueue()`` lose or misplace tasks.

    Args:
        backend: The TaskqBackend.
        databases: ``settings.DATABASES`` unless given.

    - ``taskq.E101``: ``taskq.contrib.django`` is not installed (no tables, no App).
    - ``taskq.E102``: ``OPTIONS["database"]`` is not in ``DATABASES``.
    - ``taskq.E103``: that database is not the one taskq's relay reads (``TASKQ["database"]``
      or ``TASKQ["database_url"]``): outbox rows written there would never be published.
    """
    from django.apps import apps
    from django.conf import settings

    databases = settings.DATABASES if databases is None else databases
    where = f"TASKS[{backend.alias!r}]"
    if not apps.is_installed("taskq.contrib.django"):
        return [checks.Error(
            f"{where} uses TaskqBackend but 'taskq.contrib.django' is not in INSTALLED_APPS",
            hint="Add it, set TASKQ = {'app': 'proj.taskq:app'} and run migrate.",
            id="taskq.E101",
        )]
    if backend.database not in databases:
        return [checks.Error(
            f"{where}['OPTIONS']['database'] = {backend.database!r} is not in DATABASES",
            hint=f"Use one of {', '.join(sorted(databases))}.",
            id="taskq.E102",
        )]
    return _same_database(backend, where, databases)


def _same_database(backend: Any, where: str, databases: Any) -> list[checks.CheckMessage]:
    from taskq.contrib.django.apps import configured_app
    from taskq.contrib.django.outbox import database_url
    from taskq.errors import ConfigurationError

    try:
        relay_url = configured_app().settings.database_url
        url = database_url(databases[backend.database])
    except ConfigurationError as exc:
        return [checks.Error(f"{where}: {exc}", id="taskq.E103")]
    if url == relay_url:
        return []
    from taskq.settings import redact_url

    return [checks.Error(
        f"{where} enqueues in the transactions of database {backend.database!r}, but taskq's "
        f"relay reads the outbox of {redact_url(relay_url)}: its tasks would never be "
        "published",
        hint=f"Set TASKQ['database'] = {backend.database!r} (or OPTIONS['database'] to "
        "taskq's alias): the outbox must live in the database whose transactions enqueue.",
        id="taskq.E103",
    )]
