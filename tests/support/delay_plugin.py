"""Whether the test broker has ``rabbitmq_delayed_message_exchange``, probed once per session.

The suite runs against a broker with or without the plugin (``TASKQ_TEST_BROKER_URL``);
tests that depend on it ask here instead of assuming either.
"""

from __future__ import annotations

from taskq.broker.delayed import probe_delayed_message_plugin
from taskq.settings import Settings
from tests.conftest import BROKER_URL

_probed: list[bool | None] = []


def plugin_enabled() -> bool | None:
    """Whether the test broker has the plugin (``None``: the probe was refused)."""
    if not _probed:
        _probed.append(probe_delayed_message_plugin(Settings(broker_url=BROKER_URL)))
    return _probed[0]


def auto_delay_backend() -> str:
    """What ``delay_backend="auto"`` chooses on the test broker: ``plugin`` or ``tiers``."""
    return "plugin" if plugin_enabled() else "tiers"
