"""Refuse a changed partition count of an ordered queue before declaring anything.

RabbitMQ compares only the arguments it knows when a queue is declared again, so
``x-taskq-partitions`` alone cannot make it refuse another count. The existing partition
queues tell instead: with ``N`` partitions wanted, ``Q.p<N>`` must not exist (the queue had
more) and, if ``Q.p0`` exists, ``Q.p<N-1>`` must too (it had fewer). Each look is a passive
declare on a channel of its own, since the broker closes a channel on ``404 NOT_FOUND``.
Partitions are declared highest first (:meth:`taskq.broker.topology.Topology.for_queue`), so
a process that checks while another declares the same count for the first time never sees
``Q.p0`` without ``Q.p<N-1>``.
"""

from __future__ import annotations

import pika.exceptions
from pika import BlockingConnection

from taskq.errors import TopologyError
from taskq.ordering.changes import partition_count_change
from taskq.ordering.keys import PARTITIONS_ARGUMENT, partition_queue_name


def check_partition_count(connection: BlockingConnection, queue: str, partitions: int) -> None:
    """Raise ``TopologyError`` if ``queue`` exists with another partition count.

    Raises:
        TopologyError: more or fewer partition queues exist; the text says how to migrate.
    """
    if _exists(connection, partition_queue_name(queue, partitions)):
        existing = "more"
    elif partitions > 1 and _exists(connection, partition_queue_name(queue, 0)) and not (
        _exists(connection, partition_queue_name(queue, partitions - 1))
    ):
        existing = "fewer"
    else:
        return
    name = partition_queue_name(queue, 0)
    text = partition_count_change(name, {PARTITIONS_ARGUMENT: partitions}, None) or ""
    raise TopologyError(
        text.replace("another partition count", f"{existing} than {partitions} partitions"),
        name=name, kind="queue", queue=name, expected={PARTITIONS_ARGUMENT: partitions},
        actual=None, actual_complete=False, broker_reply="", channel=None,
    )


def _exists(connection: BlockingConnection, name: str) -> bool:
    channel = connection.channel()
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    channel.close()
    return True
