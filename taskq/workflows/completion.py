"""The worker's side of workflows: count a member in its completion transaction, or fail it.

A member message carries the ``taskq-workflow`` header. When its task succeeds, the worker
records the idempotency key *and* counts the member in one transaction
(:class:`MemberCompletion`): for a ``transactional=True`` task that is the task's own
transaction, joined before its commit; otherwise one of its own, opened right after the task
returned and before the ack. The member's result is stored in its row, the workflow's
counter goes down, and the statement that takes it to 0 enqueues the next step through the
outbox. So "finished" and "counted" commit together or not at all:

- a crash before that commit leaves neither: the broker redelivers, the task runs again and
  is counted then;
- a copy that arrives after it finds the key recorded and is acked as a duplicate; should
  the key be gone (pruned), the member row, already ``SUCCESS``, does not count it twice.

When a member is dead-lettered (no retries left, rejected, time limit, crash loop), the
dead-letterer calls :meth:`WorkflowHooks.failed` before the ack: one transaction marks the
member and the workflow ``FAILURE`` and, only in the statement that changed the workflow's
state, enqueues ``link_error``; so it runs once, and later steps never start.
"""

from __future__ import annotations

import logging
from typing import Any

from taskq.errors import SerializationError
from taskq.message import WORKFLOW, Envelope
from taskq.workflows.messages import WorkflowApp, WorkflowMessages
from taskq.workflows.store import Target, WorkflowStore, encode_value
from taskq.workflows.transactions import in_completion_transaction, in_failure_transaction

logger = logging.getLogger(__name__)


class WorkflowHooks:
    """One worker process's workflow bookkeeping.

    Args:
        app: The worker's app (database, outbox).
    """

    def __init__(self, app: WorkflowApp) -> None:
        self._app = app
        self._store: WorkflowStore | None = None

    @property
    def store(self) -> WorkflowStore:
        """The workflow store (built on first use)."""
        if self._store is None:
            self._store = WorkflowMessages(self._app).store()
        return self._store

    def completion_of(self, envelope: Envelope) -> MemberCompletion | None:
        """The completion participant of a workflow member; ``None`` for a plain task."""
        headers = envelope.headers
        if not headers or not isinstance(headers.get(WORKFLOW), str):
            return None
        return MemberCompletion(self, envelope.task_id, envelope.task)

    def failed(
        self, task_id: str, error_type: str, error: str, traceback: str | None
    ) -> None:
        """Member ``task_id`` was dead-lettered: fail its workflow (link_error once).

        Raises:
            IdempotencyError: the database could not be reached (nothing was written).
        """
        text = f"{error_type}: {error}"
        store = self.store
        in_failure_transaction(
            self._app.engine, task_id,
            lambda conn: store.member_failed(conn, task_id, text, traceback),
        )

    def count(self, target: Target, task_id: str, task: str, result: Any) -> None:
        """Count member ``task_id`` with ``result`` in ``target``'s transaction.

        A value the codec cannot carry cannot reach the next step: the member, and so the
        workflow, fails with a ``SerializationError`` instead.
        """
        try:
            encoded = encode_value(result, task)
        except SerializationError as exc:
            logger.error("workflow member %s[%s] returned a value that cannot be stored: %s",
                         task, task_id, exc)
            self.store.member_failed(
                target, task_id, f"SerializationError: its return value cannot be passed on "
                f"({exc})", None,
            )
            return
        self.store.member_succeeded(target, task_id, encoded)


class MemberCompletion:
    """Joins the completion of one workflow member to its idempotency record.

    The worker's deduplicator calls :meth:`record` (its own transaction, the key included)
    or :meth:`join` (inside a transactional task's transaction, before its commit).
    """

    __slots__ = ("_hooks", "task_id", "task")

    def __init__(self, hooks: WorkflowHooks, task_id: str, task: str) -> None:
        self._hooks = hooks
        self.task_id = task_id
        self.task = task

    def record(self, key: str, task: str, result: Any) -> bool:
        """Record ``key`` and count the member in one transaction.

        Returns:
            ``False`` if the key was already recorded (counted by another copy).

        Raises:
            IdempotencyError: the database could not be reached (nothing was committed).
        """
        hooks = self._hooks
        return in_completion_transaction(
            hooks._app.engine, key, task,
            lambda conn: hooks.count(conn, self.task_id, self.task, result),
        )

    def join(self, session: Any, result: Any) -> None:
        """Count the member in ``session``'s open transaction (its key is already in it)."""
        self._hooks.count(session, self.task_id, self.task, result)
