"""Delay backends: how a message waits in RabbitMQ until it is due (DESIGN §6).

:mod:`taskq.retry` decides *when* to run again; this module decides *how* to wait. Nothing
here holds a message in a process: a delayed message waits in the broker, never unacked in a
worker (RabbitMQ's ``consumer_timeout`` would close the worker's channel, and waiting
messages would fill its prefetch).

**tiers** (:class:`TierDelay`, any RabbitMQ): tier ``N`` is a queue with a fixed
``x-message-ttl`` of ``2**N`` ms behind a headers exchange. A message's delay in
milliseconds is written in binary; it enters at the tier of its highest set bit, and each
tier dead-letters onward to the next tier down, whose exchange either keeps it (its bit is 1)
or passes it straight on (0)::

    delay 5000 ms = 0b1001110001000: tiers 12, 9, 8, 7, 3 (4096 + 512 + 256 + 128 + 8)

    publish --> x 12 --(bit 12 = 1)--> q 12 (4096 ms) --DLX--> x 11 --(0)--> x 10 --(0)--> x 9
      x 9 --(1)--> q 9 (512 ms) --DLX--> x 8 --(1)--> q 8 ... q 3 (8 ms) --DLX--> x 2 --(0)-->
      x 1 --(0)--> x 0 --(0)--> ns (direct) --(routing key Q)--> Q   (or ns.unroutable)

A queue only ever holds messages of one TTL, so it is strictly FIFO in expiry order and a
5 s delay never waits behind a 10 min one. The routing key is the destination queue from
start to end (dead-lettering keeps it), and the bits travel in ``taskq-delay-level-NN``
headers; the last hop goes through the app's exchange, whose alternate exchange parks the
message in ``ns.unroutable`` when the queue is gone. The idea of binary levels comes from
NServiceBus's RabbitMQ transport, which puts the bits and the destination into a topic
routing key; taskq uses headers so that any queue name (dots included, up to 200
characters) fits in the 255-byte routing key and can never be confused with another.

**plugin** (:class:`PluginDelay`): the ``x-delayed-message`` exchange ``ns.delayed`` with an
integer ``x-delay`` header (ms), published without ``mandatory`` and without an alternate
exchange (the plugin returns every message to a mandatory publisher and hands an immediate
copy to an alternate exchange). An ``x-delay`` that is not an integer crashes the plugin and
closes the connection, and one above ``2**32 - 1`` ms is delivered at once: delays are
validated here, and longer ones go through the tiers.

:func:`choose_backend` resolves ``delay_backend="auto"|"plugin"|"tiers"`` and logs the
choice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

from taskq.broker.delayed import (
    PluginPublisher,
    PublishItem,
    declare_now,
    probe_delayed_message_plugin,
)
from taskq.broker.publisher import Publisher
from taskq.broker.topology import (
    DELAY_LEVEL_HEADER_PREFIX,
    DELAY_LEVEL_PASS,
    DELAY_LEVEL_WAIT,
    DELAY_PLUGIN_MAX_MS,
    DELAY_TIERS_MAX_MS,
    Declarations,
    HeaderBindingSpec,
    Topology,
    delay_level_header,
    delay_tier_name,
    delayed_exchange_name,
)
from taskq.errors import BrokerConnectionError, ConfigurationError, PublishError
from taskq.message import ETA, TASK, WireMessage, strip_x_death
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)

X_DELAY = "x-delay"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_MILLISECOND = timedelta(milliseconds=1)


# -- pure maths ---------------------------------------------------------------------------


def epoch_ms(at: datetime | None = None) -> int:
    """``at`` (an aware datetime; ``None`` is now) in whole epoch milliseconds, rounded down."""
    if at is None:
        return time.time_ns() // 1_000_000
    return (at - _EPOCH) // _MILLISECOND


def delay_ms_from_s(delay_s: float) -> int:
    """Seconds to whole milliseconds, rounded up so that a message is never early."""
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)):
        raise ConfigurationError(f"a delay must be a number of seconds, not {delay_s!r}")
    if not math.isfinite(delay_s):
        raise ConfigurationError(f"a delay must be a number of seconds, not {delay_s!r}")
    return max(0, math.ceil(delay_s * 1000))


def eta_ms_of(eta: datetime) -> int:
    """An aware datetime in epoch milliseconds, rounded up (never early)."""
    if eta.utcoffset() is None:
        raise ConfigurationError(f"eta {eta!r} is naive; pass an aware datetime")
    microseconds = (eta - _EPOCH) // _MICROSECOND
    return -(-microseconds // 1000)


def tier_levels(delay_ms: int) -> list[int]:
    """The tiers a message of ``delay_ms`` waits in, longest first: its set bits.

    Raises:
        ConfigurationError: ``delay_ms`` is not an int in 0 .. ``DELAY_TIERS_MAX_MS``.
    """
    _check_delay_ms(delay_ms, DELAY_TIERS_MAX_MS, "the delay tiers")
    return [level for level in range(delay_ms.bit_length() - 1, -1, -1) if delay_ms >> level & 1]


def tier_headers(delay_ms: int) -> dict[str, int]:
    """The ``taskq-delay-level-NN`` headers that walk a message down ``delay_ms``.

    One header per tier from the entry (highest set bit) down to tier 00: 1 means wait in
    that tier, 0 pass it by. Tiers above the entry are never visited and get no header.
    """
    waits = set(tier_levels(delay_ms))
    return {
        delay_level_header(level): DELAY_LEVEL_WAIT if level in waits else DELAY_LEVEL_PASS
        for level in range(delay_ms.bit_length() - 1, -1, -1)
    }


def x_delay(delay_ms: int) -> int:
    """Validate an ``x-delay`` value for the delayed-message plugin.

    The plugin crashes (and the broker closes the connection) on an ``x-delay`` that is not
    an integer, and delivers one above ``2**32 - 1`` at once.

    Raises:
        ConfigurationError: not an int in 0 .. ``DELAY_PLUGIN_MAX_MS``.
    """
    _check_delay_ms(delay_ms, DELAY_PLUGIN_MAX_MS, "the delayed-message plugin")
    return delay_ms


def _check_delay_ms(delay_ms: int, limit_ms: int, what: str) -> None:
    if delay_ms.__class__ is not int:
        raise ConfigurationError(f"a delay must be whole milliseconds (int), not {delay_ms!r}")
    if not 0 <= delay_ms <= limit_ms:
        raise ConfigurationError(
            f"a delay of {delay_ms} ms is outside what {what} can hold (0 .. {limit_ms} ms, "
            f"about {limit_ms / 86_400_000:.0f} days); enqueue longer delays through the "
            "outbox (apply_async(..., session=...)), which keeps them in the database"
        )


def _delayed_headers(wire: WireMessage, eta_ms: int) -> dict[str, object]:
    """Headers of a republished delayed message: no x-death, no stale tier bits, the eta."""
    headers = {
        name: value
        for name, value in strip_x_death(wire.headers).items()
        if not name.startswith(DELAY_LEVEL_HEADER_PREFIX) and name != X_DELAY
    }
    headers[ETA] = eta_ms
    return headers


def _with_headers(wire: WireMessage, headers: dict[str, object]) -> WireMessage:
    return WireMessage(
        wire.body,
        wire.message_id,
        headers,
        wire.priority,
        wire.timestamp,
        wire.app_id,
        wire.content_type,
    )


# -- the seam -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DelayedMessage:
    """An encoded message to deliver to ``queue`` no earlier than ``eta_ms``.

    Args:
        wire: The message (its ``taskq-eta`` header is set to ``eta_ms`` on publishing).
        queue: The destination work queue.
        eta_ms: Epoch milliseconds before which it must not be delivered.
    """

    wire: WireMessage
    queue: str
    eta_ms: int


class DelayBackend(Protocol):
    """Publishes messages that the broker holds until they are due.

    ``publish_many`` returns once the broker confirmed every message (a message that is
    already due is published straight to its queue). It raises ``PublishError`` (with
    ``unconfirmed_ids`` where known) like :meth:`Publisher.publish_many`.
    """

    @property
    def name(self) -> str:
        """``"plugin"`` or ``"tiers"``."""

    @property
    def max_delay_ms(self) -> int:
        """The longest delay this backend accepts."""

    def publish_many(
        self, messages: Sequence[DelayedMessage], *, now_ms: int | None = None
    ) -> None:
        """Publish ``messages`` with confirms; ``now_ms`` defaults to the clock."""

    def close(self) -> None:
        """Release connections the backend opened itself."""


class DelayDeclarer:
    """Declares delay topology and destination queues once per process, on a short connection.

    The publisher declares a work queue only before a publish to the app's exchange; a
    delayed message enters through a tier exchange, so its queue and the tiers are declared
    here first (idempotently) so that delays work on a fresh broker.

    Args:
        settings: Where to connect.
        topology: Names and arguments.
        declare: Declares one batch (injected by tests).
    """

    def __init__(
        self,
        settings: Settings,
        topology: Topology,
        declare: Callable[[Declarations, Sequence[HeaderBindingSpec]], None] | None = None,
    ) -> None:
        self._settings = settings
        self._topology = topology
        self._declare = declare or (lambda d, b: declare_now(settings, d, b))
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, *, tiers: str | None, queues: Iterable[str]) -> bool:
        """Declare the ``tiers`` queue type's tiers and ``queues`` unless done already.

        Returns:
            Whether anything was declared (it took a round trip to the broker).

        Raises:
            BrokerConnectionError: the broker is unreachable.
            TopologyError: an object exists with other arguments.
        """
        wanted = [f"queue:{q}" for q in sorted(set(queues))]
        if tiers is not None:
            wanted.insert(0, f"tiers:{tiers}")
        with self._lock:
            missing = [key for key in wanted if key not in self._done]
            if not missing:
                return False
            parts = [self._topology.base()]
            bindings: tuple[HeaderBindingSpec, ...] = ()
            for key in missing:
                kind, _, name = key.partition(":")
                if kind == "tiers":
                    tier = self._topology.delay_tiers(name)
                    parts.append(tier.declarations)
                    bindings = tier.header_bindings
                else:
                    parts.append(self._topology.for_queue(name))
            self._declare(_merge(parts), bindings)
            self._done.update(missing)
            return True

    def forget(self) -> None:
        """Declare everything again next time (after a channel error: something was deleted)."""
        with self._lock:
            self._done.clear()


def _merge(parts: Sequence[Declarations]) -> Declarations:
    return Declarations(
        exchanges=tuple(e for p in parts for e in p.exchanges),
        queues=tuple(q for p in parts for q in p.queues),
        bindings=tuple(b for p in parts for b in p.bindings),
    )


def due_item(topology: Topology, message: DelayedMessage) -> PublishItem:
    """The ``(exchange, routing_key, wire)`` that publishes a due message to its queue now."""
    headers = _delayed_headers(message.wire, message.eta_ms)
    return topology.exchange, message.queue, _with_headers(message.wire, headers)


# -- tiers ----------------------------------------------------------------------------------


class TierDelay:
    """Plugin-free delays: fixed-TTL tier queues that dead-letter onward (module docstring).

    Produces ``(exchange, routing_key, wire)`` items and publishes them through ``publisher``
    (the app's or the relay's), so delayed messages share the one confirmed publish path.

    Args:
        topology: Names of the tiers and the app's exchange.
        publisher: Publishes with confirms (mandatory: the entry tier always routes).
        declarer: Declares the tiers and destination queues before the first publish.
        queue_type: ``classic`` or ``quorum`` tiers (``delay_tier_queue_type``).
    """

    name = "tiers"
    max_delay_ms = DELAY_TIERS_MAX_MS

    def __init__(
        self,
        topology: Topology,
        publisher: Publisher,
        declarer: DelayDeclarer,
        *,
        queue_type: str = "classic",
    ) -> None:
        self.topology = topology
        self.publisher = publisher
        self.declarer = declarer
        self.queue_type = queue_type

    def item(self, message: DelayedMessage, *, now_ms: int) -> PublishItem:
        """The ``(exchange, routing_key, wire)`` that delivers ``message`` at its eta.

        Raises:
            ConfigurationError: the delay is longer than the tiers can hold.
        """
        delay_ms = max(0, message.eta_ms - now_ms)
        if delay_ms == 0:
            return due_item(self.topology, message)
        headers = _delayed_headers(message.wire, message.eta_ms)
        headers.update(tier_headers(delay_ms))
        entry = delay_tier_name(self.topology.namespace, delay_ms.bit_length() - 1, self.queue_type)
        return entry, message.queue, _with_headers(message.wire, headers)

    def publish_many(
        self, messages: Sequence[DelayedMessage], *, now_ms: int | None = None
    ) -> None:
        """Publish ``messages`` into the tiers with confirms.

        Raises:
            ConfigurationError: a delay is longer than ``max_delay_ms`` (nothing published).
            PublishError: not confirmed.
            TopologyError: a tier or a work queue exists with other arguments.
        """
        if not messages:
            return
        now = epoch_ms() if now_ms is None else now_ms
        items = [self.item(message, now_ms=now) for message in messages]  # validates first
        tiers = self.queue_type if any(i[0] != self.topology.exchange for i in items) else None
        try:
            declared = self.declarer.ensure(tiers=tiers, queues=(m.queue for m in messages))
        except BrokerConnectionError as exc:
            raise PublishError(
                f"{exc.message}; the delayed message(s) were not published",
                reason="unreachable",
                unconfirmed_ids=[m.wire.message_id for m in messages],
            ) from exc
        if declared and now_ms is None:  # declaring took a while: measure delays from now
            now = epoch_ms()
            items = [self.item(message, now_ms=now) for message in messages]
        try:
            if len(items) == 1:
                exchange, key, wire = items[0]
                task = wire.headers.get(TASK)
                self.publisher.publish(
                    wire, exchange=exchange, routing_key=key, task=task if task else None
                )
            else:
                self.publisher.publish_many(items)
        except PublishError as exc:
            if getattr(exc, "reason", None) == "channel_error":
                self.declarer.forget()  # a tier exchange was deleted: declare again next time
            raise

    def close(self) -> None:
        """Nothing of its own to close: the publisher belongs to its owner."""


# -- plugin ---------------------------------------------------------------------------------


class PluginDelay:
    """Delays through ``rabbitmq_delayed_message_exchange`` (module docstring).

    Delays up to ``DELAY_PLUGIN_MAX_MS`` go to the plugin's exchange with ``x-delay``;
    longer ones, and due messages, go through ``tiers``.

    Args:
        topology: Names.
        publisher: Non-mandatory confirmed publisher for the plugin's exchange.
        tiers: For delays the plugin cannot hold (declared on first use only).
    """

    name = "plugin"
    max_delay_ms = DELAY_TIERS_MAX_MS

    def __init__(self, topology: Topology, publisher: PluginPublisher, tiers: TierDelay) -> None:
        self.topology = topology
        self.publisher = publisher
        self.tiers = tiers

    def item(self, message: DelayedMessage, *, now_ms: int) -> PublishItem:
        """The ``(exchange, routing_key, wire)`` for the plugin's exchange."""
        delay_ms = max(0, message.eta_ms - now_ms)
        headers = _delayed_headers(message.wire, message.eta_ms)
        headers[X_DELAY] = x_delay(delay_ms)
        exchange = delayed_exchange_name(self.topology.namespace)
        return exchange, message.queue, _with_headers(message.wire, headers)

    def publish_many(
        self, messages: Sequence[DelayedMessage], *, now_ms: int | None = None
    ) -> None:
        """Publish ``messages``: short delays to the plugin, the rest through the tiers.

        Raises:
            ConfigurationError: a delay is longer than ``max_delay_ms``.
            PublishError: not confirmed.
        """
        if now_ms is None:
            # Connecting and declaring first, so that the x-delay is measured from the
            # moment of publishing.
            self.publisher.prepare({m.queue for m in messages})
        now = epoch_ms() if now_ms is None else now_ms
        plugin: list[PublishItem] = []
        others: list[DelayedMessage] = []
        for message in messages:
            delay_ms = message.eta_ms - now
            if 0 < delay_ms <= DELAY_PLUGIN_MAX_MS:
                plugin.append(self.item(message, now_ms=now))
            else:
                others.append(message)
        if others:
            self.tiers.publish_many(others, now_ms=now)
        self.publisher.publish_many(plugin)

    def close(self) -> None:
        """Close the plugin publisher's connection."""
        self.publisher.close()


