"""Worker-side hook: close stale database connections around each task.

Django closes connections that are broken or older than ``CONN_MAX_AGE`` at the start and
end of every request (``close_old_connections`` on ``request_started`` and
``request_finished``). A worker process has no requests, so without this a connection the
database dropped overnight fails the next task. Installed in worker processes only (by
:mod:`taskq.contrib.django.worker`), never in web processes or tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import close_old_connections


@contextmanager
def fresh_connections() -> Iterator[None]:
    """Close unusable or expired connections before and after the task (a task context)."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()
