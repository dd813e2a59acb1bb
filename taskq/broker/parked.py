"""Read a parking queue (``Q.dlq``, ``ns.unroutable``) without consuming it; move or purge.

Used by :mod:`taskq.dlq` (the ``taskq dlq`` runbook). Messages are fetched one at a time with
``basic_get`` and *no* auto-ack: a message stays in the queue, invisible to others, until it
is acked (:meth:`ParkedQueue.ack`) or given back when the reader closes. Listing therefore
never removes anything, and an interrupted replay leaves the rest where it was.

Giving back is a ``basic.nack(requeue)`` of every fetched, unacked message before the
connection closes: RabbitMQ 4.x counts a message returned by a channel close (or
``basic.reject``) against a quorum queue's delivery limit -- 20 by default, after which the
message is dropped -- and 4.3 does not count a nack (measured on 4.3.6: 30 listings by
nack kept the message, 21 by close dropped it). taskq also declares its quorum parking lots
without a limit on 4.x (:mod:`taskq.broker.quorum`); the nack keeps those an older taskq
declared safe on 4.3. A reader that dies returns its messages by the close all the same.

Republishing uses a second channel of the same connection in confirm mode, with
``mandatory``; :meth:`ParkedQueue.ack` of the parked copy comes only after the confirm. Each
``basic_get`` is a round trip on the channel that carried the previous ack, and the broker
handles a channel's commands in order, so when the next message arrives the previous ack has
been processed: an interruption at any point leaves at most the one message in flight in
both queues.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from taskq.broker.connection import open_connection
from taskq.broker.delivery import received_message
from taskq.broker.publisher import _properties
from taskq.errors import BrokerConnectionError, BrokerError, PublishError
from taskq.message import WireMessage
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)

_NOT_FOUND = 404


@dataclass(frozen=True, slots=True)
class Parked:
    """One message fetched from a parking queue, not yet acked.

    Args:
        message: The message as stored (body, id, headers, properties).
        routing_key: The routing key it was last published with; for ``ns.unroutable`` the
            destination it could not reach.
        exchange: The exchange it was last published to.
        delivery_tag: Valid on the :class:`ParkedQueue` that fetched it.
    """

    message: WireMessage
    routing_key: str
    exchange: str
    delivery_tag: int


class ParkedQueue:
    """A connection to one parking queue: fetch without consuming, ack, republish, purge.

    Use it as a context manager; closing returns every message fetched and not acked.

    Args:
        settings: Where the broker is.
        queue: The parking queue (``Q.dlq`` or ``ns.unroutable``).

    Raises:
        BrokerConnectionError: the broker is unreachable.
        BrokerError: the queue does not exist.
    """

    def __init__(self, settings: Settings, queue: str) -> None:
        self.queue = queue
        self._url = redact_url(settings.broker_url)
        self._connection = open_connection(settings, client_name=f"taskq dlq {queue}")
        self._publishing: BlockingChannel | None = None
        try:
            self._channel = self._connection.channel()
            self.depth = self._depth(self._channel)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ParkedQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def get(self) -> Parked | None:
        """Fetch the next ready message without acking it; ``None`` when there is none."""
        method, properties, body = self._call(self._channel.basic_get, self.queue)
        if method is None:
            return None
        return Parked(received_message(properties, body), method.routing_key, method.exchange,
                      method.delivery_tag)

    def ack(self, parked: Parked) -> None:
        """Remove ``parked`` from the queue for good."""
        self._call(self._channel.basic_ack, parked.delivery_tag)

    def publish(self, wire: WireMessage, *, exchange: str, routing_key: str) -> None:
        """Publish ``wire`` (persistent, ``mandatory``) and wait for the broker's confirm.

        Raises:
            PublishError: nacked, returned, or the connection failed.
        """
        channel = self._publishing
        if channel is None or not channel.is_open:
            channel = self._publishing = self._call(self._connection.channel)
            self._call(channel.confirm_delivery)
        try:
            channel.basic_publish(
                exchange, routing_key, wire.body, _properties(wire), mandatory=True
            )
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
            raise PublishError(
                f"message {wire.message_id} was not taken by RabbitMQ at {self._url} "
                f"(exchange {exchange!r}, routing key {routing_key!r}): {type(exc).__name__}",
                task_id=wire.message_id, queue=routing_key, url=self._url,
            ) from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise self._lost(exc) from exc

    def queue_exists(self, name: str) -> bool:
        """Whether queue ``name`` exists (a passive declare on a throwaway channel)."""
        channel = self._call(self._connection.channel)
        try:
            channel.queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == _NOT_FOUND:
                return False
            raise self._lost(exc) from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise self._lost(exc) from exc
        self._call(channel.close)
        return True

    def purge(self) -> int:
        """Delete every ready message of the queue; return how many were deleted."""
        frame = self._call(self._channel.queue_purge, self.queue)
        return int(frame.method.message_count)

    def close(self) -> None:
        """Give back every fetched, unacked message (a nack: see above) and disconnect."""
        connection = self._connection
        if connection.is_open:
            try:
                channel = getattr(self, "_channel", None)
                if channel is not None and channel.is_open:
                    # Tag 0 with multiple: every unacked delivery of the channel.
                    channel.basic_nack(0, multiple=True, requeue=True)
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                logger.debug("error closing the dlq connection", exc_info=True)

    def _depth(self, channel: BlockingChannel) -> int:
        try:
            frame = channel.queue_declare(self.queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != _NOT_FOUND:
                raise self._lost(exc) from exc
            raise BrokerError(
                f"queue {self.queue!r} does not exist on RabbitMQ at {self._url}; check the "
                "queue name and the app's namespace (TASKQ_NAMESPACE)",
                queue=self.queue, url=self._url,
            ) from None
        return int(frame.method.message_count)

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> BrokerConnectionError:
        return BrokerConnectionError(
            f"the connection to RabbitMQ at {self._url} failed while working on queue "
            f"{self.queue!r} ({type(exc).__name__}: {exc or 'no detail'}); messages not yet "
            "moved are still in the queue",
            queue=self.queue, url=self._url,
        )
