"""AsyncResult: the handle ``delay`` and ``apply_async`` return."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.app import App


class AsyncResult:
    """A handle on one enqueued task.

    Args:
        task_id: The task id (also the AMQP ``message_id``).
        task: The registered task name.
        queue: The queue the task was sent to.
        app: The app that sent it.
    """

    __slots__ = ("id", "task", "queue", "app")

    def __init__(self, task_id: str, *, task: str, queue: str, app: App | None = None) -> None:
        self.id = task_id
        self.task = task
        self.queue = queue
        self.app = app

    def __repr__(self) -> str:
        return f"<AsyncResult {self.id} task={self.task} queue={self.queue}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)
