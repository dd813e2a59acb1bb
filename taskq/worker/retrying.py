"""Send a delivery back to the broker to run later: retries, and messages that came early.

Both follow DESIGN §6: a copy is published through the app's delay backend and confirmed
*before* the original delivery is acked. A crash or a lost connection between the two leaves
the original unacked, so the broker redelivers it: a duplicate, never a loss. If the publish
itself fails, the original is requeued after a short pause instead of acked.

The copy keeps the body and properties byte for byte; only headers change: ``taskq-retries``
(a retry counts one more), ``taskq-eta`` (set by the delay backend), and RabbitMQ's
``x-death`` family is dropped (RabbitMQ before 4.0.1 drops messages whose ``x-death`` shows
a dead-letter cycle).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from taskq.broker.topology import DELAY_TIERS_MAX_MS
from taskq.errors import TaskqError
from taskq.message import RETRIES, WireMessage

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.subscription import Delivery

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
    """

    def __init__(self, app: App) -> None:
        self._app = app

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
            Whether the retry was published; ``False`` means the delivery was requeued.
        """
        copy = with_retries(delivery.message, retries + 1)
        if not self._publish_then_ack(delivery, copy, task=task, delay_s=delay_s):
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
        if not self._publish_then_ack(delivery, delivery.message, task=task, delay_s=delay_s):
            return False
        logger.warning(
            "task %s[%s] from %s arrived %.3fs before its eta; sent back to wait in the broker",
            task, delivery.message.message_id, delivery.queue, delay_s,
        )
        return True

    def _publish_then_ack(
        self, delivery: Delivery, copy: WireMessage, *, task: str, delay_s: float
    ) -> bool:
        try:
            self._app.publish_delayed(
                copy, queue=delivery.queue, delay_s=min(max(delay_s, 0.0), _MAX_DELAY_S)
            )
        except TaskqError as exc:
            logger.error(
                "task %s[%s] from %s could not be sent back to run later (%s); returning it "
                "to the queue", task, delivery.message.message_id, delivery.queue, exc,
            )
            time.sleep(REQUEUE_PAUSE_S)
            delivery.reject(requeue=True)
            return False
        delivery.ack()
        return True


def with_retries(message: WireMessage, retries: int) -> WireMessage:
    """A copy of ``message`` whose ``taskq-retries`` header is ``retries``."""
    headers = dict(message.headers)
    headers[RETRIES] = retries
    return message.with_headers(headers)
