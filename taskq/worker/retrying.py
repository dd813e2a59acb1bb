"""Send a delivery back to the broker to run later: retries, early messages, send-backs.

All follow docs/delays.md: a copy is published through the app's delay backend and confirmed
*before* the original delivery is acked. A crash or a lost connection between the two leaves
the original unacked, so the broker redelivers it: a duplicate, never a loss.

If the broker path fails (a full ``reject-publish`` queue, a delay tier declared with other
arguments, the plugin gone, the connection), the delivery is held and the publish retried with
backoff while the delivery can still be acked (:class:`~taskq.worker.infra_faults.Hold`): a
retry's task body already ran and must not run again because its retry could not be sent.
Only a lost channel (the broker has requeued it already) or a stopping worker ends the hold;
the delivery then goes back to its queue. A delay that is not a number of seconds (``nan``) is
replaced before publishing, with an error naming the task.

The copy keeps the body and properties byte for byte; only headers change: ``taskq-retries``
(a retry counts one more), ``taskq-eta`` (set by the delay backend), and RabbitMQ's
``x-death`` family is dropped (RabbitMQ before 4.0.1 drops messages whose ``x-death`` shows
a dead-letter cycle).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from taskq.broker.topology import DELAY_TIERS_MAX_MS
from taskq.message import RETRIES, WireMessage
from taskq.worker.infra_faults import Hold

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.delivery import Delivery
    from taskq.worker.dead_letters import DeadLetterer

logger = logging.getLogger(__name__)

# Pause before requeueing a delivery whose copy could not be published, so that a broken
# broker path does not become a hot redelivery loop.
REQUEUE_PAUSE_S = 1.0
# The longest wait any delay backend holds; a longer retry delay waits this long instead of
# failing in the worker forever.
_MAX_DELAY_S = DELAY_TIERS_MAX_MS / 1000


class Retrier:
    """Publishes a delivery's copy to run later, then acks the delivery.

    Args:
        app: Publishes through :meth:`~taskq.app.App.publish_delayed` (confirmed).
        hold: Retries a failed publish while the delivery is held; without one (tests), a
            failed publish requeues the delivery at once.
        dead_letters: Where a retry goes when publishing it fails with a bug, not a broker
            fault (it would fail the same way forever).
    """

    def __init__(
        self, app: App, *, hold: Hold | None = None, dead_letters: DeadLetterer | None = None
    ) -> None:
        self._app = app
        self._hold = hold or Hold(lambda: 0, lambda: True)
        self._dead_letters = dead_letters

    def retry(
        self, delivery: Delivery, *, task: str, retries: int, delay_s: float, reason: str
    ) -> bool:
        """Publish the next attempt (``taskq-retries = retries + 1``) due in ``delay_s``.

        Args:
            delivery: The failed delivery; acked once the copy is confirmed.
            task: Task name, for the log.
            retries: The failed attempt's ``taskq-retries``.
            delay_s: Seconds until the retry.
            reason: What failed (``ValueError: ...``), for the log.

        Returns:
            Whether the retry was published; ``False`` means the delivery was settled
            otherwise (requeued, or dead-lettered when the retry could not be built).
        """
        copy = with_retries(delivery.message, retries + 1)
        delay_s = self._checked_delay_s(delivery, task, delay_s)
        what = f"task {task}[{delivery.message.message_id}] from {delivery.queue}: its retry"
        published = self._publish_then_ack(delivery, copy, delay_s=delay_s, what=what)
        if published is None:
            self._dead_letter_unpublishable(delivery, reason)
            return False
        if not published:
            return False
        logger.warning(
            "task %s[%s] from %s failed on attempt %d (%s); retry %d in %.3fs",
            task, delivery.message.message_id, delivery.queue, retries + 1, reason,
            retries + 1, delay_s,
            extra={"task_id": delivery.message.message_id, "task": task,
                   "queue": delivery.queue, "attempt": retries + 1},
        )
        return True

    def postpone(self, delivery: Delivery, *, task: str, delay_s: float) -> bool:
        """Send a delivery that arrived before its eta back to wait ``delay_s`` in the broker.

        Holding it unacked in the worker would block prefetch and run into RabbitMQ's
        ``consumer_timeout``; this happens only when a delay backend delivered early.

        Returns:
            Whether it was published; ``False`` means the delivery was requeued.
        """
        if not self.send_back(delivery, task=task, delay_s=delay_s):
            return False
        logger.warning(
            "task %s[%s] from %s arrived %.3fs before its eta; sent back to wait in the broker",
            task, delivery.message.message_id, delivery.queue, delay_s,
        )
        return True

    def send_back(self, delivery: Delivery, *, task: str, delay_s: float) -> bool:
        """Publish an unchanged copy due in ``delay_s``, then ack (no attempt used).

        Returns:
            Whether it was published; ``False`` means the delivery was requeued.
        """
        what = f"task {task}[{delivery.message.message_id}] from {delivery.queue}: its copy"
        published = self._publish_then_ack(
            delivery, delivery.message, delay_s=self._checked_delay_s(delivery, task, delay_s),
            what=what,
        )
        if published is None:
            self._requeue(delivery)
        return bool(published)

    def _publish_then_ack(
        self, delivery: Delivery, copy: WireMessage, *, delay_s: float, what: str
    ) -> bool | None:
        """``True``: published and acked; ``False``: requeued; ``None``: a bug, unsettled."""
        def publish() -> None:
            self._app.publish_delayed(copy, queue=delivery.queue, delay_s=delay_s)

        try:
            fault = self._hold.publish(delivery, publish, what=what)
        except Exception:  # a bug, not the broker: retrying would fail the same way
            logger.exception("%s could not be published because of an error in taskq", what)
            return None
        if fault is not None:
            logger.error(
                "%s could not be published (%s) and the delivery can no longer be held "
                "(channel lost or worker stopping); returning it to the queue", what, fault,
            )
            self._requeue(delivery)
            return False
        delivery.ack()
        return True

    def _requeue(self, delivery: Delivery) -> None:
        if self._hold.can_hold(delivery):
            time.sleep(REQUEUE_PAUSE_S)  # no hot redelivery loop
        delivery.reject(requeue=True)

    def _dead_letter_unpublishable(self, delivery: Delivery, reason: str) -> None:
        if self._dead_letters is None:
            self._requeue(delivery)
            return
        self._dead_letters.dead_letter(
            delivery, "RetryNotPublished",
            f"the task failed ({reason}) and its retry could not be published because of "
            "an error in taskq (see the worker log for the traceback); replay it with "
            "`taskq dlq replay` once fixed",
        )

    def _checked_delay_s(self, delivery: Delivery, task: str, delay_s: float) -> float:
        """``delay_s`` within what the delay backends hold; ``nan`` becomes 0 (logged)."""
        if isinstance(delay_s, (int, float)) and not isinstance(delay_s, bool):
            if not math.isnan(delay_s):
                return float(min(max(float(delay_s), 0.0), _MAX_DELAY_S))
        logger.error(
            "task %s[%s] from %s asked to run again in %r seconds, which is not a number of "
            "seconds; it runs again now instead (fix the countdown the task passes)",
            task, delivery.message.message_id, delivery.queue, delay_s,
        )
        return 0.0


def with_retries(message: WireMessage, retries: int) -> WireMessage:
    """A copy of ``message`` whose ``taskq-retries`` header is ``retries``."""
    headers = dict(message.headers)
    headers[RETRIES] = retries
    return message.with_headers(headers)
