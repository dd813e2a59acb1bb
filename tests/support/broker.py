"""Look at and clean up the real test broker over a connection of its own.

Tests use it to check what actually reached RabbitMQ (depths, messages on the wire) and to
delete what they declared; it never goes through taskq's own publisher or worker.
"""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

Message = tuple[Any, pika.BasicProperties, bytes]


class BrokerAdmin:
    """A small admin client: depths, basic_get, declare, unbind and delete.

    Args:
        url: AMQP URL of the broker.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None

    @property
    def channel(self) -> BlockingChannel:
        """An open channel, reopened (with its connection) after any error closed it."""
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(pika.URLParameters(self.url))
            self._channel = None
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
        return self._channel

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (passive declare); raises if the queue is missing."""
        try:
            return self.channel.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise AssertionError(f"queue {queue!r} does not exist: {exc.reply_text}") from None

    def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists."""
        try:
            self.channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return False
        return True

    def get_all(self, queue: str, max_n: int | None = None) -> list[Message]:
        """Take up to ``max_n`` (default: all ready) messages off ``queue``, acking them."""
        messages: list[Message] = []
        while max_n is None or len(messages) < max_n:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            messages.append((method, properties, body))
        return messages

    def declare_queue(self, name: str, arguments: dict[str, Any] | None = None) -> None:
        """Declare a durable queue (to set up a conflicting one in a test)."""
        self.channel.queue_declare(name, durable=True, arguments=arguments)

    def unbind(self, queue: str, exchange: str, routing_key: str) -> None:
        """Remove a binding (to make a routing key unroutable)."""
        self.channel.queue_unbind(queue, exchange, routing_key=routing_key)

    def delete_queue(self, name: str) -> None:
        """Delete ``name`` with its messages; a missing queue is not an error."""
        self.channel.queue_delete(name)

    def delete_exchange(self, name: str) -> None:
        """Delete ``name``; a missing exchange is not an error."""
        self.channel.exchange_delete(name)

    def close(self) -> None:
        """Close the admin connection (safe to call more than once)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except pika.exceptions.AMQPError:
                pass  # the broker went away first; nothing left to close
