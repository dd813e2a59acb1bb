"""Plugin-free delays: fixed-TTL tier queues that dead-letter onward (docs/delays.md).

Works on any RabbitMQ. Tier ``N`` is a queue with a fixed ``x-message-ttl`` of ``2**N`` ms
behind a headers exchange. A message's delay in
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
"""

from __future__ import annotations

from collections.abc import Sequence

from taskq.broker.delayed import PublishItem
from taskq.broker.publisher import Publisher
from taskq.broker.topology import DELAY_TIERS_MAX_MS, Topology, delay_tier_name
from taskq.delay.backend import CLOCK_SLICE, DelayDeclarer, DelayedMessage, due_item, with_unsent
from taskq.delay.maths import delayed_headers, epoch_ms, tier_headers, with_headers
from taskq.errors import BrokerConnectionError, PublishError
from taskq.message import TASK


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
        headers = delayed_headers(message.wire, message.eta_ms)
        headers.update(tier_headers(delay_ms))
        entry = delay_tier_name(self.topology.namespace, delay_ms.bit_length() - 1, self.queue_type)
        return entry, message.queue, with_headers(message.wire, headers)

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
        declared = self._ensure(messages, items)
        if now_ms is not None or len(messages) <= CLOCK_SLICE:
            if declared and now_ms is None:  # declaring took a while: measure from now
                items = [self.item(message, now_ms=epoch_ms()) for message in messages]
            self._send(items)
            return
        # Many messages take a while to send: each slice's delays are measured when it is
        # sent, or the last messages of a large batch would arrive that much late.
        for first in range(0, len(messages), CLOCK_SLICE):
            part = messages[first:first + CLOCK_SLICE]
            now = epoch_ms()
            try:
                self._send([self.item(message, now_ms=now) for message in part])
            except PublishError as exc:
                raise with_unsent(exc, messages[first + CLOCK_SLICE:]) from exc

    def prepare(self, messages: Sequence[DelayedMessage], *, now_ms: int) -> bool:
        """Declare what ``messages`` need (the tiers unless all are due, and their queues).

        Declared once per process (the declarer remembers), so that a caller that reads the
        clock afterwards does not measure the declaring into the delays.

        Returns:
            Whether anything was declared (it took a round trip to the broker).

        Raises:
            ConfigurationError: a delay is longer than ``max_delay_ms``.
            PublishError: the broker is unreachable.
            TopologyError: a tier or a work queue exists with other arguments.
        """
        return self._ensure(messages, [self.item(message, now_ms=now_ms) for message in messages])

    def _ensure(self, messages: Sequence[DelayedMessage], items: list[PublishItem]) -> bool:
        tiers = self.queue_type if any(i[0] != self.topology.exchange for i in items) else None
        try:
            return self.declarer.ensure(tiers=tiers, queues=(m.queue for m in messages))
        except BrokerConnectionError as exc:
            raise PublishError(
                f"{exc.message}; the delayed message(s) were not published",
                reason="unreachable",
                unconfirmed_ids=[m.wire.message_id for m in messages],
            ) from exc

    def _send(self, items: list[PublishItem]) -> None:
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
