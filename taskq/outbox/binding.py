"""Which database an outbox row lands in: refuse a session the relay does not read.

The relay reads the ``taskq_outbox`` table of ``database_url``. A row written through a
session bound elsewhere (another SQLite file, another PostgreSQL database or schema) commits
with the caller's transaction and is never published, because nothing reads that table:
:func:`check_outbox_database` refuses the write at enqueue instead.

Two URLs name the same outbox when they agree on what decides where the table is
(:class:`DatabaseId`): the backend, the server, the database and, on PostgreSQL, a
``search_path`` given in the ``options`` query parameter (the test suite and many
deployments keep several schemas in one database). What does not move the table is ignored:
the driver (``postgresql://`` and ``postgresql+psycopg://``), user and password, the other
query options (``connect_timeout``, ``sslmode``...). ``localhost``, ``127.0.0.1``, ``::1``
and a Unix socket are one local server. A SQLite path is compared as an absolute, resolved
path, so ``sqlite:///taskq.db`` and ``sqlite:////srv/app/taskq.db`` match when the process
runs in ``/srv/app``.

Not seen here: a ``search_path`` set outside the URL (``ALTER ROLE ... SET``, a connect
event), and two names of one host (a DNS alias and its address) are taken as two servers.

Enqueueing is a hot path: an engine's :class:`DatabaseId` is computed once per engine (a
weak reference, so a disposed engine is forgotten) and ``database_url``'s once per string.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import parse_qs

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from taskq.errors import ConfigurationError
from taskq.schema import outbox_table
from taskq.settings import redact_url

# What Session.execute() resolves the bind of an outbox INSERT from: a session with several
# binds (``binds={outbox_table: engine}``, Flask-SQLAlchemy's bind keys) routes by table.
_PROBE = outbox_table.insert()

_LOCAL_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1", "[::1]"})
_PG_DEFAULT_PORT = 5432
_MEMORY = ":memory:"


class DatabaseId(NamedTuple):
    """What decides which ``taskq_outbox`` table a connection reaches."""

    backend: str  # "postgresql", "sqlite"...
    server: str  # "local", "db.example:5432"; "" for SQLite
    database: str  # a PostgreSQL database name, an absolute SQLite path, ":memory:"
    search_path: str = ""  # PostgreSQL only, when the URL sets one


# id(engine) -> (a weak reference to it, its DatabaseId); an entry leaves with its engine.
_engine_ids: dict[int, tuple[weakref.ref[Engine], DatabaseId]] = {}


def check_outbox_database(
    target: Any, *, database_url: str, task: str, task_id: str, queue: str
) -> None:
    """Refuse to write an outbox row where the relay of ``database_url`` never reads.

    Args:
        target: The caller's ORM ``Session`` (also Flask-SQLAlchemy's, or a
            ``scoped_session``), Core ``Connection``, or a framework adapter with
            ``taskq_add_outbox_row`` (which may tell its URL with ``taskq_database_url()``;
            one that does not is not checked).
        database_url: The app's ``database_url``, whose outbox the relay reads.
        task: The task's name (for the error).
        task_id: The task id (for the error).
        queue: The destination queue (for the error).

    Raises:
        ConfigurationError: ``target`` is bound to another database, or to none.
    """
    expected = url_id(database_url)
    if expected is None:
        return  # an unparsable database_url fails where the engine is built, not here
    found, source = _target_id(target, task)
    if found is None or found == expected:
        return
    raise ConfigurationError(
        f"task {task!r} (id {task_id}) for queue {queue!r} was not enqueued: its session "
        f"writes to the outbox of {_rendered(source)}, but taskq's relay reads the outbox of "
        f"database_url {redact_url(database_url)}, so the task would never be published. "
        "Pass a session bound to the database of database_url (e.g. Session(app.engine)), "
        "or set database_url to the session's database",
        task=task,
        task_id=task_id,
        queue=queue,
    )


def _target_id(target: Any, task: str) -> tuple[DatabaseId | None, Engine | str]:
    """The :class:`DatabaseId` of ``target`` (``None``: cannot tell) and where it writes (an
    engine, or a URL), for the error."""
    if hasattr(target, "taskq_add_outbox_row"):
        describe: Callable[[], str] | None = getattr(target, "taskq_database_url", None)
        if describe is None:
            return None, ""
        url = describe()
        return url_id(url), url
    engine = _engine_of(target, task)
    if engine is None:
        return None, ""
    # By id, not a WeakKeyDictionary: a plain dict lookup costs a tenth as much.
    cached = _engine_ids.get(id(engine))
    if cached is not None and cached[0]() is engine:
        return cached[1], engine
    found = database_id(engine.url)
    key = id(engine)
    _engine_ids[key] = (weakref.ref(engine, lambda _: _engine_ids.pop(key, None)), found)
    return found, engine


def _rendered(source: Engine | str) -> str:
    if isinstance(source, Engine):
        return redact_url(source.url.render_as_string(hide_password=False))
    return redact_url(source)


def _engine_of(target: Any, task: str) -> Engine | None:
    get_bind = getattr(target, "get_bind", None)
    if get_bind is None:  # a Core Connection (or Engine)
        engine = getattr(target, "engine", None)
        return engine if isinstance(engine, Engine) else None
    try:
        bind = get_bind(clause=_PROBE)
    except sa.exc.UnboundExecutionError:
        raise ConfigurationError(
            f"task {task!r} was not enqueued: its session is bound to no database; bind it "
            "to the engine of database_url (e.g. Session(app.engine)), whose outbox taskq's "
            "relay reads",
            task=task,
        ) from None
    engine = getattr(bind, "engine", None)  # an Engine is its own .engine; a Connection's
    return engine if isinstance(engine, Engine) else None


@functools.lru_cache(maxsize=64)
def url_id(url: str) -> DatabaseId | None:
    """The :class:`DatabaseId` of a URL string; ``None`` when it cannot be parsed."""
    try:
        return database_id(sa.make_url(url))
    except (sa.exc.ArgumentError, ValueError):
        return None


def database_id(url: URL) -> DatabaseId:
    """What in ``url`` decides which database (and schema) its connections reach."""
    backend = url.get_backend_name()
    if backend == "postgres":  # the old alias (taskq.db.normalise_url accepts it)
        backend = "postgresql"
    if backend == "sqlite":
        return DatabaseId("sqlite", "", _sqlite_database(url))
    query = url.query
    host = (url.host or _first(query, "host")).lower()
    port = url.port or int(_first(query, "port") or _PG_DEFAULT_PORT)
    if backend != "postgresql":
        return DatabaseId(backend, f"{host}:{url.port or ''}", url.database or "")
    # libpq: no host or a socket directory is the local server, as loopback is.
    server = "local" if host in _LOCAL_HOSTS or host.startswith("/") else host
    database = url.database or _first(query, "dbname") or url.username or ""
    return DatabaseId(
        "postgresql", f"{server}:{port}", database, _search_path(_first(query, "options"))
    )


def _sqlite_database(url: URL) -> str:
    path = url.database or ""
    if _first(url.query, "uri").lower() in ("true", "1") and path.startswith("file:"):
        path, _, params = path[len("file:"):].partition("?")
        if "memory" in parse_qs(params).get("mode", []):
            return f"{_MEMORY}{path}"  # shared-cache memory databases have names
    if path in ("", _MEMORY):
        return _MEMORY
    return os.path.realpath(path)


def _search_path(options: str) -> str:
    """The ``search_path`` that libpq ``options`` set (``-csearch_path=a,b``), normalised."""
    value = ""
    words = options.replace("-c ", "-c").split()
    for word in words:
        for prefix in ("-csearch_path=", "--search_path=", "--search-path="):
            if word.startswith(prefix):
                value = word[len(prefix):]  # the last one wins, as in PostgreSQL
    return ",".join(part.strip() for part in value.split(",") if part.strip())


def _first(query: Mapping[str, Any], name: str) -> str:
    value = query.get(name)
    if isinstance(value, tuple):  # a parameter given twice
        value = value[0] if value else None
    return str(value) if value is not None else ""
