"""Task results: the ``taskq_results`` table and the :class:`AsyncResult` handle.

Results are kept only for tasks that ask (``@app.task(store_result=True)``) or when the app
sets ``store_results=True``: most tasks' return values are not needed, and writing them costs
a round trip per state change. States, in order: ``PENDING`` (no row yet: unknown ids are
pending, as in Celery), ``STARTED``, ``RETRY`` (failed, a retry is scheduled), then one of
``SUCCESS``, ``FAILURE`` (the task raised and no retry was left; its message is in
``Q.dlq``) or ``DEAD`` (dead-lettered for another reason: rejected, time limit, crash loop).
Return values are stored with taskq's msgpack codec (never pickle).

Rows only move forward, and the rule is in the upsert's SQL (``ON CONFLICT ... DO UPDATE ...
WHERE``), so it holds across worker processes and however late a write arrives:

- ``SUCCESS`` is never replaced: a duplicate delivery, or a copy without an idempotency key
  that ran again, does not change a stored value.
- ``FAILURE`` and ``DEAD`` are replaced only by another final state: a later run that ended,
  such as a dead letter replayed with ``taskq dlq replay`` (its ``STARTED`` is not shown).
- ``STARTED`` and ``RETRY`` never replace a final state, nor a row of a later attempt
  (more ``retries``): a retry copy may start before the failed attempt's ``RETRY`` is
  written. Within one attempt ``RETRY`` replaces ``STARTED``, not the other way round.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from taskq.errors import ResultError, ResultTimeout, SerializationError, TaskFailed

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.sql.elements import ColumnElement


class ResultState(str, enum.Enum):
    """Where a task stands: the states of ``taskq_results.state`` and of :mod:`taskq.states`.

    Stored in ``taskq_results``: ``STARTED``, ``RETRY``, ``SUCCESS``, ``FAILURE``, ``DEAD``.
    Found elsewhere (``taskq inspect``, the dashboard, ``AsyncResult.state``): ``WAITING``
    (in the outbox), ``QUEUED``, ``DELAYED``, ``SKIPPED`` (a duplicate of a finished
    idempotency key; it did not run), ``UNKNOWN``. ``PENDING``: nothing in the database says
    more (``AsyncResult`` does not read the broker; ``taskq inspect`` does).
    """

    PENDING = "PENDING"
    WAITING = "WAITING"
    QUEUED = "QUEUED"
    DELAYED = "DELAYED"
    STARTED = "STARTED"
    RETRY = "RETRY"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    DEAD = "DEAD"
    SKIPPED = "SKIPPED"
    UNKNOWN = "UNKNOWN"

    @property
    def is_ready(self) -> bool:
        """Whether the state is final."""
        return self in (ResultState.SUCCESS, ResultState.FAILURE, ResultState.DEAD,
                        ResultState.SKIPPED)


@dataclass(frozen=True)
class ResultRecord:
    """One row of ``taskq_results``."""

    task_id: str
    task: str
    state: ResultState
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    retries: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``taskq inspect --json``)."""
        return {
            "task_id": self.task_id,
            "task": self.task,
            "state": self.state.value,
            "result": repr(self.result) if self.result is not None else None,
            "error": self.error,
            "traceback": self.traceback,
            "retries": self.retries,
            "attempts": self.retries + 1,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


class ResultStore:
    """Writes and reads ``taskq_results`` (one upsert per state change).

    Every write (``started``, ``succeeded``, ``failed``, ``already_done``) follows the rules of
    the module docstring: a write that may not replace the stored row changes nothing. A write
    that fails raises :class:`~taskq.errors.ResultError` whose ``unavailable`` attribute says
    whether the database could not be reached (try again later) or refused the row.

    Args:
        engine: Engine of the database named by ``database_url``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def started(self, task_id: str, task: str, retries: int) -> None:
        """The task began running (attempt ``retries + 1``)."""
        self._upsert(task_id, task, ResultState.STARTED, retries=retries, started=True)

    def succeeded(self, task_id: str, task: str, retries: int, value: Any) -> None:
        """The task returned ``value`` (stored encoded; unencodable values are noted)."""
        from taskq.codec import encode_body

        error = None
        try:
            encoded: bytes | None = encode_body([value], None, task=task)
        except SerializationError as exc:
            encoded, error = None, f"the return value was not stored: {exc}"
        self._upsert(task_id, task, ResultState.SUCCESS, retries=retries, result=encoded,
                     error=error, finished=True)

    def failed(
        self,
        task_id: str,
        task: str,
        retries: int,
        *,
        state: ResultState,
        error: str,
        traceback: str | None,
    ) -> None:
        """The attempt failed: ``RETRY`` (will run again), ``FAILURE`` or ``DEAD``."""
        self._upsert(task_id, task, state, retries=retries, error=error, traceback=traceback,
                     finished=state.is_ready)

    def already_done(self, task_id: str, task: str, retries: int) -> None:
        """A duplicate found its idempotency key done: ``SUCCESS``, value unknown.

        The key is recorded only when a run succeeded, so the task did succeed; this
        process has no return value, so none is stored (``error`` says why). The row changes
        only when no success is stored yet: the run that succeeded may have lost its own
        write to a database outage, or the key belongs to another task id.
        """
        self._upsert(task_id, task, ResultState.SUCCESS, retries=retries,
                     error=_NOT_RUN_AGAIN, finished=True)

    def _read_error(self, task_id: str, exc: Exception) -> ResultError | None:
        """What a failed read of ``task_id`` means: ``None`` for the embedded SQLite default
        whose tables no worker has made yet (nothing stored), else the error to raise."""
        from taskq.db import describe_database_error, missing_tables_message, unmade_tables

        missing, not_yet = unmade_tables(self.engine, ["taskq_results"])
        if not_yet:
            return None
        if missing:
            return ResultError(missing_tables_message(str(self.engine.url), missing),
                               task_id=task_id)
        return ResultError(f"cannot read the result of task {task_id}: "
                           f"{describe_database_error(exc)}", task_id=task_id)

    def get(self, task_id: str) -> ResultRecord | None:
        """The record of ``task_id``, or ``None`` when there is none (``PENDING``).

        On the embedded SQLite default, a database whose tables no worker has made yet holds
        no record; on any other database, missing tables are a :class:`ResultError` saying
        to run ``taskq db create``.

        Raises:
            ResultError: the database cannot be read.
        """
        import sqlalchemy as sa

        from taskq.codec import decode_body
        from taskq.db import as_aware
        from taskq.schema import results_table as t

        try:
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(t).where(t.c.task_id == task_id)).mappings().first()
        except sa.exc.SQLAlchemyError as exc:
            error = self._read_error(task_id, exc)
            if error is None:
                return None
            raise error from exc
        if row is None:
            return None
        value = decode_body(row["result"])[0][0] if row["result"] is not None else None
        return ResultRecord(
            task_id=row["task_id"], task=row["task"], state=ResultState(row["state"]),
            result=value, error=row["error"], traceback=row["traceback"],
            retries=row["retries"], created_at=as_aware(row["created_at"]),
            started_at=as_aware(row["started_at"]), finished_at=as_aware(row["finished_at"]),
        )

    def prune(self, *, older_than: timedelta, batch_size: int = 1000) -> int:
        """Delete finished results older than ``older_than`` in short batches."""
        from taskq.db import delete_in_batches, utcnow
        from taskq.schema import results_table as t

        cutoff = utcnow() - older_than
        return delete_in_batches(self.engine, t.c.task_id, t.c.finished_at < cutoff, batch_size)

    def _upsert(
        self,
        task_id: str,
        task: str,
        state: ResultState,
        *,
        retries: int,
        result: bytes | None = None,
        error: str | None = None,
        traceback: str | None = None,
        started: bool = False,
        finished: bool = False,
    ) -> None:
        import sqlalchemy as sa
        from sqlalchemy.dialects import postgresql, sqlite

        from taskq.db import utcnow
        from taskq.schema import results_table as t

        now = utcnow()
        changes: dict[str, Any] = {
            "state": state.value, "retries": retries, "result": result, "error": error,
            "traceback": traceback,
        }
        if started:
            changes["started_at"] = now
        if finished:
            changes["finished_at"] = now
        values = {"task_id": task_id, "task": task, "created_at": now, **changes}
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(t).values(values)
        stmt = stmt.on_conflict_do_update(
            index_elements=["task_id"], set_=changes, where=_may_replace(state, retries)
        )
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt)
        except sa.exc.SQLAlchemyError as exc:
            # The driver's message only: SQLAlchemy's own text repeats the parameters,
            # which hold the task's return value.
            raise ResultError(
                f"cannot store the {state.value} result of task {task} ({task_id}): "
                f"{getattr(exc, 'orig', None) or exc}",
                task_id=task_id, task=task, unavailable=_unreachable(exc),
            ) from exc


# What the SQL of _may_replace compares with; PENDING is never stored.
_FINAL_STATES = (ResultState.SUCCESS.value, ResultState.FAILURE.value, ResultState.DEAD.value)
_NOT_RUN_AGAIN = (
    "not run again: a duplicate delivery found its idempotency key done, so an earlier run "
    "succeeded, but that run's return value was not stored"
)


def _may_replace(state: ResultState, retries: int) -> ColumnElement[bool]:
    """SQL: may the stored row take ``state`` of attempt ``retries + 1``? (module docstring)."""
    import sqlalchemy as sa

    from taskq.schema import results_table as t

    if state.is_ready:
        return t.c.state != ResultState.SUCCESS.value
    running = t.c.state.not_in(_FINAL_STATES)
    if state is ResultState.RETRY:
        return sa.and_(running, t.c.retries <= retries)
    same_attempt_running = sa.and_(t.c.retries == retries,
                                   t.c.state == ResultState.STARTED.value)
    return sa.and_(running, sa.or_(t.c.retries < retries, same_attempt_running))


def _unreachable(exc: Exception) -> bool:
    """Whether a database error means "cannot reach it now" (retry later), not a bad write."""
    import sqlalchemy as sa

    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    # OperationalError: connection refused or lost, server shutting down, SQLite locked;
    # InterfaceError: the driver's connection is closed; TimeoutError: the pool is empty.
    return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError,
                            sa.exc.TimeoutError, sa.exc.DisconnectionError))


class ResultSource(Protocol):
    """Where an :class:`AsyncResult` reads its record: the app (``app.results``)."""

    @property
    def results(self) -> ResultStore:
        """The result store of the app's database."""

    @property
    def registry(self) -> Any:
        """The app's tasks (whether a task keeps its result)."""

    @property
    def settings(self) -> Any:
        """The app's settings (``store_results``)."""

    def task_state(self, task_id: str, *, broker: bool = True) -> Any:
        """What taskq's tables say of ``task_id`` (:mod:`taskq.states`)."""


class AsyncResult:
    """A handle on one enqueued task: its id, and its state and result when stored.

    Args:
        task_id: The task id (also the AMQP ``message_id``).
        task: The registered task name.
        queue: The queue the task was sent to.
        app: The app that sent it (needed for ``state``, ``get`` and ``ready``).
    """

    __slots__ = ("id", "task", "queue", "app")

    def __init__(
        self, task_id: str, *, task: str, queue: str, app: ResultSource | None = None
    ) -> None:
        self.id = task_id
        self.task = task
        self.queue = queue
        self.app = app

    def __repr__(self) -> str:
        return f"<AsyncResult {self.id} task={self.task} queue={self.queue}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def _record(self) -> ResultRecord | None:
        if self.app is None:
            raise ResultError(f"AsyncResult {self.id} has no app; use app.result(task_id)",
                              task_id=self.id)
        record: ResultRecord | None = self.app.results.get(self.id)
        return record

    @property
    def state(self) -> ResultState:
        """Where the task stands as taskq's tables tell (:mod:`taskq.states`, no broker read).

        ``WAITING`` (outbox), ``STARTED``, ``RETRY``, ``SUCCESS``, ``FAILURE``, ``DEAD``,
        ``SKIPPED``; ``PENDING`` when the tables know nothing yet (queued, delayed, or an
        unknown id: ``taskq inspect`` also reads the broker).
        """
        record = self._record()
        if record is not None and record.state.is_ready:
            return record.state
        status = self._status()
        return status.state if status is not None else ResultState.PENDING

    def _status(self) -> Any:
        if self.app is None:
            raise ResultError(f"AsyncResult {self.id} has no app; use app.result(task_id)",
                              task_id=self.id)
        return self.app.task_state(self.id, broker=False)

    def keeps_result(self) -> bool:
        """Whether the task stores its return value (``store_result`` or the app's
        ``store_results``); ``True`` when the task is not registered here (it may be)."""
        if self.app is None:
            return True
        task = self.app.registry.lookup(self.task)
        if task is None or task.options.store_result is None:
            return task is None or bool(self.app.settings.store_results)
        return bool(task.options.store_result)

    def ready(self) -> bool:
        """Whether the task reached a final state (success, failure or dead letter)."""
        return self.state.is_ready

    def get(self, timeout_s: float | None = None, *, interval_s: float = 0.1) -> Any:
        """Wait for the task and return its result.

        Args:
            timeout_s: Give up after this many seconds (``None``: wait forever).
            interval_s: How often the table is polled.

        A task that keeps no result (``store_result`` off, and not a workflow member) is
        not waited for: ``get()`` answers at once from :mod:`taskq.states`, as it does for
        any task found finished without a kept value (e.g. skipped as a duplicate).

        Raises:
            TaskFailed: the task failed or was dead-lettered; carries ``exc_type``,
                ``remote_traceback`` and ``state``.
            ResultNotKept: the task keeps no result; the message says where it stands
                (e.g. "succeeded, no value kept: set store_result=True").
            ResultTimeout: no final state within ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        keeps = self.keeps_result()
        while True:
            record = self._record()
            if record is not None and record.state.is_ready:
                return self._outcome(record)
            if record is None:
                # Nothing in taskq_results: a task that keeps no result, a workflow member
                # (its table keeps it), or one that has not started.
                status = self._status()
                if status is not None and status.state.is_ready:
                    if status.has_result:
                        return status.result
                    self._not_kept(status)
                if not keeps:
                    self._not_kept(status)
            if deadline is not None and time.monotonic() >= deadline:
                state = record.state.value if record is not None else "PENDING"
                raise ResultTimeout(
                    f"task {self.task} ({self.id}) on queue {self.queue!r} has no result "
                    f"after {timeout_s:g}s (state {state}); is a worker consuming the queue, "
                    "and does the task store results (store_result=True)?",
                    task_id=self.id, task=self.task, queue=self.queue,
                )
            time.sleep(interval_s)

    def _not_kept(self, status: Any) -> None:
        from taskq.errors import ResultNotKept

        state = status.state.value if status is not None else ResultState.PENDING.value
        if status is not None and status.state in (ResultState.FAILURE, ResultState.DEAD):
            raise TaskFailed(
                f"task {self.task} ({self.id}) ended {state}: {status.summary}",
                task_id=self.id, task=self.task, state=state, exc_type=None,
                error=status.error, remote_traceback=status.traceback,
            )
        now = status.summary if status is not None else "no record of it in the database yet"
        raise ResultNotKept(
            f"task {self.task} ({self.id}) keeps no result, so get() cannot wait for one: "
            f"{now}. Set store_result=True on the task (or store_results=True on the app) "
            "to keep results; `taskq inspect ID` shows any task's state",
            task_id=self.id, task=self.task, queue=self.queue, state=state,
        )

    def _outcome(self, record: ResultRecord) -> Any:
        if record.state is ResultState.SUCCESS:
            return record.result
        exc_type, _, message = (record.error or "").partition(": ")
        raise TaskFailed(
            f"task {record.task} ({record.task_id}) ended {record.state.value} after "
            f"{record.retries + 1} attempt(s): {record.error}\n"
            f"remote traceback:\n{record.traceback or '(none)'}",
            task_id=record.task_id, task=record.task, state=record.state.value,
            exc_type=exc_type, error=message, remote_traceback=record.traceback,
        )
