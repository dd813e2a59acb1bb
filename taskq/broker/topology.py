"""Names and declare arguments of every exchange and queue (DESIGN §3): pure data, no I/O.

No other module spells ``.dlq``, ``.dlx`` or ``.unroutable``: they ask this one.

=====================  ==========================================================
object                 declared as
=====================  ==========================================================
``ns``                 direct exchange, durable, ``alternate-exchange: ns.unroutable``
``ns.unroutable``      fanout exchange + durable queue of the same name
``Q``                  durable queue bound to ``ns`` with key ``Q``; dead-letters to
                       ``ns.dlx`` with key ``Q``; classic: ``x-max-priority``;
                       quorum: ``x-delivery-limit``
``ns.dlx``             direct exchange, durable
``Q.dlq``              durable queue bound to ``ns.dlx`` with key ``Q``
=====================  ==========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from taskq.errors import ConfigurationError

QueueType = Literal["classic", "quorum"]
Overflow = Literal["drop-head", "reject-publish", "reject-publish-dlx"]

_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_\-.:]+$")
_RESERVED_SUFFIXES = (".dlq",)


def exchange_name(namespace: str) -> str:
    """The direct exchange every task is published to."""
    return namespace


def unroutable_name(namespace: str) -> str:
    """The alternate exchange (and its queue) that parks messages no queue took."""
    return f"{namespace}.unroutable"


def dlx_name(namespace: str) -> str:
    """The dead-letter exchange; it routes by origin queue name to ``Q.dlq``."""
    return f"{namespace}.dlx"


def dlq_name(queue: str) -> str:
    """The parking lot of ``queue``."""
    return f"{queue}.dlq"


def delayed_exchange_name(namespace: str) -> str:
    """The ``x-delayed-message`` exchange used by the plugin delay backend."""
    return f"{namespace}.delayed"


def delay_tier_prefix(namespace: str) -> str:
    """Prefix of the plugin-free delay tier queues and exchanges."""
    return f"{namespace}.delay."


@dataclass(frozen=True)
class QueueOptions:
    """How one work queue is declared (``app.queue(name, ...)``).

    Args:
        type: ``classic`` (priorities) or ``quorum`` (replicated, delivery limit).
        max_priority: ``x-max-priority`` of a classic queue; ``None`` takes the app default.
        max_length: ``x-max-length`` in messages, to shed load first on background lanes.
        message_ttl_s: ``x-message-ttl``: messages older than this expire (dead-letter).
        overflow: ``x-overflow`` behaviour when ``max_length`` is reached.
        delivery_limit: ``x-delivery-limit`` of a quorum queue.
    """

    type: QueueType = "classic"
    max_priority: int | None = None
    max_length: int | None = None
    message_ttl_s: float | None = None
    overflow: Overflow | None = None
    delivery_limit: int | None = None

    def __post_init__(self) -> None:
        if self.type not in ("classic", "quorum"):
            raise ConfigurationError(f"queue type must be 'classic' or 'quorum', not {self.type!r}")
        if self.max_priority is not None:
            if self.type == "quorum":
                raise ConfigurationError("quorum queues do not support max_priority")
            if not 1 <= self.max_priority <= 255:
                raise ConfigurationError("max_priority must be between 1 and 255")
        if self.delivery_limit is not None:
            if self.type != "quorum":
                raise ConfigurationError("delivery_limit applies to quorum queues only")
            if self.delivery_limit < 1:
                raise ConfigurationError("delivery_limit must be at least 1")
        if self.max_length is not None and self.max_length < 1:
            raise ConfigurationError("max_length must be at least 1")
        if self.message_ttl_s is not None and self.message_ttl_s <= 0:
            raise ConfigurationError("message_ttl_s must be positive")
        if self.overflow not in (None, "drop-head", "reject-publish", "reject-publish-dlx"):
            raise ConfigurationError(
                "overflow must be 'drop-head', 'reject-publish' or 'reject-publish-dlx'"
            )


# Quorum queues: how often a message may be delivered before the broker dead-letters it.
DEFAULT_DELIVERY_LIMIT = 10


@dataclass(frozen=True)
class ExchangeSpec:
    """One exchange to declare."""

    name: str
    type: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    """One durable queue to declare."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BindingSpec:
    """Bind ``queue`` to ``exchange`` with ``routing_key``."""

    queue: str
    exchange: str
    routing_key: str


