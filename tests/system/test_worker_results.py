"""Stored results of a real ``taskq worker``: a duplicate delivery never changes them."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from taskq import App
from taskq.schema import results_table
from tests import tasks
from tests.system.workers import Worker, send


def _row(app: App, task_id: str) -> dict[str, Any]:
    with app.engine.connect() as conn:
        row = conn.execute(
            sa.select(results_table).where(results_table.c.task_id == task_id)
        ).mappings().one()
    return dict(row)


def test_a_duplicate_of_a_finished_task_leaves_its_result_and_value(
    app: App, start_worker: Any
) -> None:
    # Given a task whose result is stored, run by a worker with one process
    app.create_tables()
    worker: Worker = start_worker("-c", "1", loglevel="INFO")
    first = send(app, tasks.add, 2, 3)
    assert first.get(timeout_s=30) == 5
    before = _row(app, first.id)

    # When the same message (same id) is delivered again, then another task after it
    send(app, tasks.add, 2, 3, task_id=first.id)
    later = send(app, tasks.add, 1, 1)
    assert later.get(timeout_s=30) == 2  # one process: the duplicate was handled before it

    # Then the duplicate was skipped, and the stored row is the first run's, value and all
    assert worker.log().count("is a duplicate") == 1
    assert first.get(timeout_s=1) == 5
    assert _row(app, first.id) == before