# -- choosing -------------------------------------------------------------------------------


def choose_backend(
    settings: Settings, *, probe: Callable[[], bool | None] | None = None
) -> str:
    """Resolve ``settings.delay_backend`` to ``"plugin"`` or ``"tiers"`` and log the choice.

    ``auto`` and ``plugin`` ask the broker (on a throwaway connection) whether
    ``rabbitmq_delayed_message_exchange`` is enabled.

    Args:
        settings: The app's settings.
        probe: Replaces the broker probe (tests).

    Raises:
        ConfigurationError: ``plugin`` was asked for and the broker does not have it.
        BrokerConnectionError: the broker is unreachable.
    """
    wanted = settings.delay_backend
    url = redact_url(settings.broker_url)
    if wanted == "tiers":
        logger.info("delay backend: tiers (delay_backend='tiers')")
        return "tiers"
    found = (probe or (lambda: probe_delayed_message_plugin(settings)))()
    if wanted == "plugin":
        if found is False:
            raise ConfigurationError(
                f"delay_backend='plugin' but RabbitMQ at {url} does not have "
                "rabbitmq_delayed_message_exchange enabled; enable it (rabbitmq-plugins "
                "enable rabbitmq_delayed_message_exchange) or use delay_backend='tiers' or "
                "'auto'",
                settings=["delay_backend"],
            )
        logger.info("delay backend: plugin (delay_backend='plugin')")
        return "plugin"
    if found:
        logger.info("delay backend: plugin (auto: rabbitmq_delayed_message_exchange is enabled "
                    "on %s)", url)
        return "plugin"
    why = "is not enabled" if found is False else "could not be probed"
    logger.info("delay backend: tiers (auto: rabbitmq_delayed_message_exchange %s on %s)",
                why, url)
    return "tiers"


def build_backend(
    kind: str,
    settings: Settings,
    topology: Topology,
    publisher: Publisher,
    declarer: DelayDeclarer,
) -> DelayBackend:
    """Build the ``kind`` backend (from :func:`choose_backend`) on ``publisher``."""
    tiers = TierDelay(topology, publisher, declarer, queue_type=settings.delay_tier_queue_type)
    if kind == "tiers":
        return tiers
    plugin_publisher = PluginPublisher(
        settings,
        lambda queue: _merge([topology.base(), topology.for_queue(queue),
                              topology.delayed_exchange(queue)]),
    )
    return PluginDelay(topology, plugin_publisher, tiers)

