"""is_database_outage: a lost database connection is told from the task's own SQL errors.

Decided by exception type and attributes (what SQLAlchemy and psycopg raise), never by
message text: the messages below are deliberately misleading.
"""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors as pg_errors

from taskq.errors import IdempotencyError
from taskq.idempotency import is_database_outage


def _wrapped(orig: BaseException, *, invalidated: bool = False) -> sa.exc.DBAPIError:
    return sa.exc.DBAPIError.instance(
        "SELECT 1", {}, orig, psycopg.Error, connection_invalidated=invalidated
    )


def _chained(exc: BaseException) -> RuntimeError:
    try:
        try:
            raise exc
        except BaseException as inner:
            raise RuntimeError("the task gave up") from inner
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("deadlock detected"),  # no SQLSTATE: the client lost it
        pg_errors.ConnectionFailure("syntax error"),  # 08006
        pg_errors.AdminShutdown("unique violation"),  # 57P01
        pg_errors.CannotConnectNow("the database system is starting up"),  # 57P03
        _wrapped(psycopg.OperationalError("consuming input failed")),
        _wrapped(psycopg.DatabaseError("anything"), invalidated=True),
        _chained(_wrapped(psycopg.OperationalError("server closed the connection"))),
        IdempotencyError("cannot check idempotency key 'k'", key="k"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_lost_or_refused_connections_are_outages(exc: BaseException) -> None:
    assert is_database_outage(exc)


@pytest.mark.parametrize(
    "exc",
    [
        _wrapped(pg_errors.UniqueViolation("server closed the connection unexpectedly")),
        _wrapped(pg_errors.UndefinedTable("connection refused")),  # ProgrammingError
        _wrapped(pg_errors.DeadlockDetected("connection lost")),  # an OperationalError
        _wrapped(pg_errors.QueryCanceled("connection timeout")),  # statement_timeout
        _wrapped(pg_errors.SerializationFailure("could not connect")),
        sa.exc.IntegrityError("INSERT", {}, pg_errors.UniqueViolation("dup")),
        ValueError("connection refused"),
        ConnectionError("a task's own HTTP call failed"),
    ],
    ids=lambda exc: type(getattr(exc, "orig", None) or exc).__name__,
)
def test_the_tasks_own_sql_errors_are_not_outages(exc: BaseException) -> None:
    assert not is_database_outage(exc)
