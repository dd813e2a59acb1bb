"""Signatures and the canvas: ``chain``, ``group`` and ``chord``, as in Celery.

A :class:`Signature` is a task call not yet sent: ``add.s(2)`` is partial (in a chain the
previous step's result is prepended to its arguments), ``add.si(2, 3)`` is immutable. A
workflow is a list of *steps*; each step is one task or a group whose members run in
parallel. ``chain(a.s(1), group(b.s(), c.s()), d.s())`` has three steps; ``chord(group,
callback)`` is the two-step chain ``(group, callback)``.

Starting a workflow writes its rows (:mod:`taskq.workflows.store`) and the first step's
outbox rows in one transaction: the caller's (``session=``, or the app's ambient session)
or one of its own that commits before ``apply_async`` returns. The relay publishes them;
every later step is enqueued by the worker in the transaction that counts the last member
of the step before (:mod:`taskq.workflows.completion`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Protocol

from taskq.broker.topology import validate_queue_name
from taskq.errors import ConfigurationError
from taskq.message import MAX_PRIORITY, new_task_id, new_task_ids
from taskq.workflows.messages import WorkflowApp, WorkflowMessages
from taskq.workflows.result import WorkflowResult
from taskq.workflows.store import MemberCall

#: A workflow's steps: each its signatures and whether it is a group (whose result is a
#: list, even of one member).
Steps = list[tuple[list["Signature"], bool]]


class SignedTask(Protocol):
    """What a signature needs of its task (:class:`~taskq.task.Task` provides it)."""

    @property
    def name(self) -> str:
        """Registered task name."""

    @property
    def queue(self) -> str:
        """The task's queue."""

    @property
    def app(self) -> Any:
        """The app the task belongs to (a :class:`~taskq.workflows.messages.WorkflowApp`)."""

    @property
    def options(self) -> Any:
        """The task's options (``priority`` is read)."""

    def apply_async(
        self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
        queue: str | None = None, priority: int | None = None, session: Any = None,
        countdown: float | timedelta | None = None,
    ) -> Any:
        """Enqueue one call of the task."""


