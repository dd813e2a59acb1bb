"""WorkflowStore: the SQL of ``taskq_workflows`` and ``taskq_workflow_members``.

Every method that changes a workflow runs in the caller's transaction (an ORM ``Session`` or
a Core ``Connection``) and never commits: starting a workflow joins the producer's
transaction, counting a member joins the transaction that records its idempotency key.

The join is a counter on the workflow row: ``remaining`` members of the running ``step``.
A member is counted only by the statement that moves its own row out of ``PENDING`` /
``ENQUEUED`` (``UPDATE ... WHERE state IN (...)``), so a second completion of the same
member changes nothing; the decrement is one ``UPDATE ... RETURNING`` of the workflow row,
which PostgreSQL serialises on the row lock (the second transaction sees the first's
value). The statement that brings ``remaining`` to 0 is the only one that advances the
workflow, and it enqueues the next step through the outbox in the same transaction.

A worker's app may refuse what it enqueues (a result too large for the next message, a
queue it declares otherwise): each enqueue runs in a savepoint, and a refusal is recorded
instead of undoing the transaction or reaching the worker. A step that cannot start fails
the workflow naming the refused member; a link_error that cannot be enqueued is noted in
the workflow's error and logged. A database outage goes on up, unchanged (docs/reliability.md).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from taskq.codec import decode_body, encode_body
from taskq.db import as_aware, utcnow
from taskq.errors import OutboxError
from taskq.idempotency import is_database_outage
from taskq.schema import workflow_members_table as members_t
from taskq.schema import workflows_table as workflows_t

Target = Session | Connection

logger = logging.getLogger(__name__)


class WorkflowState(str, enum.Enum):
    """Where a workflow stands (``taskq_workflows.state``)."""

    PENDING = "PENDING"  # no row: not committed yet, rolled back, or pruned
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"

    @property
    def is_ready(self) -> bool:
        """Whether the state is final."""
        return self in (WorkflowState.SUCCESS, WorkflowState.FAILURE)


class MemberState(str, enum.Enum):
    """Where a member stands (``taskq_workflow_members.state``)."""

    PENDING = "PENDING"  # its step has not started (or never will: the workflow failed)
    ENQUEUED = "ENQUEUED"  # in the outbox or the queue, running, or retrying
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"  # dead-lettered


_OPEN = (MemberState.PENDING.value, MemberState.ENQUEUED.value)


@dataclass(frozen=True, slots=True)
class MemberCall:
    """What a member row stores to build its message when its step starts.

    Args:
        task_id: The member's task id (message id and idempotency key).
        task: Registered task name.
        queue: Queue it is published to.
        priority: Message priority.
        args: Positional arguments given in the signature.
        kwargs: Keyword arguments given in the signature.
        immutable: ``si()``: the previous step's result is not prepended.
        countdown_s: Delay of its message once its step starts.
        step: Index of its step in the workflow.
        position: Its place in the step (member order of a group).
        in_group: Whether its step is a group (its result is then a list).
    """

    task_id: str
    task: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    immutable: bool = False
    countdown_s: float | None = None
    step: int = 0
    position: int = 0
    in_group: bool = False

    def encoded(self) -> bytes:
        """The msgpack of the call (``taskq_workflow_members.call``).

        Raises:
            SerializationError: an argument cannot be encoded.
        """
        fields = [self.priority, self.args, self.kwargs, self.immutable, self.countdown_s,
                  self.in_group]
        return encode_body(fields, None, task=self.task)

    @classmethod
    def decoded(cls, row: Any) -> MemberCall:
        """The call stored in a member row."""
        (priority, args, kwargs, immutable, countdown_s, in_group), _ = decode_body(row.call)
        return cls(row.task_id, row.task, row.queue, priority, args, kwargs, immutable,
                   countdown_s, row.step, row.position, in_group)


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """One row of ``taskq_workflows``."""

    id: str
    kind: str
    state: WorkflowState
    step: int
    steps: int
    remaining: int
    result: Any
    error: str | None
    failed_task_id: str | None
    failed_task: str | None
    created_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One row of ``taskq_workflow_members`` (its result decoded)."""

    task_id: str
    workflow_id: str
    step: int
    position: int
    task: str
    queue: str
    state: MemberState
    result: Any
    error: str | None
    traceback: str | None
    finished_at: datetime | None


