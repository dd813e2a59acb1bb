"""The worker's transactions of workflow bookkeeping, each of its own, and their faults.

A member that finished is counted in the transaction that records its idempotency key; a
member that was dead-lettered fails its workflow in one transaction. Whatever says that the
database could not be reached, at any statement of them (the next step's or link_error's
outbox rows included: the outbox chains the driver's error as the cause of its
``OutboxError``), becomes :class:`~taskq.errors.IdempotencyError`: an infrastructure fault,
which the worker retries while it holds the delivery (docs/reliability.md), never a task failure.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from taskq.errors import IdempotencyError
from taskq.idempotency import IdempotencyStore, is_database_outage
from taskq.workflows.store import Target, first_line


def _as_outage(exc: Exception) -> bool:
    """Whether ``exc`` escaping a workflow transaction means "database unreachable".

    SQLAlchemy's own errors, and anything caused by a database outage: the outbox wraps the
    driver's error in ``OutboxError`` (its cause), and that is no task failure either.
    """
    return isinstance(exc, sa.exc.SQLAlchemyError) or is_database_outage(exc)


def in_completion_transaction(
    engine: Engine, key: str, task: str, count: Callable[[Target], object]
) -> bool:
    """Record idempotency ``key`` and run ``count`` in one transaction of its own.

    Returns:
        ``False`` when the key was already recorded: another copy of the member finished
        and was counted in that copy's transaction; nothing is done.

    Raises:
        IdempotencyError: the database could not be reached or refused the statements,
            including the next step's outbox rows (nothing was committed).
    """
    try:
        with engine.begin() as conn:
            if not IdempotencyStore(engine).claim(conn, key, task):
                return False
            count(conn)
            return True
    except Exception as exc:
        if not _as_outage(exc):
            raise
        raise IdempotencyError(
            f"cannot record the completion of workflow member {task} (key {key!r}): "
            f"{type(exc).__name__}: {first_line(exc)}; is the database up and were the "
            "tables created (taskq db create)?",
            key=key, task=task,
        ) from exc


def in_failure_transaction(
    engine: Engine, task_id: str, fail: Callable[[Target], object]
) -> None:
    """Run ``fail`` in one transaction of its own (a member was dead-lettered).

    Raises:
        IdempotencyError: the database could not be reached, including while adding the
            link_error outbox row (nothing was committed).
    """
    try:
        with engine.begin() as conn:
            fail(conn)
    except Exception as exc:
        if not _as_outage(exc):
            raise
        raise IdempotencyError(
            f"cannot record the failure of workflow member {task_id}: {type(exc).__name__}: "
            f"{first_line(exc)}; is the database up and were the tables created (taskq db "
            "create)?",
            key=task_id, task_id=task_id,
        ) from exc
