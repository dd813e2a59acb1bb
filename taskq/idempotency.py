"""Idempotency keys: the ``taskq_processed`` table says which tasks are already done.

Every message carries a key (``taskq-idempotency-key``, the task id unless the producer set
one). Three ways to use it, from weakest to strongest:

- ``idempotent=False``: no database round trip; a duplicate delivery runs again.
- ``idempotent=True`` (default): the key is *claimed* before running, checked, and
  :meth:`IdempotencyStore.record` ed right after success (one INSERT). On PostgreSQL the
  claim is a session-level advisory lock on the key (:meth:`IdempotencyStore.claim_many`,
  one statement for a whole prefetch batch): a second copy in another process finds the key
  claimed and goes back to the queue instead of running beside the first, and the check runs
  after the claim is taken, so its answer cannot be stale. The lock belongs to the worker
  process's database session, so a process that dies mid-task releases it with its
  connection: a copy sent back meanwhile then runs (never lost). On SQLite there is no such
  lock; the key is checked right before running, which leaves two copies that start at the
  same moment free to both run. A crash between the task's external side effect and the
  INSERT can repeat that side effect on redelivery.
- ``transactional=True``: the key is inserted *first*, in the same transaction the task
  writes through, and committed with them (:meth:`IdempotencyStore.claim`). A concurrent
  duplicate blocks on the unique key until the first transaction ends, then sees the
  conflict and is acknowledged as a duplicate; a rollback leaves neither key nor writes.
  Effects in that database happen exactly once. If the connection is lost during COMMIT the
  outcome is unknown to the worker; the delivery goes back to the queue, and on redelivery
  the key row decides: committed, the copy is a duplicate and acked; not committed, it runs
  again.

Connection failures of taskq's own database are infrastructure faults, not task failures
(:func:`is_database_outage`, docs/reliability.md): the worker sends the delivery back to its queue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from taskq.db import delete_in_batches, dialect_of, utcnow
from taskq.errors import IdempotencyError
from taskq.schema import processed_table
from taskq.settings import redact_url

logger = logging.getLogger(__name__)

_KEY = processed_table.c.key


# SQLSTATE classes and codes that mean the session is gone or the server unavailable:
# connection exceptions (08...), admin/crash shutdown and "cannot connect now" (57P0x).
_OUTAGE_SQLSTATE_CLASSES = ("08",)
_OUTAGE_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# Seed of the advisory-lock key hash; a constant of taskq's own, so that the locks of its
# keys do not land on the bigint locks an application derives with the default seed.
_CLAIM_SEED = 0x7461736B71  # "taskq"


def is_database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached (not what the SQL did).

    Decided by exception type and attributes, never by message text: an
    :class:`~taskq.errors.IdempotencyError`; an SQLAlchemy error whose connection was
    invalidated (its dialect recognised a disconnect); a psycopg ``OperationalError`` with no
    SQLSTATE (the client lost or could not open the connection) or a connection-class one.
    A statement timeout, a deadlock, an ``IntegrityError`` or a ``ProgrammingError`` in the
    task's own SQL are not outages. The cause chain is followed.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, IdempotencyError):
            return True
        if isinstance(current, sa.exc.DBAPIError):
            if current.connection_invalidated:
                return True
            orig = current.orig
            if isinstance(orig, BaseException) and _is_driver_outage(orig):
                return True
        elif _is_driver_outage(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_driver_outage(exc: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:  # not installed: no PostgreSQL here
        return False
    if not isinstance(exc, psycopg.OperationalError):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is None:
        return True
    return sqlstate[:2] in _OUTAGE_SQLSTATE_CLASSES or sqlstate in _OUTAGE_SQLSTATES


class IdempotencyStore:
    """Checks and records idempotency keys in ``taskq_processed``.

    Args:
        engine: Engine of the database holding the table.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._dialect = engine.dialect.name
        self._held: Connection | None = None
        self._raw_cursor: Any = None
        # The two statements of every idempotent task, as plain driver SQL: compiling and
        # executing them through SQLAlchemy cost more than the database round trip itself.
        mark = self._mark = "%s" if engine.dialect.paramstyle in ("format", "pyformat") else "?"
        table = processed_table.name
        self._sql_exists = f'SELECT 1 FROM {table} WHERE "key" = {mark}'
        self._sql_record = (
            f'INSERT INTO {table} ("key", task, finished_at) VALUES ({mark}, {mark}, {mark}) '
            'ON CONFLICT ("key") DO NOTHING RETURNING "key"'
        )

    def _connection(self) -> Connection:
        """The connection ``is_done`` and ``record`` use, opened once and kept.

        One round trip per call is the budget: a pooled checkout would add BEGIN and the
        pool's ROLLBACK-on-return, tripling the cost on PostgreSQL. The connection is in
        autocommit mode; on PostgreSQL it also runs with ``synchronous_commit=off``: a
        database crash may forget the last fraction of a second of keys, which is the same
        duplicate window a worker crash between the task and ``record`` leaves anyway.
        Transactional tasks (:meth:`begin`) commit with the database's full durability.
        """
        if self._held is None or self._held.closed or self._held.invalidated:
            conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if self._dialect == "postgresql":
                conn.exec_driver_sql("SET synchronous_commit TO OFF")
            self._held = conn
        return self._held

    def _cursor(self) -> Any:
        """A DB-API cursor on the kept connection (SQL prepared once, per dialect)."""
        if self._raw_cursor is None:
            conn = self._connection()
            self._raw_cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        return self._raw_cursor

    def _drop_connection(self, *, invalidate: bool = False) -> None:
        held, self._held = self._held, None
        self._raw_cursor = None
        if held is not None:
            try:
                if invalidate:
                    held.invalidate()
                held.close()
            except sa.exc.SQLAlchemyError:  # it is broken already; the next call reconnects
                logger.debug("error closing the idempotency connection", exc_info=True)

    def close(self) -> None:
        """Close the kept connection (the engine's pool is the caller's).

        On PostgreSQL the connection is closed, not returned to the pool: its session may
        hold claims (advisory locks), which must end with it rather than pass to the next
        user of the pool.
        """
        self._drop_connection(invalidate=self._dialect == "postgresql")

    def is_done(self, key: str) -> bool:
        """Whether a task with this key already finished (one SELECT).

        Not thread-safe: a worker process calls it from its main thread only.

        Raises:
            IdempotencyError: the database cannot be reached or the table is missing.
        """
        try:
            cursor = self._cursor()
            cursor.execute(self._sql_exists, (key,))
            return cursor.fetchone() is not None
        except Exception as exc:  # driver errors: this path bypasses SQLAlchemy for speed
            self._drop_connection(invalidate=True)
            raise self._error("check", key, exc) from exc

    def done_among(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` are already recorded (one SELECT for all of them).

        Raises:
            IdempotencyError: the database cannot be reached or the table is missing.
        """
        if not keys:
            return set()
        marks = ", ".join([self._mark] * len(keys))
        sql = f'SELECT "key" FROM {processed_table.name} WHERE "key" IN ({marks})'
        try:
            cursor = self._cursor()
            cursor.execute(sql, tuple(keys))
            return {row[0] for row in cursor.fetchall()}
        except Exception as exc:  # driver errors: this path bypasses SQLAlchemy for speed
            self._drop_connection(invalidate=True)
            raise self._error("check", keys[0], exc) from exc

    @property
    def claims_keys(self) -> bool:
        """Whether :meth:`claim_many` can claim keys here (PostgreSQL advisory locks)."""
        return self._dialect == "postgresql"

    def claim_many(self, keys: Sequence[str], *, release: Sequence[str] = ()) -> list[str]:
        """Claim ``keys`` for this session, releasing ``release`` first (one statement).

        A claim is a session-level advisory lock on the key's hash, taken with
        ``pg_try_advisory_lock`` (never waits). It lasts until released or until this
        store's connection ends, so a dead worker process leaves no claim behind. Locks are
        counted per session: a key claimed twice must be released twice. Check a claimed
        key with :meth:`done_among` or :meth:`is_done` *after* this call returns: a check in
        the same statement could read a snapshot older than the claim.

        Args:
            keys: Keys to claim (no duplicates).
            release: Keys this session claimed earlier and is done with.

        Returns:
            The keys of ``keys`` now claimed; the others are claimed by another session.

        Raises:
            IdempotencyError: the database cannot be reached (every claim is then gone).
        """
        sql = (
            "SELECT (SELECT count(*) FROM unnest(%s::text[]) AS r(k) "
            f"WHERE pg_advisory_unlock(hashtextextended(r.k, {_CLAIM_SEED}))), "
            "ARRAY(SELECT c.k FROM unnest(%s::text[]) AS c(k) "
            f"WHERE pg_try_advisory_lock(hashtextextended(c.k, {_CLAIM_SEED})))"
        )
        try:
            cursor = self._cursor()
            cursor.execute(sql, (list(release), list(keys)))
            row = cursor.fetchone()
        except Exception as exc:  # driver errors: this path bypasses SQLAlchemy for speed
            self._drop_connection(invalidate=True)
            raise self._error("claim", keys[0] if keys else "", exc) from exc
        return list(row[1]) if row is not None else []

    def release_claims(self, keys: Sequence[str]) -> None:
        """Release claims this session holds (one statement; errors only logged).

        A failure means the connection is gone, and its claims with it.
        """
        if not keys:
            return
        try:
            self.claim_many([], release=keys)
        except IdempotencyError as exc:
            logger.debug("releasing idempotency claims failed: %s", exc)

    def record(self, key: str, task: str) -> bool:
        """Record ``key`` as done (one INSERT, autocommit).

        Returns:
            ``False`` if the key was already there (another copy finished first).

        Raises:
            IdempotencyError: the database cannot be reached or the table is missing.
        """
        now = utcnow()
        finished_at: Any = now if self._dialect == "postgresql" else _sqlite_datetime(now)
        try:
            cursor = self._cursor()
            cursor.execute(self._sql_record, (key, task, finished_at))
            return cursor.fetchone() is not None
        except Exception as exc:  # driver errors: this path bypasses SQLAlchemy for speed
            self._drop_connection(invalidate=True)
            raise self._error("record", key, exc) from exc

    def begin(self, key: str, task: str) -> Session | None:
        """Open the transaction of a ``transactional`` task, its key claimed first.

        Returns:
            A session in an open transaction holding the new key (the caller commits or
            rolls back, then closes it), or ``None`` if the key is already recorded: that
            delivery is a duplicate and nothing was written.

        Raises:
            IdempotencyError: the database cannot be reached or the table is missing.
        """
        session = Session(self.engine, expire_on_commit=False)
        try:
            session.begin()
            if self.claim(session, key, task):
                return session
            session.rollback()
        except sa.exc.SQLAlchemyError as exc:
            session.close()
            raise self._error("claim", key, exc) from exc
        session.close()
        return None

    def _error(self, action: str, key: str, exc: Exception) -> IdempotencyError:
        # redact_url also masks a password given as a query parameter (?password=...).
        url = redact_url(self.engine.url.render_as_string(hide_password=False))
        return IdempotencyError(
            f"cannot {action} idempotency key {key!r} in taskq_processed at {url}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            "is the database up and were the tables created (taskq db create)?",
            key=key,
        )

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
        total = delete_in_batches(self.engine, t.c.key, t.c.finished_at < cutoff, batch_size)
        logger.info("pruned %d idempotency keys older than %s", total, older_than)
        return total

    def count(self) -> int:
        """How many keys are stored."""
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(processed_table))
                       .scalar_one())


def _sqlite_datetime(value: datetime) -> str:
    """The text SQLAlchemy stores for a DateTime on SQLite (naive UTC, microseconds)."""
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")
