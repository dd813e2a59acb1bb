"""Names and declare arguments of every exchange and queue: pure data, no I/O.

The objects and their arguments are listed in docs/PROTOCOL.md ("Topology").

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
``ns.delayed``         ``x-delayed-message`` exchange (plugin backend); each ``Q`` bound
                       with key ``Q``; no alternate exchange (see :mod:`taskq.delay`)
``ns.delay.T.NN``      delay tier ``NN`` of queue type ``T``: a headers exchange (alternate
                       exchange ``ns.unroutable``) and a queue with ``x-message-ttl`` of
                       ``2**NN`` ms that dead-letters to tier ``NN-1`` (tier 00 to ``ns``)
=====================  ==========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from taskq.broker.quorum import (
    check_priority,
    dead_letter_arguments,
    parking_spec,
    work_queue_spec,
)

# Re-exported (``X as X``): the declaration records were defined here before.
from taskq.broker.specs import BindingSpec as BindingSpec
from taskq.broker.specs import Declarations as Declarations
from taskq.broker.specs import DelayTierDeclarations as DelayTierDeclarations
from taskq.broker.specs import ExchangeSpec as ExchangeSpec
from taskq.broker.specs import HeaderBindingSpec as HeaderBindingSpec
from taskq.broker.specs import QueueSpec as QueueSpec
from taskq.broker.versions import UNKNOWN, BrokerFacts, BrokerVersion
from taskq.errors import ConfigurationError
from taskq.ordering.keys import (
    PARTITIONS_ARGUMENT,
    partition_queue_name,
    split_partition_queue,
    validate_partitions,
)

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


def delay_tier_name(namespace: str, level: int, queue_type: str = "classic") -> str:
    """The exchange and the queue of delay tier ``level`` (TTL ``2**level`` ms).

    Classic and quorum tiers have different names, so that switching
    ``delay_tier_queue_type`` never meets the old queues with other arguments, and the
    messages already in the old tiers still walk down their own chain.
    """
    return f"{delay_tier_prefix(namespace)}{queue_type}.{level:02d}"


def delay_level_header(level: int) -> str:
    """The header that says whether a delayed message waits in tier ``level`` (1) or not (0)."""
    return f"{DELAY_LEVEL_HEADER_PREFIX}{level:02d}"


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
        partitions: An ordered queue of this many partition queues (see
            :mod:`taskq.ordering`); ``None``: an ordinary queue.
    """

    type: QueueType = "classic"
    max_priority: int | None = None
    max_length: int | None = None
    message_ttl_s: float | None = None
    overflow: Overflow | None = None
    delivery_limit: int | None = None
    partitions: int | None = None

    def __post_init__(self) -> None:
        if self.partitions is not None:
            validate_partitions(self.partitions, max_priority=self.max_priority)
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


# Quorum work queues: deliveries after which the broker dead-letters a message (reason
# "delivery_limit"); a last-resort backstop: taskq's crash-loop guard (max_process_deaths)
# and retry policy decide first. Node deaths, channel closes and basic.reject(requeue) count
# (+1 each); basic.nack and 4.3's consumer-timeout cancel do not. 10,000 outlasts hours of
# outage; a message looping for ever still ends in Q.dlq. (4.x's default would be 20.)
DEFAULT_DELIVERY_LIMIT = 10_000


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
        arguments.update(dead_letter_arguments(options.overflow))
    elif options.partitions is None:
        arguments["x-max-priority"] = options.max_priority or default_max_priority
    if options.partitions is not None:
        # One consumer at a time per partition, whichever process or host: the order.
        arguments["x-single-active-consumer"] = True
        arguments[PARTITIONS_ARGUMENT] = options.partitions
    if options.max_length is not None:
        arguments["x-max-length"] = options.max_length
    if options.message_ttl_s is not None:
        arguments["x-message-ttl"] = int(options.message_ttl_s * 1000)
    if options.overflow is not None:
        arguments["x-overflow"] = options.overflow
    return arguments


