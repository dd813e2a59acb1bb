"""Delivery: one message a worker process received, and how it is settled.

A delivery belongs to the connection (the *generation*) of the subscription it came from:
its delivery tag means something only on that channel. :meth:`Delivery.ack` and
:meth:`Delivery.reject` hand the action to its owner, which sends it from the I/O thread
(see :mod:`taskq.broker.subscription`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from taskq.message import WireMessage

# Actions the main thread hands back for a delivery.
ACK = 0
REJECT = 1
REQUEUE = 2


def received_message(properties: Any, body: bytes) -> WireMessage:
    """The message of a delivery as pika handed it over (``pika.BasicProperties``, body)."""
    return WireMessage(
        body,
        properties.message_id,
        properties.headers or {},
        properties.priority,
        properties.timestamp,
        properties.app_id,
        properties.content_type,
    )


class Settler(Protocol):
    """Sends a delivery's ack or reject (the subscription it came from)."""

    def settle(self, delivery: Delivery, action: int) -> None:
        """Queue ``action`` (``ACK``, ``REJECT`` or ``REQUEUE``) for ``delivery``."""


class Delivery:
    """One message received by a worker process, with its ack state.

    Attributes:
        message: The message as received (body, id, headers, properties).
        queue: The work queue it was consumed from.
        is_redelivered: The broker delivered it before (a process died, a channel closed).
        delivery_tag: AMQP delivery tag; valid only on the channel it came from.
        generation: Which connection of the subscription it came from.
        received_at: Monotonic time it arrived: the broker's ``consumer_timeout`` clock for
            it started about then.
    """

    __slots__ = (
        "message", "queue", "is_redelivered", "delivery_tag", "generation", "received_at",
        "_owner",
    )

    def __init__(
        self,
        message: WireMessage,
        queue: str,
        is_redelivered: bool,
        delivery_tag: int,
        generation: int,
        owner: Settler,
        received_at: float | None = None,
    ) -> None:
        self.message = message
        self.queue = queue
        self.is_redelivered = is_redelivered
        self.delivery_tag = delivery_tag
        self.generation = generation
        self.received_at = time.monotonic() if received_at is None else received_at
        self._owner = owner

    def __repr__(self) -> str:
        return (
            f"<Delivery {self.message.message_id} queue={self.queue} tag={self.delivery_tag}"
            f" generation={self.generation}>"
        )

    def ack(self) -> None:
        """Acknowledge: the broker forgets the message. Call once, from the main thread."""
        self._owner.settle(self, ACK)

    def reject(self, *, requeue: bool) -> None:
        """Reject: back to the queue (``requeue=True``) or to the queue's dead-letter exchange."""
        self._owner.settle(self, REQUEUE if requeue else REJECT)
