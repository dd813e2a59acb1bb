"""Rows written through a DB-API cursor SQLAlchemy does not manage (Django's), on SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy as sa

from taskq.db import as_aware, utcnow
from taskq.outbox.store import ForeignCursorStatement
from taskq.schema import metadata, workflow_members_table, workflows_table


def test_workflow_rows_written_through_a_foreign_cursor_read_back_as_sqlalchemy_wrote_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.sqlite3"
    engine = sa.create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)
    created_at = utcnow()
    workflow = ForeignCursorStatement(workflows_table.insert().values(
        id="wf-1", kind="chain", state="RUNNING", step=0, steps=2, remaining=1,
        created_at=created_at, link_error=None,
    ), "sqlite")
    members = [
        {"task_id": f"m-{i}", "workflow_id": "wf-1", "step": i, "position": 0, "task": "t",
         "queue": "q", "state": "ENQUEUED" if i == 0 else "PENDING", "call": bytes([i])}
        for i in range(2)
    ]
    member = ForeignCursorStatement(workflow_members_table.insert(), "sqlite", list(members[0]))

    # Django's SQLite cursor turns the %s placeholders into qmarks; so does this test.
    connection = sqlite3.connect(path)
    connection.execute(workflow.sql.replace("%s", "?"), workflow.parameters(None))
    connection.executemany(member.sql.replace("%s", "?"), [member.parameters(m) for m in members])
    connection.commit()
    connection.close()

    with engine.connect() as conn:
        row = conn.execute(sa.select(workflows_table)).one()
        read = conn.execute(
            sa.select(workflow_members_table).order_by(workflow_members_table.c.step)
        ).all()
    assert (row.id, row.kind, row.steps, row.remaining) == ("wf-1", "chain", 2, 1)
    assert as_aware(row.created_at) == created_at
    assert [(m.task_id, m.state, m.call) for m in read] == [
        ("m-0", "ENQUEUED", b"\x00"), ("m-1", "PENDING", b"\x01"),
    ]
    engine.dispose()