def base_declarations(
    namespace: str, queue_type: str = "classic", version: BrokerVersion = UNKNOWN
) -> Declarations:
    """The exchanges and queues every app needs, whatever its work queues.

    ``ns.unroutable`` is a quorum queue when ``queue_type`` (the ``default_queue_type``) is:
    on a cluster a classic queue lives on one node, and while that node is down every
    declaration of it fails (``404 home node ... is down or inaccessible``), which would stop
    each client that declares the base topology on connect. A quorum one is a parking lot
    like ``Q.dlq`` (:mod:`taskq.broker.quorum`).
    """
    unroutable = unroutable_name(namespace)
    return Declarations(
        exchanges=(
            ExchangeSpec(unroutable, "fanout"),
            ExchangeSpec(
                exchange_name(namespace), "direct", {"alternate-exchange": unroutable}
            ),
            ExchangeSpec(dlx_name(namespace), "direct"),
        ),
        queues=(parking_spec(unroutable, queue_type == "quorum", version),),
        bindings=(BindingSpec(unroutable, unroutable, ""),),
    )


def queue_declarations(
    namespace: str,
    queue: str,
    options: QueueOptions,
    *,
    default_max_priority: int,
    version: BrokerVersion = UNKNOWN,
) -> Declarations:
    """The work queue ``queue``, its parking lot ``queue.dlq`` and their bindings."""
    arguments = queue_arguments(
        namespace, queue, options, default_max_priority=default_max_priority
    )
    return Declarations(
        queues=(
            work_queue_spec(queue, arguments, user_overflow=options.overflow),
            parking_spec(dlq_name(queue), options.type == "quorum", version),
        ),
        bindings=(
            BindingSpec(queue, exchange_name(namespace), queue),
            BindingSpec(dlq_name(queue), dlx_name(namespace), queue),
        ),
    )


# -- delays (docs/delays.md; see taskq.delay for how messages walk the tiers) -------------------

# Tier N holds messages for 2**N ms. 36 tiers reach 2**36 - 1 ms (about 795 days): more than
# the 30 days asked, and more than the plugin's limit, so that longer plugin delays have a way.
DELAY_TIER_LEVELS = 36
DELAY_TIERS_MAX_MS = 2**DELAY_TIER_LEVELS - 1
# The delayed-message plugin delivers an x-delay above 2**32 - 1 ms at once (its timer limit).
DELAY_PLUGIN_MAX_MS = 2**32 - 1
# Tier headers: matched by the tiers' headers exchanges, ignored by workers. They are routing
# data rather than protocol headers, which is why they live here and not in taskq.message.
DELAY_LEVEL_HEADER_PREFIX = "taskq-delay-level-"
# Values of a tier header: wait in that tier, or pass it by. The headers exchanges compare
# value and type class, so the bindings and the messages both use these ints.
DELAY_LEVEL_WAIT = 1
DELAY_LEVEL_PASS = 0


def delay_tier_queue_arguments(namespace: str, level: int, queue_type: str) -> dict[str, Any]:
    """``x-*`` arguments of tier ``level``: fixed TTL, dead-letter to the next tier down.

    No ``x-dead-letter-routing-key``: a dead-lettered message keeps its routing key, which is
    the destination queue all the way down, and tier 00 dead-letters to the app's exchange.
    """
    if level:
        onward = delay_tier_name(namespace, level - 1, queue_type)
    else:
        onward = exchange_name(namespace)
    arguments: dict[str, Any] = {
        "x-message-ttl": 2**level,
        "x-dead-letter-exchange": onward,
    }
    if queue_type == "quorum":
        # At-most-once (the default) drops a message if the next hop is unavailable at the
        # moment it expires; at-least-once needs reject-publish overflow (RabbitMQ 3.10+).
        arguments["x-queue-type"] = "quorum"
        arguments["x-dead-letter-strategy"] = "at-least-once"
        arguments["x-overflow"] = "reject-publish"
    return arguments


