"""Tasks for the infrastructure-fault system tests (``-A tests.tasks_infra:app``).

Like :mod:`tests.tasks`, the app takes namespace, queue, broker and database from
``TASKQ_*`` variables. ``TASKQ_TEST_QUEUE_KIND`` shapes the default queue the way a test
needs it (the test's own App declares it the same way): ``full`` (``max_length=1``,
``reject-publish``: a retry into it is refused while a message waits) or ``quorum``
(``x-delivery-limit`` 2).
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa

from taskq import App
from tests.tasks import append_line

app = App("taskq-tests")

DELIVERY_LIMIT = 2


def shape_queue(target: App, kind: str | None) -> None:
    """Configure ``target``'s default queue for the test ``kind`` (see the module docstring)."""
    if kind == "full":
        target.queue(target.settings.default_queue, max_length=1, overflow="reject-publish")
    elif kind == "quorum":
        target.queue(
            target.settings.default_queue, type="quorum", delivery_limit=DELIVERY_LIMIT
        )


shape_queue(app, os.environ.get("TASKQ_TEST_QUEUE_KIND"))

effects_metadata = sa.MetaData()
effects = sa.Table(
    "test_infra_effects",
    effects_metadata,
    sa.Column("n", sa.Integer, nullable=False),  # no unique key on purpose: count duplicates
    sa.Column("retries", sa.Integer, nullable=False),
)


@app.task(transactional=True, bind=True)
def write_effect(self: Any, n: int, hold_s: float, *, session: Any) -> None:
    """Insert one effect row, then keep the transaction open ``hold_s`` before its commit."""
    session.execute(effects.insert().values(n=n, retries=self.request.retries))
    time.sleep(hold_s)


@app.task(bind=True, max_retries=3)
def retry_once_after_gate(self: Any, path: str, gate: str) -> None:
    """Attempt 0 waits for ``gate`` to exist, then asks for an immediate retry."""
    append_line(path, "run", self.request.retries)
    if self.request.retries:
        return
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    raise self.retry(countdown=0)


@app.task
def mark(path: str) -> None:
    """Append one ``ran`` line (an ``idempotent=True`` task, the default)."""
    append_line(path, "ran")


@app.task
def slow_mark(path: str, seconds: float) -> None:
    """Append ``start``, sleep, append ``done`` (an ``idempotent=True`` task)."""
    append_line(path, "start")
    time.sleep(seconds)
    append_line(path, "done")
