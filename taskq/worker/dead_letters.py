"""Dead-lettering: a copy of the delivery goes to ``Q.dlq`` with the reason, then the ack.

The copy keeps body and properties; its headers drop RabbitMQ's ``x-death`` family and gain
the ``taskq-error-*`` headers of docs/PROTOCOL.md (type, message, traceback, attempts, origin
queue).
It is published to the dead-letter exchange with confirms *before* the delivery is acked: a
crash between the two leaves a duplicate dead letter, never a lost message.

When the broker path fails, the delivery is held and the publish retried with backoff while
it can still be acked (:class:`~taskq.worker.infra_faults.Hold`): a failed task's body must
not run again because its dead letter could not be sent. A lost channel or a stopping worker
returns it to the queue. Any other error while publishing is a bug: it is logged with its
traceback and the delivery is rejected without requeue, so the broker dead-letters it to
``Q.dlq`` itself (without the ``taskq-error-*`` headers, which could not be built).

A dead-lettered workflow member fails its workflow before the ack. An error there that is
not the database being unreachable (those are retried while held) is a failure while
handling a failure: it is logged, and the ack stands. Nothing that goes wrong here escapes
to the loop: the member is dead-lettered once, never run again, and the process goes on.
"""

from __future__ import annotations

import logging
import time
from traceback import format_exception
from typing import TYPE_CHECKING, Any

from taskq.errors import IdempotencyError
from taskq.message import RETRIES, TASK, WORKFLOW, WireMessage
from taskq.republish import dead_letter_headers
from taskq.worker.events import Observers, TaskEvent
from taskq.worker.infra_faults import Hold

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.broker.delivery import Delivery
    from taskq.workflows.completion import WorkflowHooks

logger = logging.getLogger(__name__)

# Pause before requeueing a message whose dead letter could not be published, so that a
# broken dead-letter path does not turn into a hot redelivery loop.
DEAD_LETTER_RETRY_PAUSE_S = 1.0


