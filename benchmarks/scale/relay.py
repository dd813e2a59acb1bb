"""The outbox relay's rate against the number of rows waiting, and its claim query's plan.

Rows are committed through the real API (``Task.delay_on`` in transactions of 500); for the
large backlog those rows are multiplied in SQL (new ids, later ``created_at``, no
idempotency key), which is far faster than committing a million rows one by one and leaves
the same rows a producer would. Then one relay drains the table (``run_once`` until it
returns 0): rate = rows / time. The claim statement is captured from the relay's own first
batch and explained (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back) with the backlog in place.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from benchmarks._contenders import Taskq
from benchmarks.compare import Harness

COMMIT_BATCH = 500
#: Rows committed through the API before the SQL multiplication.
API_ROWS = 5_000


def commit_rows(c: Taskq, rows: int) -> None:
    task = c.tasks["noop"]
    for first in range(0, rows, COMMIT_BATCH):
        with Session(c.app.engine) as session, session.begin():
            for _ in range(min(COMMIT_BATCH, rows - first)):
                task.delay_on(session)


def multiply_rows(engine: sa.Engine, total: int) -> None:
    """Grow ``taskq_outbox`` to ``total`` rows by copying the existing ones in SQL."""
    with engine.begin() as conn:
        have = conn.execute(sa.text("SELECT count(*) FROM taskq_outbox")).scalar_one()
        copies = -(-(total - have) // have)  # ceiling
        conn.execute(sa.text(
            "INSERT INTO taskq_outbox (id, queue, task, body, headers, priority, eta, "
            "idempotency_key, created_at, attempts, next_attempt_at, last_error) "
            "SELECT gen_random_uuid()::text, queue, task, body, headers, priority, eta, NULL, "
            "created_at - g * interval '1 millisecond', 0, "
            "next_attempt_at - g * interval '1 millisecond', NULL "
            "FROM taskq_outbox, generate_series(1, :copies) AS g LIMIT :extra"
        ), {"copies": copies, "extra": total - have})
        conn.execute(sa.text("ANALYZE taskq_outbox"))


class ClaimCapture:
    """Remembers the first claim statement (``FOR UPDATE`` on taskq_outbox) an engine runs."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.statement: tuple[str, Any] | None = None
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, parameters: Any,
              _context: Any, _many: bool) -> None:
        if self.statement is None and "FOR UPDATE" in statement and "taskq_outbox" in statement:
            self.statement = (statement, parameters)

    def explain(self) -> list[str]:
        sa.event.remove(self.engine, "before_cursor_execute", self._seen)
        if self.statement is None:
            return ["(no claim statement seen)"]
        statement, parameters = self.statement
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
            plan = [row[0] for row in cursor.fetchall()]
            raw.rollback()
        finally:
            raw.close()
        return plan


def drain(h: Harness, rows: int) -> dict[str, Any]:
    """Commit ``rows`` outbox rows, then time one relay publishing and deleting them.

    The relay's first batch runs before the clock starts: it carries the claim statement
    that is then explained, with the backlog still in the table.
    """
    c = Taskq(relay=True, label="taskq relay")
    with h.measurement(c, database=True):
        engine = c.app.engine
        with engine.begin() as conn:  # rows an earlier measurement left must not count
            conn.execute(sa.text("DELETE FROM taskq_outbox"))
        # An earlier round deleted a million rows: without a vacuum their dead tuples and
        # index entries slowed every later round (measured: 12,964 -> 7,458 -> 5,017 rows/s
        # for the 5,000-row point in three rounds).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE taskq_outbox"))
        commit_rows(c, min(rows, API_ROWS))
        if rows > API_ROWS:
            multiply_rows(engine, rows)
        relay = c.app.relay()
        capture = ClaimCapture(engine)
        first = relay.run_once()
        plan = capture.explain()
        started = time.perf_counter()
        published = 0
        while batch := relay.run_once():
            published += batch
        elapsed = time.perf_counter() - started
    if first + published != rows:
        raise RuntimeError(f"the relay published {first + published} of {rows} rows")
    return {"rows": rows, "published": first + published, "rate": published / elapsed,
            "plan": plan}
