"""What the dashboard shows, as JSON-ready dictionaries (the pages and ``/api/`` share them).

Everything is read through the parts ``taskq status``, ``taskq dlq`` and ``taskq inspect``
use: :func:`taskq.status.collect`, :mod:`taskq.dlq` and :class:`~taskq.broker.parked.
ParkedQueue`, the result store, and the ``taskq_outbox`` table (read only). URLs are
redacted; argument, header and result values, and the error of each dead letter listed,
are shortened with :func:`shorten` (the templates escape them); a single dead letter's
error and traceback are shown whole (docs/dashboard.md, "Safety", states these lengths).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq import dlq
from taskq.broker.parked import ParkedQueue
from taskq.db import as_aware, utcnow
from taskq.errors import BrokerConnectionError, BrokerError, DecodeError, OutboxError
from taskq.message import FAILED_AT, TRACEBACK, WORKFLOW, decode
from taskq.schema import outbox_table
from taskq.status import collect

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.worker.sidecars import SupervisedProcesses

# Longest repr of one argument, header or result value, or of a listed dead letter's
# error, shown (the rest is cut, with a marker).
VALUE_MAX_CHARS = 300
# Longest last_error of an outbox row shown: what the relay stores of it (outbox/store.py).
OUTBOX_ERROR_MAX_CHARS = 2000
# Most dead letters one page lists, and most messages looked at to find one by id.
LIST_LIMIT = 200
FIND_LIMIT = 10_000
OUTBOX_LIMIT = 100


def shorten(value: Any, limit: int = VALUE_MAX_CHARS) -> str:
    """``repr(value)`` (a ``str`` as itself), cut to ``limit`` characters."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = int(value)  # pika reads AMQP longs as an int subclass whose repr ends in L
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def status(app: App) -> dict[str, Any]:
    """Exactly what ``taskq status --json`` prints."""
    return collect(app).to_dict()


def workers(processes: SupervisedProcesses | None) -> dict[str, Any]:
    """Worker processes of the supervisor serving the dashboard, or where to find them."""
    if processes is None:
        return {
            "served_from_worker": False,
            "note": "this dashboard runs on its own: consumers per queue are shown; for "
            "processes alive and restarts serve it from `taskq worker --dashboard-port N` "
            "or scrape the worker's --metrics-port (taskq_worker_processes_alive, "
            "taskq_worker_process_restarts_total)",
        }
    return {
        "served_from_worker": True,
        "processes": processes.process_count,
        "alive": processes.alive(),
        "restarts": processes.restarts,
        "healthy": processes.healthy(),
    }


@dataclass(frozen=True)
class Source:
    """A parking queue: a work queue's ``.dlq`` or (``queue is None``) the unroutable one."""

    queue: str | None

    @property
    def unroutable(self) -> bool:
        return self.queue is None

    @property
    def label(self) -> str:
        return f"{self.queue}.dlq" if self.queue else "unroutable (parked)"


def dead_letters(app: App, source: Source, *, task: str | None = None,
                 limit: int = LIST_LIMIT) -> dict[str, Any]:
    """Up to ``limit`` parked messages (optionally of one task), oldest first.

    A parking queue that is not declared yet (no worker started on its queue) holds
    nothing: ``missing`` says so instead of an error.

    Raises:
        BrokerConnectionError: the broker cannot be reached.
    """
    listing: dict[str, Any] = {"queue": source.label, "task": task, "missing": None}
    try:
        with ParkedQueue(app.settings, dlq.source_queue(
                app, source.queue, unroutable=source.unroutable)) as lot:
            infos = _describe_all(lot, source, FIND_LIMIT if task else limit)
            depth = lot.depth
    except BrokerConnectionError:
        raise
    except BrokerError as exc:  # ParkedQueue's only other error: the queue does not exist
        return {**listing, "depth": 0, "messages": [], "tasks": [], "missing": str(exc)}
    rows = [info.as_dict() for info in infos if not task or info.task == task][:limit]
    for row in rows:
        row["error"] = shorten(row["error"]) if row["error"] else row["error"]
    return {**listing, "depth": depth, "messages": rows,
            "tasks": sorted({info.task for info in infos if info.task})}


def _describe_all(lot: ParkedQueue, source: Source, limit: int) -> list[dlq.ParkedInfo]:
    infos, now_s = [], time.time()
    for _ in range(min(lot.depth, limit)):
        parked = lot.get()
        if parked is None:
            break
        infos.append(dlq.describe(parked, source.queue, now_s=now_s))
    return infos


def dead_letter(app: App, source: Source, task_id: str) -> dict[str, Any] | None:
    """One parked message by id: what the list shows, its headers and decoded arguments."""
    with ParkedQueue(app.settings, dlq.source_queue(
            app, source.queue, unroutable=source.unroutable)) as lot:
        for _ in range(min(lot.depth, FIND_LIMIT)):
            parked = lot.get()
            if parked is None:
                break
            if parked.message.message_id == task_id:
                info = dlq.describe(parked, source.queue, now_s=time.time()).as_dict()
                return {**info, **_message_part(parked.message)}
    return None


