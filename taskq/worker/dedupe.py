"""Idempotent execution in the worker: claim, skip what is done, record what succeeded.

The loop asks :class:`Deduplicator` to run a task whose plan is ``idempotent``; it answers
with the task's :data:`~taskq.worker.execution.Outcome`, or with :class:`Duplicate` (the key
is already recorded: ack without running), :class:`Busy` (another worker process holds the
key's claim right now: send the copy back, it runs later if that one does not finish) or
:class:`Unavailable` (taskq's database could not be reached: an infrastructure fault, the
delivery goes back to its queue without using an attempt). See :mod:`taskq.idempotency` for
the guarantees of each mode.

On PostgreSQL the keys of the deliveries in hand are claimed and then checked in two
statements per prefetch batch (:meth:`Deduplicator.precheck`), so a task costs one INSERT
(its record) after that; the claims of a batch are released together when its last key has
run, or when the loop ends the batch (:meth:`Deduplicator.end_batch`) with deliveries that
never ran (their channel was lost, they were settled before running, a stop). A claim never
outlives the deliveries in hand, and a key recorded while its claim is still held counts as
done for every other process (:class:`Duplicate`, not :class:`Busy`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
class Busy:
    """Another worker process holds the key's claim: a copy of this task is running there."""

    key: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    """taskq's database could not be reached; the message goes back to the queue."""

    error: str


Execute = Callable[[dict[str, Any]], Outcome]
#: Retries a call that failed with IdempotencyError while the delivery is held; ``True``
#: once it succeeded (see :meth:`taskq.worker.infra_faults.Hold.retry`).
RetryCall = Callable[[Callable[[], object]], bool]



