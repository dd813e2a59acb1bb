"""Engine helpers: the differences between PostgreSQL and SQLite live here.

- ``postgresql://`` URLs without a driver use psycopg 3 (SQLAlchemy's default would be
  psycopg2, which taskq does not depend on).
- SQLite runs in WAL mode with a busy timeout, so readers never block the writer and a
  producer's commit waits briefly instead of failing while the relay deletes rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from taskq.errors import ConfigurationError
from taskq.settings import redact_url

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 10_000


def normalise_url(url: str) -> str:
    """Return ``url`` with the psycopg 3 driver made explicit for PostgreSQL."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


# What every database URL error ends with: the two databases taskq works on.
SUPPORTED_DATABASES = (
    "taskq keeps its tables in PostgreSQL (postgresql://user:password@host:5432/dbname, "
    "with `pip install taskq[postgres]`) or SQLite (sqlite:///path/to/file.sqlite3, the "
    "default)"
)
_SUPPORTED_BACKENDS = ("postgresql", "sqlite")


def create_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for taskq's tables with the right per-dialect settings.

    Raises:
        ConfigurationError: the URL cannot be parsed, names a database taskq does not
            support, or its driver is not installed; the message says which ones work.
    """
    url = normalise_url(url)
    shown = redact_url(url)
    try:
        backend = sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError:
        raise ConfigurationError(
            f"database URL {shown!r} is not a URL; {SUPPORTED_DATABASES}", url=shown
        ) from None
    if backend not in _SUPPORTED_BACKENDS:
        raise ConfigurationError(
            f"database URL {shown}: {backend} is not supported; {SUPPORTED_DATABASES}",
            url=shown,
        )
    try:
        if backend == "sqlite":
            engine = sa.create_engine(url, **kwargs)
            sa.event.listen(engine, "connect", _sqlite_pragmas)
            return engine
        kwargs.setdefault("pool_pre_ping", True)
        return sa.create_engine(url, **kwargs)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot use database URL {shown}: its driver is not installed ({exc}); "
            "PostgreSQL needs psycopg 3: `pip install taskq[postgres]`",
            url=shown,
        ) from None
    except sa.exc.ArgumentError as exc:
        raise ConfigurationError(
            f"cannot use database URL {shown}: {exc}; {SUPPORTED_DATABASES}", url=shown
        ) from None


def reach_advice(url: str) -> str:
    """What to check when the database of ``url`` cannot be reached or opened."""
    if normalise_url(url).startswith("sqlite"):
        return ("check that the SQLite file's directory exists and that this user may "
                "write there")
    return ("check that the server runs, that the database exists and that user and "
            "password are right")


def describe_database_error(exc: BaseException) -> str:
    """One line for a person: what the database or its driver said.

    SQLAlchemy's text adds the statement and parameters on lines of their own and ends with
    a link to its background page; in the middle of taskq's sentence those read as noise.
    """
    lines = []
    for line in str(exc).splitlines():
        if line.startswith(("[SQL:", "[parameters:", "(Background on this error at:")):
            break
        if line.strip():
            lines.append(line.strip())
    return " ".join(lines) or type(exc).__name__


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def dialect_of(target: Session | Connection | Engine) -> str:
    """Return ``postgresql``, ``sqlite``... for a session, connection or engine."""
    if isinstance(target, Session):
        return target.get_bind().dialect.name
    return target.dialect.name


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def as_aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; taskq always stores UTC, so attach it."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def missing_tables(engine: Engine, tables: Iterable[str]) -> list[str]:
    """The names among ``tables`` that do not exist in ``engine``'s database (its schema).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached.
    """
    inspector = sa.inspect(engine)
    return [table for table in tables if not inspector.has_table(table)]


def delete_in_batches(
    engine: Engine, key: sa.Column[Any], older: sa.ColumnElement[bool], batch_size: int
) -> int:
    """Delete the rows of ``key``'s table matching ``older``, ``batch_size`` at a time, each
    batch its own short transaction (pruning millions of rows never holds long locks
    against running workers); return how many were deleted."""
    table = key.table
    total = 0
    while True:
        batch = sa.select(key).where(older).limit(batch_size)
        with engine.begin() as conn:
            count = int(conn.execute(
                table.delete().where(key.in_(batch.scalar_subquery()))
            ).rowcount or 0)
        total += count
        if count < batch_size:
            return total


def unmade_tables(engine: Engine, tables: Iterable[str]) -> tuple[list[str], bool]:
    """After a failed read: which of ``tables`` are missing, and whether that only means no
    worker has made them yet (the embedded SQLite default, whose tables the first worker,
    relay or scheduler creates: nothing is stored there yet). ``([], False)`` when the
    database cannot be inspected either."""
    try:
        missing = missing_tables(engine, tables)
    except Exception:  # unreachable: the caller reports its own error
        return [], False
    return missing, bool(missing) and engine.dialect.name == "sqlite"


def missing_tables_message(url: str, tables: Iterable[str], app_path: str | None = None) -> str:
    """What a command says when taskq's tables are missing: what to run comes first.

    Only the embedded SQLite default gets its tables created by the worker, the relay and
    the scheduler; every other database needs ``taskq db create`` (or a migration) once.
    """
    return (
        f"taskq's tables are missing: run `taskq db create -A {app_path or 'MODULE:APP'}` "
        "once (every database but the embedded SQLite default needs it; or migrate with "
        "taskq.metadata in Alembic, or `manage.py migrate` with Django). "
        f"Missing in {redact_url(url)}: {', '.join(tables)}"
    )
