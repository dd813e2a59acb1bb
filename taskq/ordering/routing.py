"""The partition queue of a message: one function for ``delay()``, bulk enqueue and the outbox.

:func:`route` is called by the app for every publish and every outbox row, so a key lands in
the same partition whichever path it takes. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from taskq.broker.topology import Topology
from taskq.errors import ConfigurationError
from taskq.message import ORDERING_KEY
from taskq.ordering.keys import partition_of, partition_queue_name


def route(topology: Topology, headers: dict[str, Any], queue: str, task: str) -> str:
    """The queue a message with ``headers`` for ``queue`` is published to.

    An ordinary queue is its own destination. For an ordered queue it is the partition of
    the message's ``taskq-ordering-key``. A partition name (``ledger.p3``, a replay or a
    republished copy) is kept as it is.

    Raises:
        ConfigurationError: an ordered queue without a key, or a key for an unordered one.
    """
    key = headers.get(ORDERING_KEY) if headers else None
    partitions = topology.partitions(queue)
    if partitions is None:
        if key is not None and topology.ordered_parent(queue) is None:
            raise ConfigurationError(
                f"task {task!r} has ordering key {key!r} but queue {queue!r} is not ordered: "
                f"declare it with app.queue({queue!r}, partitions=N), or send the task "
                "without ordering_key",
                task=task, queue=queue,
            )
        return queue
    if not isinstance(key, str):
        raise ConfigurationError(
            f"task {task!r} is sent to ordered queue {queue!r} without an ordering key: give "
            "it one per task (@app.task(queue=..., ordering_key='<argument name>')) or per "
            "call (apply_async(..., ordering_key='acct-42'))",
            task=task, queue=queue,
        )
    return partition_queue_name(queue, partition_of(key, partitions))
