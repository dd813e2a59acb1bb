"""taskq: a task queue for Python on RabbitMQ, with a transactional outbox.

Define tasks with :meth:`App.task`, enqueue them with ``task.delay(...)`` and run them with
``taskq worker -A module:app``. Importing taskq opens no connection and imports no web
framework.
"""

from __future__ import annotations

from taskq.app import App
from taskq.errors import (
    BrokerConnectionError,
    BrokerError,
    ConfigurationError,
    DecodeError,
    DuplicateTaskName,
    IdempotencyError,
    MessageTooLarge,
    OutboxError,
    PublishError,
    Reject,
    ResultError,
    ResultNotKept,
    ResultTimeout,
    Retry,
    SerializationError,
    SoftTimeLimitExceeded,
    TaskControl,
    TaskFailed,
    TaskNotRegistered,
    TaskqError,
    TimeLimitExceeded,
    TopologyError,
)
from taskq.results import AsyncResult
from taskq.schedules.spec import crontab
from taskq.schema import metadata
from taskq.settings import Settings
from taskq.task import Task
from taskq.workflows import Signature, WorkflowResult, chain, chord, group

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncResult",
    "BrokerConnectionError",
    "BrokerError",
    "ConfigurationError",
    "DecodeError",
    "DuplicateTaskName",
    "IdempotencyError",
    "MessageTooLarge",
    "OutboxError",
    "PublishError",
    "Reject",
    "ResultError",
    "ResultNotKept",
    "ResultTimeout",
    "Retry",
    "SerializationError",
    "Settings",
    "Signature",
    "SoftTimeLimitExceeded",
    "Task",
    "TaskControl",
    "TaskFailed",
    "TaskNotRegistered",
    "TaskqError",
    "TimeLimitExceeded",
    "TopologyError",
    "WorkflowResult",
    "__version__",
    "chain",
    "chord",
    "crontab",
    "group",
    "metadata",
]
