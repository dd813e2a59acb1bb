"""Every exception taskq raises on purpose.

::

    TaskqError                      everything taskq raises on purpose
    ├── ConfigurationError          bad or unknown settings, queue or task options
    ├── TaskNotRegistered           a message or a call names a task the app does not know
    ├── DuplicateTaskName           two functions registered under one name
    ├── SerializationError          at enqueue: names the task and the argument; nothing published
    │   ├── MessageTooLarge         the encoded message exceeds ``max_message_size_bytes``
    │   └── DecodeError             poison body or envelope: goes to Q.dlq, never retried
    ├── BrokerError
    │   ├── BrokerConnectionError   recoverable: reconnect, re-declare, resume
    │   ├── PublishError            not confirmed: unreachable, nacked, timed out (cause chained)
    │   └── TopologyError           PRECONDITION_FAILED: names the object and both argument sets
    ├── OutboxError
    ├── IdempotencyError            the idempotency table cannot be read or written
    ├── TimeLimitExceeded           hard time limit: the worker killed the task's process
    ├── ResultError
    │   ├── ResultTimeout
    │   ├── ResultNotKept           get() of a task that keeps no result: says where it stands
    │   └── TaskFailed              remote failure: exception type, message, traceback text
    └── TaskControl                 raised *by task code* to steer the worker
        ├── Retry                   retry without logging an error
        └── Reject                  stop now; dead-letter; no more retries
    SoftTimeLimitExceeded(BaseException)  ``except Exception`` in task code must not swallow it

Every class carries structured keyword attributes (``task``, ``task_id``, ``queue``...) so
callers classify by type and attribute, never by message text. Errors that the CLI reports
carry an ``exit_code``.
"""

from __future__ import annotations

from typing import Any


class TaskqError(Exception):
    """Base of everything taskq raises on purpose.

    Args:
        message: A sentence saying what happened and what to do.
        **attributes: Structured context (``task``, ``task_id``, ``queue``...), set as
            attributes on the instance.
    """

    exit_code = 1

    def __init__(self, message: str, **attributes: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in attributes.items():
            setattr(self, key, value)


class ConfigurationError(TaskqError):
    """A setting, queue option or task option is unknown or invalid."""

    exit_code = 2


class TaskNotRegistered(TaskqError):
    """A task name is not in the app's registry (only registered tasks ever run)."""


class DuplicateTaskName(TaskqError):
    """Two different functions were registered under the same task name."""


class SerializationError(TaskqError):
    """Arguments cannot be encoded; raised at enqueue, before anything is published."""


class MessageTooLarge(SerializationError):
    """The encoded message is larger than the ``max_message_size_bytes`` setting."""


class DecodeError(SerializationError):
    """A received body or envelope is malformed; the message is dead-lettered, never retried."""


class BrokerError(TaskqError):
    """Base of errors talking to RabbitMQ."""


class BrokerConnectionError(BrokerError):
    """The broker could not be reached or the connection dropped (recoverable)."""


class PublishError(BrokerError):
    """A message was not confirmed by the broker (unreachable, nacked or timed out)."""


class TopologyError(BrokerError):
    """An exchange or queue exists with other arguments than the ones taskq declares."""

    exit_code = 3


class OutboxError(TaskqError):
    """The transactional outbox could not store or relay a task."""


class IdempotencyError(TaskqError):
    """The ``taskq_processed`` table could not be read or written (database down?)."""


class TimeLimitExceeded(TaskqError):
    """A task ran past its hard ``time_limit_s`` and the worker killed its process.

    Never raised in task code (the process is gone); it names that failure for retry
    policies (put it in ``dont_autoretry_for`` to dead-letter at once) and in dead letters.
    """


class ResultError(TaskqError):
    """A task result could not be stored or read."""


class ResultTimeout(ResultError):
    """A result was not ready within the given time."""


class ResultNotKept(ResultError):
    """``AsyncResult.get()`` of a task that keeps no result; the message says its state."""


class TaskFailed(ResultError):
    """The task failed in the worker; carries the remote type, message and traceback."""


class TaskControl(TaskqError):
    """Raised by task code to steer the worker rather than to report a failure."""


class Retry(TaskControl):
    """Ask for a retry of the current task without logging an error.

    ``raise self.retry(...)`` in a ``bind=True`` task builds and raises it. The worker
    retries while ``max_retries`` allows, whatever ``autoretry_for`` says; once retries are
    exhausted the message is dead-lettered with ``exc`` as the reason.

    Args:
        delay_s: Seconds to wait before the retry; ``None`` lets the retry policy decide.
        message: Shown in logs.
        exc: The failure that made the task ask (reported if retries are exhausted).
        max_retries: Overrides the task's ``max_retries`` for this decision.
    """

    delay_s: float | None
    exc: BaseException | None
    max_retries: int | None

    def __init__(
        self,
        delay_s: float | None = None,
        message: str = "retry requested",
        *,
        exc: BaseException | None = None,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(message, delay_s=delay_s, exc=exc, max_retries=max_retries)


class Reject(TaskControl):
    """Stop the current task now and dead-letter it, with no further retries.

    Args:
        reason: Why the message is rejected; stored in the dead letter's headers.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason=reason)


class SoftTimeLimitExceeded(BaseException):
    """Raised inside a task that ran past its ``soft_time_limit_s``.

    It derives from ``BaseException`` so that ``except Exception`` in task code does not
    swallow it; catch it explicitly to clean up, then let it propagate.
    """
