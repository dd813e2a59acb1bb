"""What a quorum queue gets and takes on each broker version: pure rules, no I/O.

Decided from :class:`~taskq.broker.versions.BrokerVersion` (read at connect), never from a
setting (docs/rabbitmq.md, "Broker versions: what taskq decides at connect"):

- **Priorities.** RabbitMQ 3.x quorum queues ignore message priorities; 4.0-4.2 tell two
  apart (0-4 normal, 5-9 high); 4.3 each of 0-9. None takes ``x-max-priority``. A message
  without a priority counts as 4 on 4.3 (AMQP 1.0's default; measured): taskq always sends
  one (0 by default), so its own unprioritised tasks sort below every prioritised one.
- **Dead letters at least once.** A quorum work queue dead-letters with
  ``x-dead-letter-strategy: at-least-once`` (RabbitMQ 3.10+), which needs
  ``x-overflow: reject-publish``: the default, at-most-once, drops a dead letter when
  ``Q.dlq`` cannot take it at that moment. A queue configured with another ``overflow``
  keeps at-most-once (RabbitMQ refuses the combination).
- **Parking lots keep everything.** From 4.0 a quorum queue without ``x-delivery-limit``
  has a limit of 20 and drops (or dead-letters) a message returned more often; every
  ``taskq dlq list`` returns what it reads. So ``Q.dlq`` and ``ns.unroutable`` are declared
  with ``x-delivery-limit: -1`` (unlimited) on 4.x; on 3.x they have no limit by default,
  and ``-1`` there would be a limit of 0 (measured on 3.10.8).

The arguments added here for safety are *adoptable*: a queue that an older taskq declared
without them is used as it is (see :func:`taskq.broker.connection.declare`), with a warning
that says what it lacks.
"""

from __future__ import annotations

from typing import Any

from taskq.broker.specs import QueueSpec
from taskq.broker.versions import BrokerVersion
from taskq.errors import ConfigurationError

#: Arguments that taskq adds for safety and that an existing queue may lack.
ADOPTABLE = frozenset({"x-dead-letter-strategy", "x-overflow", "x-delivery-limit"})
# x-delivery-limit of a parking lot on RabbitMQ 4.x: unlimited.
UNLIMITED_DELIVERIES = -1


def dead_letter_arguments(overflow: str | None) -> dict[str, Any]:
    """At-least-once dead-lettering for a quorum work queue, when its overflow allows it."""
    if overflow not in (None, "reject-publish"):
        return {}
    return {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def parking_arguments(version: BrokerVersion) -> dict[str, Any]:
    """Extra arguments of a quorum parking lot (``Q.dlq``, ``ns.unroutable``)."""
    if version.lifts_delivery_limit:
        return {"x-delivery-limit": UNLIMITED_DELIVERIES}
    return {}


def work_queue_spec(
    name: str, arguments: dict[str, Any], *, user_overflow: str | None
) -> QueueSpec:
    """A work queue; a quorum one may be adopted without the dead-letter safety arguments."""
    if arguments.get("x-queue-type") != "quorum" or user_overflow is not None:
        return QueueSpec(name, arguments)
    return QueueSpec(name, arguments, adoptable=ADOPTABLE - {"x-delivery-limit"})


def parking_spec(name: str, quorum: bool, version: BrokerVersion) -> QueueSpec:
    """A parking lot (``Q.dlq``, ``ns.unroutable``); a quorum one keeps every message."""
    if not quorum:
        return QueueSpec(name)
    arguments = {"x-queue-type": "quorum", **parking_arguments(version)}
    return QueueSpec(name, arguments, adoptable=ADOPTABLE)


def check_priority(
    version: BrokerVersion, *, queue_type: str, ordered: bool, queue: str, priority: int,
    task: str,
) -> None:
    """Refuse ``priority`` > 0 where ``queue`` would ignore it or must not honour it.

    Raises:
        ConfigurationError: the queue is ordered (a priority would let a task overtake earlier
            ones of its key), or a quorum queue on a broker that ignores priorities there
            (RabbitMQ 3.x, or a broker not known to be 4.x).
    """
    if not priority:
        return
    if ordered:
        raise ConfigurationError(
            f"task {task!r} has priority {priority} but queue {queue!r} is ordered "
            "(partitions=...): a priority would let it overtake earlier tasks of its key; "
            "drop the priority",
            task=task, queue=queue,
        )
    if queue_type != "quorum" or version.quorum_priority_levels:
        return
    broker = f"the broker is {version}" if version.text else "the broker's version is not known"
    raise ConfigurationError(
        f"task {task!r} has priority {priority} but queue {queue!r} is a quorum queue and "
        f"{broker}: quorum queues honour priorities only from RabbitMQ 4.0, older ones run "
        "them in arrival order. Drop the priority, route urgent work to a queue of its own "
        "(a separate lane with its own workers), make the queue classic "
        "(app.queue(name, type='classic')), or upgrade RabbitMQ to 4.x",
        task=task, queue=queue,
    )
