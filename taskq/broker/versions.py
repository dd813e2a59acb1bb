"""What the broker is, read from the server properties of each connection: pure, no I/O.

Every connection taskq opens hands the broker's ``server_properties`` (its ``product``,
``version`` and ``capabilities``, sent in ``connection.start``) to the app's
:class:`BrokerFacts`. The parts that behave differently on RabbitMQ 3.x and 4.x ask it,
never a setting the user must know:

- priorities on quorum queues (none before 4.0; two levels, 0-4 and 5-9, on 4.0-4.2; each
  of 0-9 on 4.3 and later),
- the quorum queues' default delivery limit of 20 (4.0 and later) and ``-1`` to lift it,
- 4.3's consumer timeout (a quorum consumer is cancelled, no channel closes) and its
  per-consumer ``x-consumer-timeout``,
- whether the delayed-message plugin can exist at all (not on 4.3, which dropped Mnesia).

Before the first connection nothing is known (:attr:`BrokerFacts.version` is ``None``) and
every answer is the one of RabbitMQ 3.x, the oldest supported: declarations are made only
on a connection, so they never use that guess; see :meth:`taskq.road.Road.build` for the
one decision that can come earlier (a priority on a quorum queue).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class BrokerVersion:
    """One broker node as it introduced itself at connect.

    Args:
        product: ``product`` of the server properties (``RabbitMQ``).
        text: ``version`` as sent (``4.3.6``).
        number: ``(major, minor, patch)``; ``(0, 0, 0)`` when the version cannot be read or
            the product is not RabbitMQ: then every answer is RabbitMQ 3.x's.
        capabilities: The capability flags the broker set (``consumer_cancel_notify``...).
    """

    product: str
    text: str
    number: tuple[int, int, int]
    capabilities: frozenset[str]

    @classmethod
    def from_server_properties(cls, properties: Mapping[Any, Any]) -> BrokerVersion:
        """Read ``connection.start``'s server properties (as pika keeps them)."""
        product = _text(properties.get("product"))
        text = _text(properties.get("version"))
        match = _VERSION_RE.match(text)
        number = (0, 0, 0)
        if match is not None and product == "RabbitMQ":
            number = (int(match[1]), int(match[2]), int(match[3] or 0))
        raw = properties.get("capabilities") or {}
        capabilities = frozenset(_text(name) for name, on in dict(raw).items() if on)
        return cls(product, text, number, capabilities)

    def __str__(self) -> str:
        return f"{self.product or 'unknown broker'} {self.text or '(no version)'}".strip()

    @property
    def is_4x(self) -> bool:
        """RabbitMQ 4.0 or later."""
        return self.number >= (4, 0, 0)

    @property
    def quorum_priority_levels(self) -> int:
        """How many of taskq's priorities 0-9 a quorum queue tells apart (0: it ignores them).

        4.0-4.2: two (0-4 normal, 5-9 high, as RabbitMQ documents); 4.3: each of 0-9
        (measured on 4.3.6: 9, 8, ..., 0 strictly in that order).
        """
        if self.number >= (4, 3, 0):
            return 10
        return 2 if self.is_4x else 0

    @property
    def quorum_default_delivery_limit(self) -> int | None:
        """The delivery limit of a quorum queue declared without one (``None``: unlimited)."""
        return 20 if self.is_4x else None

    @property
    def lifts_delivery_limit(self) -> bool:
        """``x-delivery-limit: -1`` means unlimited (4.0+; 3.10 counts it as a limit of 0)."""
        return self.is_4x

    @property
    def consumer_timeout_cancels(self) -> bool:
        """Quorum queues enforce ``consumer_timeout`` by ``basic.cancel`` (4.3+).

        The stuck consumer's messages go back to the queue without counting against the
        delivery limit; classic queues no longer time out at all. Before 4.3 the broker
        closes the channel instead (a 406), which does count.
        """
        return self.number >= (4, 3, 0)

    @property
    def per_consumer_timeout(self) -> bool:
        """A consumer may set its own ``x-consumer-timeout`` on a quorum queue (taskq: 4.3+).

        RabbitMQ has the argument since 3.11.15; taskq uses it where it is measured: 4.3.
        """
        return self.number >= (4, 3, 0)

    @property
    def may_have_delay_plugin(self) -> bool:
        """The delayed-message plugin can run (it needs Mnesia, which 4.3 removed)."""
        return self.number < (4, 3, 0)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


class BrokerFacts:
    """The last broker version an app's connections met (shared by its parts, thread-safe).

    With several nodes (``broker_url`` holding more than one) the node last connected to is
    what counts; the nodes of one cluster run one minor version, except during a rolling
    upgrade, where the differences that matter (priority levels 4.2 -> 4.3) are harmless.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: BrokerVersion | None = None

    @property
    def version(self) -> BrokerVersion | None:
        """The broker met at the last connect; ``None`` before any."""
        return self._version

    @property
    def known(self) -> BrokerVersion:
        """The version to decide by: the one met, or RabbitMQ 3.x's answers before any."""
        return self._version or UNKNOWN

    def learn(self, server_properties: Mapping[Any, Any]) -> BrokerVersion:
        """Record the broker of a new connection and return it."""
        version = BrokerVersion.from_server_properties(server_properties)
        with self._lock:
            self._version = version
        return version


#: What is assumed before any connection: every answer is RabbitMQ 3.x's.
UNKNOWN = BrokerVersion("", "", (0, 0, 0), frozenset())