#: Publishes a step's members: called with the transaction, the workflow id and the calls,
#: plus the result of the previous step (``None`` and ``False`` for the first step).
EnqueueStep = Callable[[Target, str, Sequence[MemberCall], Any, bool], None]
#: Called with the transaction, the workflow id, the stored link_error call, the failed
#: member's task id and its error, once, when the workflow fails.
EnqueueErrback = Callable[[Target, str, MemberCall, str, str], None]


def encode_value(value: Any, task: str) -> bytes:
    """The msgpack of one result value (raises ``SerializationError``)."""
    return encode_body([value], None, task=task)


def decode_value(data: bytes | None) -> Any:
    """The result value stored by :func:`encode_value` (``None`` stays ``None``)."""
    return decode_body(data)[0][0] if data is not None else None


class WorkflowStore:
    """Reads and writes the workflow tables (see the module docstring).

    Args:
        enqueue_step: Adds a step's member messages to the outbox in a transaction.
        enqueue_errback: Adds the link_error message to the outbox in a transaction.
    """

    def __init__(self, enqueue_step: EnqueueStep, enqueue_errback: EnqueueErrback) -> None:
        self._enqueue_step = enqueue_step
        self._enqueue_errback = enqueue_errback

    def create(
        self,
        target: Target,
        workflow_id: str,
        kind: str,
        steps: Sequence[Sequence[MemberCall]],
        link_error: MemberCall | None,
    ) -> None:
        """Insert the workflow and its members, and enqueue its first step, in ``target``.

        Raises:
            SerializationError: an argument cannot be encoded (nothing is written).
        """
        try:
            self._create(target, workflow_id, kind, steps, link_error)
        except sa.exc.SQLAlchemyError as exc:
            raise OutboxError(
                f"cannot start {kind} {workflow_id}: {getattr(exc, 'orig', None) or exc}; "
                "run app.create_tables() or `taskq db create` if its tables are missing",
                task_id=workflow_id,
            ) from exc

    def _create(
        self, target: Target, workflow_id: str, kind: str,
        steps: Sequence[Sequence[MemberCall]], link_error: MemberCall | None,
    ) -> None:
        now = utcnow()
        rows = [
            {"task_id": c.task_id, "workflow_id": workflow_id, "step": c.step,
             "position": c.position, "task": c.task, "queue": c.queue,
             "state": MemberState.ENQUEUED.value if c.step == 0 else MemberState.PENDING.value,
             "call": c.encoded()}
            for step in steps for c in step
        ]
        target.execute(workflows_t.insert().values(
            id=workflow_id, kind=kind, state=WorkflowState.RUNNING.value, step=0,
            steps=len(steps), remaining=len(steps[0]), created_at=now,
            link_error=_pack_call(link_error) if link_error is not None else None,
        ))
        target.execute(members_t.insert(), rows)
        self._enqueue_step(target, workflow_id, steps[0], None, False)

    def member_succeeded(self, target: Target, task_id: str, result: bytes) -> bool:
        """Count member ``task_id`` done with ``result``; advance the workflow if it was last.

        Returns:
            Whether this call counted it (``False``: already counted, failed, or unknown).
        """
        t = members_t
        member = target.execute(
            sa.update(t)
            .where(t.c.task_id == task_id, t.c.state.in_(_OPEN))
            .values(state=MemberState.SUCCESS.value, result=result, finished_at=utcnow())
            .returning(t.c.workflow_id, t.c.step)
        ).first()
        if member is None:
            return False
        w = workflows_t
        left = target.execute(
            sa.update(w)
            .where(w.c.id == member.workflow_id, w.c.state == WorkflowState.RUNNING.value,
                   w.c.step == member.step)
            .values(remaining=w.c.remaining - 1)
            .returning(w.c.remaining, w.c.steps)
        ).first()
        if left is not None and left.remaining == 0:
            self._advance(target, member.workflow_id, member.step, left.steps)
        return True

    def _advance(self, target: Target, workflow_id: str, step: int, steps: int) -> None:
        """The last member of ``step`` finished: start the next step, or finish."""
        value = self._step_result(target, workflow_id, step)
        w = workflows_t
        if step + 1 == steps:
            target.execute(
                sa.update(w).where(w.c.id == workflow_id).values(
                    state=WorkflowState.SUCCESS.value, finished_at=utcnow(),
                    result=encode_value(value, f"workflow {workflow_id}"),
                )
            )
            return
        t = members_t
        calls = [MemberCall.decoded(row) for row in target.execute(
            sa.select(t).where(t.c.workflow_id == workflow_id, t.c.step == step + 1)
            .order_by(t.c.position)
        )]
        refused = self._start_step(target, workflow_id, step + 1, calls, value)
        if refused is not None:
            self._step_refused(target, workflow_id, *refused)

    def _start_step(
        self, target: Target, workflow_id: str, step: int, calls: Sequence[MemberCall],
        previous: Any,
    ) -> tuple[MemberCall, Exception] | None:
        """Start ``step``, all or nothing; else the refused member and why (an outage raises)."""
        w, t = workflows_t, members_t
        current = calls[0]
        try:
            with target.begin_nested():
                target.execute(sa.update(w).where(w.c.id == workflow_id).values(
                    step=step, remaining=len(calls)))
                target.execute(sa.update(t).where(
                    t.c.workflow_id == workflow_id, t.c.step == step,
                    t.c.state == MemberState.PENDING.value,
                ).values(state=MemberState.ENQUEUED.value))
                for current in calls:  # one by one: a refusal names its member
                    self._enqueue_step(target, workflow_id, [current], previous, True)
        except Exception as exc:
            if is_database_outage(exc):
                raise
            return current, exc
        return None

    def _step_refused(
        self, target: Target, workflow_id: str, call: MemberCall, exc: Exception
    ) -> None:
        """A member of the next step could not be enqueued: it fails the workflow.

        The member that finished stays ``SUCCESS`` (it did its work); the refused one is
        ``FAILURE`` with the refusal, and ``link_error`` is called for it as for any failure.
        """
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        logger.error(
            "workflow %s: the message of member %s[%s] for queue %r could not be enqueued "
            "when its step began (%s); the workflow is FAILURE and its later steps never "
            "start: fix the cause (the error says how) and start the workflow again",
            workflow_id, call.task, call.task_id, call.queue, reason,
            extra={"task_id": call.task_id, "task": call.task, "queue": call.queue},
        )
        self.member_failed(
            target, call.task_id,
            f"{type(exc).__name__}: its message for queue {call.queue!r} could not be "
            f"enqueued when its step began: {exc}",
            None,
        )

    def _step_result(self, target: Target, workflow_id: str, step: int) -> Any:
        """A single task's value, or the list of a group's values in member order."""
        t = members_t
        rows = target.execute(
            sa.select(t.c.result, t.c.call).where(t.c.workflow_id == workflow_id,
                                                  t.c.step == step)
            .order_by(t.c.position)
        ).all()
        values = [decode_value(row.result) for row in rows]
        (_, _, _, _, _, in_group), _ = decode_body(rows[0].call)
        return values if in_group else values[0]

    def member_failed(
        self, target: Target, task_id: str, error: str, traceback: str | None
    ) -> bool:
        """Mark member ``task_id`` FAILURE and its workflow FAILURE; enqueue link_error once.

        Returns:
            Whether this call failed the workflow (``False``: it had failed or finished
            already, the member was done, or the id is no member).
        """
        t = members_t
        member = target.execute(
            sa.update(t)
            .where(t.c.task_id == task_id, t.c.state.in_(_OPEN))
            .values(state=MemberState.FAILURE.value, error=error, traceback=traceback,
                    finished_at=utcnow())
            .returning(t.c.workflow_id, t.c.task)
        ).first()
        if member is None:
            return False
        w = workflows_t
        failed = target.execute(
            sa.update(w)
            .where(w.c.id == member.workflow_id, w.c.state == WorkflowState.RUNNING.value)
            .values(state=WorkflowState.FAILURE.value, error=error, failed_task_id=task_id,
                    failed_task=member.task, finished_at=utcnow())
            .returning(w.c.link_error)
        ).first()
        if failed is None:
            return False
        if failed.link_error is not None:
            self._send_errback(target, member.workflow_id, failed.link_error, task_id, error)
        return True

    def _send_errback(
        self, target: Target, workflow_id: str, packed: bytes, failed_task_id: str,
        error: str,
    ) -> None:
        """Enqueue link_error in a savepoint; if refused, note it (an outage raises)."""
        errback: MemberCall | None = None
        try:
            with target.begin_nested():
                errback = _unpack_call(packed)
                self._enqueue_errback(target, workflow_id, errback, failed_task_id, error)
        except Exception as exc:
            if is_database_outage(exc):
                raise
            self._errback_refused(target, workflow_id, errback, failed_task_id, error, exc)

    def _errback_refused(
        self, target: Target, workflow_id: str, errback: MemberCall | None,
        failed_task_id: str, error: str, exc: Exception,
    ) -> None:
        """Record and log that link_error will not run; the workflow stays FAILURE."""
        task = errback.task if errback is not None else "(unreadable call)"
        queue = errback.queue if errback is not None else "(unknown)"
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        logger.error(
            "workflow %s failed (member %s: %s) but its link_error %s for queue %r could not "
            "be enqueued (%s): it will not run. The workflow is FAILURE. Fix the cause (the "
            "error says how), then call %s yourself with (workflow id, failed task id, error, "
            "*its args)", workflow_id, failed_task_id, error, task, queue, reason, task,
            extra={"task_id": failed_task_id, "task": task, "queue": queue},
        )
        w = workflows_t
        target.execute(sa.update(w).where(w.c.id == workflow_id).values(
            error=f"{error}; its link_error {task} for queue {queue!r} was not enqueued "
                  f"({reason}) and will not run",
        ))