@dataclass(frozen=True)
class Signature:
    """One task call with its arguments and options, not yet sent.

    Args:
        task: The task to call.
        args: Positional arguments (the previous result goes first in a chain).
        kwargs: Keyword arguments.
        immutable: ``True`` for ``si()``: no previous result is prepended.
        queue: Overrides the task's queue.
        priority: Overrides the task's priority (0..9).
        countdown_s: Delays this member's message once its step starts.
    """

    task: SignedTask
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    immutable: bool = False
    queue: str | None = None
    priority: int | None = None
    countdown_s: float | None = None

    def __post_init__(self) -> None:
        _check_priority(self.priority)
        if self.countdown_s is not None:
            object.__setattr__(self, "countdown_s", _seconds(self.countdown_s))

    def __repr__(self) -> str:
        mark = "si" if self.immutable else "s"
        call = ", ".join([*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())])
        return f"{self.task.name}.{mark}({call})"

    @property
    def name(self) -> str:
        """The task's registered name."""
        return self.task.name

    def set(
        self, *, queue: str | None = None, priority: int | None = None,
        countdown: float | timedelta | None = None,
    ) -> Signature:
        """A copy with these options (``None`` keeps the current one)."""
        return replace(
            self,
            queue=queue if queue is not None else self.queue,
            priority=priority if priority is not None else self.priority,
            countdown_s=_seconds(countdown) if countdown is not None else self.countdown_s,
        )

    def __or__(self, other: Signature | Group | Chain | Chord) -> Chain:
        return Chain(self, other)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """Send this call now with extra arguments: ``apply_async(args, kwargs)``."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
        queue: str | None = None, priority: int | None = None,
        countdown: float | timedelta | None = None, session: Any = None,
        link_error: Signature | None = None,
    ) -> Any:
        """Send this call, ``args`` appended to its own and ``kwargs`` merged in.

        A lone signature is a plain task call and returns an
        :class:`~taskq.results.AsyncResult`; with ``link_error`` it runs as a one-task
        workflow and returns a :class:`WorkflowResult`.
        """
        called = replace(self, args=(*self.args, *args), kwargs={**self.kwargs, **(kwargs or {})})
        if link_error is not None:
            return Chain(called).apply_async(queue=queue, priority=priority,
                                             countdown=countdown, session=session,
                                             link_error=link_error)
        return self.task.apply_async(
            called.args, called.kwargs, queue=queue or self.queue,
            priority=self.priority if priority is None else priority,
            countdown=countdown if countdown is not None else self.countdown_s,
            session=session,
        )

    def _steps(self) -> Steps:
        return [([self], False)]


class _Workflow:
    """What chains, groups and chords share: their steps and how they are started."""

    kind = "chain"

    def _steps(self) -> Steps:
        raise NotImplementedError

    def __or__(self, other: Signature | Group | Chain | Chord) -> Chain:
        return Chain(self, other)  # type: ignore[arg-type]

    def delay(self) -> WorkflowResult:
        """Start the workflow now: ``apply_async()``."""
        return self.apply_async()

    def apply_async(
        self, *, queue: str | None = None, priority: int | None = None,
        countdown: float | timedelta | None = None, session: Any = None,
        link_error: Signature | None = None,
    ) -> WorkflowResult:
        """Start the workflow: its rows and its first step's messages, in one transaction.

        Args:
            queue: Queue of every member whose signature does not name one.
            priority: Priority of every member whose signature does not set one.
            countdown: Delays the first step (seconds or a ``timedelta``).
            session: Write everything in this transaction (an ORM ``Session`` or a Core
                ``Connection``): the workflow starts if it commits, never if it rolls back.
                Without one, the ambient transaction: inside Django's
                ``transaction.atomic()`` (``taskq.contrib.django``) the block's, through
                Django's connection; else taskq commits its own transaction before this
                returns.
            link_error: Called once if a member is dead-lettered, as
                ``link_error(workflow_id, failed_task_id, error, *its args)`` (only its own
                args if made with ``si()``).

        Raises:
            ConfigurationError: an empty group, a bad option, eager mode, or a member or
                errback that could not be enqueued when its turn came (a priority its queue
                does not take, a missing ordering key...): every message is built through
                the app's road (:mod:`taskq.road`) first, so nothing is written.
            TypeError: a member's or the errback's arguments do not fit its function.
            SerializationError: an argument cannot be encoded (nothing is written).
            OutboxError: the rows could not be written.
        """
        steps = self._steps()
        app: WorkflowApp = steps[0][0][0].task.app
        first_delay = _seconds(countdown) if countdown is not None else None
        _check_priority(priority)
        calls = _calls(steps, queue, priority, first_delay)
        errback = None
        if link_error is not None:
            errback = _call(link_error, new_task_id(), queue, priority, None, 0, 0, False)
        target = _transaction_of(app, session)
        signatures = [sig for sigs, _ in steps for sig in sigs]
        if link_error is not None:
            signatures.append(link_error)
        messages = WorkflowMessages(app, {sig.task.name: sig.task for sig in signatures})
        # Every member and the errback are built once now: what a worker could not enqueue
        # when their turn comes is refused here, before anything is written.
        for index, step in enumerate(calls):
            messages.check_step(step, has_previous=index > 0)
        if errback is not None:
            messages.check_errback(errback)
        workflow_id = new_task_id()
        store = messages.store()
        if target is not None:
            store.create(target, workflow_id, self.kind, calls, errback)
        else:
            with app.engine.begin() as conn:
                store.create(conn, workflow_id, self.kind, calls, errback)
        return WorkflowResult(workflow_id, kind=self.kind, app=app)


class Chain(_Workflow):
    """Steps run one after the other; each gets the previous step's result first.

    Args:
        *items: Signatures, groups, chords or chains (nested chains are flattened).
    """

    def __init__(self, *items: Signature | Group | Chain | Chord) -> None:
        if not items:
            raise ConfigurationError("a chain needs at least one signature (task.s(...))")
        for item in items:
            _check_item(item, "a chain")
        self.items = items

    def __repr__(self) -> str:
        return " | ".join(repr(item) for item in self.items)

    def _steps(self) -> Steps:
        return [step for item in self.items for step in item._steps()]


class Group(_Workflow):
    """Members run in parallel; the group's result is the list of theirs, in member order.

    Args:
        *members: Signatures, or one iterable of them.
    """

    kind = "group"

    def __init__(self, *members: Signature | Iterable[Signature]) -> None:
        if len(members) == 1 and not isinstance(members[0], Signature):
            members = tuple(members[0])
        if not members:
            raise ConfigurationError("a group needs at least one member (task.s(...))")
        for member in members:
            if not isinstance(member, Signature):
                raise ConfigurationError(
                    f"a group's members are signatures (task.s(...)); got {member!r} "
                    "(a chain or group inside a group is not supported)"
                )
        self.members: tuple[Signature, ...] = members  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"group({', '.join(map(repr, self.members))})"

    def __len__(self) -> int:
        return len(self.members)

    def _steps(self) -> Steps:
        return [(list(self.members), True)]


class Chord(_Workflow):
    """A group and a callback called once with the list of the members' results.

    Args:
        header: The group (or an iterable of signatures).
        body: The callback signature.
    """

    kind = "chord"

    def __init__(self, header: Group | Iterable[Signature], body: Signature) -> None:
        self.header = header if isinstance(header, Group) else Group(header)
        if not isinstance(body, Signature):
            raise ConfigurationError(f"a chord's callback is a signature; got {body!r}")
        self.body = body

    def __repr__(self) -> str:
        return f"chord({self.header!r}, {self.body!r})"

    def _steps(self) -> Steps:
        return [*self.header._steps(), ([self.body], False)]


def chain(*items: Signature | Group | Chain | Chord) -> Chain:
    """``chain(a.s(1), b.s(), c.s())``: run one after the other (see :class:`Chain`)."""
    return Chain(*items)


def group(*members: Signature | Iterable[Signature]) -> Group:
    """``group(sigs)`` or ``group(a.s(1), a.s(2))``: run in parallel (see :class:`Group`)."""
    return Group(*members)


def chord(header: Group | Iterable[Signature], body: Signature) -> Chord:
    """``chord(group, callback)``: callback of the list of results (see :class:`Chord`)."""
    return Chord(header, body)


def _check_item(item: object, where: str) -> None:
    if not isinstance(item, (Signature, Group, Chain, Chord)):
        raise ConfigurationError(
            f"{where} holds signatures (task.s(...)), groups, chords or chains; got {item!r}"
        )


def _calls(
    steps: Steps, queue: str | None, priority: int | None, first_delay: float | None
) -> list[list[MemberCall]]:
    ids = iter(new_task_ids(sum(len(sigs) for sigs, _ in steps)))
    return [
        [_call(sig, next(ids), queue, priority, first_delay if index == 0 else None, index,
               position, is_group)
         for position, sig in enumerate(sigs)]
        for index, (sigs, is_group) in enumerate(steps)
    ]


def _call(
    sig: Signature, task_id: str, queue: str | None, priority: int | None,
    delay_s: float | None, step: int, position: int, in_group: bool,
) -> MemberCall:
    task = sig.task
    chosen = sig.priority if sig.priority is not None else priority
    target = sig.queue or queue or task.queue
    validate_queue_name(target)  # now, not when a worker enqueues a later step
    return MemberCall(
        task_id=task_id, task=task.name, queue=target,
        priority=task.options.priority if chosen is None else chosen,
        args=list(sig.args), kwargs=dict(sig.kwargs), immutable=sig.immutable,
        countdown_s=sig.countdown_s if sig.countdown_s is not None else delay_s,
        step=step, position=position, in_group=in_group,
    )


def _transaction_of(app: WorkflowApp, session: Any) -> Any:
    """The caller's transaction to start in: ``session``, else the ambient one, if any."""
    if app.settings.task_always_eager:
        raise ConfigurationError(
            "workflows need workers: their joins run in the worker's completion "
            "transaction, so task_always_eager=True cannot run a chain, group or chord; "
            "test them with a worker (or call the tasks directly)"
        )
    if session is None and app.session_provider is not None:
        # Inside Django's transaction.atomic(): the block's own connection (DjangoOutbox).
        session = app.session_provider()
    return session


def _check_priority(priority: int | None) -> None:
    if priority is None:
        return
    if not isinstance(priority, int) or isinstance(priority, bool) or not (
        0 <= priority <= MAX_PRIORITY
    ):
        raise ConfigurationError(f"priority must be an int from 0 to {MAX_PRIORITY}, "
                                 f"not {priority!r}")


def _seconds(value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ConfigurationError(f"countdown must be seconds >= 0, not {value!r}")
    return float(seconds)