def _message_part(message: Any) -> dict[str, Any]:
    headers = dict(message.headers)
    traceback = headers.pop(TRACEBACK, None)
    if isinstance(traceback, bytes):
        traceback = traceback.decode("utf-8", "replace")
    failed_at = headers.get(FAILED_AT)
    workflow_id = headers.get(WORKFLOW)
    part: dict[str, Any] = {
        "headers": {name: shorten(value) for name, value in sorted(headers.items())},
        # Shown as a time and an age, not epoch milliseconds; the workflow as a link.
        "failed_at": _time_and_age(failed_at),
        "workflow_id": workflow_id if isinstance(workflow_id, str) else None,
        "traceback": traceback if isinstance(traceback, str) else None,
        "body_bytes": len(message.body),
    }
    try:
        envelope = decode(message)
    except DecodeError as exc:
        part.update(args=None, kwargs=None, decode_error=getattr(exc, "reason", str(exc)))
        return part
    part.update(args=[shorten(a) for a in envelope.args],
                kwargs={k: shorten(v) for k, v in envelope.kwargs.items()},
                decode_error=None)
    return part


def task(app: App, task_id: str) -> dict[str, Any]:
    """What ``taskq inspect ID --json`` prints: the task's state (:mod:`taskq.states`) with
    its workflow, or a workflow given its id (``"is_workflow": true``)."""
    from taskq.states import lookup
    from taskq.states.workflow_view import workflow_dict

    workflow = workflow_dict(app.engine, task_id)
    if workflow is not None:
        return {"task_id": task_id, "is_workflow": True, "known": True, "workflow": workflow}
    status = lookup(app, task_id)
    part = status.to_dict()
    if part["result"] is not None:
        part["result"] = shorten(status.result)
    workflow = workflow_dict(app.engine, status.workflow_id) if status.workflow_id else None
    return {**part, "is_workflow": False, "known": status.is_known,
            "stored": "results" in status.sources, "workflow": workflow}


def outbox(app: App, *, limit: int = OUTBOX_LIMIT) -> dict[str, Any]:
    """The oldest waiting rows and the failing ones (``last_error`` set), each up to
    ``limit``.

    Raises:
        OutboxError: the database cannot be read.
    """
    t = outbox_table
    columns = [t.c.id, t.c.queue, t.c.task, t.c.created_at, t.c.attempts,
               t.c.next_attempt_at, t.c.last_error]
    waiting = sa.select(*columns).order_by(t.c.created_at).limit(limit)
    failing = (sa.select(*columns).where(t.c.last_error.is_not(None))
               .order_by(t.c.created_at).limit(limit))
    try:
        with app.engine.connect() as conn:
            backlog = app.outbox_backlog()
            rows = [_outbox_row(r) for r in conn.execute(waiting).mappings()]
            failing_rows = [_outbox_row(r) for r in conn.execute(failing).mappings()]
    except sa.exc.SQLAlchemyError as exc:
        raise OutboxError(f"cannot read the outbox: {str(exc).splitlines()[0]}") from exc
    return {"rows": backlog.rows, "failing_rows": backlog.failing_rows,
            "oldest_age_s": backlog.oldest_age_s(), "waiting": rows, "failing": failing_rows}


def _outbox_row(row: Any) -> dict[str, Any]:
    created = as_aware(row["created_at"])
    return {
        "id": row["id"], "queue": row["queue"], "task": row["task"],
        "created_at": _iso(created),
        "age_s": (utcnow() - created).total_seconds() if created else None,
        "attempts": row["attempts"], "next_attempt_at": _iso(as_aware(row["next_attempt_at"])),
        "last_error": (shorten(row["last_error"], OUTBOX_ERROR_MAX_CHARS)
                       if row["last_error"] else None),
    }


def _time_and_age(epoch_ms: Any) -> str | None:
    """``2026-12-02 10:04:05 UTC (3.2 min ago)`` for an epoch-milliseconds header."""
    if not isinstance(epoch_ms, (int, float)) or isinstance(epoch_ms, bool):
        return None
    at = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    ago_s = max(0.0, time.time() - epoch_ms / 1000)
    if ago_s < 120:
        ago = f"{ago_s:.1f} s"
    elif ago_s < 7200:
        ago = f"{ago_s / 60:.1f} min"
    elif ago_s < 172800:
        ago = f"{ago_s / 3600:.1f} h"
    else:
        ago = f"{ago_s / 86400:.1f} d"
    return f"{at.strftime('%Y-%m-%d %H:%M:%S')} UTC ({ago} ago)"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def overview(app: App, rates: Any, processes: SupervisedProcesses | None) -> dict[str, Any]:
    """The overview page: the status, rates per queue, worker processes and schedules.

    ``schedules`` and ``schedulers`` are the status's own (periodic tasks), empty when the
    app has none or this taskq does not report them.
    """
    data = status(app)
    return {
        "status": data,
        "rates": rates.observe(data),
        "workers": workers(processes),
        "schedules": data.get("schedules") or [],
        "schedulers": data.get("schedulers") or [],
    }
