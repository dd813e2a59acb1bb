"""An app whose tasks have no hard time limit: its quorum consumers ask for exactly
``consumer_timeout_s`` (tests/system/test_worker_quorum_limits.py)."""

from __future__ import annotations

import time

from taskq import App
from tests.tasks import append_line

app = App("taskq-consumer-timeout-tests")


@app.task(idempotent=False, max_retries=0)
def slow_unkeyed(path: str, seconds: float, tag: str = "-") -> None:
    """Record ``start``, sleep, record ``done``; no time limit, idempotency check or retry."""
    append_line(path, "start", tag)
    time.sleep(seconds)
    append_line(path, "done", tag)


@app.task
def record(path: str, tag: str = "-") -> None:
    """Record one run: ``ran <tag> <pid>``."""
    append_line(path, "ran", tag)
