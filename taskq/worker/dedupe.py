"""Idempotent execution in the worker: skip what is done, record what succeeded.

The loop asks :class:`Deduplicator` to run a task whose plan is ``idempotent``; it answers
with the task's :data:`~taskq.worker.execution.Outcome`, or with :class:`Duplicate` (the key
is already recorded: ack without running) or :class:`Unavailable` (taskq's database could
not be reached: an infrastructure fault, the delivery goes back to its queue without using
an attempt). See :mod:`taskq.idempotency` for the guarantees of each mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskq.errors import IdempotencyError
from taskq.idempotency import is_database_outage
from taskq.worker.execution import Failed, Outcome, Succeeded, failure

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from taskq.app import App
    from taskq.idempotency import IdempotencyStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The idempotency key is already recorded: the task ran before; ack and skip."""

    key: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    """taskq's database could not be reached; the message goes back to the queue."""

    error: str


Execute = Callable[[dict[str, Any]], Outcome]

# Recently recorded keys kept in memory per process (cleared past this size).
_RECORDED_MAX = 10_000


class Deduplicator:
    """Runs idempotent and transactional tasks against ``taskq_processed``.

    Args:
        app: The worker's app; its ``engine`` (``database_url``) holds the table.
    """

    def __init__(self, app: App) -> None:
        self._app = app
        self._store: IdempotencyStore | None = None
        self.duplicates = 0
        # Keys of the deliveries in hand already checked in one batch (not done then), and
        # keys this process recorded recently: both spare a SELECT per task.
        self._checked: set[str] = set()
        self._recorded: set[str] = set()

    @property
    def store(self) -> IdempotencyStore:
        """The store, created on first use in this process."""
        if self._store is None:
            from taskq.idempotency import IdempotencyStore

            self._store = IdempotencyStore(self._app.engine)
        return self._store

    def run(
        self,
        key: str,
        task: str,
        kwargs: dict[str, Any],
        execute: Execute,
        *,
        transactional: bool,
    ) -> Outcome | Duplicate | Unavailable:
        """Run ``execute(kwargs)`` at most once per ``key`` (see the module docstring)."""
        if transactional:
            return self._run_in_transaction(key, task, kwargs, execute)
        if key in self._recorded:
            self.duplicates += 1
            return Duplicate(key)
        if key in self._checked:
            self._checked.discard(key)
        else:
            try:
                if self.store.is_done(key):
                    self.duplicates += 1
                    return Duplicate(key)
            except IdempotencyError as exc:
                return Unavailable(str(exc))
        outcome = execute(kwargs)
        if outcome.__class__ is Succeeded:
            self._record(key, task)
        return outcome

    def precheck(self, keys: list[str]) -> None:
        """Check the keys of the deliveries in hand in one SELECT (before running them).

        Keys found done are remembered as recorded (their deliveries become duplicates);
        the others are marked checked, so running them costs no further SELECT. A key
        recorded by another process between this check and the run is the same window a
        per-task check leaves between SELECT and run. On a database error nothing is
        remembered: each task then checks on its own (and is sent back if that fails too).
        """
        self._checked.clear()
        if len(self._recorded) > _RECORDED_MAX:
            self._recorded.clear()
        wanted = [key for key in dict.fromkeys(keys) if key not in self._recorded]
        if len(wanted) < 2:
            return
        try:
            done = self.store.done_among(wanted)
        except IdempotencyError:
            return
        self._recorded.update(done)
        self._checked.update(key for key in wanted if key not in done)

    def _record(self, key: str, task: str) -> None:
        self._recorded.add(key)
        try:
            self.store.record(key, task)
        except IdempotencyError as exc:
            # The task has run; running it again because its key was not written would be
            # worse than the small window this leaves for a duplicate.
            logger.error("task %s succeeded but its key was not recorded: %s", task, exc)

    def _run_in_transaction(
        self, key: str, task: str, kwargs: dict[str, Any], execute: Execute
    ) -> Outcome | Duplicate | Unavailable:
        try:
            session = self.store.begin(key, task)
        except IdempotencyError as exc:
            return Unavailable(str(exc))
        if session is None:
            self.duplicates += 1
            return Duplicate(key)
        try:
            outcome = execute({**kwargs, "session": session})
            if outcome.__class__ is Succeeded:
                return _commit(session, outcome, task)
            _rollback(session)
            if isinstance(outcome, Failed) and outcome.exc is not None:
                if is_database_outage(outcome.exc):
                    # The session lost its connection: nothing was committed, the task did
                    # not fail; it runs again once the database is back.
                    return Unavailable(_outage(task, "its statement", outcome.exc))
            return outcome
        finally:
            _close(session)


def _commit(session: Session, outcome: Succeeded, task: str) -> Outcome | Unavailable:
    """Commit a transactional task's writes with its key; the commit decides."""
    try:
        session.commit()
    except Exception as exc:  # no key, no writes
        _rollback(session)
        if is_database_outage(exc):
            # Perhaps committed, perhaps not: the key row tells when the copy comes back.
            return Unavailable(_outage(task, "its commit", exc))
        return failure(exc, outcome.duration_s)
    return outcome


def _outage(task: str, what: str, exc: BaseException) -> str:
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return (
        f"the database connection of task {task}'s transaction was lost during {what} "
        f"({type(exc).__name__}: {first_line})"
    )


def _rollback(session: Session) -> None:
    try:
        session.rollback()
    except Exception:  # a lost connection cannot roll back; the server already did
        logger.debug("rollback of a transactional task failed", exc_info=True)


def _close(session: Session) -> None:
    try:
        session.close()
    except Exception:
        logger.debug("closing the session of a transactional task failed", exc_info=True)
