"""The project's taskq App, named in ``settings.TASKQ["app"]`` (like a Celery app module).

Its settings come from ``settings.TASKQ`` and ``TASKQ_*`` environment variables; tasks are
defined in each app's ``tasks.py``, which taskq imports when Django is ready.
"""

from __future__ import annotations

from taskq import App

app = App("django-shop")
