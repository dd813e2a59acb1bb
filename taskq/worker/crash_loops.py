"""Redelivered messages that killed worker processes: dead-letter crash loops, charge time limits.

The supervisor writes each death of a process that held a message to the
:class:`~taskq.worker.deaths.DeathLedger`. When such a message is redelivered, a worker
process looks it up before running it: after ``max_process_deaths`` deaths it goes to
``Q.dlq`` (``ProcessCrashLoop``); a hard time-limit kill counts as a failed attempt under the
task's retry policy (a delayed retry, or ``Q.dlq`` with ``TimeLimitExceeded``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from taskq.errors import TimeLimitExceeded
from taskq.message import TASK
from taskq.retry import Decision, GiveUp
from taskq.worker.dead_letters import DeadLetterer, retries_of
from taskq.worker.retrying import Retrier
from taskq.worker.time_limits import delivery_key

if TYPE_CHECKING:
    from taskq.broker.delivery import Delivery
    from taskq.worker.deaths import DeathLedger
    from taskq.worker.time_limits import Slot

logger = logging.getLogger(__name__)

# Longest wait for the supervisor to record the death of a sibling that held a message.
DEATH_RECORD_WAIT_S = 2.0

Decide = Callable[[Any, BaseException | None, int], Decision]


class CrashLoopGuard:
    """Settles redelivered messages whose earlier processes died holding them.

    Args:
        ledger: The supervisor's death records.
        sibling_slots: The other worker processes' slots (what they hold right now).
        max_deaths: ``max_process_deaths``: deaths after which a message is dead-lettered.
        dead_letters: Parks messages in ``Q.dlq``.
        retrier: Publishes the retry after a time-limit kill.
        decide: The loop's retry decision for a task name, exception and retries count.
    """

    def __init__(
        self,
        ledger: DeathLedger,
        sibling_slots: Sequence[Slot],
        *,
        max_deaths: int,
        dead_letters: DeadLetterer,
        retrier: Retrier,
        decide: Decide,
    ) -> None:
        self._ledger = ledger
        self._sibling_slots = tuple(sibling_slots)
        self._max_deaths = max_deaths
        self._dead_letters = dead_letters
        self._retrier = retrier
        self._decide = decide

    def settle(self, delivery: Delivery) -> bool:
        """Dead-letter or retry a redelivered message that killed its processes.

        Returns:
            ``True`` when the delivery was settled here; ``False``: run it as usual.
        """
        message_id = delivery_key(delivery.message)
        self._await_death_record(message_id)
        record = self._ledger.read(message_id)
        if record is None:
            return False
        retries = retries_of(delivery.message.headers)
        if record.time_limit_s is not None:
            error = (taken_back_error(delivery, record.time_limit_s) if record.by_broker else
                     f"the task ran past its hard time limit of {record.time_limit_s:g}s; "
                     "its worker process was killed")
            return self._settle_time_limit(delivery, message_id, error, retries)
        if record.deaths < self._max_deaths:
            return False
        error = f"the message killed its worker process {record.deaths} times"
        # Deaths count as attempts: those of this delivery's retries level, plus the retries.
        if self._dead_letters.dead_letter(
            delivery, "ProcessCrashLoop", error, attempts=retries + record.deaths
        ):
            self._ledger.forget(message_id)
        return True

    def _settle_time_limit(
        self, delivery: Delivery, message_id: bytes, error: str, retries: int
    ) -> bool:
        """A hard time-limit kill is a failed attempt: retry per policy, else dead-letter.

        So is a run the broker took the delivery back from (4.3's consumer timeout).
        """
        name = delivery.message.headers.get(TASK)
        decision = self._decide(name, TimeLimitExceeded(error), retries)
        if isinstance(decision, GiveUp):
            settled = self._dead_letters.dead_letter(
                delivery, "TimeLimitExceeded", error, attempts=retries + 1
            )
        else:
            settled = self._retrier.retry(
                delivery, task=str(name), retries=retries, delay_s=decision.delay_s,
                reason=f"TimeLimitExceeded: {error}",
            )
        if settled:
            # The copy is a new delivery; a stale record would dead-letter it if it is ever
            # redelivered.
            self._ledger.forget(message_id)
        return True

    def _await_death_record(self, message_id: bytes) -> None:
        """Wait while a sibling's slot still holds the message (briefly, with a deadline).

        When a process dies, the broker may redeliver its message to a sibling before the
        supervisor has written the death to the ledger. The supervisor clears the dead
        process's slot only after writing, so while a slot still holds this message id its
        death is not counted yet. (A sibling that is alive and holds the same message -- its
        channel was lost mid-task -- simply makes us wait out the deadline.)
        """
        deadline = time.monotonic() + DEATH_RECORD_WAIT_S
        while any(slot.holds(message_id) for slot in self._sibling_slots):
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


def taken_back_error(delivery: Delivery, held_s: float) -> str:
    """The reason recorded for a run ended because the broker took its delivery back."""
    name = delivery.message.headers.get(TASK)
    return (
        f"task {name} held its delivery of quorum queue {delivery.queue!r} for {held_s:.0f}s, "
        "past the consumer timeout: RabbitMQ cancelled the consumer and returned the "
        "message, so taskq ended that run (its worker process was killed) as past a hard "
        "time limit. Give the task a time_limit_s (taskq then asks RabbitMQ 4.3+ for a "
        "consumer timeout above its longest hold), or raise consumer_timeout_s "
        "(TASKQ_CONSUMER_TIMEOUT_S: taskq's consumers of quorum queues ask for at least that "
        "as x-consumer-timeout)"
    )
