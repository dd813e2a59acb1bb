"""Which partitions a worker process registers for first, so partitions spread over processes.

RabbitMQ's single active consumer makes the *first registered* consumer of a queue the active
one; RabbitMQ 3.10 honours no consumer priority for it and tells no consumer that it became
active. If every process subscribed to every partition at once, the first process up would
win them all and the others would only wait. So process ``i`` of ``n`` (1-based) registers at
once for the partitions ``p`` with ``p % n == i - 1`` (its share), and for the others only
:data:`STANDBY_DELAY_S` later, as a standby that the broker activates when the active consumer
goes away (its process died, its connection was lost, it stopped). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from taskq.broker.topology import Topology

#: Seconds between a process's own partitions and its standby registrations: long enough for
#: the sibling processes of one supervisor, started together, to register their shares.
STANDBY_DELAY_S = 2.0


@dataclass(frozen=True)
class ConsumeOrder:
    """The queues one worker process consumes, in two steps."""

    first: tuple[str, ...]
    standby: tuple[str, ...]


def consume_order(
    topology: Topology, queues: Sequence[str], *, index: int, process_count: int
) -> ConsumeOrder:
    """Split ``queues`` (ordered ones expanded to their partitions) for process ``index``.

    Unordered queues and partition names given as such are consumed at once.
    """
    first: list[str] = []
    standby: list[str] = []
    count = max(1, process_count)
    for queue in queues:
        partitions = topology.partition_queues(queue)
        if not partitions:
            first.append(queue)
            continue
        for number, name in enumerate(partitions):
            (first if number % count == (index - 1) % count else standby).append(name)
    return ConsumeOrder(tuple(first), tuple(standby))
