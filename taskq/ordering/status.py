"""``taskq status`` of ordered queues: each partition's depth, consumers and active consumer.

The depths come with the other queues' figures (:mod:`taskq.broker.inspect`); which consumer
is active comes from the management API (:mod:`taskq.broker.consumers`) and is reported as
unknown without it: AMQP does not tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from taskq.broker.consumers import active_consumers
from taskq.broker.inspect import QueueStats

if TYPE_CHECKING:
    from taskq.app import App

_N = TypeVar("_N", int, float)

UNKNOWN_ACTIVE = (
    "unknown: RabbitMQ tells which consumer is active only through its management API "
    "(enable rabbitmq_management); AMQP does not"
)


@dataclass(frozen=True)
class PartitionStatus:
    """One partition queue of an ordered queue."""

    name: str
    exists: bool
    ready: int
    unacked: int | None
    consumers: int
    active: str | None  # connection name of the active consumer; None: none or unknown
    published_per_s: float | None = None  # management API only
    acked_per_s: float | None = None


@dataclass(frozen=True)
class OrderedQueueStatus:
    """An ordered queue's partitions; ``active_known`` is False without the management API."""

    name: str
    active_known: bool
    partitions: list[PartitionStatus] = field(default_factory=list)


def partition_names(app: App, names: list[str]) -> list[str]:
    """The partition queues of the ordered queues among ``names`` (to read their figures)."""
    return [p for name in names for p in app.topology.partition_queues(name)]


def ordered_part(
    app: App, names: list[str], stats: Mapping[str, QueueStats]
) -> list[OrderedQueueStatus]:
    """The status of each ordered queue among ``names`` (``stats``: the broker's figures)."""
    ordered = [name for name in names if app.topology.partitions(name)]
    if not ordered:
        return []
    partitions = partition_names(app, ordered)
    active = active_consumers(app.settings, partitions)
    empty = QueueStats("", 0, None, 0)
    return [
        OrderedQueueStatus(name, active is not None, [
            PartitionStatus(
                p, p in stats, q.ready, q.unacked, q.consumers, (active or {}).get(p),
                q.published_per_s, q.acked_per_s,
            )
            for p in app.topology.partition_queues(name)
            for q in (stats.get(p, empty),)
        ])
        for name in ordered
    ]


def totals(queue: str, ordered: list[OrderedQueueStatus]) -> QueueStats | None:
    """An ordered queue's figures summed over its partitions (``None``: not ordered)."""
    for status in ordered:
        if status.name == queue and any(p.exists for p in status.partitions):
            parts = status.partitions
            return QueueStats(
                queue, sum(p.ready for p in parts), _sum([p.unacked for p in parts]),
                max(p.consumers for p in parts),
                _sum([p.published_per_s for p in parts]), _sum([p.acked_per_s for p in parts]),
            )
    return None


def _sum(values: list[_N | None]) -> _N | None:
    """The sum, or ``None`` when any part is unknown."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def render_ordered(ordered: list[OrderedQueueStatus]) -> list[str]:
    """The lines ``taskq status`` prints under the queue table."""
    lines: list[str] = []
    for status in ordered:
        lines.append(f"  ordered queue {status.name}: {len(status.partitions)} partitions")
        lines.append(f"    {'partition':<34} {'ready':>8} {'unacked':>8} {'consumers':>9}  "
                     "active consumer")
        for p in status.partitions:
            unacked = "-" if p.unacked is None else str(p.unacked)
            active = p.active or ("none" if status.active_known else "unknown")
            name = p.name if p.exists else f"{p.name} (not declared)"
            lines.append(f"    {name:<34} {p.ready:>8} {unacked:>8} {p.consumers:>9}  {active}")
        if not status.active_known:
            lines.append(f"    active consumer {UNKNOWN_ACTIVE}")
    return lines
