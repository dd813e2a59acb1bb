"""Retries in place for ordered queues: the delivery is held, the backoff waited, the task rerun.

A retry elsewhere is a delayed copy published to the queue's tail: on an ordered queue the
later tasks of the key would overtake it. So for a delivery from a partition queue,
:class:`InPlaceRetrier` keeps the delivery unacked in this process (the I/O thread keeps the
connection's heartbeats flowing), waits the backoff, and marks the delivery to run again with
``taskq-retries`` one higher; the loop runs it before any later delivery of the partition. The
same holds for send-backs (taskq's database unreachable, a key claimed elsewhere). A delivery
that arrived before its eta is a delayed task: it goes back through the delay backend and
enters its partition when due, as any delayed task does.

If the worker is asked to stop while waiting, the delivery is left unacked: the loop stops,
and closing the channel returns it and the later deliveries to their places at the head of
the partition, and the next consumer starts with it; its ``taskq-retries`` starts again from
the value it was published with. If the channel is lost meanwhile, the broker has already
requeued it; nothing is sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from taskq.worker.retrying import Retrier, with_retries

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.delivery import Delivery
    from taskq.worker.dead_letters import DeadLetterer
    from taskq.worker.infra_faults import Hold

logger = logging.getLogger(__name__)

# How often a backoff wait looks at the stop flag and the channel.
_WAIT_STEP_S = 0.1


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
        # A held delivery holds its channel's consumer_timeout clock: wait at most half.
        self._max_wait_s = app.settings.consumer_timeout_s / 2
        self._again: Delivery | None = None

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
        """Ordered: wait ``delay_s`` holding the delivery, then mark it to run again."""
        if not self.is_ordered(delivery):
            return super().retry(
                delivery, task=task, retries=retries, delay_s=delay_s, reason=reason
            )
        delay_s = min(self._checked_delay_s(delivery, task, delay_s), self._max_wait_s)
        logger.warning(
            "task %s[%s] from %s failed on attempt %d (%s); retry %d in place in %.3fs (the "
            "later tasks of its partition wait)", task, delivery.message.message_id,
            delivery.queue, retries + 1, reason, retries + 1, delay_s,
            extra={"task_id": delivery.message.message_id, "task": task,
                   "queue": delivery.queue, "attempt": retries + 1},
        )
        if not self._wait(delivery, delay_s):
            return False
        delivery.message = with_retries(delivery.message, retries + 1)
        self._again = delivery
        return True

    def send_back(self, delivery: Delivery, *, task: str, delay_s: float) -> bool:
        """Ordered: wait ``delay_s`` holding the delivery, then mark it to run again."""
        if not self.is_ordered(delivery):
            return super().send_back(delivery, task=task, delay_s=delay_s)
        if not self._wait(delivery, min(delay_s, self._max_wait_s)):
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