class DeadLetterer:
    """Publishes dead letters of one worker process, then acks their deliveries.

    Args:
        app: Its publisher, dead-letter exchange and ``traceback_max_chars``.
        observers: Told about each dead letter (results, metrics).
        hold: Retries a failed publish while the delivery is held; without one (tests), a
            failed publish requeues the delivery at once.
        workflows: Told before the ack when a workflow member is dead-lettered.
    """

    def __init__(
        self, app: App, observers: Observers, *, hold: Hold | None = None,
        workflows: WorkflowHooks | None = None,
    ) -> None:
        self._workflows = workflows
        self._app = app
        self._hold = hold or Hold(lambda: 0, lambda: True)
        self._dlx = app.topology.dlx
        self._traceback_max_chars = app.settings.traceback_max_chars
        self._observers = observers

    def dead_letter(
        self,
        delivery: Delivery,
        error_type: str,
        error: str,
        *,
        traceback: str | None = None,
        attempts: int | None = None,
    ) -> bool:
        """Publish a copy of the delivery to ``Q.dlq`` with the reason, then ack it.

        Args:
            delivery: The delivery to park.
            error_type: ``taskq-error-type`` (an exception name or a taskq reason).
            error: ``taskq-error``: what went wrong, for the operator.
            traceback: The task's traceback, when it raised.
            attempts: ``taskq-attempts``; defaults to the delivery's retries + 1.

        Returns:
            Whether it was dead-lettered; ``False`` means it was requeued instead, because
            the dead letter could not be published.
        """
        message = delivery.message
        task = message.headers.get(TASK)
        task = task if isinstance(task, str) else None
        shown = task or "(unknown task)"
        try:
            copy = self._copy(delivery, error_type, error, traceback, attempts)
            fault = self._hold.publish(
                delivery,
                lambda: self._app.publisher.publish(
                    copy, exchange=self._dlx, routing_key=delivery.queue, task=task
                ),
                what=f"task {shown}[{message.message_id}] from {delivery.queue}: its dead letter",
            )
        except Exception:  # a bug, not the broker: retrying would fail the same way
            self._reject_to_broker_dlx(delivery, shown, error_type, error)
            return True
        if fault is not None:
            logger.error(
                "task %s[%s] from %s could not be dead-lettered (%s) and can no longer be "
                "held (channel lost or worker stopping); returning it to the queue",
                shown, message.message_id, delivery.queue, fault,
            )
            if self._hold.can_hold(delivery):
                time.sleep(DEAD_LETTER_RETRY_PAUSE_S)
            delivery.reject(requeue=True)
            return False
        if WORKFLOW in message.headers and not self._fail_workflow(
            delivery, shown, error_type, error, traceback
        ):
            return False
        retries = retries_of(message.headers)
        if self._observers:
            # Before the ack: the final result (FAILURE, DEAD) is stored before the broker
            # forgets the message, so a crash between the two cannot leave it STARTED.
            self._observers.dead_lettered(
                TaskEvent(message.message_id or "", shown, delivery.queue, retries),
                error_type, error, traceback,
            )
        delivery.ack()
        logger.error(
            "task %s[%s] from %s dead-lettered after attempt %d: %s: %s",
            shown, message.message_id, delivery.queue, retries + 1, error_type, error,
            extra=log_fields(message.message_id, shown, delivery.queue, retries),
        )
        return True

    def _fail_workflow(
        self, delivery: Delivery, shown: str, error_type: str, error: str,
        traceback: str | None,
    ) -> bool:
        """Fail the member's workflow before the ack; ``False``: requeued instead.

        The failure must be written before the broker forgets the message, or the workflow
        would wait forever; the dead letter copy already sent stays (a duplicate at worst).
        """
        workflows = self._workflows
        if workflows is None:
            return True
        message_id = delivery.message.message_id or ""
        try:
            fault = self._hold.retry(
                delivery, lambda: workflows.failed(message_id, error_type, error, traceback),
                what=f"task {shown}[{message_id}] from {delivery.queue}: its workflow's "
                     "failure", done="recorded", faults=(IdempotencyError,),
                repair="the connection to taskq's database",
            )
        except Exception:
            # A failure while handling a failure (a bug: the store records what it can
            # refuse, such as a link_error that cannot be enqueued). Its dead letter is sent:
            # the ack stands, so the task neither runs nor is dead-lettered again.
            logger.exception(
                "task %s[%s] from %s was dead-lettered but its workflow's failure could not be "
                "recorded because of an error in taskq; acking it all the same (running or "
                "dead-lettering it again would not help): `taskq inspect %s` shows its "
                "workflow, which may still say RUNNING", shown, message_id, delivery.queue,
                message_id,
            )
            return True
        if fault is None:
            return True
        logger.error(
            "task %s[%s] from %s was dead-lettered but its workflow's failure could not be "
            "recorded (%s); returning it to the queue to record it on redelivery",
            shown, message_id, delivery.queue, fault,
        )
        delivery.reject(requeue=True)
        return False

    def park_worker_error(self, delivery: Delivery, exc: Exception) -> None:
        """Dead-letter a delivery whose handling raised in taskq itself (``WorkerError``).

        The error is the worker's, not the task's: it is logged with its traceback and the
        message parked with it, so that one bad message never takes the process down.
        """
        message = delivery.message
        name = message.headers.get(TASK)
        shown = name if isinstance(name, str) else "(unknown task)"
        logger.exception(
            "task %s[%s] from %s: the worker failed while handling the message (%s: %s); "
            "dead-lettering it", shown, message.message_id, delivery.queue,
            type(exc).__name__, exc,
        )
        try:
            self.dead_letter(
                delivery, "WorkerError",
                f"the worker failed while handling this message (not the task): "
                f"{type(exc).__name__}: {exc}",
                traceback="".join(format_exception(exc)),
            )
        except Exception:
            # Whatever happens here must stay with this message, never stop the process.
            self._reject_to_broker_dlx(delivery, shown, "WorkerError", str(exc))

    def _reject_to_broker_dlx(
        self, delivery: Delivery, shown: str, error_type: str, error: str
    ) -> None:
        logger.exception(
            "task %s[%s] from %s: its dead letter (%s: %s) could not be built or published "
            "because of an error in taskq; rejecting it so that the broker dead-letters it to "
            "%s.dlq without taskq's reason headers", shown, delivery.message.message_id,
            delivery.queue, error_type, error, delivery.queue,
        )
        delivery.reject(requeue=False)

    def _copy(
        self,
        delivery: Delivery,
        error_type: str,
        error: str,
        traceback: str | None,
        attempts: int | None,
    ) -> WireMessage:
        """Same body and properties; headers without x-death, plus the taskq-error-* ones."""
        message = delivery.message
        headers = dead_letter_headers(
            message.headers,
            error_type=error_type,
            error=error,
            traceback=traceback,
            attempts=retries_of(message.headers) + 1 if attempts is None else attempts,
            origin_queue=delivery.queue,
            traceback_max_chars=self._traceback_max_chars,
        )
        return message.with_headers(headers)


def log_fields(
    task_id: str | None, task: str, queue: str, retries: int, duration_s: float | None = None
) -> dict[str, Any]:
    """Structured fields of a task event line (``--log-format json`` prints them)."""
    fields: dict[str, Any] = {
        "task_id": task_id, "task": task, "queue": queue, "attempt": retries + 1,
    }
    if duration_s is not None:
        fields["duration_s"] = round(duration_s, 6)
    return fields


def retries_of(headers: dict[str, Any]) -> int:
    """The ``taskq-retries`` header as a count (0 when missing or not a valid count)."""
    retries = headers.get(RETRIES, 0)
    return retries if isinstance(retries, int) and retries >= 0 else 0
