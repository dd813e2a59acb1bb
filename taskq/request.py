"""The delivery a worker is executing, as task code sees it (``self.request``).

:func:`taskq.worker.execution.execute` (and eager mode) set :data:`current_request` around
the task call; :attr:`taskq.task.Task.request` reads it. A module of its own so that the
worker's execution and eager mode need nothing of :mod:`taskq.task`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Request:
    """The delivery a worker is executing, as task code sees it (``self.request``).

    Args:
        task_id: The task id (AMQP ``message_id``); ``""`` for an in-process call.
        task: The registered task name.
        retries: Retries already done: 0 on the first run (``taskq-retries``).
        queue: The queue the message was consumed from.
        idempotency_key: The key recorded when the task succeeds.
        eta: When the message was due, for delayed tasks and retries.
        headers: Extra headers of the message.
        is_redelivered: The broker delivered the message before (a process or channel died).
    """

    task_id: str
    task: str
    retries: int = 0
    queue: str = ""
    idempotency_key: str = ""
    eta: datetime | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    is_redelivered: bool = False


#: The request of the task the worker is executing in this context; set by
#: :func:`taskq.worker.execution.execute` around the task call.
current_request: ContextVar[Request | None] = ContextVar("taskq_current_request", default=None)
