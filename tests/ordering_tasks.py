"""Tasks of the ordered-queue tests (``-A tests.ordering_tasks:app``).

The app takes broker, database and namespace from ``TASKQ_*`` variables and the ordered
queue's name and partition count from ``TASKQ_TEST_ORDERED_QUEUE`` and
``TASKQ_TEST_PARTITIONS``, which each test sets for its own workers. Every run that finishes
writes one row to ``ordering_effects`` in its own transaction (``transactional=True``): the
row commits with the task's idempotency key or not at all, so a killed run leaves no row and
a duplicate run would leave a second one. ``n`` (a sequence) orders the rows as they were
written; ``started``/``finished`` (epoch seconds) show which partitions ran at the same time.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from taskq import App

QUEUE = os.environ.get("TASKQ_TEST_ORDERED_QUEUE", "ordering-tests")
PARTITIONS = int(os.environ.get("TASKQ_TEST_PARTITIONS", "16"))

app = App("taskq-ordering-tests")
app.queue(QUEUE, partitions=PARTITIONS)

effects_metadata = sa.MetaData()
effects = sa.Table(
    "ordering_effects",
    effects_metadata,
    sa.Column("n", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("task_id", sa.String(64), nullable=False),  # no unique key: duplicates show
    sa.Column("queue", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("retries", sa.Integer, nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("finished", sa.Float, nullable=False),
)


class Flaky(Exception):
    """Raised by :func:`flaky` on its first attempts."""


def _record(task: Any, session: Any, key: str, seq: int, started: float) -> None:
    request = task.request
    session.execute(effects.insert().values(
        key=key, seq=seq, task_id=request.task_id, queue=request.queue, pid=os.getpid(),
        retries=request.retries, started=started, finished=time.time(),
    ))


@app.task(queue=QUEUE, ordering_key="key", transactional=True)
def step(key: str, seq: int, duration_ms: int, *, session: Any) -> None:
    """Take ``duration_ms``, then record ``(key, seq)``."""
    started = time.time()
    if duration_ms:
        time.sleep(duration_ms / 1000)
    _record(step, session, key, seq, started)


@app.task(
    queue=QUEUE, ordering_key="key", transactional=True, max_retries=3,
    retry_backoff=0.3, retry_jitter=False, autoretry_for=(Flaky,),
)
def flaky(key: str, seq: int, failures: int, *, session: Any) -> None:
    """Fail the first ``failures`` attempts, then record ``(key, seq)``."""
    started = time.time()
    if flaky.request.retries < failures:
        raise Flaky(f"attempt {flaky.request.retries + 1} of {key}/{seq} fails on purpose")
    _record(flaky, session, key, seq, started)


@app.task(queue=QUEUE, ordering_key="key", idempotent=False)
def noop(key: str) -> None:
    """Do nothing (the benchmark)."""


@app.task(
    queue=QUEUE, ordering_key="key", max_retries=3, retry_backoff=0.3, retry_jitter=False,
    autoretry_for=(Flaky,),
)
def flaky_line(key: str, seq: int, failures: int, path: str) -> None:
    """Idempotent, not transactional: fail ``failures`` attempts, then append a line."""
    retries = flaky_line.request.retries
    if retries < failures:
        raise Flaky(f"attempt {retries + 1} of {key}/{seq} fails on purpose")
    with open(path, "a", encoding="utf-8") as file:
        file.write(f"{key} {seq} {retries} {os.getpid()}\n")