def delay_tier_declarations(
    namespace: str, queue_type: str = "classic"
) -> DelayTierDeclarations:
    """Every delay tier of ``queue_type``, from the longest down.

    Tier ``N``'s exchange routes a message whose header ``delay_level_header(N)`` is 1 to its
    queue, and one whose header is 0 straight on to tier ``N-1``'s exchange (tier 00's to the
    app's exchange). A message without the header matches nothing and is parked in
    ``ns.unroutable`` by the alternate exchange instead of vanishing.
    """
    if queue_type not in ("classic", "quorum"):
        raise ConfigurationError(
            f"delay tier queue type must be 'classic' or 'quorum', not {queue_type!r}"
        )
    unroutable = unroutable_name(namespace)
    levels = range(DELAY_TIER_LEVELS - 1, -1, -1)
    names = {level: delay_tier_name(namespace, level, queue_type) for level in levels}
    bindings: list[HeaderBindingSpec] = []
    for level in levels:
        header = delay_level_header(level)
        onward = names[level - 1] if level else exchange_name(namespace)
        bindings.append(
            HeaderBindingSpec(
                names[level], names[level], {"x-match": "all", header: DELAY_LEVEL_WAIT}
            )
        )
        bindings.append(
            HeaderBindingSpec(
                names[level], onward, {"x-match": "all", header: DELAY_LEVEL_PASS}, to_exchange=True
            )
        )
    return DelayTierDeclarations(
        Declarations(
            exchanges=tuple(
                ExchangeSpec(names[level], "headers", {"alternate-exchange": unroutable})
                for level in levels
            ),
            queues=tuple(
                QueueSpec(names[level], delay_tier_queue_arguments(namespace, level, queue_type))
                for level in levels
            ),
        ),
        tuple(bindings),
    )


def delayed_exchange_declarations(namespace: str, queue: str) -> Declarations:
    """The plugin's ``x-delayed-message`` exchange and the binding of ``queue`` to it.

    No alternate exchange: the plugin routes a message only when its delay is over, so an
    alternate exchange would receive an immediate copy of every delayed message.
    """
    exchange = delayed_exchange_name(namespace)
    return Declarations(
        exchanges=(ExchangeSpec(exchange, "x-delayed-message", {"x-delayed-type": "direct"}),),
        bindings=(BindingSpec(queue, exchange, queue),),
    )


