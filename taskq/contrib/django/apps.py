"""The Django app: reads ``settings.TASKQ`` in ``ready()``, then autodiscovers ``tasks``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig

from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)

# Keys of settings.TASKQ that are not taskq settings.
APP_KEY = "app"
DATABASE_KEY = "database"

_configured: App | None = None


class TaskqConfig(AppConfig):
    """``taskq.contrib.django``: configuration, autodiscovery, tables and commands."""

    name = "taskq.contrib.django"
    label = "taskq"
    verbose_name = "taskq"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        """Configure the project's App from ``settings.TASKQ`` and import ``tasks`` modules."""
        global _configured
        from django.conf import settings
        from django.utils.module_loading import autodiscover_modules

        _configured = configure(getattr(settings, "TASKQ", None), settings.DATABASES)
        autodiscover_modules("tasks")


def configure(config: Mapping[str, Any] | None, databases: Mapping[str, Any]) -> App:
    """Load the App named by ``config["app"]`` and apply the rest of ``config`` to it.

    Raises:
        ConfigurationError: ``TASKQ`` or its ``app`` is missing, a key names no setting, or
            the database cannot be derived.
    """
    from taskq.contrib.django.outbox import OutboxSessions, database_url
    from taskq.worker.process import load_app

    if not isinstance(config, Mapping) or not config.get(APP_KEY):
        raise ConfigurationError(
            'settings.TASKQ must name the project\'s App, e.g. TASKQ = {"app": '
            '"proj.taskq:app", "broker_url": "amqp://..."}'
        )
    settings = {k: v for k, v in config.items() if k not in (APP_KEY, DATABASE_KEY)}
    alias = config.get(DATABASE_KEY, "default")
    if alias not in databases:
        raise ConfigurationError(f"settings.TASKQ['database'] = {alias!r} is not in DATABASES")
    settings.setdefault("database_url", database_url(databases[alias]))
    try:
        app = load_app(config[APP_KEY])
        app.configure(**settings)
    except ConfigurationError as exc:
        raise ConfigurationError(f"settings.TASKQ: {exc}") from exc
    app.session_provider = OutboxSessions(alias)
    logger.debug("taskq app %s configured from settings.TASKQ", app.name)
    return app


def configured_app() -> App:
    """The App configured in ``ready()``."""
    if _configured is None:
        raise ConfigurationError(
            "taskq's Django app is not ready: add 'taskq.contrib.django' to INSTALLED_APPS "
            "and call django.setup() (manage.py does) first"
        )
    return _configured
