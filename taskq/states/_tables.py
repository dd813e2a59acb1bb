"""The table reads of :mod:`taskq.states.lookup`: outbox row, workflow member, finished key."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq.db import as_aware
from taskq.results import ResultState
from taskq.schema import outbox_table, processed_table
from taskq.states._describe import when
from taskq.workflows.store import MemberRecord, MemberState, read_members, workflow_of_member

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from taskq.states.model import TaskStatus


def outbox_row(engine: Engine, task_id: str) -> Any:
    """The outbox row of ``task_id`` (without its body), or ``None``."""
    o = outbox_table
    with engine.connect() as conn:
        return conn.execute(
            sa.select(o.c.queue, o.c.task, o.c.eta, o.c.created_at, o.c.attempts,
                      o.c.last_error, o.c.next_attempt_at).where(o.c.id == task_id)
        ).first()


def waiting(task_id: str, row: Any) -> TaskStatus:
    """``WAITING``: committed in the outbox, not yet published by the relay."""
    from taskq.states.model import TaskStatus

    created = as_aware(row.created_at)
    eta = as_aware(row.eta)
    summary = (f"waiting in the outbox since {when(created)} for the relay (in `taskq "
               f"worker` or `taskq relay`) to publish it to {row.queue}")
    if eta is not None:
        summary += f"; it runs at {when(eta)} at the earliest"
    if row.attempts:
        summary += (f"; {row.attempts} publish attempt(s) failed, the next at "
                    f"{when(as_aware(row.next_attempt_at))}: {row.last_error}")
    return TaskStatus(task_id, ResultState.WAITING, summary, task=str(row.task),
                      queue=str(row.queue), due_at=eta, sources=("outbox",))


def member(engine: Engine, task_id: str) -> MemberRecord | None:
    """The workflow member ``task_id``, or ``None``."""
    workflow_id = workflow_of_member(engine, task_id)
    if workflow_id is None:
        return None
    return next((m for m in read_members(engine, workflow_id) if m.task_id == task_id), None)


def from_member(task_id: str, m: MemberRecord, known: TaskStatus | None) -> TaskStatus | None:
    """What the workflow tables add: a kept result, a failure, a step not started yet."""
    from taskq.states.model import TaskStatus

    where = f"member {m.position + 1} of step {m.step + 1} of workflow {m.workflow_id}"
    if m.state is MemberState.SUCCESS:
        return TaskStatus(task_id, ResultState.SUCCESS,
                          f"succeeded at {when(m.finished_at)} ({where})", task=m.task,
                          queue=m.queue, finished_at=m.finished_at, result=m.result,
                          has_result=True, sources=("workflow",))
    if m.state is MemberState.FAILURE:
        return TaskStatus(task_id, ResultState.FAILURE,
                          f"failed at {when(m.finished_at)} ({where}): {m.error}",
                          task=m.task, queue=m.queue, finished_at=m.finished_at,
                          error=m.error, traceback=m.traceback, sources=("workflow",))
    if known is not None:
        return known
    if m.state is MemberState.PENDING:
        return TaskStatus(task_id, ResultState.WAITING,
                          f"waiting for its step to start ({where})", task=m.task,
                          queue=m.queue, sources=("workflow",))
    # ENQUEUED, and no worker recorded anything yet: sent, not started.
    return TaskStatus(task_id, ResultState.QUEUED,
                      f"sent to {m.queue}, not started yet ({where})", task=m.task,
                      queue=m.queue, sources=("workflow",))


def key_finished_at(engine: Engine, key: str) -> datetime | None:
    """When the idempotency key ``key`` was recorded done, or ``None``."""
    p = processed_table
    with engine.connect() as conn:
        value = conn.execute(sa.select(p.c.finished_at).where(p.c.key == key)).scalar()
    return as_aware(value)
