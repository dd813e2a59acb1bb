"""Look for one message id in queues without consuming them (``taskq inspect``).

Each queue is read with ``basic_get`` and no ack, up to a limit, and everything fetched is
given back with ``basic.nack(requeue)`` before the next queue: nothing is removed. Messages
looked at are briefly invisible to consumers and come back with the ``redelivered`` flag;
RabbitMQ puts them back in their place. Messages a consumer holds (prefetched or running)
cannot be fetched and are not seen.

A quorum queue counts every return against its delivery limit on RabbitMQ before 4.3 (4.3
does not count a nack, :mod:`taskq.broker.parked`), so such queues are not read there: the
answer says so instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from taskq.broker.connection import open_connection
from taskq.broker.delivery import received_message
from taskq.broker.versions import BrokerFacts
from taskq.errors import BrokerError
from taskq.message import WireMessage
from taskq.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Place:
    """A queue to look in: its name and whether it is a quorum queue."""

    name: str
    quorum: bool = False


@dataclass(frozen=True, slots=True)
class Sighting:
    """The message found: in which queue, at which position (1 = next out), as stored."""

    queue: str
    position: int
    message: WireMessage


@dataclass
class Search:
    """What a search found and what it could not look at (for an honest "unknown")."""

    found: Sighting | None = None
    #: Queues with more ready messages than the limit (name, ready).
    partly_read: list[tuple[str, int]] = field(default_factory=list)
    #: Quorum queues not read, where a look would count against their delivery limit.
    not_read: list[str] = field(default_factory=list)


def find_message(
    settings: Settings, places: Sequence[Place], message_id: str, *, limit: int
) -> Search:
    """Look for ``message_id`` in ``places``, in order; stop at the first sighting.

    Raises:
        BrokerConnectionError: the broker cannot be reached.
        BrokerError: the broker closed the connection while it was read.
    """
    facts = BrokerFacts()
    connection = open_connection(settings, client_name="taskq inspect", broker=facts)
    nack_counts = facts.known.number < (4, 3, 0)
    search = Search()
    try:
        channel = connection.channel()
        for place in places:
            if place.quorum and nack_counts:
                search.not_read.append(place.name)
                continue
            channel, sighting = _look(connection, channel, place.name, message_id, limit,
                                      search)
            if sighting is not None:
                search.found = sighting
                break
    except pika.exceptions.AMQPError as exc:
        raise BrokerError(f"the broker closed the connection while taskq inspect read its "
                          f"queues: {exc!r}") from exc
    finally:
        if connection.is_open:
            connection.close()
    return search


def _look(
    connection: pika.BlockingConnection, channel: BlockingChannel, queue: str,
    message_id: str, limit: int, search: Search,
) -> tuple[BlockingChannel, Sighting | None]:
    try:
        method = channel.queue_declare(queue, passive=True).method
    except pika.exceptions.ChannelClosedByBroker:
        return connection.channel(), None  # 404: the queue does not exist
    ready = method.message_count
    if ready > limit:
        search.partly_read.append((queue, ready))
    found = None
    fetched = 0
    try:
        while fetched < min(ready, limit):
            got, properties, body = channel.basic_get(queue, auto_ack=False)
            if got is None:
                break
            fetched += 1
            if properties.message_id == message_id:
                found = Sighting(queue, fetched, received_message(properties, body))
                break
    finally:
        if fetched and channel.is_open:
            channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
    return channel, found
