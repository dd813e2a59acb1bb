"""Explaining a changed partition count: what to do instead of re-spreading the keys.

Changing ``partitions`` of an ordered queue would move most keys to other partitions while
their earlier messages still wait in the old ones, so a key's later tasks could run before its
earlier ones. RabbitMQ does not compare custom arguments such as ``x-taskq-partitions`` (which
each partition carries, for people reading the broker), so
:mod:`taskq.broker.partition_check` looks at which partition queues exist, and this module
words the refusal with the migration steps. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from taskq.ordering.keys import PARTITIONS_ARGUMENT, split_partition_queue


def partition_count_change(
    name: str, expected: dict[str, Any], actual: dict[str, Any] | None
) -> str | None:
    """The error text when partition queue ``name`` exists with another partition count.

    Returns:
        ``None`` when the mismatch is about something else (the generic text applies).
    """
    wanted = expected.get(PARTITIONS_ARGUMENT)
    split = split_partition_queue(name)
    if wanted is None or split is None:
        return None
    existing = (actual or {}).get(PARTITIONS_ARGUMENT)
    if actual is not None and existing == wanted:
        return None
    queue = split[0]
    was = f"{existing} partitions" if existing is not None else "another partition count"
    return (
        f"ordered queue {queue!r} exists with {was} (queue {name!r}), but the app declares "
        f"{wanted}: changing the count would move keys to other partitions while their "
        "earlier tasks still wait in the old ones, breaking their order, so taskq refuses. "
        "To migrate: (1) stop producing to it (or enqueue through the outbox and stop the "
        "relays), (2) let the workers drain every partition (`taskq status` shows the "
        f"depths), (3) delete the queues {queue}.p0 .. {queue}.p<N-1> (e.g. `rabbitmqctl "
        "delete_queue`), (4) deploy the new count and start producing again. Or declare a "
        f"new ordered queue under another name with the new count and move producers to it "
        f"once {queue!r} is empty."
    )
