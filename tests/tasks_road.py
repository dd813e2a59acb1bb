"""Tasks of the one-road combination test (``-A tests.tasks_road:app``).

One app with three queues, one of each kind: classic, quorum and ordered (4 partitions),
named ``<TASKQ_TEST_ROAD_PREFIX>.<kind>``. For each kind the same tasks exist, named
``road.<what>.<kind>`` and sent to that kind's queue (the ordered ones keyed by ``key``).
Every run that counts writes one row to ``road_effects`` in the task's own transaction
(``transactional=True``), so a run either lands once with its idempotency key or not at
all, and a duplicate run would show as a second row.

With ``TASKQ_TEST_ROAD_SCHEDULES=1`` each kind also has a periodic task (every second) of
its ``record`` task, which ``taskq worker --beat`` fires.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from taskq import App, Reject
from taskq.task import Task

PREFIX = os.environ.get("TASKQ_TEST_ROAD_PREFIX", "road-tests")
KINDS = ("classic", "quorum", "ordered")

app = App("taskq-road-tests")

effects_metadata = sa.MetaData()
effects = sa.Table(
    "road_effects",
    effects_metadata,
    sa.Column("n", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("marker", sa.String(200), nullable=False),
    sa.Column("task_id", sa.String(64), nullable=False),  # no unique key: duplicates show
    sa.Column("queue", sa.String(255), nullable=False),
)
# A marker whose gate row exists lets ``gate`` run (the replay path); absent, it rejects.
gates = sa.Table("road_gates", effects_metadata, sa.Column("marker", sa.String(200),
                                                           primary_key=True))


def queue_of(kind: str) -> str:
    """The queue of ``kind``."""
    return f"{PREFIX}.{kind}"


for _kind in KINDS:
    if _kind == "ordered":
        app.queue(queue_of(_kind), partitions=4)
    else:
        app.queue(queue_of(_kind), type=_kind)


def _write(task: Any, session: Any, marker: str) -> None:
    request = task.request
    session.execute(effects.insert().values(marker=marker, task_id=request.task_id,
                                            queue=request.queue))


def _tasks_of(kind: str) -> dict[str, Task[Any, Any]]:
    options: dict[str, Any] = {"queue": queue_of(kind), "transactional": True, "bind": True}
    if kind == "ordered":
        options["ordering_key"] = "key"

    @app.task(name=f"road.record.{kind}", **options)
    def record(self: Any, key: str, marker: str, *, session: Any) -> str:
        """Record one run of ``marker``; returns the marker (a chain passes it on)."""
        _write(self, session, marker)
        return marker

    @app.task(name=f"road.flaky.{kind}", max_retries=3, retry_backoff=0.2,
              retry_jitter=False, autoretry_for=(RuntimeError,), **options)
    def flaky(self: Any, key: str, marker: str, *, session: Any) -> None:
        """Fail the first attempt, record on the second (the retry path)."""
        if self.request.retries == 0:
            raise RuntimeError(f"{marker}: first attempt fails on purpose")
        _write(self, session, marker)

    @app.task(name=f"road.fail.{kind}", **options)
    def fail(self: Any, key: str, marker: str, *, session: Any) -> None:
        """Dead-letter at once (a workflow's member whose errback runs)."""
        raise Reject(f"{marker}: rejected on purpose")

    @app.task(name=f"road.errback.{kind}", **options)
    def errback(
        self: Any, workflow_id: str, failed_task_id: str, error: str, key: str, marker: str, *,
        session: Any,
    ) -> None:
        """A workflow's link_error: record that it ran."""
        _write(self, session, marker)

    @app.task(name=f"road.gate.{kind}", **options)
    def gate(self: Any, key: str, marker: str, *, session: Any) -> None:
        """Dead-letter until the test opens ``marker``'s gate; then record (replay path)."""
        if session.execute(sa.select(gates.c.marker).where(gates.c.marker == marker)).first():
            _write(self, session, marker)
            return
        raise Reject(f"{marker}: gate closed")

    return {"record": record, "flaky": flaky, "fail": fail, "errback": errback, "gate": gate}


TASKS = {kind: _tasks_of(kind) for kind in KINDS}

if os.environ.get("TASKQ_TEST_ROAD_SCHEDULES") == "1":
    for _kind in KINDS:
        app.add_periodic_task(1.0, TASKS[_kind]["record"], name=f"road-tick-{_kind}",
                              args=(f"tick-{_kind}", f"tick-{_kind}"))
