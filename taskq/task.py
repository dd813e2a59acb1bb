"""Task: a registered function plus its options; ``delay`` publishes it now.

Calling the task object runs the function in-process, like calling the function itself.
``delay(*args, **kwargs)`` and ``apply_async(...)`` encode the call, publish it with
publisher confirms and return an :class:`~taskq.results.AsyncResult` whose ``.id`` is the
task id.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, Protocol, TypeVar, cast

from taskq.calls import CallShape
from taskq.errors import ConfigurationError, Retry
from taskq.message import Envelope, gc_paused, new_task_ids
from taskq.ordering.arguments import KeyArgument
from taskq.ordering.keys import normalize_key
from taskq.request import Request, current_request
from taskq.results import AsyncResult
from taskq.retry import RetryOverrides
from taskq.workflows.canvas import Signature

if TYPE_CHECKING:
    from taskq.results import ResultStore
    from taskq.road import Outgoing, Road
    from taskq.settings import Settings

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
        idempotent: Skip a message whose idempotency key is already in ``taskq_processed``
            and record the key after success (one SELECT and one INSERT per task).
            ``False`` runs every delivery, with no database round trip.
        transactional: Pass the task a SQLAlchemy ``session`` keyword argument whose
            transaction also records the key: the task's writes and the key commit
            together, so effects in that database happen exactly once.
        max_retries: Retries after the first run; ``None`` takes ``task_max_retries``.
        retry_backoff: Exponential backoff base in seconds; ``None`` takes
            ``task_retry_backoff_s``.
        retry_backoff_max: Longest backoff in seconds; ``None`` takes
            ``task_retry_backoff_max_s``.
        retry_jitter: Randomise backoffs; ``None`` takes ``task_retry_jitter``.
        autoretry_for: Exception classes retried automatically (none by default: a task
            that raises anything else is dead-lettered at once).
        dont_autoretry_for: Exception classes never retried automatically (wins over
            ``autoretry_for``).
        bind: Pass the task object as the first argument (``self.request``,
            ``self.retry(...)``).
        store_result: Keep state and result in ``taskq_results``; ``None`` takes the
            app's ``store_results`` setting.
        ordering_key: For a task on an ordered queue: the name of the argument whose value
            is the call's ordering key (tasks of one key run one at a time, in order).
    """

    queue: str | None = None
    priority: int = 0
    time_limit_s: float | None = None
    soft_time_limit_s: float | None = None
    idempotent: bool = True
    transactional: bool = False
    max_retries: int | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    retry_jitter: bool | None = None
    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    bind: bool = False
    store_result: bool | None = None
    ordering_key: str | None = None

    def __post_init__(self) -> None:
        validate_priority(self.priority)
        self.retry_overrides()  # validates the retry options now, not in the worker
        for name in ("time_limit_s", "soft_time_limit_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ConfigurationError(f"{name} must be a positive number of seconds")
        if self.transactional and not self.idempotent:
            raise ConfigurationError(
                "transactional=True records the idempotency key in the task's transaction; "
                "it cannot be combined with idempotent=False"
            )
        if (
            self.time_limit_s is not None
            and self.soft_time_limit_s is not None
            and self.soft_time_limit_s >= self.time_limit_s
        ):
            raise ConfigurationError("soft_time_limit_s must be shorter than time_limit_s")


    def retry_overrides(self) -> RetryOverrides:
        """The task's retry options, to resolve against the app's defaults."""
        return RetryOverrides(
            max_retries=self.max_retries,
            retry_backoff=self.retry_backoff,
            retry_backoff_max=self.retry_backoff_max,
            retry_jitter=self.retry_jitter,
            autoretry_for=self.autoretry_for,
            dont_autoretry_for=self.dont_autoretry_for,
        )


class TaskApp(Protocol):
    """What a :class:`Task` needs of its app (:class:`~taskq.app.App` provides it).

    A protocol rather than the App itself, so that ``task`` does not depend on ``app``.
    """

    name: str
    settings: Settings
    session_provider: Callable[[], Any] | None

    @property
    def results(self) -> ResultStore:
        """The result store (read by :class:`~taskq.results.AsyncResult`)."""

    @property
    def road(self) -> Road:
        """Where every new message is built, checked and routed."""

    @property
    def registry(self) -> Any:
        """The app's tasks (whether a task keeps its result)."""

    def task_state(self, task_id: str, *, broker: bool = True) -> Any:
        """Where a task stands (read by :class:`~taskq.results.AsyncResult`)."""

    def send(self, outgoing: Outgoing) -> None:
        """Publish one message now, with confirms."""

    def send_many(self, outgoings: list[Outgoing]) -> None:
        """Publish messages now, with windowed confirms."""

    def enqueue(self, session: Any, outgoing: Outgoing) -> bool:
        """Add a message to the outbox in ``session``'s transaction."""


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
        self, app: TaskApp, fn: Callable[P, R], *, name: str, options: TaskOptions
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        self._key_argument = (
            KeyArgument(fn, options.ordering_key, task=name, bound=options.bind)
            if options.ordering_key is not None else None
        )
        self._shape = CallShape(
            fn, task=name, bound=options.bind,
            injected=("session",) if options.transactional else (),
        )
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the task function in this process (no broker involved)."""
        if self.options.bind:
            return cast(Any, self.fn)(self, *args, **kwargs)  # type: ignore[no-any-return]
        return self.fn(*args, **kwargs)

    @property
    def request(self) -> Request:
        """The delivery being executed, when this task runs in a worker.

        Outside a worker (a plain call) it is an empty request: ``task_id == ""`` and
        ``retries == 0``.
        """
        request = current_request.get()
        if request is not None and request.task == self.name:
            return request
        return Request(task_id="", task=self.name, queue=self.queue)

    def retry(
        self,
        countdown: float | timedelta | None = None,
        exc: BaseException | None = None,
        max_retries: int | None = None,
    ) -> NoReturn:
        """Ask the worker to run this task again later: raises :class:`~taskq.errors.Retry`.

        Write ``raise self.retry(...)`` so that readers (and linters) see the task stops
        here. The worker publishes a copy with ``taskq-retries + 1`` and acks this delivery;
        once ``max_retries`` is reached it dead-letters the message with ``exc`` instead.

        Args:
            countdown: Seconds (or a ``timedelta``) until the retry; ``None`` uses the
                task's backoff.
            exc: The failure behind the retry; defaults to the exception being handled.
            max_retries: Overrides the task's ``max_retries`` for this decision.

        Raises:
            Retry: always.
            ConfigurationError: a negative countdown or an invalid ``max_retries``.
        """
        delay_s = _countdown_s(countdown)
        if max_retries is not None:
            RetryOverrides(max_retries=max_retries)  # validates
        cause = exc if exc is not None else sys.exc_info()[1]
        text = f"retry requested ({type(cause).__name__}: {cause})" if cause else "retry requested"
        raise Retry(delay_s, text, exc=cause, max_retries=max_retries)

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
        ordering_key: Any = None,
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
            ordering_key: The call's ordering key (``str``, ``int`` or UUID), for an
                ordered queue; wins over the task's ``ordering_key`` argument.

        Returns:
            A handle whose ``id`` is the task id.

        Raises:
            SerializationError: an argument cannot be encoded (nothing is enqueued).
            MessageTooLarge: the encoded message exceeds ``max_message_size_bytes``.
            PublishError: the broker did not confirm the message (direct publish only).
            ConfigurationError: invalid options (naive ``eta``, both countdown and eta, a
                delay longer than the delay backend holds, an ordered queue without an
                ordering key or a key for an unordered queue...).
        """
        outgoing = self.app.road.build(
            self, args, kwargs, queue=queue, priority=priority, task_id=task_id,
            headers=headers, idempotency_key=idempotency_key, eta=resolve_eta(countdown, eta),
            ordering_key=ordering_key,
        )
        session = self._session(session)
        if session is not None:
            self.app.enqueue(session, outgoing)
        else:
            self.app.send(outgoing)
        return AsyncResult(outgoing.envelope.task_id, task=self.name, queue=outgoing.queue,
                           app=self.app)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call for a workflow; in a chain the previous result is
        prepended to ``args`` (see :mod:`taskq.workflows`)."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain it gets no previous result."""
        return Signature(self, args, kwargs, immutable=True)

    def delay_on(self, session: Any, /, *args: P.args, **kwargs: P.kwargs) -> AsyncResult:
        """Enqueue a call through the outbox in ``session``'s transaction.

        Shorthand for ``apply_async(args, kwargs, session=session)``.
        """
        return self.apply_async(args, kwargs, session=session)

    def map(
        self,
        items: Iterable[Any],
        *,
        queue: str | None = None,
        priority: int | None = None,
        session: Any = None,
    ) -> list[AsyncResult]:
        """Enqueue one call per item, each item being the single argument (Celery's ``map``).

        Without ``session`` all calls are published together with windowed publisher
        confirms, far faster than ``delay()`` in a loop; with ``session`` they become
        outbox rows of that transaction.
        """
        return self.starmap(((item,) for item in items), queue=queue, priority=priority,
                            session=session)

    def starmap(
        self,
        calls: Iterable[Sequence[Any]],
        *,
        queue: str | None = None,
        priority: int | None = None,
        session: Any = None,
    ) -> list[AsyncResult]:
        """Enqueue one call per tuple of positional arguments, in bulk (see :meth:`map`).

        Raises:
            SerializationError: an argument cannot be encoded (nothing is enqueued).
            MessageTooLarge: a message exceeds ``max_message_size_bytes`` (nothing is sent).
            PublishError: some messages were not confirmed; ``unconfirmed_ids`` lists them.
        """
        calls = calls if isinstance(calls, (list, tuple)) else list(calls)
        build = self.app.road.build
        with gc_paused():
            outgoings = [
                build(self, args, None, queue=queue, priority=priority, task_id=task_id)
                for args, task_id in zip(calls, new_task_ids(len(calls)), strict=True)
            ]
        session = self._session(session)
        if session is not None:
            for outgoing in outgoings:
                self.app.enqueue(session, outgoing)
        else:
            self.app.send_many(outgoings)
        with gc_paused():
            return [
                AsyncResult(o.envelope.task_id, task=self.name, queue=o.queue, app=self.app)
                for o in outgoings
            ]

    @property
    def default_priority(self) -> int:
        """The priority of a call that sets none (``@app.task(priority=...)``)."""
        return self.options.priority

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None) -> None:
        """Raise the ``TypeError`` calling the function with ``args, kwargs`` would raise.

        Raises:
            TypeError: a missing or unexpected argument, naming the task.
        """
        self._shape.check(args, kwargs)

    def ordering_key_of(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        queue: str,
        given: Any = None,
    ) -> str | None:
        """The ordering key of a call: ``given``, else the task's key argument, else ``None``.

        Raises:
            ConfigurationError: the key is not a str, int or UUID, or the call lacks the
                key argument.
        """
        if given is None and self._key_argument is not None:
            given = self._key_argument.of(args, kwargs)
        if given is None:
            return None
        return normalize_key(given, task=self.name, queue=queue)

    def _session(self, session: Any) -> Any:
        """The session to enqueue through: the given one, else the ambient one, if any.

        Framework integrations (Flask, Django) provide the request's own transaction.
        """
        if session is None and self.app.session_provider is not None:
            return self.app.session_provider()
        return session

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
        """The envelope of one call to this task's queue, checked like ``apply_async``
        (see :mod:`taskq.road`), not yet sent."""
        return self.app.road.build(
            self, args, kwargs, priority=priority, task_id=task_id, headers=headers,
            idempotency_key=idempotency_key, eta=eta,
        ).envelope


def _countdown_s(countdown: float | timedelta | None) -> float | None:
    if countdown is None:
        return None
    seconds = countdown.total_seconds() if isinstance(countdown, timedelta) else countdown
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ConfigurationError(f"countdown must be seconds >= 0, not {countdown!r}")
    return float(seconds)


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
