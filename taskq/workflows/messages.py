"""The messages of a workflow: a step's members and the link_error call, through the outbox.

Both the producer (the first step) and the worker (every later step, link_error) enqueue
through here, always as outbox rows of the transaction that decided it: the relay publishes
them once that transaction commits, and never if it rolls back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

from taskq.message import WORKFLOW
from taskq.workflows.store import MemberCall, Target, WorkflowStore

if TYPE_CHECKING:
    from taskq.road import Outgoing, Road

# What ``check_step`` puts in the place of a result not known until the step before ends.
PREVIOUS_RESULT = "<result of the previous step>"
# What ``check_errback`` puts in the place of the errback's first three arguments.
_ERRBACK_PLACEHOLDERS = ("<workflow id>", "<failed task id>", "<error>")


class TaskLookup(Protocol):
    """The app's task registry, as workflows use it."""

    def get(self, name: str) -> Any:
        """The task registered as ``name`` (raises ``TaskNotRegistered``)."""


class WorkflowApp(Protocol):
    """What workflows need of the app (:class:`~taskq.app.App` provides it)."""

    name: str
    session_provider: Callable[[], Any] | None

    @property
    def registry(self) -> TaskLookup:
        """The app's tasks by name."""

    @property
    def settings(self) -> Any:
        """The app's settings."""

    @property
    def engine(self) -> Any:
        """The engine of ``database_url`` (workflow tables, outbox)."""

    @property
    def road(self) -> Road:
        """Where every new message is built, checked and routed."""

    def enqueue(self, session: Any, outgoing: Outgoing) -> bool:
        """Add a message to the outbox in ``session``'s transaction."""


class WorkflowMessages:
    """Builds (through the app's road) and enqueues the messages of workflows for ``app``.

    Args:
        app: The app whose road, registry and outbox are used.
        tasks: The producer's own task objects by name (those of the signatures being
            applied); any other task is looked up in the app's registry, as a worker does.
    """

    def __init__(self, app: WorkflowApp, tasks: Mapping[str, Any] | None = None) -> None:
        self._app = app
        self._tasks = dict(tasks or {})

    def store(self) -> WorkflowStore:
        """A :class:`WorkflowStore` that enqueues through this object."""
        return WorkflowStore(self.enqueue_step, self.enqueue_errback)

    def check_step(self, calls: Sequence[MemberCall], *, has_previous: bool) -> None:
        """Build each member's message once, to refuse now what a worker could not enqueue.

        A later step's arguments start with a result not known yet: a placeholder stands in
        for it (its ordering key too, when the key is that argument).

        Raises:
            TypeError, ConfigurationError, SerializationError, MessageTooLarge: as the road.
            TaskNotRegistered: a member's task is not registered in this app.
        """
        for call in calls:
            args = call.args if call.immutable or not has_previous else [
                PREVIOUS_RESULT, *call.args
            ]
            self._outgoing(call, args, {WORKFLOW: "check"})

    def check_errback(self, call: MemberCall) -> None:
        """Build the link_error message once, with placeholders, to refuse it now."""
        args = call.args if call.immutable else [*_ERRBACK_PLACEHOLDERS, *call.args]
        self._outgoing(call, args, {})

    def enqueue_step(
        self, target: Target, workflow_id: str, calls: Sequence[MemberCall], previous: Any,
        has_previous: bool,
    ) -> None:
        """Add one outbox row per member; prepend ``previous`` unless a member is immutable."""
        for call in calls:
            args = call.args if call.immutable or not has_previous else [previous, *call.args]
            self._app.enqueue(target, self._outgoing(call, args, {WORKFLOW: workflow_id}))

    def enqueue_errback(
        self, target: Target, workflow_id: str, call: MemberCall, failed_task_id: str,
        error: str,
    ) -> None:
        """Add the link_error row: ``errback(workflow_id, failed_task_id, error, *args)``."""
        args = call.args if call.immutable else [workflow_id, failed_task_id, error, *call.args]
        self._app.enqueue(target, self._outgoing(call, args, {}))

    def _outgoing(self, call: MemberCall, args: list[Any], headers: dict[str, Any]) -> Outgoing:
        eta: datetime | None = None
        if call.countdown_s:
            eta = datetime.now(timezone.utc) + timedelta(seconds=call.countdown_s)
        task = self._tasks.get(call.task) or self._app.registry.get(call.task)
        return self._app.road.build(
            task, args, call.kwargs, queue=call.queue,
            priority=call.priority, task_id=call.task_id, headers=headers, eta=eta,
        )
