"""OutboxStore: the SQL of the ``taskq_outbox`` table.

``add`` runs in the caller's transaction (an ORM ``Session`` or a Core ``Connection``) and
never commits. ``claim`` takes a batch of due rows: on PostgreSQL with
``FOR UPDATE SKIP LOCKED`` so several relays share the work without publishing a row twice.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgpack
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from taskq.db import as_aware, dialect_of, utcnow
from taskq.errors import OutboxError
from taskq.schema import outbox_table

logger = logging.getLogger(__name__)

# PostgreSQL channel the relay LISTENs on; NOTIFY is sent inside the producer's
# transaction, so PostgreSQL delivers it only if (and when) that transaction commits.
NOTIFY_CHANNEL = "taskq_outbox"


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One task waiting in the outbox."""

    id: str
    queue: str
    task: str
    body: bytes
    headers: dict[str, Any] | None  # None: the stored headers could not be decoded
    priority: int
    eta: datetime | None
    idempotency_key: str | None
    created_at: datetime
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    ordering_key: str | None = None  # ordered queues: relayed one at a time per key


@dataclass(frozen=True, slots=True)
class Backlog:
    """How much waits in the outbox: rows, the oldest row's age, rows marked failing."""

    rows: int
    oldest_created_at: datetime | None
    failing_rows: int

    def oldest_age_s(self, now: datetime | None = None) -> float:
        """Age of the oldest row in seconds (0 when empty)."""
        if self.oldest_created_at is None:
            return 0.0
        return max(0.0, ((now or utcnow()) - self.oldest_created_at).total_seconds())


class OutboxStore:
    """Reads and writes ``taskq_outbox`` rows."""

    def __init__(self) -> None:
        self._notified: weakref.WeakSet[Any] = weakref.WeakSet()
        self._last_created_at: datetime | None = None

    def add(self, target: Session | Connection, row: OutboxRow) -> bool:
        """Insert ``row`` in ``target``'s current transaction; do not commit.

        A row whose id or idempotency key is already in the outbox is skipped.

        ``target`` may also be an object with a ``taskq_add_outbox_row(row) -> bool`` method:
        a framework's own connection (``taskq.contrib.django``), which runs the SQL of
        :func:`compile_insert` in its own transaction.

        Returns:
            ``True`` if the row was inserted, ``False`` if it was a duplicate.
        """
        add_row = getattr(target, "taskq_add_outbox_row", None)
        if add_row is not None:
            return bool(add_row(row))
        dialect = dialect_of(target)
        inserted = target.execute(insert_statement(row, dialect)).first() is not None
        if inserted and dialect == "postgresql":
            self._notify_once(target)
        return inserted

    def _notify_once(self, target: Session | Connection) -> None:
        transaction = target.get_transaction()
        if transaction is None or transaction in self._notified:
            return
        target.execute(sa.select(sa.func.pg_notify(NOTIFY_CHANNEL, "")))
        self._notified.add(transaction)

    def claim(self, conn: Connection, *, limit: int, now: datetime) -> list[OutboxRow]:
        """Return up to ``limit`` due rows, oldest first.

        On PostgreSQL the rows stay locked (``SKIP LOCKED`` for other relays) until
        ``conn``'s transaction ends, so claim, publish and delete belong in one transaction.

        A row with an ordering key is claimed only while no older undelayed row of its key
        and queue is left (:func:`_is_head_of_key`): that older row is being relayed by
        another relay, or waits for its retry after a failed publish, and SKIP LOCKED alone
        would let this one overtake it. So each key's rows reach the broker one after
        another, oldest first, however many relays run.
        """
        t = outbox_table
        stmt = (
            sa.select(t)
            .where(t.c.next_attempt_at <= now, _is_head_of_key())
            .order_by(t.c.next_attempt_at, t.c.created_at)
            .limit(limit)
        )
        if conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True, of=t)
        return [_row_from_db(r) for r in conn.execute(stmt).mappings()]

    def delete(self, conn: Connection, ids: list[str]) -> int:
        """Delete the rows whose ids are given (they were confirmed by the broker)."""
        if not ids:
            return 0
        return conn.execute(outbox_table.delete().where(outbox_table.c.id.in_(ids))).rowcount

    def defer(
        self,
        conn: Connection,
        row: OutboxRow,
        *,
        next_attempt_at: datetime,
        error: str,
    ) -> None:
        """Record a failed publish of ``row`` and hold it until ``next_attempt_at``."""
        conn.execute(
            outbox_table.update()
            .where(outbox_table.c.id == row.id)
            .values(
                attempts=outbox_table.c.attempts + 1,
                next_attempt_at=next_attempt_at,
                last_error=error[:2000],
            )
        )

    def reschedule(self, conn: Connection, row: OutboxRow, *, next_attempt_at: datetime) -> None:
        """Hold ``row`` until ``next_attempt_at`` without counting a failed attempt."""
        conn.execute(
            outbox_table.update()
            .where(outbox_table.c.id == row.id)
            .values(next_attempt_at=next_attempt_at)
        )

    def backlog(self, engine: Engine) -> Backlog:
        """Count waiting rows and find the oldest (for ``taskq status`` and metrics)."""
        t = outbox_table
        stmt = sa.select(
            sa.func.count(),
            sa.func.min(t.c.created_at),
            sa.func.count(t.c.last_error),
        )
        try:
            with engine.connect() as conn:
                count, oldest, failing = conn.execute(stmt).one()
        except sa.exc.SQLAlchemyError as exc:
            raise OutboxError(f"cannot read the outbox backlog: {exc}") from exc
        return Backlog(int(count), as_aware(oldest), int(failing))

    def next_due_at(self, conn: Connection) -> datetime | None:
        """When the earliest row becomes due (lets an idle relay sleep exactly that long)."""
        value = conn.execute(sa.select(sa.func.min(outbox_table.c.next_attempt_at))).scalar()
        return as_aware(value)

    def created_at(self) -> datetime:
        """A creation time strictly after the previous one from this store.

        Rows are relayed oldest first; within one process, two rows enqueued in the same
        microsecond still keep their order.
        """
        now = utcnow()
        last = self._last_created_at
        if last is not None and now <= last:
            now = last + timedelta(microseconds=1)
        self._last_created_at = now
        return now


