"""Tasks for the dashboard's browser tests (``-A tests.tasks_dashboard:app``).

Like :mod:`tests.tasks`, the app takes its namespace, queue, broker and database from
``TASKQ_*`` variables that each test sets for its own worker and dashboard.
"""

from __future__ import annotations

import os

from taskq import App
from tests.tasks import append_line

app = App("taskq-dashboard-tests")


@app.task
def record(path: str, tag: str = "-") -> None:
    """Record one run: ``ran <tag> <pid>``."""
    append_line(path, "ran", tag)


@app.task(max_retries=0, store_result=True)
def broken_until_fixed(path: str, flag: str, note: str = "") -> str:
    """Record the run; fail (no retries: dead-lettered) until the file ``flag`` exists."""
    append_line(path, "ran", "broken_until_fixed")
    if not os.path.exists(flag):
        raise ValueError(f"the flag file {flag} is missing")
    return f"fixed {len(note)}"