@dataclass(frozen=True)
class Topology:
    """The app's view of its broker objects: namespace plus per-queue options."""

    namespace: str
    default_max_priority: int = 10
    queues: dict[str, QueueOptions] = field(default_factory=dict)
    # Type of the queues not in ``queues`` (the ``default_queue_type`` setting).
    default_queue_type: QueueType = "classic"
    # The broker the app's connections met (taskq.broker.versions): declarations and the
    # priority check follow its version. Shared, so it is not part of equality.
    broker: BrokerFacts = field(default_factory=BrokerFacts, compare=False, repr=False)

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
        """Options of ``queue``; queues never configured get the default type and defaults.

        A partition queue (``ledger.p3``) has the options of its ordered queue.
        """
        options = self.queues.get(queue)
        if options is not None:
            return options
        parent = self.ordered_parent(queue)
        if parent is not None:
            return self.queues[parent[0]]
        return QueueOptions(type=self.default_queue_type)

    def ordered_parent(self, name: str) -> tuple[str, int] | None:
        """``(queue, index)`` when ``name`` is a partition of an ordered queue, else ``None``."""
        if name in self.queues:
            return None
        split = split_partition_queue(name)
        if split is None:
            return None
        parent = self.queues.get(split[0])
        if parent is None or parent.partitions is None or split[1] >= parent.partitions:
            return None
        return split

    def partitions(self, queue: str) -> int | None:
        """The partition count of the ordered queue ``queue``; ``None`` if it is not one."""
        options = self.queues.get(queue)
        return options.partitions if options is not None else None

    def partition_queues(self, queue: str) -> list[str]:
        """The partition queue names of ``queue`` (empty if it is not ordered)."""
        return [partition_queue_name(queue, i) for i in range(self.partitions(queue) or 0)]

    def declared_as(self, name: str) -> str:
        """The queue whose declaration creates ``name``: its ordered queue for a partition."""
        parent = self.ordered_parent(name)
        return parent[0] if parent is not None else name

    def takes_priorities(self, queue: str) -> bool:
        """Whether ``queue`` takes priorities above 0 on the known broker: classic unordered
        queues always, quorum ones on RabbitMQ 4.x, ordered ones never (overtaking)."""
        options = self.options(queue)
        if options.partitions is not None:
            return False
        return options.type == "classic" or bool(self.broker.known.quorum_priority_levels)

    def check_priority(self, queue: str, priority: int, task: str) -> None:
        """Refuse a message priority that ``queue`` would ignore or must not honour.

        Raises:
            ConfigurationError: see :func:`taskq.broker.quorum.check_priority`.
        """
        if priority:
            options = self.options(queue)
            check_priority(
                self.broker.known, queue_type=options.type, ordered=options.partitions is not None,
                queue=queue, priority=priority, task=task,
            )

    def base(self) -> Declarations:
        """Declarations every app needs."""
        return base_declarations(self.namespace, self.default_queue_type, self.broker.known)

    def for_queue(self, queue: str, *, delayed: bool = False) -> Declarations:
        """Declarations of ``queue`` and its ``.dlq``.

        Args:
            queue: The work queue.
            delayed: The app's delay backend is the plugin: also the delayed exchange and
                the binding of ``queue`` to it. Whoever (re-)creates the queue must bind it
                too: the plugin routes a message only when its delay ends and drops it if the
                queue has no binding then.
        """
        options = self.options(queue)
        if options.partitions is not None:
            declarations = self._partitions_declarations(queue, options)
        else:
            declarations = queue_declarations(
                self.namespace, queue, options, default_max_priority=self.default_max_priority,
                version=self.broker.known,
            )
        if not delayed:
            return declarations
        plugin = [self.delayed_exchange(name) for name in self.partition_queues(queue) or [queue]]
        return Declarations(
            plugin[0].exchanges, declarations.queues,
            declarations.bindings + tuple(b for p in plugin for b in p.bindings),
            declarations.partition_checks,
        )

    def _partitions_declarations(self, queue: str, options: QueueOptions) -> Declarations:
        """Every partition queue of ``queue`` (or of the one named), and ``queue.dlq``.

        All partitions at once, even for one: the partition-count check (see
        :mod:`taskq.broker.partition_check`) needs them all or none. Each partition
        dead-letters with its own name as routing key and ``queue.dlq`` is bound with each,
        so ``taskq-origin-queue`` and a replay lead back to the partition.
        """
        base = self.declared_as(queue)
        names = self.partition_queues(base)
        quorum = options.type == "quorum"
        # Highest first: once ``queue.p0`` exists all others do, so a process checking the
        # count while another declares them for the first time sees none or all.
        queues = [
            work_queue_spec(name, queue_arguments(
                self.namespace, name, options, default_max_priority=self.default_max_priority
            ), user_overflow=options.overflow)
            for name in reversed(names)
        ]
        bindings = [BindingSpec(name, self.exchange, name) for name in names]
        bindings += [BindingSpec(dlq_name(base), self.dlx, name) for name in names]
        return Declarations(
            queues=(*queues, parking_spec(dlq_name(base), quorum, self.broker.known)),
            bindings=tuple(bindings),
            partition_checks=((base, options.partitions or 1),),
        )

    def delay_tiers(self, queue_type: str = "classic") -> DelayTierDeclarations:
        """Declarations of the plugin-free delay tiers of ``queue_type``."""
        return delay_tier_declarations(self.namespace, queue_type)

    def delayed_exchange(self, queue: str) -> Declarations:
        """The plugin's delayed exchange and the binding of ``queue`` to it."""
        return delayed_exchange_declarations(self.namespace, queue)
