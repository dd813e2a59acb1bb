"""Task: a registered function plus its options; ``delay`` publishes it now.

Calling the task object runs the function in-process, like calling the function itself.
``delay(*args, **kwargs)`` and ``apply_async(...)`` encode the call, publish it with
publisher confirms and return an :class:`~taskq.results.AsyncResult` whose ``.id`` is the
task id.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from taskq.errors import ConfigurationError
from taskq.message import Envelope
from taskq.results import AsyncResult

if TYPE_CHECKING:
    from taskq.app import App

P = ParamSpec("P")
R = TypeVar("R")

MAX_PRIORITY = 9


@dataclass(frozen=True)
class TaskOptions:
    """Per-task options given to ``@app.task(...)``.

    Args:
        queue: Queue the task is published to; ``None`` uses the app's ``default_queue``.
        priority: Default message priority, 0 (lowest) to 9.
        time_limit_s: Hard limit: past it the worker process is replaced and the message
            dead-lettered with reason ``TimeLimitExceeded``.
        soft_time_limit_s: Soft limit: ``SoftTimeLimitExceeded`` is raised inside the task.
    """

    queue: str | None = None
    priority: int = 0
    time_limit_s: float | None = None
    soft_time_limit_s: float | None = None

    def __post_init__(self) -> None:
        validate_priority(self.priority)
        for name in ("time_limit_s", "soft_time_limit_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ConfigurationError(f"{name} must be a positive number of seconds")
        if (
            self.time_limit_s is not None
            and self.soft_time_limit_s is not None
            and self.soft_time_limit_s >= self.time_limit_s
        ):
            raise ConfigurationError("soft_time_limit_s must be shorter than time_limit_s")


def validate_priority(priority: int) -> int:
    """Return ``priority`` if it is an int in 0..9, else raise ``ConfigurationError``."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ConfigurationError(f"priority must be an int from 0 to 9, not {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ConfigurationError(f"priority must be from 0 to {MAX_PRIORITY}, not {priority}")
    return priority


class Task(Generic[P, R]):
    """A function registered with an :class:`~taskq.app.App` under a unique name.

    Args:
        app: The app the task belongs to.
        fn: The function to run.
        name: Registered name; travels in the ``taskq-task`` header.
        options: Queue, priority and time limits.
    """

    def __init__(
        self, app: App, fn: Callable[P, R], *, name: str, options: TaskOptions
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the task function in this process (no broker involved)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    @property
    def queue(self) -> str:
        """The queue this task is published to when the call does not say otherwise."""
        return self.options.queue or self.app.settings.default_queue

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> AsyncResult:
        """Publish a call of this task now, with publisher confirms.

        Raises:
            SerializationError: an argument cannot be encoded (nothing is published).
            PublishError: the broker did not confirm the message.
        """
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        session: Any = None,
        idempotency_key: str | None = None,
        countdown: float | timedelta | None = None,
        eta: datetime | None = None,
    ) -> AsyncResult:
        """Enqueue a call of this task, with per-call options.

        Without ``session`` the message is published now and confirmed by the broker before
        this returns. With ``session`` (an ORM ``Session`` or a Core ``Connection``) one row
        is added to the ``taskq_outbox`` table in that session's transaction: nothing is
        sent and nothing is committed; the relay publishes the row once the caller commits,
        and never if it rolls back.

        With ``countdown`` or ``eta`` the broker holds the message until it is due (the
        app's delay backend, see :mod:`taskq.delay`); through the outbox, a row due further
        ahead than ``outbox_delay_horizon_s`` stays in the table until it is that near.

        Args:
            args: Positional arguments of the task function.
            kwargs: Keyword arguments of the task function.
            queue: Overrides the task's queue.
            priority: Overrides the task's priority (0..9, higher runs first).
            task_id: Use this id instead of a new UUID (it is also the message id).
            headers: Extra application headers carried with the message.
            session: Enqueue through the transactional outbox in this transaction.
            idempotency_key: Deduplication key; a second enqueue with the same key while
                the first is still in the outbox is a no-op, and the worker runs a key once.
            countdown: Run no earlier than this many seconds (or ``timedelta``) from now.
            eta: Run no earlier than this aware datetime (sent as ``taskq-eta``, epoch ms).

        Returns:
            A handle whose ``id`` is the task id.

        Raises:
            SerializationError: an argument cannot be encoded (nothing is enqueued).
            MessageTooLarge: the encoded message exceeds ``max_message_size_bytes``.
            PublishError: the broker did not confirm the message (direct publish only).
            ConfigurationError: invalid options (naive ``eta``, both countdown and eta, a
                delay longer than the delay backend holds...).
        """
        envelope = self.envelope(
            args,
            kwargs,
            priority=priority,
            task_id=task_id,
            headers=headers,
            idempotency_key=idempotency_key,
            eta=resolve_eta(countdown, eta),
        )
        target = queue or self.queue
        if session is None and self.app.session_provider is not None:
            # Framework integrations (Flask, Django) enqueue through the request's own
            # transaction when there is one.
            session = self.app.session_provider()
        if session is not None:
            self.app.enqueue(session, envelope, target)
        else:
            self.app.send(envelope, target)
        return AsyncResult(envelope.task_id, task=self.name, queue=target, app=self.app)

    def delay_on(self, session: Any, /, *args: P.args, **kwargs: P.kwargs) -> AsyncResult:
        """Enqueue a call through the outbox in ``session``'s transaction.

        Shorthand for ``apply_async(args, kwargs, session=session)``.
        """
        return self.apply_async(args, kwargs, session=session)

    def envelope(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        priority: int | None = None,
        task_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        eta: datetime | None = None,
    ) -> Envelope:
        """Build the envelope of one call (not yet encoded or published)."""
        if not isinstance(args, (list, tuple)):
            raise ConfigurationError(
                f"args of task {self.name!r} must be a list or tuple, not {type(args).__name__}"
            )
        return Envelope(
            task_id=task_id or str(uuid.uuid4()),
            task=self.name,
            args=list(args),
            kwargs=dict(kwargs) if kwargs else {},
            priority=self.options.priority if priority is None else validate_priority(priority),
            retries=0,
            idempotency_key=idempotency_key,
            eta=eta,
            timestamp=int(time.time()),
            app_id=self.app.name,
            headers=dict(headers) if headers else {},
        )


def resolve_eta(countdown: float | timedelta | None, eta: datetime | None) -> datetime | None:
    """Turn ``countdown`` or ``eta`` into an aware UTC datetime (``None`` = run now).

    Raises:
        ConfigurationError: both given, a naive ``eta``, or a negative countdown.
    """
    if countdown is not None and eta is not None:
        raise ConfigurationError("give countdown or eta, not both")
    if countdown is not None:
        seconds = countdown.total_seconds() if isinstance(countdown, timedelta) else countdown
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ConfigurationError(f"countdown must be seconds >= 0, not {countdown!r}")
        if seconds == 0:
            return None
        return datetime.now(timezone.utc) + timedelta(seconds=seconds)
    if eta is not None:
        if not isinstance(eta, datetime) or eta.tzinfo is None:
            raise ConfigurationError(
                f"eta must be a timezone-aware datetime, e.g. "
                f"datetime.now(timezone.utc) + timedelta(minutes=5); got {eta!r}"
            )
        return eta.astimezone(timezone.utc)
    return None