def _is_head_of_key() -> Any:
    """No older row of the same queue and ordering key without an eta waits before it.

    Rows without a key, and delayed rows (they enter their partition when due), are always
    heads. Ties of ``created_at`` (two producer processes in one microsecond) go by id.
    """
    t = outbox_table
    older = outbox_table.alias("older")
    earlier = sa.or_(
        older.c.created_at < t.c.created_at,
        sa.and_(older.c.created_at == t.c.created_at, older.c.id < t.c.id),
    )
    blocked = sa.exists().where(
        older.c.queue == t.c.queue,
        older.c.ordering_key == t.c.ordering_key,
        older.c.eta.is_(None),
        earlier,
    )
    return sa.or_(t.c.ordering_key.is_(None), t.c.eta.is_not(None), ~blocked)


def insert_statement(row: OutboxRow, dialect: str) -> Any:
    """The INSERT of ``row`` for ``dialect``: skips duplicates and returns the id if inserted."""
    values = _row_values(row)
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(outbox_table).values(values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite.insert(outbox_table).values(values).on_conflict_do_nothing()
    else:
        stmt = outbox_table.insert().values(values)
    # RETURNING rather than rowcount, which psycopg reports as -1 for ON CONFLICT.
    return stmt.returning(outbox_table.c.id)


# Dialects that render ``%s`` placeholders, the style of Django's cursors on every backend.
_FORMAT_DIALECTS: dict[str, Any] = {
    "postgresql": postgresql.psycopg.dialect(paramstyle="format"),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.pysqlite.dialect(paramstyle="format"),
}


def compile_insert(row: OutboxRow, dialect: str) -> tuple[str, list[Any]]:
    """The SQL text of :func:`insert_statement`, with ``%s`` placeholders, and its parameters.

    For connections that SQLAlchemy does not manage (``taskq.contrib.django``): the values
    are converted exactly as SQLAlchemy would convert them (e.g. SQLite datetimes), so rows
    written this way and rows written through a ``Session`` look the same to the relay.

    Raises:
        OutboxError: ``dialect`` is neither ``postgresql`` nor ``sqlite``.
    """
    compiled = ForeignCursorStatement(insert_statement(row, dialect), dialect)
    return compiled.sql, compiled.parameters(None)


class ForeignCursorStatement:
    """A SQLAlchemy Core statement of taskq's rendered for a DB-API cursor SQLAlchemy does
    not manage (Django's): ``%s`` placeholders, values converted as SQLAlchemy converts them.

    Args:
        statement: The statement (its own ``.values()`` included).
        dialect: ``postgresql`` or ``sqlite``.
        keys: The names of the parameters each execution passes (an ``insert()`` without
            values, run once per row), if any.

    Raises:
        OutboxError: ``dialect`` is neither ``postgresql`` nor ``sqlite``.
    """

    def __init__(self, statement: Any, dialect: str, keys: Sequence[str] = ()) -> None:
        sa_dialect = _FORMAT_DIALECTS.get(dialect)
        if sa_dialect is None:
            raise OutboxError(
                f"the outbox supports PostgreSQL and SQLite connections, not {dialect!r}"
            )
        self._compiled = statement.compile(dialect=sa_dialect, column_keys=list(keys) or None)
        self._processors = [
            (name, self._compiled.binds[name].type.dialect_impl(sa_dialect)
             .bind_processor(sa_dialect))
            for name in self._compiled.positiontup or ()
        ]
        self.sql = str(self._compiled)

    def parameters(self, values: Mapping[str, Any] | None) -> list[Any]:
        """The positional parameters of one execution with ``values``."""
        merged = self._compiled.construct_params(dict(values) if values else None)
        return [process(merged[name]) if process else merged[name]
                for name, process in self._processors]


def _row_values(row: OutboxRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "queue": row.queue,
        "task": row.task,
        "body": row.body,
        "headers": msgpack.packb(row.headers, use_bin_type=True),
        "priority": row.priority,
        "eta": row.eta,
        "idempotency_key": row.idempotency_key,
        "created_at": row.created_at,
        "attempts": row.attempts,
        "next_attempt_at": row.next_attempt_at or row.eta or row.created_at,
        "last_error": row.last_error,
        "ordering_key": row.ordering_key,
    }


def _row_from_db(r: Any) -> OutboxRow:
    return OutboxRow(
        id=r["id"],
        queue=r["queue"],
        task=r["task"],
        body=bytes(r["body"]),
        headers=_headers_from_db(r["headers"]),
        priority=r["priority"],
        eta=as_aware(r["eta"]),
        idempotency_key=r["idempotency_key"],
        created_at=as_aware(r["created_at"]),  # type: ignore[arg-type]
        attempts=r["attempts"],
        next_attempt_at=as_aware(r["next_attempt_at"]),
        last_error=r["last_error"],
        ordering_key=r["ordering_key"],
    )


def _headers_from_db(value: bytes) -> dict[str, Any] | None:
    try:
        headers = msgpack.unpackb(value, raw=False)
    except Exception:  # a corrupt row must not stop the relay; it is marked, not published
        return None
    return headers if isinstance(headers, dict) else None
