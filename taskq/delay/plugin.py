"""Delays through ``rabbitmq_delayed_message_exchange`` (docs/delays.md).

The ``x-delayed-message`` exchange ``ns.delayed`` with an integer ``x-delay`` header (ms),
published without ``mandatory`` and without an alternate exchange (the plugin returns every
message to a mandatory publisher and hands an immediate copy to an alternate exchange). An
``x-delay`` that is not an integer crashes the plugin and closes the connection, and one above
``2**32 - 1`` ms is delivered at once: delays are validated (:func:`taskq.delay.maths.x_delay`),
and longer ones go through the tiers (:mod:`taskq.delay.tiers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial

from taskq.broker.delayed import PluginPublisher, PublishItem
from taskq.broker.topology import (
    DELAY_PLUGIN_MAX_MS,
    DELAY_TIERS_MAX_MS,
    Topology,
    delayed_exchange_name,
)
from taskq.delay.backend import (
    CLOCK_SLICE,
    DelayedMessage,
    PartFailure,
    attempt_part,
    combined_error,
    with_unsent,
)
from taskq.delay.maths import (
    X_DELAY,
    check_delay_ms,
    delayed_headers,
    epoch_ms,
    with_headers,
    x_delay,
)
from taskq.delay.tiers import TierDelay
from taskq.errors import PublishError, TopologyError


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
        headers = delayed_headers(message.wire, message.eta_ms)
        headers[X_DELAY] = x_delay(delay_ms)
        exchange = delayed_exchange_name(self.topology.namespace)
        return exchange, message.queue, with_headers(message.wire, headers)

    def publish_many(
        self, messages: Sequence[DelayedMessage], *, now_ms: int | None = None
    ) -> None:
        """Publish ``messages``: short delays to the plugin, the rest through the tiers.

        Both parts are always attempted: a refusal of one part never keeps the other from
        being sent, and the error accounts for every message of the call. A large batch is
        sent in slices of ``CLOCK_SLICE``, each slice's delays measured when it is sent (after
        declaring what it needs); after a refused slice the later ones are not sent (and
        counted unconfirmed).

        Raises:
            ConfigurationError: a delay is longer than ``max_delay_ms`` (nothing published).
            PublishError: not confirmed; ``unconfirmed_ids`` lists every message of the call
                that the broker did not confirm (from either part).
        """
        failures: list[PartFailure] = []
        if now_ms is not None:
            self._publish_slice(messages, now_ms, failures)
            if failures:
                raise combined_error(failures)
            return
        if messages:  # validated first: a too long delay leaves the whole call unsent
            longest = max(m.eta_ms for m in messages) - epoch_ms()
            check_delay_ms(max(0, longest), self.max_delay_ms, "the delay tiers")
        # A large batch goes in slices, each measured when it is sent (CLOCK_SLICE). Each
        # slice's queues are declared again (PluginPublisher) and any tiers it needs declared
        # *before* its clock is read: declaring 200 queues takes about 0.3 s here, which
        # every message of the slice would otherwise arrive late by.
        for first in range(0, len(messages), CLOCK_SLICE):
            part = messages[first:first + CLOCK_SLICE]
            attempt_part(partial(self._prepare, part), [m.wire.message_id for m in part],
                         failures)
            if not failures:
                self._publish_slice(part, epoch_ms(), failures)
            if failures:
                raise with_unsent(combined_error(failures), messages[first + CLOCK_SLICE:])

    def _prepare(self, messages: Sequence[DelayedMessage]) -> None:
        """Connect and declare what ``messages`` need, split as :meth:`_publish_slice` will
        split them (a message that falls due meanwhile goes through the tiers, declared then).

        The tiers' part is best effort: a refusal there is met again when that part is
        published, and then keeps only that part from being sent.

        Raises:
            PublishError: the broker is unreachable.
            TopologyError: a work queue exists with other arguments.
        """
        now = epoch_ms()
        plugin = {m.queue for m in messages if 0 < m.eta_ms - now <= DELAY_PLUGIN_MAX_MS}
        others = [m for m in messages if not 0 < m.eta_ms - now <= DELAY_PLUGIN_MAX_MS]
        if plugin:
            self.publisher.prepare(plugin)
        if others:
            with contextlib.suppress(PublishError, TopologyError):
                self.tiers.prepare(others, now_ms=now)

    def _publish_slice(
        self, messages: Sequence[DelayedMessage], now: int, failures: list[PartFailure]
    ) -> None:
        """Short delays of ``messages`` to the plugin, the rest through the tiers, both
        attempted; a refused part is noted in ``failures``."""
        plugin: list[PublishItem] = []
        others: list[DelayedMessage] = []
        for message in messages:
            delay_ms = message.eta_ms - now
            if 0 < delay_ms <= DELAY_PLUGIN_MAX_MS:
                plugin.append(self.item(message, now_ms=now))
            else:
                others.append(message)
        if others:
            attempt_part(lambda: self.tiers.publish_many(others, now_ms=now),
                     [m.wire.message_id for m in others], failures)
        if plugin:
            attempt_part(lambda: self.publisher.publish_many(plugin),
                     [wire.message_id for _, _, wire in plugin], failures)

    def close(self) -> None:
        """Close the plugin publisher's connection."""
        self.publisher.close()
