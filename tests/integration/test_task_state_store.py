"""TaskStateStore on SQLite and PostgreSQL: what `taskq inspect` reads, and its pruning."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from taskq import App
from taskq.db import utcnow
from taskq.states.store import StateRow, TaskStateStore


def _row(task_id: str, state: str, age: timedelta) -> StateRow:
    return StateRow(task_id, "shop.ship", "default", state, 0, None, "host pid 1", None, None,
                    None, utcnow() - age)


def test_prune_deletes_only_records_not_updated_for_the_age(
    make_app: Callable[..., App], database_url: str
) -> None:
    app = make_app(database_url=database_url)
    app.create_tables()
    store = TaskStateStore(app.engine)
    store.write([_row(f"old-{i}", "SUCCESS", timedelta(days=8)) for i in range(5)]
                + [_row("recent", "STARTED", timedelta(minutes=1))])

    deleted = store.prune(older_than=timedelta(days=7), batch_size=2)

    assert deleted == 5
    assert store.read("old-0") is None
    recent = store.read("recent")
    assert recent is not None and recent.state == "STARTED"
