"""``taskq_task_states``: what a worker last saw happen to each task, written in batches.

Every worker process keeps the last event of each task it handled (started, retrying,
succeeded, dead-lettered, skipped as a duplicate) in memory and a thread of its own writes
them about once a second in one multi-row upsert (:class:`TaskStateStore.write`). A task that
starts and ends within one interval costs one row; nothing waits for the write, so the
task's own path gains no database round trip. The price: a process killed hard loses the
events of its last second (the lookup then falls back on ``taskq_processed``, the results and
the broker, :mod:`taskq.states.lookup`).

Rows only move forward, and the rule is in the upsert's SQL so that it holds across
processes: ``SUCCESS`` is never replaced (a redelivered copy found done is not a skip), and
otherwise a later event replaces an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq.db import as_aware, delete_in_batches, utcnow
from taskq.schema import task_states_table as t

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

#: The states this table holds (the ``AsyncResult.state`` spellings).
RECORDED_STATES = ("STARTED", "RETRY", "SUCCESS", "FAILURE", "DEAD", "SKIPPED")
_COLUMNS = ("task_id", "task", "queue", "state", "retries", "idempotency_key", "worker",
            "error", "next_at", "started_at", "updated_at")
# Forward only: a success stays; otherwise the later event wins. A row keeps its first
# start and its key when the event has none.
_ON_CONFLICT = (
    "ON CONFLICT (task_id) DO UPDATE SET queue = excluded.queue, state = excluded.state, "
    "retries = excluded.retries, worker = excluded.worker, error = excluded.error, "
    "next_at = excluded.next_at, updated_at = excluded.updated_at, "
    "started_at = coalesce(excluded.started_at, taskq_task_states.started_at), "
    "idempotency_key = coalesce(excluded.idempotency_key, taskq_task_states.idempotency_key) "
    "WHERE taskq_task_states.state <> 'SUCCESS' "
    "AND taskq_task_states.updated_at <= excluded.updated_at"
)
_POSTGRESQL_UPSERT = (
    f"INSERT INTO taskq_task_states ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[], "
    "%s::text[], %s::timestamptz[], %s::timestamptz[], %s::timestamptz[]) " + _ON_CONFLICT
)
_SQLITE_UPSERT = (
    f"INSERT INTO taskq_task_states ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_COLUMNS))}) " + _ON_CONFLICT
)
# Errors are kept short here: the full text and traceback live in Q.dlq and taskq_results.
ERROR_MAX_CHARS = 500


@dataclass(frozen=True, slots=True)
class StateRow:
    """One row of ``taskq_task_states``."""

    task_id: str
    task: str
    queue: str
    state: str
    retries: int
    idempotency_key: str | None
    worker: str | None
    error: str | None
    next_at: datetime | None
    started_at: datetime | None
    updated_at: datetime

    @property
    def attempt(self) -> int:
        """The attempt number for humans (``retries + 1``)."""
        return self.retries + 1


class TaskStateStore:
    """Writes, reads and prunes ``taskq_task_states``.

    Args:
        engine: Engine of the app's database.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name

    def write(self, rows: list[StateRow]) -> None:
        """Upsert ``rows`` in one statement and one transaction.

        Plain driver SQL, as in :mod:`taskq.idempotency`: SQLAlchemy would compile a
        statement of many VALUES rows anew each time, which costs more than the write. On
        PostgreSQL the rows travel as one array per column (``unnest``); on SQLite, which
        runs in this process, as an ``executemany``.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or the table is
                missing (the caller, a worker thread, logs it and drops the batch).
        """
        if not rows:
            return
        with self.engine.begin() as conn:
            if self._dialect == "postgresql":
                columns = list(zip(*(_values(row) for row in rows), strict=True))
                conn.exec_driver_sql(_POSTGRESQL_UPSERT, tuple(list(c) for c in columns))
            else:
                conn.exec_driver_sql(_SQLITE_UPSERT, [_sqlite_values(row) for row in rows])

    def read(self, task_id: str) -> StateRow | None:
        """The row of ``task_id``, or ``None``."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t).where(t.c.task_id == task_id)).mappings().first()
        if row is None:
            return None
        values = dict(row)
        for name in ("next_at", "started_at", "updated_at"):
            values[name] = as_aware(values[name])
        return StateRow(**values)

    def prune(self, *, older_than: timedelta, batch_size: int = 1000) -> int:
        """Delete rows not updated for ``older_than``, in short batches; return how many."""
        cutoff = utcnow() - older_than
        return delete_in_batches(self.engine, t.c.task_id, t.c.updated_at < cutoff, batch_size)


def _values(row: StateRow) -> tuple[Any, ...]:
    return tuple(getattr(row, name) for name in _COLUMNS)


def _sqlite_values(row: StateRow) -> tuple[Any, ...]:
    # The text SQLAlchemy stores for a DateTime on SQLite (naive UTC), so reads parse it.
    return tuple(
        value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        if isinstance(value, datetime) else value
        for value in _values(row)
    )
