"""A consumer the broker cancels: what it means, and the consumer timeout taskq asks for.

RabbitMQ sends ``basic.cancel`` to a consumer when its queue is deleted, and on 4.3+ when a
delivery of a quorum queue stayed unacked past the consumer timeout: it then returns every
unacked message of that consumer to the queue (they count as *returned*, not *failed*: the
delivery limit is not spent) and leaves the channel open. Before 4.3 a consumer timeout
closes the channel instead (:func:`taskq.broker._losses.log_loss`).

Which of the two happened is read from the broker, not guessed: after the cancel the I/O
thread asks (passively, on a channel of its own) whether the queue still exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

from taskq.broker.topology import Topology

logger = logging.getLogger("taskq.broker.subscription")  # where these lines always appeared

_NOT_FOUND = 404


@dataclass(frozen=True)
class Cancel:
    """A broker-sent cancel of the consumer of ``queue``, explained.

    Args:
        queue: The consumer's queue.
        timed_out: The broker took the consumer's deliveries back after its consumer
            timeout (4.3+, a quorum queue that still exists).
        text: What happened and what to change, for the log.
    """

    queue: str
    timed_out: bool
    text: str


def consume_arguments(
    topology: Topology, queue: str, consumer_timeout_s: float | None
) -> dict[str, Any] | None:
    """``basic.consume`` arguments for ``queue``: its own ``x-consumer-timeout`` where it can.

    Only quorum queues on RabbitMQ 4.3+ take it (a classic queue refuses the argument with a
    406 that closes the channel; on 4.3 classic queues do not time out at all).
    """
    if consumer_timeout_s is None or not topology.broker.known.per_consumer_timeout:
        return None
    if topology.options(queue).type != "quorum":
        return None
    return {"x-consumer-timeout": int(consumer_timeout_s * 1000)}


def explain_cancel(
    connection: pika.BlockingConnection, queue: str, topology: Topology,
    consumer_timeout_s: float | None,
) -> Cancel:
    """Why the broker cancelled the consumer of ``queue`` (asks the broker; never raises)."""
    version = topology.broker.known
    if not _queue_exists(connection, queue):
        return Cancel(queue, False, (
            f"the broker ({version}) cancelled the consumer of queue {queue!r}: the queue was "
            "deleted (with the messages in it); consuming again re-declares it"))
    quorum = topology.options(queue).type == "quorum"
    if not (version.consumer_timeout_cancels and quorum):
        return Cancel(queue, False, (
            f"the broker ({version}) cancelled the consumer of queue {queue!r}, which still "
            "exists (a failover of the node that held it, or an operator's action)"))
    asked = (f"this consumer asked for x-consumer-timeout={consumer_timeout_s:g}s, from "
             "consumer_timeout_s and the tasks' time limits" if consumer_timeout_s is not None
             else "the queue's x-consumer-timeout or consumer-timeout policy, else "
             "consumer_timeout in rabbitmq.conf")
    return Cancel(queue, True, (
        f"the broker ({version}) cancelled the consumer of quorum queue {queue!r} and returned "
        "its unacked messages to the queue: a delivery stayed unacked past the consumer "
        f"timeout ({asked}). The task holding it is ended and counted as a failed attempt; "
        "give long tasks a time_limit_s or raise TASKQ_CONSUMER_TIMEOUT_S"))


def _queue_exists(connection: pika.BlockingConnection, queue: str) -> bool:
    try:
        channel = connection.channel()
    except (pika.exceptions.AMQPError, OSError):
        return True  # unknown: the reconnect that follows finds out
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return bool(exc.reply_code != _NOT_FOUND)
    except (pika.exceptions.AMQPError, OSError):
        return True
    try:
        channel.close()
    except (pika.exceptions.AMQPError, OSError):
        logger.debug("closing the channel of a passive declare failed", exc_info=True)
    return True


class CancelWatch:
    """The broker-sent cancels of one subscription's consumers (used by its I/O thread).

    Args:
        topology: What the queues are and the broker version met at connect.
        consumer_timeout_s: The ``x-consumer-timeout`` the consumers of quorum queues ask
            for where the broker takes it (:func:`consume_arguments`); ``None``: none.

    ``on_timed_out`` (set before the subscription starts), called in the I/O thread with
    the queue and the generation of the channel, is told that the broker took the
    deliveries of that queue's consumer back after its consumer timeout.
    """

    def __init__(self, topology: Topology, consumer_timeout_s: float | None) -> None:
        self._topology = topology
        self._consumer_timeout_s = consumer_timeout_s
        self.on_timed_out: Callable[[str, int], None] | None = None
        self.cancelled = False  # a cancel arrived on the current channel
        self._tag = ""
        self._queue_of_tag: dict[str, str] = {}

    def arguments(self, queue: str) -> dict[str, Any] | None:
        """``basic.consume`` arguments for a consumer of ``queue``."""
        return consume_arguments(self._topology, queue, self._consumer_timeout_s)

    def consumed(self, tag: str, queue: str) -> None:
        """Remember which queue consumer ``tag`` reads, to name it if it is cancelled."""
        self._queue_of_tag[tag] = queue

    def on_cancel(self, frame: Any) -> None:
        """pika's callback for a broker-sent ``basic.cancel``."""
        self.cancelled = True
        self._tag = str(getattr(frame.method, "consumer_tag", ""))

    def explain(
        self, connection: pika.BlockingConnection, generation: int
    ) -> pika.exceptions.ConsumerCancelled:
        """Find out why, report a timeout to ``on_timed_out``; the error to reconnect on."""
        queue = self._queue_of_tag.get(self._tag, "?")
        asked = self._consumer_timeout_s if self.arguments(queue) else None
        cancel = explain_cancel(connection, queue, self._topology, asked)
        if cancel.timed_out and self.on_timed_out is not None:
            self.on_timed_out(queue, generation)
        return pika.exceptions.ConsumerCancelled(cancel.text)
