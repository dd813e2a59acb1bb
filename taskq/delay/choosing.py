"""Resolves ``delay_backend="auto"|"plugin"|"tiers"``, logs the choice, builds the backend."""

from __future__ import annotations

import logging
from collections.abc import Callable

from taskq.broker.delayed import PluginPublisher, probe_delayed_message_plugin
from taskq.broker.publisher import Publisher
from taskq.broker.topology import Topology
from taskq.broker.versions import BrokerFacts
from taskq.delay.backend import DelayBackend, DelayDeclarer, merge_declarations
from taskq.delay.plugin import PluginDelay
from taskq.delay.tiers import TierDelay
from taskq.errors import ConfigurationError
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)


def choose_backend(
    settings: Settings,
    *,
    probe: Callable[[], bool | None] | None = None,
    broker: BrokerFacts | None = None,
) -> str:
    """Resolve ``settings.delay_backend`` to ``"plugin"`` or ``"tiers"`` and log the choice.

    ``auto`` and ``plugin`` ask the broker (on a throwaway connection) whether
    ``rabbitmq_delayed_message_exchange`` is enabled.

    Args:
        settings: The app's settings.
        probe: Replaces the broker probe (tests).
        broker: Learns the broker's version at the probe's connect: RabbitMQ 4.3+ cannot
            run the plugin, and ``auto`` says so when it picks the tiers.

    Raises:
        ConfigurationError: ``plugin`` was asked for and the broker does not have it.
        BrokerConnectionError: the broker is unreachable.
    """
    wanted = settings.delay_backend
    url = redact_url(settings.broker_url)
    if wanted == "tiers":
        logger.info("delay backend: tiers (delay_backend='tiers')")
        return "tiers"
    broker = broker or BrokerFacts()
    found = (probe or (lambda: probe_delayed_message_plugin(settings, broker)))()
    met = broker.version
    if found is False and met is not None and not met.may_have_delay_plugin:
        if wanted == "plugin":
            raise ConfigurationError(
                f"delay_backend='plugin' but RabbitMQ at {url} is {met}, which cannot run "
                "rabbitmq_delayed_message_exchange (it needs Mnesia, removed in 4.3): use "
                "delay_backend='tiers' or 'auto'",
                settings=["delay_backend"],
            )
        logger.info("delay backend: tiers (auto: RabbitMQ at %s is %s, which has no "
                    "delayed-message plugin: it needs Mnesia, removed in 4.3)", url, met)
        return "tiers"
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
        lambda queue: merge_declarations(
            [topology.base(), topology.for_queue(queue, delayed=True)]
        ),
    )
    return PluginDelay(topology, plugin_publisher, tiers)

