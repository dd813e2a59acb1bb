"""Infrastructure faults are not task failures (docs/reliability.md).

When taskq's own database or broker cannot be reached, the delivery in hand did nothing
wrong. Two cases, two answers:

- **Before the task's work is settled** (the idempotency check or claim, the commit of a
  ``transactional`` task): :class:`SendBack` returns the delivery to its queue after a
  backoff, as an unchanged copy published through the delay backend and confirmed before the
  delivery is acked. No retry attempt is used (``taskq-retries`` is unchanged), and no
  delivery is spent either: a ``reject(requeue=True)`` would count against a quorum queue's
  ``x-delivery-limit`` and, repeated through an outage, park a healthy message in ``Q.dlq``
  with no reason on it. The backoff grows while faults follow each other in this process and
  starts again after a success.
- **After the task ran** (publishing its retry or its dead letter, or a send-back copy;
  recording the key of an ``idempotent=True`` task that succeeded): running the body again
  would repeat finished work, so :class:`Hold` keeps the delivery unacked and retries with
  capped exponential backoff for as long as the delivery can still be acked: its channel is
  alive and the worker is not stopping. Only then does it give up: a publish returns the
  delivery to the queue (a lost channel has requeued it already); a key that still cannot
  be recorded is logged and the delivery acked, as running the task again would be worse.

What counts as unreachable is decided by exception type, never by message text: broker
errors taskq raises (:class:`~taskq.errors.PublishError`, ``BrokerConnectionError``,
``TopologyError``) and ``OSError`` here; database errors in
:func:`taskq.idempotency.is_database_outage`. Anything else escaping a publish is a bug, and
the callers keep it visible (logged with its traceback) instead of retrying it forever.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from taskq.errors import BrokerError

if TYPE_CHECKING:
    from taskq.broker.delivery import Delivery

logger = logging.getLogger(__name__)

#: Publish errors that mean "the broker path is broken", worth retrying while holding.
BROKER_FAULTS: tuple[type[BaseException], ...] = (BrokerError, OSError)

# First pause of a held publish; it doubles per failed attempt up to the cap.
HOLD_FIRST_PAUSE_S = 0.5
HOLD_MAX_PAUSE_S = 30.0
# First send-back delay after a database fault; doubles per consecutive fault up to the cap.
SEND_BACK_FIRST_DELAY_S = 1.0
SEND_BACK_MAX_DELAY_S = 30.0
# How often a held delivery looks at its channel and the stop flag while it waits.
_WATCH_S = 0.1


class Hold:
    """Retries a failed settlement publish while its delivery can still be acked.

    Args:
        generation: The subscription's current connection generation (a delivery of an older
            one can no longer be acked: the broker has requeued it).
        is_stopping: Whether the worker was asked to stop.
    """

    def __init__(self, generation: Callable[[], int], is_stopping: Callable[[], bool]) -> None:
        self._generation = generation
        self._is_stopping = is_stopping

    def publish(
        self, delivery: Delivery, publish: Callable[[], object], *, what: str
    ) -> BaseException | None:
        """Call ``publish()`` until it returns; retry broker faults with backoff.

        Args:
            delivery: The delivery held meanwhile (unacked).
            publish: Publishes and waits for the broker's confirm.
            what: Says what is published, for the log (``task t[id] from Q: its retry``).

        Returns:
            ``None`` once published; else the last broker fault, when the delivery could no
            longer be held (channel lost, worker stopping).

        Raises:
            Exception: anything that is not a broker fault, unchanged (a bug: not retried).
        """
        return self.retry(
            delivery, publish, what=what, done="published", faults=BROKER_FAULTS,
            repair="the broker path (queue full, delay tier or plugin, connection)",
        )

    def retry(
        self,
        delivery: Delivery,
        call: Callable[[], object],
        *,
        what: str,
        done: str,
        faults: tuple[type[BaseException], ...],
        repair: str,
    ) -> BaseException | None:
        """Call ``call()`` until it returns; retry ``faults`` with backoff while held.

        Returns:
            ``None`` once it returned; else the last fault, when the delivery could no
            longer be held (channel lost, worker stopping).
        """
        pause_s = HOLD_FIRST_PAUSE_S
        attempts = 0
        while True:
            try:
                call()
            except faults as exc:
                attempts += 1
                # ERROR once, then WARNING per attempt: the pauses grow, so do not the lines.
                logger.log(
                    logging.ERROR if attempts == 1 else logging.WARNING,
                    "%s could not be %s (attempt %d: %s); holding the delivery and trying "
                    "again in %.1fs (the task is not run again); repair %s",
                    what, done, attempts, exc, pause_s, repair,
                )
                if not self._wait(delivery, pause_s):
                    return exc
                pause_s = min(pause_s * 2, HOLD_MAX_PAUSE_S)
                continue
            if attempts:
                logger.warning("%s %s after %d failed attempts", what, done, attempts)
            return None

    def can_hold(self, delivery: Delivery) -> bool:
        """Whether the delivery can still be acked: its channel lives, no stop was asked."""
        return delivery.generation == self._generation() and not self._is_stopping()

    def _wait(self, delivery: Delivery, pause_s: float) -> bool:
        deadline = time.monotonic() + pause_s
        while self.can_hold(delivery):
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return True
            time.sleep(min(_WATCH_S, left_s))
        return False


class FaultBackoff:
    """Delay before a sent-back delivery is due: doubles per consecutive fault, capped.

    "Equal jitter" (half fixed, half random) keeps the processes that met one outage
    together from coming back in the same instant.
    """

    def __init__(
        self,
        first_s: float = SEND_BACK_FIRST_DELAY_S,
        max_s: float = SEND_BACK_MAX_DELAY_S,
        *,
        rand: random.Random | None = None,
    ) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._faults = 0
        self._rand = rand or random.Random()

    def next_s(self) -> float:
        """The delay for this fault (and count it)."""
        delay_s = min(self._max_s, self._first_s * 2 ** min(self._faults, 30))
        self._faults += 1
        return float(delay_s / 2 + self._rand.uniform(0, delay_s / 2))

    def reset(self) -> None:
        """A database call succeeded: the next fault starts from the first delay again."""
        self._faults = 0


SendBackCopy = Callable[..., bool]


class SendBack:
    """Returns a delivery to its queue, no attempt used: a database fault, a busy key.

    Args:
        send_back: Publishes the unchanged copy due in ``delay_s`` then acks the delivery
            (:meth:`taskq.worker.retrying.Retrier.send_back`).
        backoff: The delays; one per worker process.
        kind: What happened, for the log.
    """

    def __init__(
        self,
        send_back: SendBackCopy,
        backoff: FaultBackoff | None = None,
        *,
        kind: str = "an infrastructure fault, not a task failure",
    ) -> None:
        self._send_back = send_back
        self._backoff = backoff or FaultBackoff()
        self._kind = kind

    def __call__(self, delivery: Delivery, *, task: str, task_id: str, reason: str) -> None:
        """Send ``delivery`` back because of ``reason``."""
        delay_s = self._backoff.next_s()
        logger.warning(
            "task %s[%s] from %s not run: %s; %s: back to the queue in %.1fs (no retry "
            "attempt used)", task, task_id, delivery.queue, reason, self._kind, delay_s,
            extra={"task_id": task_id, "task": task, "queue": delivery.queue},
        )
        self._send_back(delivery, task=task, delay_s=delay_s)

    def recovered(self) -> None:
        """The database answered: start the backoff over."""
        self._backoff.reset()
