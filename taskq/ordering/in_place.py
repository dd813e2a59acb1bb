"""Retries in place for ordered queues: the delivery is held, the backoff waited, the task rerun.

A retry elsewhere is a delayed copy published to the queue's tail: on an ordered queue the
later tasks of the key would overtake it. So for a delivery from a partition queue,
:class:`InPlaceRetrier` keeps the delivery unacked in this process (the I/O thread keeps the
connection's heartbeats flowing), waits the backoff, and marks the delivery to run again with
``taskq-retries`` one higher; the loop runs it before any later delivery of the partition. The
same holds for send-backs (taskq's database unreachable, a key claimed elsewhere). A delivery
that arrived before its eta is a delayed task: it goes back through the delay backend and
enters its partition when due, as any delayed task does.

**The hold has a budget.** RabbitMQ closes a channel (or, on 4.3, cancels the consumer) whose
oldest unacked delivery is older than its ``consumer_timeout``; the message would then come
back with the retry count it was published with, and a task that always fails would loop
forever. The delivery in hand is the oldest this process holds (deliveries run in arrival
order; those prefetched behind it arrived later), so its whole hold, counted from its arrival
over every attempt and wait, is kept within half of ``consumer_timeout_s``: the other half is
for the deliveries waiting behind it. When the next wait would pass the budget, the delivery
is **given back**: rejected with requeue, which puts it back at its place at the head of its
partition, and every later delivery of that partition this process receives before it comes
back is given back the same way, in arrival order, so they return behind it. The process stays
the partition's active consumer (a requeue does not hand the partition over), so the message
comes back here, with a fresh ``consumer_timeout`` clock; the retry count it had reached is
remembered here and set on it, the rest of the backoff is waited, and it runs again. A
failing task therefore reaches ``Q.dlq`` after its retries, however long its backoffs.

If the worker is asked to stop while waiting, the delivery is left unacked: the loop stops,
and closing the channel returns it and the later deliveries to their places at the head of
the partition, and the next consumer starts with it; its ``taskq-retries`` starts again from
the value it was published with (as it does when the process dies while it is given back).
If the channel is lost meanwhile, the broker has already requeued it; nothing is sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskq.message import RETRIES
from taskq.worker.retrying import Retrier, with_retries

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.delivery import Delivery
    from taskq.worker.dead_letters import DeadLetterer
    from taskq.worker.infra_faults import Hold

logger = logging.getLogger(__name__)

# How often a backoff wait looks at the stop flag and the channel.
_WAIT_STEP_S = 0.1


@dataclass(frozen=True, slots=True)
class _GivenBack:
    """A partition's delivery given back to the broker, awaited back at the partition's head."""

    message_id: str | None
    retries: int  # the taskq-retries it had reached here
    due_at: float  # monotonic time its backoff ends
    generation: int  # the channel it was given back on


class InPlaceRetrier(Retrier):
    """A :class:`~taskq.worker.retrying.Retrier` that retries ordered deliveries in place.

    Args:
        app: The app (its topology tells partition queues apart).
        hold: See :class:`Retrier`.
        dead_letters: See :class:`Retrier`.
        is_stopping: The loop's stop flag.
        generation: The subscription's current channel generation.
        alive_at: The process slot's liveness stamp, refreshed while waiting.
    """

    def __init__(
        self,
        app: App,
        *,
        hold: Hold,
        dead_letters: DeadLetterer,
        is_stopping: Callable[[], bool],
        generation: Callable[[], int],
        alive_at: Any,
    ) -> None:
        super().__init__(app, hold=hold, dead_letters=dead_letters)
        self._topology = app.topology
        self._is_stopping = is_stopping
        self._generation = generation
        self._alive_at = alive_at
        # How long a delivery may be held in all (see the module docstring).
        self._budget_s = app.settings.consumer_timeout_s / 2
        self._again: Delivery | None = None
        self._given_back: dict[str, _GivenBack] = {}  # by partition queue

    def is_ordered(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` came from a partition of an ordered queue."""
        return self._topology.ordered_parent(delivery.queue) is not None

    def take_again(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` is to run again now (once per marking)."""
        if self._again is not delivery:
            return False
        self._again = None
        return True

    def retry(
        self, delivery: Delivery, *, task: str, retries: int, delay_s: float, reason: str
    ) -> bool:
        """Ordered: wait ``delay_s`` holding the delivery, then mark it to run again.

        Past the hold budget the delivery is given back instead (module docstring).
        """
        if not self.is_ordered(delivery):
            return super().retry(
                delivery, task=task, retries=retries, delay_s=delay_s, reason=reason
            )
        delay_s = min(self._checked_delay_s(delivery, task, delay_s), self._budget_s)
        logger.warning(
            "task %s[%s] from %s failed on attempt %d (%s); retry %d in place in %.3fs (the "
            "later tasks of its partition wait)", task, delivery.message.message_id,
            delivery.queue, retries + 1, reason, retries + 1, delay_s,
            extra={"task_id": delivery.message.message_id, "task": task,
                   "queue": delivery.queue, "attempt": retries + 1},
        )
        if self._over_budget(delivery, delay_s):
            self._give_back(delivery, task, retries + 1, delay_s)
            return True
        if not self._wait(delivery, delay_s):
            return False
        delivery.message = with_retries(delivery.message, retries + 1)
        self._again = delivery
        return True

    def send_back(self, delivery: Delivery, *, task: str, delay_s: float) -> bool:
        """Ordered: wait ``delay_s`` holding the delivery, then mark it to run again."""
        if not self.is_ordered(delivery):
            return super().send_back(delivery, task=task, delay_s=delay_s)
        delay_s = min(delay_s, self._budget_s)
        if self._over_budget(delivery, delay_s):
            self._give_back(delivery, task, _retries_of(delivery), delay_s)
            return True
        if not self._wait(delivery, delay_s):
            return False
        self._again = delivery
        return True

    def postpone(self, delivery: Delivery, *, task: str, delay_s: float) -> bool:
        """An early delayed task goes back through the delay backend, ordered or not."""
        published = super().send_back(delivery, task=task, delay_s=delay_s)
        if published:
            logger.warning(
                "task %s[%s] from %s arrived %.3fs before its eta; sent back to wait in the "
                "broker", task, delivery.message.message_id, delivery.queue, delay_s,
            )
        return published

    def gives_back(self, delivery: Delivery) -> bool:
        """Before a delivery runs: ``True`` if it was given back to wait behind another.

        A delivery of a partition whose earlier delivery was given back returns to the
        broker too, behind it, until that one is back. When it is back, it gets the retry
        count it had reached here and the rest of its backoff is waited (holding it, on a
        fresh ``consumer_timeout`` clock); then it runs (``False``).
        """
        given = self._given_back.get(delivery.queue)
        if given is None:
            return False
        if given.generation != delivery.generation:
            # The channel died since: the broker put every message back at its place and
            # this process may not be the partition's consumer any more.
            del self._given_back[delivery.queue]
            return False
        if delivery.message.message_id != given.message_id:
            delivery.reject(requeue=True)
            return True
        del self._given_back[delivery.queue]
        if given.retries > _retries_of(delivery):
            delivery.message = with_retries(delivery.message, given.retries)
        if not self._wait(delivery, given.due_at - time.monotonic()):
            return True  # its channel is gone or the worker stops: left to the broker
        return False

    def _over_budget(self, delivery: Delivery, delay_s: float) -> bool:
        held_s = time.monotonic() - delivery.received_at
        return held_s + delay_s > self._budget_s

    def _give_back(self, delivery: Delivery, task: str, retries: int, delay_s: float) -> None:
        logger.warning(
            "task %s[%s] from %s has been held %.1fs, and waiting %.3fs more would pass half "
            "the broker's consumer_timeout (%gs): giving it back to the head of its partition "
            "with the later deliveries of the partition behind it; it runs again here with "
            "taskq-retries %d", task, delivery.message.message_id, delivery.queue,
            time.monotonic() - delivery.received_at, delay_s,
            self._budget_s * 2, retries,
        )
        self._given_back[delivery.queue] = _GivenBack(
            delivery.message.message_id, retries, time.monotonic() + delay_s,
            delivery.generation,
        )
        delivery.reject(requeue=True)

    def _wait(self, delivery: Delivery, delay_s: float) -> bool:
        """Wait holding ``delivery``; ``False`` if it had to be given up meanwhile."""
        deadline = time.monotonic() + delay_s
        while True:
            if delivery.generation != self._generation():
                return False  # its channel is gone: the broker requeued it at its place
            if self._is_stopping():
                # Left unacked: the loop stops, and closing the channel returns it and the
                # later deliveries of its partition to their places, before the standby
                # consumer gets any (a requeue now could reach it behind later ones).
                return False
            left = deadline - time.monotonic()
            self._alive_at.value = time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(_WAIT_STEP_S, left))


def _retries_of(delivery: Delivery) -> int:
    value = delivery.message.headers.get(RETRIES, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
