"""Eager mode (setting ``task_always_eager``): enqueued tasks run in-process, for tests.

The App encodes a call and checks its size exactly as for the broker, so
``SerializationError`` and ``MessageTooLarge`` are raised at enqueue as in production; then
the message is *decoded* again and the task runs on what a worker would receive (tuples
become lists, datetimes come back aware), inside the app's ``task_context`` hooks.

When it runs:

- published directly (no session): at once, inside ``delay()``; its exception propagates;
- through the outbox: when the transaction commits, never if it rolls back. Nothing is
  written to ``taskq_outbox``. An ORM ``Session`` runs its tasks right after the commit
  (``after_commit``; a task must not use that same session, which is between transactions);
  a Core ``Connection`` runs them when it next begins a transaction or is returned to the
  pool after the commit; a framework adapter (Django) on its own commit hook
  (``transaction.on_commit``). An exception propagates from that point (e.g. ``commit()``).

Delays (``countdown``/``eta``), retries, idempotency keys and time limits do not apply.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from taskq.message import WireMessage, decode
from taskq.request import Request, current_request
from taskq.worker.execution import in_task_context

if TYPE_CHECKING:
    from taskq.registry import TaskRegistry

logger = logging.getLogger(__name__)

_PENDING = "taskq_eager_pending"


class EagerApp(Protocol):
    """What eager mode needs of the app (:class:`~taskq.app.App` provides it)."""

    registry: TaskRegistry
    task_context: list[Callable[[], AbstractContextManager[Any]]]

    @property
    def engine(self) -> Any:
        """The app's SQLAlchemy engine (transactional tasks run in a session on it)."""


def run(app: EagerApp, wire: WireMessage, queue: str) -> Any:
    """Decode ``wire`` as a worker would and run its task now; return what the task returns.

    The task sees ``self.request`` (``bind=True``) with its id, queue and key, as in a worker.

    Raises:
        DecodeError: the message cannot be decoded (a codec bug; never expected).
        TaskNotRegistered: the task is not registered in ``app``.
        Exception: whatever the task raises.
    """
    envelope = decode(wire)
    task = app.registry.get(envelope.task)
    call = in_task_context(task, app.task_context)  # Task.__call__ passes self if bind=True
    request = Request(
        envelope.task_id,
        envelope.task,
        envelope.retries,
        queue,
        envelope.idempotency_key or envelope.task_id,
        envelope.eta,
        envelope.headers,
    )
    logger.debug("task %s[%s] runs eagerly", envelope.task, envelope.task_id)
    token = current_request.set(request)
    try:
        if not getattr(task.options, "transactional", False):
            return call(*envelope.args, **envelope.kwargs)
        # A transactional task gets a session whose commit also holds its writes, as in
        # the worker (the idempotency key itself is not recorded in eager mode).
        from sqlalchemy.orm import Session

        with Session(app.engine, expire_on_commit=False) as session, session.begin():
            return call(*envelope.args, **{**envelope.kwargs, "session": session})
    finally:
        current_request.reset(token)


def run_on_commit(app: EagerApp, target: Any, wire: WireMessage, queue: str) -> None:
    """Run ``wire``'s task when ``target``'s transaction commits (see the module docstring).

    Args:
        app: The app whose registry and hooks run the task.
        target: An ORM ``Session``, a Core ``Connection`` or an object with a
            ``taskq_on_commit(callback)`` method (``taskq.contrib.django``).
        wire: The encoded message.
        queue: The queue it was sent to.
    """

    def callback() -> None:
        run(app, wire, queue)

    on_commit = getattr(target, "taskq_on_commit", None)
    if on_commit is not None:
        on_commit(callback)
        return
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(target, Session):
        _after_session_commit(target, callback)
    elif isinstance(target, Connection):
        _after_connection_commit(target, callback)
    else:
        from taskq.errors import ConfigurationError

        raise ConfigurationError(
            f"eager mode cannot tell when {type(target).__name__} commits; enqueue through "
            "an ORM Session, a Core Connection or a framework integration"
        )


def _after_session_commit(session: Any, callback: Callable[[], None]) -> None:
    import sqlalchemy as sa

    # Begin the transaction as the outbox INSERT would, so that its end is observed.
    session.connection()
    pending: _SessionPending | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = _SessionPending()
        sa.event.listen(session, "after_commit", pending.on_commit)
        sa.event.listen(session, "after_soft_rollback", pending.on_soft_rollback)
        sa.event.listen(session, "after_transaction_end", pending.on_transaction_end)
    pending.entries.append((session.get_nested_transaction(), callback))


class _SessionPending:
    """Tasks enqueued in one ORM session, each with the savepoint it was enqueued in."""

    def __init__(self) -> None:
        self.entries: list[tuple[Any, Callable[[], None]]] = []
        self._committed = False

    def on_commit(self, session: Any) -> None:
        self._committed = True  # also fired by a savepoint's release: see below

    def on_soft_rollback(self, session: Any, previous: Any) -> None:
        if previous.nested:  # a rolled-back savepoint takes its tasks with it
            self.entries = [e for e in self.entries if not _inside(e[0], previous)]

    def on_transaction_end(self, session: Any, transaction: Any) -> None:
        committed, self._committed = self._committed, False
        if transaction.parent is not None:  # a savepoint: its tasks wait for the outermost
            return
        entries, self.entries = self.entries, []
        if committed:
            _run_all([callback for _, callback in entries])


def _inside(transaction: Any, ancestor: Any) -> bool:
    while transaction is not None:
        if transaction is ancestor:
            return True
        transaction = transaction.parent
    return False


# Core connections: tasks of the open transaction, and tasks whose transaction committed,
# waiting for the connection to be idle (its next transaction, or its return to the pool).
_connection_pending: weakref.WeakKeyDictionary[Any, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)
_committed: dict[int, list[Callable[[], None]]] = {}
_watched_engines: weakref.WeakSet[Any] = weakref.WeakSet()


def _after_connection_commit(connection: Any, callback: Callable[[], None]) -> None:
    import sqlalchemy as sa

    if not connection.in_transaction():  # begin as the outbox INSERT would (autobegin)
        connection.begin()
    pending = _connection_pending.get(connection)
    if pending is None:
        pending = _connection_pending[connection] = []
        dbapi_id = id(connection.connection.dbapi_connection)

        def on_commit(conn: Any) -> None:
            tasks = _connection_pending[conn]
            _committed.setdefault(dbapi_id, []).extend(tasks)
            tasks.clear()

        def on_rollback(conn: Any) -> None:
            _connection_pending[conn].clear()

        def on_begin(conn: Any) -> None:
            _run_all(_committed.pop(dbapi_id, []))

        sa.event.listen(connection, "commit", on_commit)
        sa.event.listen(connection, "rollback", on_rollback)
        sa.event.listen(connection, "begin", on_begin)
        engine = connection.engine
        if engine not in _watched_engines:
            _watched_engines.add(engine)

            def on_checkin(dbapi_connection: Any, record: Any) -> None:
                _run_all(_committed.pop(id(dbapi_connection), []))

            sa.event.listen(engine, "checkin", on_checkin)
    pending.append(callback)


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    """Run every callback; the first exception propagates once all have run."""
    error: BaseException | None = None
    for callback in callbacks:
        try:
            callback()
        except BaseException as exc:  # the others still run, as each would in a worker
            error = error or exc
    if error is not None:
        raise error
