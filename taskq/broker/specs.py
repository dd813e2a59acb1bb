"""The records of what to declare: exchanges, queues, bindings. Pure data, no I/O.

Built by :mod:`taskq.broker.topology`, declared by :func:`taskq.broker.connection.declare`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ExchangeSpec:
    """One exchange to declare."""

    name: str
    type: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    """One durable queue to declare.

    ``adoptable``: arguments taskq adds for safety (:mod:`taskq.broker.quorum`) that an
    existing queue may lack or hold with another value: such a queue is used as it is, with
    a warning, instead of failing with a ``TopologyError``.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    adoptable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BindingSpec:
    """Bind ``queue`` to ``exchange`` with ``routing_key``."""

    queue: str
    exchange: str
    routing_key: str


@dataclass(frozen=True)
class Declarations:
    """What to declare, in order: partition checks, exchanges, then queues, then bindings.

    ``partition_checks``: ``(queue, partitions)`` of ordered queues whose existing partition
    queues must number exactly ``partitions`` (:mod:`taskq.broker.partition_check`).
    """

    exchanges: tuple[ExchangeSpec, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    bindings: tuple[BindingSpec, ...] = ()
    partition_checks: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class HeaderBindingSpec:
    """Bind ``destination`` to the headers exchange ``source`` for messages matching ``arguments``.

    ``destination`` is an exchange (an exchange-to-exchange binding) when ``to_exchange``.
    """

    source: str
    destination: str
    arguments: dict[str, Any]
    to_exchange: bool = False


@dataclass(frozen=True)
class DelayTierDeclarations:
    """The delay tiers: exchanges and queues, then the headers bindings between them."""

    declarations: Declarations
    header_bindings: tuple[HeaderBindingSpec, ...]