class Completion(Protocol):
    """Work that must commit with a task's idempotency key (a workflow member's count).

    See :class:`taskq.workflows.completion.MemberCompletion`.
    """

    def record(self, key: str, task: str, result: Any) -> bool:
        """Record ``key`` and the work in one transaction (raises IdempotencyError)."""

    def join(self, session: Any, result: Any) -> None:
        """Do the work in ``session``'s open transaction, which holds the key."""


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
        # Keys this process recorded recently (spare a SELECT per duplicate); keys of the
        # deliveries in hand claimed and found not done (PostgreSQL); claims this session
        # holds (advisory locks count).
        self._recorded: set[str] = set()
        self._ready: set[str] = set()
        self._held: Counter[str] = Counter()

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
        retry_record: RetryCall | None = None,
        completion: Completion | None = None,
    ) -> Outcome | Duplicate | Busy | Unavailable:
        """Run ``execute(kwargs)`` at most once per ``key`` (see the module docstring).

        ``retry_record`` keeps trying to record the key of a task that succeeded while the
        database is unreachable (the task must not run again because of it).
        ``completion`` commits with the key (a workflow member's count); if it cannot be
        committed the delivery goes back to the queue and the task runs again.
        """
        if transactional:
            return self._run_in_transaction(key, task, kwargs, execute, completion)
        if key in self._recorded:
            self.duplicates += 1
            self._batch_key_done(key)
            return Duplicate(key)
        try:
            refusal = self._admit(key)
        except IdempotencyError as exc:
            self._lost_claims()
            return Unavailable(str(exc))
        if refusal is not None:
            self._batch_key_done(key)
            return refusal
        outcome = execute(kwargs)
        if outcome.__class__ is Succeeded:
            if completion is not None:
                completed = self._complete(key, task, completion, outcome, retry_record)
                self._batch_key_done(key)
                return completed
            self._record(key, task, retry_record)
        self._batch_key_done(key)
        return outcome

    def _complete(
        self, key: str, task: str, completion: Completion, outcome: Outcome,
        retry_record: RetryCall | None,
    ) -> Outcome | Unavailable:
        """Record the key with ``completion``'s work; Unavailable if it cannot commit."""
        result = outcome.result if isinstance(outcome, Succeeded) else None
        try:
            completion.record(key, task, result)
        except IdempotencyError as exc:
            error: IdempotencyError | None = exc
        else:
            error = None
        if error is not None and not (
            retry_record is not None
            and retry_record(lambda: completion.record(key, task, result))
        ):
            # Unlike a plain task's key, a lost count would stall its workflow: run again.
            return Unavailable(f"task {task} succeeded but its completion could not be "
                               f"recorded, so it runs again: {error}")
        self._recorded.add(key)
        return outcome

    def _admit(self, key: str) -> Duplicate | Busy | None:
        """Claim (PostgreSQL) and check ``key`` unless its batch did; ``None``: run it."""
        store = self.store
        if key in self._ready:
            return None
        if store.claims_keys:
            # Claimed again even when the batch found it busy: that claim may be gone since
            # (its holder lost its connection, dropped the delivery, or finished).
            if not store.claim_many([key]):
                # A holder that recorded the key may keep its claim until its batch ends:
                # done is done, whoever holds the claim.
                if not store.is_done(key):
                    return Busy(key)
                self.duplicates += 1
                self._recorded.add(key)
                return Duplicate(key)
            self._held[key] += 1
        if store.is_done(key):
            self.duplicates += 1
            self._recorded.add(key)
            return Duplicate(key)
        return None

    def precheck(self, keys: list[str]) -> None:
        """Claim and check the keys of the deliveries in hand (before running them).

        On PostgreSQL, one statement releases the previous batch's claims and claims these
        keys, and a second one checks them all: keys found done become duplicates (claimed
        here or not), the claimed others run with no further statement, and the rest, claimed
        elsewhere, try again one by one when their turn comes (:class:`Busy` if still held).
        On SQLite only the keys found done are remembered; each task checks right before it
        runs. On a database error nothing is remembered: each task then tries on its own
        (and is sent back if that fails too).
        """
        self._ready.clear()
        if len(self._recorded) > _RECORDED_MAX:
            self._recorded.clear()
        wanted = [key for key in dict.fromkeys(keys) if key not in self._recorded]
        store = self.store
        try:
            if store.claims_keys:
                self._claim_batch(wanted)
            elif len(wanted) > 1:
                self._recorded.update(store.done_among(wanted))
        except IdempotencyError:
            self._lost_claims()

    def _claim_batch(self, wanted: list[str]) -> None:
        store = self.store
        release = list(self._held.elements())
        if not wanted and not release:
            return
        claimed = store.claim_many(wanted, release=release)
        self._held.clear()
        self._held.update(claimed)
        done = store.done_among(wanted)  # checked after the claim (see claim_many)
        self._recorded.update(done)
        self._ready.update(key for key in claimed if key not in done)

    def _batch_key_done(self, key: str) -> None:
        """Forget ``key``'s batch answer; release the claims once the batch has run."""
        self._ready.discard(key)
        if self._held and not self._ready:
            self.end_batch()

    def end_batch(self) -> None:
        """The deliveries in hand are all settled or dropped: release every claim left.

        Claims of keys that never came to :meth:`run` stay otherwise: deliveries dropped
        unexecuted because their channel was lost (the broker has handed them to another
        consumer, which must be able to claim them), deliveries settled before running
        (dead-lettered, postponed), or a batch cut short by a stop. No statement when none is
        held, as when every key of the batch ran (the last one released them).
        """
        self._ready.clear()
        if self._held:
            release = list(self._held.elements())
            self._held.clear()
            self.store.release_claims(release)

    def _lost_claims(self) -> None:
        """The connection failed: its claims ended with it."""
        self._held.clear()
        self._ready.clear()

    def _record(self, key: str, task: str, retry_record: RetryCall | None) -> None:
        self._recorded.add(key)
        try:
            self.store.record(key, task)
            return
        except IdempotencyError as exc:
            self._lost_claims()
            error = exc
        if retry_record is not None and retry_record(lambda: self.store.record(key, task)):
            return
        # The task has run; running it again because its key was not written would be
        # worse than the small window this leaves for a duplicate.
        logger.error("task %s succeeded but its key %s was not recorded: %s", task, key, error)

    def _run_in_transaction(
        self, key: str, task: str, kwargs: dict[str, Any], execute: Execute,
        completion: Completion | None = None,
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
                if completion is not None:
                    refused = _join(session, completion, outcome, task)
                    if refused is not None:
                        return refused
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


def _join(
    session: Session, completion: Completion, outcome: Outcome, task: str
) -> Outcome | Unavailable | None:
    """Do ``completion``'s work before the commit; ``None`` when it is in the transaction."""
    try:
        completion.join(session, outcome.result if isinstance(outcome, Succeeded) else None)
    except Exception as exc:  # nothing commits: neither the task's writes nor the key
        _rollback(session)
        if is_database_outage(exc):
            return Unavailable(_outage(task, "its workflow completion", exc))
        return failure(exc, outcome.duration_s)
    return None


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
