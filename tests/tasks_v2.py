"""The next deploy of :mod:`tests.tasks`: the same app, plus a task the first did not know.

``taskq dlq`` tests dead-letter a call of :func:`greet` with a worker of ``tests.tasks:app``
(``TaskNotRegistered``), then replay it to a worker of ``tests.tasks_v2:app``, which runs it.
"""

from __future__ import annotations

from tests.tasks import app, append_line

__all__ = ["app", "greet"]


@app.task(name="tests.deploy.greet")
def greet(path: str, who: str) -> None:
    """Record ``hello <who>``."""
    append_line(path, "hello", who)
