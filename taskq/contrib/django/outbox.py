"""The outbox through Django's own database connection, and the database URL for the relay.

Inside ``transaction.atomic()`` the App's ``session_provider`` hands ``delay()`` (and a
workflow's ``apply_async()``) a :class:`DjangoOutbox`: the outbox row, and a workflow's own
rows, are inserted with Django's cursor, in Django's transaction, so they commit or roll back
with the block. The SQL is SQLAlchemy's own, rendered for the connection's vendor
(:class:`taskq.outbox.store.ForeignCursorStatement`), so the relay and the workers read the
rows exactly as if a SQLAlchemy ``Session`` had written them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from django.db import DatabaseError, connections, transaction

from taskq.errors import ConfigurationError, OutboxError
from taskq.outbox.store import NOTIFY_CHANNEL, ForeignCursorStatement, compile_insert

if TYPE_CHECKING:
    from taskq.outbox.store import OutboxRow

# Connection parameters of Django's PostgreSQL OPTIONS that libpq understands too.
_LIBPQ_OPTIONS = (
    "options", "sslmode", "sslrootcert", "sslcert", "sslkey", "application_name",
    "connect_timeout", "service", "passfile", "target_session_attrs",
)


class OutboxSessions:
    """``App.session_provider``: a :class:`DjangoOutbox` inside an atomic block, else None.

    Args:
        alias: The ``DATABASES`` alias of the outbox.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def __call__(self) -> DjangoOutbox | None:
        connection = connections[self.alias]
        return DjangoOutbox(connection) if connection.in_atomic_block else None


class DjangoOutbox:
    """The outbox as seen through one Django connection, inside its atomic block.

    Args:
        connection: A Django database connection (``django.db.connections[alias]``).
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def taskq_add_outbox_row(self, row: OutboxRow) -> bool:
        """Insert ``row`` in the connection's transaction; ``False`` for a duplicate.

        Raises:
            OutboxError: the vendor is not PostgreSQL or SQLite, or the insert failed
                (e.g. the tables were not migrated).
        """
        vendor = self.connection.vendor
        sql, params = compile_insert(row, vendor)
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(sql, params)
                inserted = cursor.fetchone() is not None
                if inserted and vendor == "postgresql":
                    # Wakes a LISTENing relay at commit; PostgreSQL folds repeats into one.
                    cursor.execute("SELECT pg_notify(%s, '')", [NOTIFY_CHANNEL])
        except DatabaseError as exc:
            raise OutboxError(
                f"cannot add task {row.task!r} (id {row.id}) for queue {row.queue!r} to the "
                f"outbox through Django database {self.connection.alias!r}: {exc}; run "
                "`python manage.py migrate taskq` if the table is missing",
                task=row.task,
                task_id=row.id,
                queue=row.queue,
            ) from exc
        return inserted

    def taskq_database_url(self) -> str:
        """The URL of the connection's database, which the outbox check compares with
        ``database_url`` (:mod:`taskq.outbox.binding`): a row written in another database
        than the relay's would never be published.

        Raises:
            ConfigurationError: the database is neither PostgreSQL nor a SQLite file (an
                in-memory database no relay can read).
        """
        return database_url(self.connection.settings_dict)

    def execute(self, statement: Any, parameters: Any = None) -> None:
        """Run one of taskq's SQLAlchemy Core inserts in the connection's transaction.

        What a workflow's start writes (``taskq_workflows``, ``taskq_workflow_members``), with
        the signature of ``Connection.execute``: a list of dicts runs the statement once per
        dict (``executemany``). Nothing is read back.

        Raises:
            OutboxError: the vendor is not PostgreSQL or SQLite, or the insert failed
                (e.g. the tables were not migrated).
        """
        rows = parameters if isinstance(parameters, list) else [parameters]
        compiled = ForeignCursorStatement(
            statement, self.connection.vendor, list(rows[0]) if rows[0] else ()
        )
        try:
            with self.connection.cursor() as cursor:
                if len(rows) == 1:
                    cursor.execute(compiled.sql, compiled.parameters(rows[0]))
                else:
                    cursor.executemany(compiled.sql, [compiled.parameters(r) for r in rows])
        except DatabaseError as exc:
            table = getattr(getattr(statement, "table", None), "name", "taskq's")
            raise OutboxError(
                f"cannot write {table} rows through Django database "
                f"{self.connection.alias!r}: {exc}; run `python manage.py migrate taskq` if "
                "the table is missing"
            ) from exc

    def taskq_on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after the outermost atomic block commits (eager mode)."""
        transaction.on_commit(callback, using=self.connection.alias)


def database_url(database: Mapping[str, Any]) -> str:
    """A SQLAlchemy URL for one ``DATABASES`` entry (PostgreSQL or SQLite).

    Raises:
        ConfigurationError: another engine, or an in-memory SQLite database.
    """
    engine = str(database.get("ENGINE", ""))
    name = str(database.get("NAME") or "")
    if engine.endswith(("postgresql", "postgis")):
        user = quote(str(database.get("USER") or ""), safe="")
        password = quote(str(database.get("PASSWORD") or ""), safe="")
        host = str(database.get("HOST") or "")
        port = str(database.get("PORT") or "")
        credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        location = f"{host}:{port}" if port else host
        options = database.get("OPTIONS") or {}
        # %20, not +, for spaces: libpq reads the URL too (the relay's LISTEN connection).
        query = urlencode(
            {k: options[k] for k in _LIBPQ_OPTIONS if options.get(k)}, quote_via=quote
        )
        url = f"postgresql+psycopg://{credentials}{location}/{quote(name, safe='')}"
        return f"{url}?{query}" if query else url
    if engine.endswith("sqlite3") and name and name != ":memory:" and "mode=memory" not in name:
        return f"sqlite:///{name}"
    raise ConfigurationError(
        f"cannot derive taskq's database_url from the Django database {engine} {name!r}: "
        "the outbox needs PostgreSQL or a SQLite file; set TASKQ['database_url']"
    )
