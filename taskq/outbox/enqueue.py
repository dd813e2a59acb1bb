"""Enqueue through the outbox: one encoded task becomes one row in the caller's transaction.

The row commits (or rolls back) with the caller's business change; the relay publishes it
afterwards. A task due beyond ``outbox_delay_horizon_s`` stays in the table until it is near
due, so a month-long delay never sits in RabbitMQ.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from taskq.errors import OutboxError
from taskq.idempotency import is_database_outage
from taskq.message import ORDERING_KEY, Envelope, WireMessage
from taskq.outbox.binding import check_outbox_database
from taskq.outbox.store import OutboxRow, OutboxStore


def add_to_outbox(
    store: OutboxStore,
    session: Any,
    envelope: Envelope,
    wire: WireMessage,
    queue: str,
    *,
    horizon_s: float,
    database_url: str | None = None,
) -> bool:
    """Add the row of ``envelope`` (encoded as ``wire``) for ``queue`` in ``session``.

    Args:
        store: The outbox's SQL.
        session: The caller's ``Session``, ``Connection`` or framework adapter.
        envelope: The task's envelope.
        wire: ``envelope`` encoded.
        queue: The destination queue (a partition queue for an ordered task).
        horizon_s: How long before its eta a delayed row is handed to the relay.
        database_url: The app's ``database_url``: ``session`` must write to that outbox,
            the one the relay reads (:mod:`taskq.outbox.binding`); ``None`` skips the check.

    Returns:
        ``False`` when the task id or idempotency key is already in the outbox.

    Raises:
        ConfigurationError: ``session`` is bound to another database than
            ``database_url``, or to none.
        OutboxError: the row could not be written (missing table, database error).
    """
    if database_url is not None:
        check_outbox_database(
            session, database_url=database_url, task=envelope.task,
            task_id=envelope.task_id, queue=queue,
        )
    next_attempt_at = None
    if envelope.eta is not None:
        # The relay claims it this long before its eta and hands it to the delay backend.
        next_attempt_at = envelope.eta - timedelta(seconds=horizon_s)
    row = OutboxRow(
        id=envelope.task_id,
        queue=queue,
        task=envelope.task,
        body=wire.body,
        headers=wire.headers,
        priority=envelope.priority,
        eta=envelope.eta,
        idempotency_key=envelope.idempotency_key,
        created_at=store.created_at(),
        next_attempt_at=next_attempt_at,
        ordering_key=envelope.headers.get(ORDERING_KEY) if envelope.headers else None,
    )
    try:
        return bool(store.add(session, row))
    except Exception as exc:
        if not type(exc).__module__.startswith("sqlalchemy"):
            raise
        if is_database_outage(exc):
            # Chained as the cause: callers that hold a delivery (a worker enqueueing a
            # workflow's next step) find the outage there and retry instead of failing.
            advice = ("the database could not be reached; the transaction is lost: run it "
                      "again once the database is back")
        else:
            advice = "run app.create_tables() or `taskq db create` if the table is missing"
        raise OutboxError(
            f"cannot add task {envelope.task!r} (id {envelope.task_id}) for queue {queue!r} "
            f"to the outbox: {exc}; {advice}",
            task=envelope.task,
            task_id=envelope.task_id,
            queue=queue,
        ) from exc
