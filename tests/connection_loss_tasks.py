"""Tasks of the ordered-queue connection-loss tests (``-A tests.connection_loss_tasks:app``).

Like :mod:`tests.ordering_tasks`, the app takes broker, database and namespace from
``TASKQ_*`` variables and its ordered queue's name and partition count from
``TASKQ_TEST_ORDERED_QUEUE`` and ``TASKQ_TEST_PARTITIONS``. Its tasks are idempotent and not
transactional, so their keys are claimed (PostgreSQL advisory locks) by the batch pre-check
of prefetched deliveries: the path where a lost connection left claims behind. Each run that
finishes appends ``key seq retries pid`` to the file it is given.
"""

from __future__ import annotations

import os
import time

from taskq import App

QUEUE = os.environ.get("TASKQ_TEST_ORDERED_QUEUE", "connection-loss-tests")
PARTITIONS = int(os.environ.get("TASKQ_TEST_PARTITIONS", "4"))

app = App("taskq-connection-loss-tests")
app.queue(QUEUE, partitions=PARTITIONS)


class Failing(Exception):
    """Raised by :func:`failing` on every attempt."""


def _line(path: str, key: str, seq: int, retries: int) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(f"{key} {seq} {retries} {os.getpid()}\n")


@app.task(queue=QUEUE, ordering_key="key")
def slow_line(key: str, seq: int, duration_ms: int, path: str) -> None:
    """Take ``duration_ms``, then append a line (idempotent: the default)."""
    if duration_ms:
        time.sleep(duration_ms / 1000)
    _line(path, key, seq, slow_line.request.retries)


@app.task(
    queue=QUEUE, ordering_key="key", max_retries=3, retry_backoff=1.0, retry_jitter=False,
    autoretry_for=(Failing,),
)
def failing(key: str, seq: int, path: str) -> None:
    """Fail on every attempt (after noting the attempt in ``path``)."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(f"attempt {key} {seq} {failing.request.retries} {os.getpid()}\n")
    raise Failing(f"{key}/{seq} fails on purpose")
