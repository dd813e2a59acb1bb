"""Tasks run by the cluster tests' workers (``-A tests.cluster.tasks:app``).

The app takes broker, database, namespace, queue and queue types from ``TASKQ_*`` variables
that each scenario sets for its own processes. Two records tell what happened to a task id
(the fault suite's convention, tests/faults):

- an *execution*: a line ``<kind> <task id> <pid> <x-delivery-count> <late ms>`` appended
  (``<late ms>``: how long after its eta (``taskq-eta``) it started, ``-`` without one; one short
  ``O_APPEND`` write: atomic between processes) to the file named by
  ``TASKQ_CLUSTER_EXECUTIONS`` when the body starts, outside any transaction: it counts runs;
- an *effect*: one row in ``cluster_effects``, written by a ``transactional=True`` task in
  its session and committed with its idempotency key or not at all. No unique key on
  purpose: a second row for an id is a duplicated effect, which the tests count.
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from taskq import App
from taskq.request import current_request

app = App("taskq-cluster")

EXECUTIONS_ENV = "TASKQ_CLUSTER_EXECUTIONS"

effects_metadata = sa.MetaData()
effects = sa.Table(
    "cluster_effects",
    effects_metadata,
    sa.Column("task_id", sa.String(64), nullable=False),  # no unique key: duplicates show
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("done_at", sa.Float, nullable=False),  # epoch seconds: when the effect was made
)


def record_execution(kind: str) -> str:
    """Append ``<kind> <task id> <pid> <delivery count> <late ms>``; return the task id."""
    request = current_request.get()
    assert request is not None, "called outside a worker"
    count = request.headers.get("x-delivery-count", 0)
    eta = request.eta
    late = round((time.time() - eta.timestamp()) * 1000) if eta is not None else "-"
    line = f"{kind} {request.task_id} {os.getpid()} {count} {late}\n".encode()
    fd = os.open(os.environ[EXECUTIONS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return request.task_id


def _effect(session: Any, task_id: str) -> None:
    session.execute(effects.insert().values(task_id=task_id, pid=os.getpid(), done_at=time.time()))


@app.task(transactional=True)
def work(duration_ms: int, *, session: Any) -> None:
    """Healthy work: record the run, take ``duration_ms``, write one effect row."""
    task_id = record_execution("exec")
    if duration_ms:
        time.sleep(duration_ms / 1000)
    _effect(session, task_id)


@app.task(transactional=True, max_retries=3, retry_backoff=2.0, retry_jitter=False,
          autoretry_for=(RuntimeError,))
def fails_once(*, session: Any) -> None:
    """Fail the first attempt (a delayed retry 2 s later, through the delay tiers), then work."""
    task_id = record_execution("exec")
    request = current_request.get()
    if request is not None and request.retries == 0:
        raise RuntimeError("the first attempt fails on purpose")
    _effect(session, task_id)