@dataclass(frozen=True)
class Declarations:
    """What to declare, in order: exchanges, then queues, then bindings."""

    exchanges: tuple[ExchangeSpec, ...] = ()
    queues: tuple[QueueSpec, ...] = ()
    bindings: tuple[BindingSpec, ...] = ()


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it can be a work queue, else raise ``ConfigurationError``."""
    if not name or len(name) > 200 or not _QUEUE_NAME_RE.match(name):
        raise ConfigurationError(
            f"queue name {name!r} is invalid: use 1-200 letters, digits, '_', '-', '.', ':'"
        )
    if name.endswith(_RESERVED_SUFFIXES):
        raise ConfigurationError(f"queue name {name!r} ends with a suffix reserved by taskq")
    return name


def queue_arguments(
    namespace: str, queue: str, options: QueueOptions, *, default_max_priority: int
) -> dict[str, Any]:
    """Return the ``x-*`` arguments a work queue is declared with."""
    arguments: dict[str, Any] = {
        "x-dead-letter-exchange": dlx_name(namespace),
        "x-dead-letter-routing-key": queue,
    }
    if options.type == "quorum":
        arguments["x-queue-type"] = "quorum"
        arguments["x-delivery-limit"] = options.delivery_limit or DEFAULT_DELIVERY_LIMIT
    else:
        arguments["x-max-priority"] = options.max_priority or default_max_priority
    if options.max_length is not None:
        arguments["x-max-length"] = options.max_length
    if options.message_ttl_s is not None:
        arguments["x-message-ttl"] = int(options.message_ttl_s * 1000)
    if options.overflow is not None:
        arguments["x-overflow"] = options.overflow
    return arguments


def base_declarations(namespace: str) -> Declarations:
    """The exchanges and queues every app needs, whatever its work queues."""
    unroutable = unroutable_name(namespace)
    return Declarations(
        exchanges=(
            ExchangeSpec(unroutable, "fanout"),
            ExchangeSpec(
                exchange_name(namespace), "direct", {"alternate-exchange": unroutable}
            ),
            ExchangeSpec(dlx_name(namespace), "direct"),
        ),
        queues=(QueueSpec(unroutable),),
        bindings=(BindingSpec(unroutable, unroutable, ""),),
    )


def queue_declarations(
    namespace: str, queue: str, options: QueueOptions, *, default_max_priority: int
) -> Declarations:
    """The work queue ``queue``, its parking lot ``queue.dlq`` and their bindings."""
    arguments = queue_arguments(
        namespace, queue, options, default_max_priority=default_max_priority
    )
    dlq_arguments: dict[str, Any] = {}
    if options.type == "quorum":
        dlq_arguments["x-queue-type"] = "quorum"
    return Declarations(
        queues=(QueueSpec(queue, arguments), QueueSpec(dlq_name(queue), dlq_arguments)),
        bindings=(
            BindingSpec(queue, exchange_name(namespace), queue),
            BindingSpec(dlq_name(queue), dlx_name(namespace), queue),
        ),
    )


@dataclass(frozen=True)
class Topology:
    """The app's view of its broker objects: namespace plus per-queue options."""

    namespace: str
    default_max_priority: int = 10
    queues: dict[str, QueueOptions] = field(default_factory=dict)

    @property
    def exchange(self) -> str:
        """The exchange tasks are published to."""
        return exchange_name(self.namespace)

    @property
    def dlx(self) -> str:
        """The dead-letter exchange."""
        return dlx_name(self.namespace)

    @property
    def unroutable(self) -> str:
        """The parking exchange and queue for unroutable messages."""
        return unroutable_name(self.namespace)

    def options(self, queue: str) -> QueueOptions:
        """Options of ``queue``; queues never configured are classic with defaults."""
        return self.queues.get(queue) or QueueOptions()

    def base(self) -> Declarations:
        """Declarations every app needs."""
        return base_declarations(self.namespace)

    def for_queue(self, queue: str) -> Declarations:
        """Declarations of ``queue`` and its ``.dlq``."""
        return queue_declarations(
            self.namespace,
            queue,
            self.options(queue),
            default_max_priority=self.default_max_priority,
        )