def _pack_call(call: MemberCall) -> bytes:
    """A whole call with its identity (the link_error column)."""
    fields = [call.task_id, call.task, call.queue, call.priority, call.args, call.kwargs,
              call.immutable, call.countdown_s]
    return encode_body(fields, None, task=call.task)


def _unpack_call(data: bytes) -> MemberCall:
    (task_id, task, queue, priority, args, kwargs, immutable, countdown_s), _ = decode_body(data)
    return MemberCall(task_id, task, queue, priority, args, kwargs, immutable, countdown_s)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (of its driver error for SQLAlchemy's)."""
    lines = str(getattr(exc, "orig", None) or exc).splitlines()
    return lines[0] if lines else ""


def read_workflow(engine: Engine, workflow_id: str) -> WorkflowRecord | None:
    """The workflow row, or ``None`` (not committed, unknown or pruned)."""
    w = workflows_t
    with engine.connect() as conn:
        row = conn.execute(sa.select(w).where(w.c.id == workflow_id)).first()
    if row is None:
        return None
    return WorkflowRecord(
        row.id, row.kind, WorkflowState(row.state), row.step, row.steps, row.remaining,
        decode_value(row.result), row.error, row.failed_task_id, row.failed_task,
        as_aware(row.created_at), as_aware(row.finished_at),
    )


def read_members(engine: Engine, workflow_id: str) -> list[MemberRecord]:
    """The workflow's members, in step and member order."""
    t = members_t
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t).where(t.c.workflow_id == workflow_id).order_by(t.c.step, t.c.position)
        ).all()
    return [
        MemberRecord(r.task_id, r.workflow_id, r.step, r.position, r.task, r.queue,
                     MemberState(r.state), decode_value(r.result), r.error, r.traceback,
                     as_aware(r.finished_at))
        for r in rows
    ]


def workflow_of_member(engine: Engine, task_id: str) -> str | None:
    """The id of the workflow ``task_id`` is a member of, or ``None``."""
    t = members_t
    with engine.connect() as conn:
        found: str | None = conn.execute(
            sa.select(t.c.workflow_id).where(t.c.task_id == task_id)
        ).scalar()
    return found


def prune_workflows(engine: Engine, *, older_than: timedelta, batch_size: int = 1000) -> int:
    """Delete workflows that finished before ``older_than`` ago, with their members.

    Running workflows keep every member row (their results are still needed). Each batch
    is a short transaction of its own.

    Returns:
        How many workflows were deleted.
    """
    cutoff = utcnow() - older_than
    w, t = workflows_t, members_t
    total = 0
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(
                sa.select(w.c.id).where(w.c.finished_at < cutoff).limit(batch_size)
            ).scalars())
            if ids:
                conn.execute(t.delete().where(t.c.workflow_id.in_(ids)))
                conn.execute(w.delete().where(w.c.id.in_(ids)))
        total += len(ids)
        if len(ids) < batch_size:
            return total
