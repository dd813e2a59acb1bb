"""The ``PublishError`` of each way a publish fails: what happened, to which messages, what to do.

Private to the broker package (see the failure table in :mod:`taskq.broker.publisher`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pika.exceptions

from taskq.broker._confirm_channel import ConfirmTimeout
from taskq.errors import PublishError, SerializationError

# What encoding one message can raise: pika's table encoder (a float, tuple or other value AMQP
# tables cannot hold), struct (an int beyond 64 bits), a short string over 255 bytes or not
# encodable, a priority over 255, a header name that is not a str. A fault of that message,
# not of the broker: enqueue refuses such headers, but an outbox row written by an older
# taskq or by hand can still carry them.
ENCODE_ERRORS = (
    SerializationError,  # taskq's own frame encoder (broker/_frames.py)
    pika.exceptions.UnsupportedAMQPFieldException,
    struct.error,
    ValueError,
    TypeError,
    AttributeError,
    IndexError,
)
# A channel error is a wrong command, not an outage: it is reported, never retried.
CHANNEL_ERROR_ADVICE = {
    0: "this is not an outage, so it was not retried; check the exchange and routing key",
    403: "the broker user lacks permission on this vhost, exchange or queue; grant it "
    "(rabbitmqctl set_permissions)",
    404: "the exchange does not exist; publish to the app's exchange (declared on connect) "
    "or declare this one first",
    406: "the broker refused the message itself: larger than its max_message_size (lower "
    "max_message_size_bytes or raise the broker's limit), or a header it checks is malformed "
    "(CC and BCC must be arrays of strings)",
}


class PublishErrors:
    """Builds the errors one publisher raises.

    Args:
        url: The broker URL, password masked.
        app_exchange: The app's exchange (a message to it is named by its queue).
        timeout_s: The confirm timeout, quoted when it ran out.
    """

    def __init__(self, url: str, app_exchange: str, timeout_s: float) -> None:
        self._url = url
        self._app_exchange = app_exchange
        self._timeout_s = timeout_s

    def error(
        self,
        what: str,
        advice: str,
        reason: str,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> PublishError:
        """The error for ``ids``: ``what`` happened, ``advice`` says what to do."""
        if exchange == self._app_exchange or not exchange:
            target = f"queue {routing_key!r}"
        else:
            target = f"exchange {exchange!r} with routing key {routing_key!r}"
        if len(ids) == 1:
            subject = f"task {task!r} (id {ids[0]})" if task else f"message {ids[0]}"
        else:
            shown = ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")
            subject = f"{len(ids)} messages ({shown}; the first for {target})"
        stop = "" if what.endswith((".", "?")) else "."
        return PublishError(
            f"{subject} was not published to {target}: {what}{stop} What to do: {advice}."
            if len(ids) == 1
            else f"{subject} were not confirmed: {what}{stop} What to do: {advice}.",
            task=task,
            task_id=ids[0] if len(ids) == 1 else None,
            queue=routing_key,
            exchange=exchange,
            url=self._url,
            reason=reason,
            unconfirmed_ids=list(ids),
            what=what,
        )

    def failure(
        self,
        exc: Exception,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> PublishError:
        """The broker failed (timeout, alarm, lost connection) also after a reconnect."""
        if isinstance(exc, ConfirmTimeout) and exc.blocked:
            what, reason = (
                f"RabbitMQ at {self._url} has blocked publishers (a memory or disk alarm) "
                f"and did not confirm within {self._timeout_s:g}s",
                "blocked",
            )
            advice = "free memory or disk on the broker (rabbitmqctl status lists alarms)"
        elif isinstance(exc, ConfirmTimeout):
            what, reason = (
                f"RabbitMQ at {self._url} did not confirm within {self._timeout_s:g}s "
                "(publish_confirm_timeout_s), also after a reconnect",
                "timeout",
            )
            advice = (
                "the broker may be overloaded or the network stalled; it may still have "
                "taken the message, so enqueueing again can run the task twice unless it is "
                "idempotent"
            )
        else:
            what, reason = (
                f"the connection to RabbitMQ at {self._url} was lost and publishing again "
                f"on a new connection failed ({type(exc).__name__}: {exc or 'no detail'})",
                "connection_lost",
            )
            advice = (
                "check the broker and the network, then enqueue again; or enqueue through "
                "the outbox (apply_async(session=...)) so the relay retries for you"
            )
        return self.error(what, advice, reason, ids, task, exchange, routing_key)

    def refused(
        self,
        returned: dict[int, tuple[int, str]],
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> PublishError:
        """One message was returned (``returned`` names it) or else nacked."""
        if returned:
            code, text = next(iter(returned.values()))
            what = f"RabbitMQ at {self._url} returned it as unroutable ({code} {text})"
            advice = (
                f"no queue is bound to routing key {routing_key!r} on exchange {exchange!r} "
                "and the exchange has no alternate exchange; declare and bind the queue"
            )
            reason = "returned"
        else:
            what = f"RabbitMQ at {self._url} refused it (nack)"
            advice = (
                "the queue is full and has x-overflow=reject-publish, or a queue process "
                "failed; let consumers catch up (or raise max_length), then enqueue again"
            )
            reason = "nack"
        return self.error(what, advice, reason, ids, task, exchange, routing_key)


    def batch_refused(self, failed: dict[int, str], ids: list[str | None]) -> PublishError:
        """Messages ``failed`` (index: reason) of a batch were refused; the others confirmed."""
        reasons = sorted(set(failed.values()))
        unconfirmed = [ids[i] for i in sorted(failed)]
        if any(r == "nack" for r in reasons):
            reason = "nack"
        elif any(r.startswith("returned") for r in reasons):
            reason = "returned"
        else:
            reason = "unencodable"
        return PublishError(
            f"{len(unconfirmed)} message(s) were not confirmed by RabbitMQ at {self._url} "
            f"({'; '.join(reasons)}): {', '.join(map(str, unconfirmed[:20]))}"
            f"{' ...' if len(unconfirmed) > 20 else ''}. The others were confirmed. A nack "
            "means a full queue with x-overflow=reject-publish or a failed queue process; a "
            "return means no queue is bound for the routing key; a message that cannot be "
            "encoded carries a header value AMQP has no type for (e.g. a float).",
            url=self._url,
            reason=reason,
            unconfirmed_ids=unconfirmed,
            failures={str(ids[i]): why for i, why in failed.items()},
        )

    def unencodable(
        self,
        exc: Exception,
        ids: Sequence[str | None],
        task: str | None,
        exchange: str,
        routing_key: str,
    ) -> PublishError:
        """The message cannot be encoded as AMQP: refused before anything was sent."""
        return self.error(
            f"it cannot be encoded as AMQP ({type(exc).__name__}: {exc})",
            "remove or convert the header AMQP has no type for (float, tuple, a name over "
            "255 bytes, an int beyond 64 bits); it was not retried",
            "unencodable",
            ids,
            task,
            exchange,
            routing_key,
        )
