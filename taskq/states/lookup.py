"""What happened to a task id: one answer for ``taskq inspect``, the dashboard and AsyncResult.

:func:`lookup` asks, in order, what taskq already keeps:

1. the outbox (``taskq_outbox``): the task waits there for the relay (``WAITING``);
2. the results (``taskq_results``, tasks that keep them) and the workers' state records
   (``taskq_task_states``, :mod:`taskq.states.store`): started where and when, retrying
   until when, succeeded, failed, dead-lettered, skipped as a duplicate;
3. the workflow tables: members keep their results;
4. the idempotency keys (``taskq_processed``): a key equal to the id means it succeeded;
5. the broker, unless the answer is final already: the app's ``Q.dlq`` queues (``DEAD`` or
   ``FAILURE``, with the dead-letter headers), its work queues (``QUEUED``) and the delay
   tiers (``DELAYED``, or ``RETRY`` for a retry), each read up to ``scan_limit`` messages
   without consuming them (:mod:`taskq.broker.browse`).

Nothing found is ``UNKNOWN``, with what could not be looked at (messages held by workers,
the delayed-message plugin's store, queues past the limit). :func:`from_database` is steps
1-4 alone: no broker round trip, what ``AsyncResult`` uses.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from taskq.results import ResultRecord, ResultState
from taskq.states._describe import when as _when
from taskq.states.model import NO_VALUE_KEPT, StateSource, TaskStatus
from taskq.states.store import StateRow, TaskStateStore

if TYPE_CHECKING:
    from taskq.broker.browse import Search, Sighting

logger = logging.getLogger(__name__)

#: Messages read per queue at most when looking for an id in the broker.
DEFAULT_SCAN_LIMIT = 1000


def lookup(app: StateSource, task_id: str, *, broker: bool = True,
           scan_limit: int = DEFAULT_SCAN_LIMIT) -> TaskStatus:
    """Where ``task_id`` stands (module docstring).

    Args:
        app: The app whose database and broker are asked.
        task_id: The task id.
        broker: Also look in the broker's queues when the database has no final answer.
        scan_limit: Messages read per queue at most.

    Raises:
        TaskqError: the database or (with ``broker``) the broker cannot be read.
    """
    known = from_database(app, task_id)
    if not broker or (known is not None and (known.state.is_ready
                                              or known.state is ResultState.WAITING)):
        return known if known is not None else _unknown(app, task_id, None)
    from taskq.broker.browse import find_message

    search = find_message(app.settings, _places(app), task_id, limit=scan_limit)
    if search.found is not None:
        return _sighted(app, task_id, search.found, known)
    if known is not None:
        return known
    return _unknown(app, task_id, search)


def from_database(app: StateSource, task_id: str) -> TaskStatus | None:
    """What taskq's tables say of ``task_id`` (steps 1-4), ``None`` when nothing.

    Raises:
        ResultError: the database cannot be read.
    """
    import sqlalchemy as sa

    from taskq.db import missing_tables_message, unmade_tables
    from taskq.errors import ResultError
    from taskq.schema import metadata

    try:
        return _from_tables(app, task_id)
    except sa.exc.SQLAlchemyError as exc:
        missing, not_yet = unmade_tables(app.engine, [t.name for t in metadata.sorted_tables])
        if not_yet:
            return None  # the embedded SQLite default before its first worker: nothing yet
        if missing:
            raise ResultError(missing_tables_message(str(app.engine.url), missing),
                              task_id=task_id) from exc
        raise ResultError(
            f"cannot read the state of task {task_id} from taskq's database: "
            f"{str(getattr(exc, 'orig', None) or exc).splitlines()[0]}; is the database up "
            "and were the tables created (taskq db create)?", task_id=task_id,
        ) from exc


def _from_tables(app: StateSource, task_id: str) -> TaskStatus | None:
    from taskq.states import _tables

    member = _tables.member(app.engine, task_id)
    workflow_id = member.workflow_id if member is not None else None
    waiting = _tables.outbox_row(app.engine, task_id)
    if waiting is not None:
        return replace(_tables.waiting(task_id, waiting), workflow_id=workflow_id)
    record = app.results.get(task_id)
    row = TaskStateStore(app.engine).read(task_id)
    status = _from_records(task_id, record, row)
    if member is not None and (status is None or not status.state.is_ready):
        status = _tables.from_member(task_id, member, status)
    if status is None:
        finished_at = _tables.key_finished_at(app.engine, task_id)
        if finished_at is not None:
            status = TaskStatus(
                task_id, ResultState.SUCCESS, f"succeeded at {_when(finished_at)}; "
                f"{NO_VALUE_KEPT}", finished_at=finished_at, sources=("processed",),
            )
    if status is not None and workflow_id is not None:
        status = replace(status, workflow_id=workflow_id)
    return status


def _from_records(task_id: str, record: ResultRecord | None,
                  row: StateRow | None) -> TaskStatus | None:
    from taskq.states import _describe

    if record is not None and (record.state.is_ready or row is None
                               or record.retries > row.retries):
        return _describe.from_result(task_id, record, row)
    if row is not None:
        return _describe.from_state_row(task_id, row, record)
    return None


def _places(app: StateSource) -> list[Any]:
    from taskq.broker import topology as topo
    from taskq.broker.browse import Place

    work = []
    for name in app.queue_names():
        work += app.topology.partition_queues(name) or [name]
    quorum = {name: app.topology.options(name).type == "quorum" for name in work}
    dead = [Place(topo.dlq_name(name), quorum[name]) for name in work]
    queues = [Place(name, quorum[name]) for name in work]
    ns, kind = app.settings.namespace, app.settings.delay_tier_queue_type
    tiers = [Place(topo.delay_tier_name(ns, level, kind), kind == "quorum")
             for level in range(topo.DELAY_TIER_LEVELS)]
    return dead + queues + tiers


def _sighted(app: StateSource, task_id: str, seen: Sighting,
             known: TaskStatus | None) -> TaskStatus:
    from taskq.states import _describe

    status = _describe.from_sighting(app, task_id, seen)
    if known is not None:
        status = replace(status, task=status.task or known.task,
                         worker=status.worker or known.worker,
                         workflow_id=known.workflow_id,
                         started_at=status.started_at or known.started_at,
                         sources=known.sources + status.sources)
    return status


def _unknown(app: StateSource, task_id: str, search: Search | None) -> TaskStatus:
    notes = ["no trace in the outbox, taskq_results, taskq_task_states, the workflow tables "
             "or taskq_processed"]
    if search is not None:
        notes.append("not in any Q.dlq, work queue or delay tier of this app; a message a "
                     "worker holds (prefetched or running) cannot be seen there")
        notes += [f"{name} holds {ready} ready messages: only the first ones were read "
                  "(raise --scan-limit)" for name, ready in search.partly_read]
        notes += [f"{name} not read: a quorum queue on RabbitMQ before 4.3 counts every look "
                  "against its delivery limit" for name in search.not_read]
        if app.settings.delay_backend != "tiers":
            notes.append("messages delayed by the delayed-message plugin cannot be seen "
                         "until they are due")
    if not app.settings.track_task_states:
        notes.append("track_task_states is off: workers do not record task states")
    return TaskStatus(task_id, ResultState.UNKNOWN,
                      "unknown: taskq has no record of this id (mistyped, from another app "
                      "or database, or pruned)", notes=tuple(notes))

