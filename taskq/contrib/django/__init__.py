"""Django integration: ``INSTALLED_APPS += ["taskq.contrib.django"]``.

.. code-block:: python

    # proj/taskq.py -- the project's App, like a Celery app module
    from taskq import App
    app = App("proj")

    # proj/settings.py
    INSTALLED_APPS = [..., "taskq.contrib.django"]
    TASKQ = {
        "app": "proj.taskq:app",          # required: module:attribute of the App
        "broker_url": "amqp://...",       # any taskq setting, by its name
        # "database": "default",          # the DATABASES alias of the outbox
        # "database_url": "...",          # default: derived from that alias
    }

    # shop/tasks.py -- found by autodiscovery in every installed app
    from proj.taskq import app

    @app.task
    def send_confirmation(order_id: int) -> None: ...

When Django is ready (``AppConfig.ready``), the App is configured from ``settings.TASKQ``
(over ``TASKQ_*`` environment variables) and every installed app's ``tasks`` module is
imported. Inside ``transaction.atomic()``, ``task.delay(...)`` writes its outbox row
through Django's own connection, so it commits or rolls back with the block; outside one
(autocommit) it publishes directly. ``python manage.py migrate`` creates taskq's tables;
``python manage.py taskq worker`` (``relay``, ``db prune``...) runs ``taskq`` with Django
set up in every worker process, closing stale database connections around each task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.app import App

__all__ = ["get_app"]


def get_app() -> App:
    """Return the App named by ``settings.TASKQ["app"]``, configured (after ``django.setup()``).

    Raises:
        ConfigurationError: Django is not set up yet, or ``taskq.contrib.django`` is not in
            ``INSTALLED_APPS``.
    """
    from taskq.contrib.django.apps import configured_app

    return configured_app()
