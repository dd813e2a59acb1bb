"""The messages of a workflow: a step's members and the link_error call, through the outbox.

Both the producer (the first step) and the worker (every later step, link_error) enqueue
through here, always as outbox rows of the transaction that decided it: the relay publishes
them once that transaction commits, and never if it rolls back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from taskq.message import WORKFLOW, Envelope
from taskq.workflows.store import MemberCall, Target, WorkflowStore


class WorkflowApp(Protocol):
    """What workflows need of the app (:class:`~taskq.app.App` provides it)."""

    name: str
    session_provider: Callable[[], Any] | None

    @property
    def settings(self) -> Any:
        """The app's settings."""

    @property
    def engine(self) -> Any:
        """The engine of ``database_url`` (workflow tables, outbox)."""

    def enqueue(self, session: Any, envelope: Envelope, queue: str) -> bool:
        """Add an envelope to the outbox in ``session``'s transaction."""


class WorkflowMessages:
    """Builds and enqueues the messages of workflows for ``app``.

    Args:
        app: The app whose outbox (``enqueue``) and name (``app_id``) are used.
    """

    def __init__(self, app: WorkflowApp) -> None:
        self._app = app

    def store(self) -> WorkflowStore:
        """A :class:`WorkflowStore` that enqueues through this object."""
        return WorkflowStore(self.enqueue_step, self.enqueue_errback)

    def enqueue_step(
        self, target: Target, workflow_id: str, calls: Sequence[MemberCall], previous: Any,
        has_previous: bool,
    ) -> None:
        """Add one outbox row per member; prepend ``previous`` unless a member is immutable."""
        for call in calls:
            args = call.args if call.immutable or not has_previous else [previous, *call.args]
            envelope = self._envelope(call, args, {WORKFLOW: workflow_id})
            self._app.enqueue(target, envelope, call.queue)

    def enqueue_errback(
        self, target: Target, workflow_id: str, call: MemberCall, failed_task_id: str,
        error: str,
    ) -> None:
        """Add the link_error row: ``errback(workflow_id, failed_task_id, error, *args)``."""
        args = call.args if call.immutable else [workflow_id, failed_task_id, error, *call.args]
        self._app.enqueue(target, self._envelope(call, args, {}), call.queue)

    def _envelope(self, call: MemberCall, args: list[Any], headers: dict[str, Any]) -> Envelope:
        eta: datetime | None = None
        if call.countdown_s:
            eta = datetime.now(timezone.utc) + timedelta(seconds=call.countdown_s)
        return Envelope(
            task_id=call.task_id, task=call.task, args=args, kwargs=dict(call.kwargs),
            priority=call.priority, retries=0, idempotency_key=None, eta=eta,
            timestamp=int(time.time()), app_id=self._app.name, headers=headers,
        )
