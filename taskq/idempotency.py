"""Idempotency keys: the ``taskq_processed`` table says which tasks are already done.

Every message carries a key (``taskq-idempotency-key``, the task id unless the producer set
one). Three ways to use it, from weakest to strongest:

- ``idempotent=False``: no database round trip; a duplicate delivery runs again.
- ``idempotent=True`` (default): :meth:`IdempotencyStore.is_done` before running (one
  SELECT), :meth:`IdempotencyStore.record` right after success (one INSERT). A crash between
  the task's external side effect and the INSERT can repeat that side effect on redelivery;
  so can two copies running at the same moment in two processes.
- ``transactional=True``: the key is inserted *first*, in the same transaction the task
  writes through, and committed with them (:meth:`IdempotencyStore.claim`). A concurrent
  duplicate blocks on the unique key until the first transaction ends, then sees the
  conflict and is acknowledged as a duplicate; a rollback leaves neither key nor writes.
  Effects in that database happen exactly once.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from taskq.db import dialect_of, utcnow
from taskq.schema import processed_table

logger = logging.getLogger(__name__)

_KEY = processed_table.c.key


class IdempotencyStore:
    """Checks and records idempotency keys in ``taskq_processed``.

    Args:
        engine: Engine of the database holding the table.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name
        self._exists = sa.select(sa.literal(1)).where(_KEY == sa.bindparam("key"))

    def is_done(self, key: str) -> bool:
        """Whether a task with this key already finished (one SELECT)."""
        with self.engine.connect() as conn:
            return conn.execute(self._exists, {"key": key}).first() is not None

    def record(self, key: str, task: str) -> bool:
        """Record ``key`` as done in its own short transaction (one INSERT).

        Returns:
            ``False`` if the key was already there (another copy finished first).
        """
        with self.engine.begin() as conn:
            return self.claim(conn, key, task)

    def claim(self, target: Session | Connection, key: str, task: str) -> bool:
        """Insert ``key`` in ``target``'s transaction; ``False`` if it is already there.

        On PostgreSQL an uncommitted insert of the same key by another transaction makes
        this wait until that one ends: the unique key decides which copy runs.
        """
        values = {"key": key, "task": task, "finished_at": utcnow()}
        dialect = dialect_of(target)
        if dialect == "postgresql":
            stmt: Any = postgresql.insert(processed_table).values(values)
            stmt = stmt.on_conflict_do_nothing(index_elements=["key"])
        elif dialect == "sqlite":
            stmt = sqlite.insert(processed_table).values(values).on_conflict_do_nothing()
        else:
            stmt = processed_table.insert().values(values)
        # RETURNING, not rowcount: psycopg reports -1 for INSERT ... ON CONFLICT DO NOTHING
        # through SQLAlchemy 2.1, on PostgreSQL a skipped row returns nothing.
        return target.execute(stmt.returning(_KEY)).first() is not None

    def prune(
        self, *, older_than: timedelta, batch_size: int = 1000, now: datetime | None = None
    ) -> int:
        """Delete keys older than ``older_than`` in batches; return how many were deleted.

        Each batch is its own short transaction, so pruning millions of keys never holds
        long locks against running workers.
        """
        cutoff = (now or utcnow()) - older_than
        t = processed_table
        total = 0
        while True:
            batch = sa.select(t.c.key).where(t.c.finished_at < cutoff).limit(batch_size)
            with self.engine.begin() as conn:
                deleted = conn.execute(t.delete().where(t.c.key.in_(batch.scalar_subquery())))
                count = int(deleted.rowcount or 0)
            total += count
            if count < batch_size:
                break
        logger.info("pruned %d idempotency keys older than %s", total, older_than)
        return total

    def count(self) -> int:
        """How many keys are stored."""
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(processed_table))
                       .scalar_one())
