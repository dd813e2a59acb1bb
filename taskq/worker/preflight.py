"""Checks the supervisor makes once before any worker process starts.

* A task's time limit longer than the broker's consumer timeout is warned about (the broker
  would close the channel under a long task).
* Idempotent tasks need ``taskq_processed``: checked (on SQLite, created) here once, rather
  than raced for by every process; missing, it is a :class:`ConfigurationError` that says
  how to create it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from taskq.errors import ConfigurationError
from taskq.settings import redact_url
from taskq.worker.consumer_timeout import consumer_timeout_warnings
from taskq.worker.relay_process import ensure_table

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)


def warn_about_long_time_limits(app: App, queues: tuple[str, ...]) -> None:
    for warning in consumer_timeout_warnings(app, queues):
        logger.warning("%s", warning)


def ensure_idempotency_table(app: App) -> None:
    """Raise :class:`ConfigurationError` when idempotent tasks cannot find their table."""
    if not any(task.options.idempotent for task in app.registry):
        return
    try:
        ready = ensure_table(app, "taskq_processed", "idempotent tasks")
    except Exception as exc:  # SQLAlchemy errors: unreachable database, bad URL
        raise ConfigurationError(
            f"cannot reach the database {redact_url(app.settings.database_url)} that "
            f"holds idempotency keys: {exc}; idempotent tasks need it (or declare tasks "
            "with idempotent=False)"
        ) from exc
    finally:
        app.close()  # no pooled connection may be inherited by a process
    if not ready:
        raise ConfigurationError(
            "table taskq_processed is missing; run `taskq db create -A ...` (or migrate "
            "with taskq.metadata), or declare tasks with idempotent=False"
        )
