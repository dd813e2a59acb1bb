"""Find and delete everything an app declared on the broker (behind ``taskq teardown``).

Two kinds of objects, because queue names carry no namespace prefix (docs/PROTOCOL.md,
"Topology"):

- **The app's queues**: each work queue it knows (or the partition queues of an ordered
  one) and its ``Q.dlq``. Another app that names the same queue in the same vhost shares
  it, and loses it too: isolate apps with a vhost each (docs/guide.md, "What is on the
  broker").
- **The namespace's objects**: the exchanges ``ns``, ``ns.dlx``, ``ns.unroutable`` (and its
  queue), ``ns.delayed`` and the delay tiers ``ns.delay.*``. Other apps with the same
  ``namespace`` use them as well, so they are deleted only when, once the app's queues are
  gone, no queue is bound to the exchange ``ns`` any more (``exchange.delete`` with
  ``if-unused``: the broker decides atomically, no management API needed).

Everything is found with passive declares, so it works on any RabbitMQ without the
management plugin; a passive declare of something missing closes the channel (404), after
which a new one is opened.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import pika
import pika.exceptions

from taskq.broker import topology as topo
from taskq.broker.connection import open_connection
from taskq.errors import BrokerError
from taskq.settings import Settings

logger = logging.getLogger(__name__)

Kind = Literal["queue", "exchange"]

_NOT_FOUND = 404
_IN_USE = 406
_TIER_TYPES = ("classic", "quorum")


@dataclass(frozen=True)
class BrokerObject:
    """One queue or exchange that exists on the broker, with what a queue holds."""

    kind: Kind
    name: str
    messages: int = 0
    consumers: int = 0


@dataclass(frozen=True)
class TeardownPlan:
    """What exists of an app: its own queues, then its namespace's objects."""

    namespace: str
    queues: tuple[BrokerObject, ...]
    namespace_objects: tuple[BrokerObject, ...]

    @property
    def empty(self) -> bool:
        """Nothing of the app is on the broker."""
        return not self.queues and not self.namespace_objects

    @property
    def consumers(self) -> tuple[BrokerObject, ...]:
        """The app's queues that have consumers (running workers)."""
        return tuple(q for q in self.queues if q.consumers)

    @property
    def messages(self) -> int:
        """Messages that deleting everything listed would drop."""
        return sum(o.messages for o in (*self.queues, *self.namespace_objects))


@dataclass
class TeardownReport:
    """What ``tear_down`` deleted, and why the namespace's objects stayed, if they did."""

    deleted: list[BrokerObject] = field(default_factory=list)
    namespace_kept: str | None = None


def app_queue_names(topology: topo.Topology, queues: Iterable[str]) -> list[str]:
    """The broker queues of the app's work ``queues``: each queue (or its partitions) and
    its ``.dlq``, in the order they are deleted."""
    names: list[str] = []
    for queue in queues:
        names += topology.partition_queues(queue) or [queue]
        names.append(topo.dlq_name(queue))
    return list(dict.fromkeys(names))


def survey(settings: Settings, topology: topo.Topology, queues: Iterable[str]) -> TeardownPlan:
    """Find what exists of the app on the broker (passive declares only; changes nothing).

    Raises:
        BrokerConnectionError: the broker cannot be reached.
    """
    with _Probe(settings) as probe:
        own = [probe.queue(name) for name in app_queue_names(topology, queues)]
        ns = topology.namespace
        shared: list[BrokerObject | None] = [
            probe.exchange(topo.exchange_name(ns)),
            probe.exchange(topo.dlx_name(ns)),
            probe.exchange(topo.delayed_exchange_name(ns)),
            probe.exchange(topo.unroutable_name(ns)),
            probe.queue(topo.unroutable_name(ns)),
        ]
        for queue_type in _TIER_TYPES:
            # Tiers are declared all together: no tier 00, no tiers of that type.
            if probe.exchange(topo.delay_tier_name(ns, 0, queue_type)) is None:
                continue
            for level in range(topo.DELAY_TIER_LEVELS):
                name = topo.delay_tier_name(ns, level, queue_type)
                shared += [probe.queue(name), probe.exchange(name)]
    return TeardownPlan(
        ns, tuple(o for o in own if o), tuple(o for o in shared if o)
    )


def tear_down(settings: Settings, plan: TeardownPlan) -> TeardownReport:
    """Delete the app's queues, then its namespace's objects unless other queues use them.

    Raises:
        BrokerConnectionError: the broker cannot be reached.
    """
    report = TeardownReport()
    with _Probe(settings) as probe:
        for queue in plan.queues:
            if probe.delete_queue(queue.name):
                report.deleted.append(queue)
        exchange = topo.exchange_name(plan.namespace)
        if any(o.name == exchange for o in plan.namespace_objects) and not probe.delete_exchange(
            exchange, if_unused=True
        ):
            report.namespace_kept = (
                f"other queues are still bound to exchange {exchange!r}: another app uses "
                f"namespace {plan.namespace!r}"
            )
            return report
        for thing in plan.namespace_objects:
            done = (
                probe.delete_queue(thing.name) if thing.kind == "queue"
                else thing.name == exchange or probe.delete_exchange(thing.name)
            )
            if done:
                report.deleted.append(thing)
    return report


class _Probe:
    """One connection and a channel that is reopened whenever the broker closes it."""

    def __init__(self, settings: Settings) -> None:
        self._connection = open_connection(settings, client_name="taskq teardown")
        self._channel = self._connection.channel()

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._connection.close()
        except pika.exceptions.AMQPError:
            logger.debug("closing the teardown connection failed", exc_info=True)

    def queue(self, name: str) -> BrokerObject | None:
        try:
            frame = self._channel.queue_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen(exc, _NOT_FOUND)
            return None
        return BrokerObject("queue", name, frame.method.message_count,
                            frame.method.consumer_count)

    def exchange(self, name: str) -> BrokerObject | None:
        try:
            self._channel.exchange_declare(name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen(exc, _NOT_FOUND)
            return None
        return BrokerObject("exchange", name)

    def delete_queue(self, name: str) -> bool:
        # Deleting a queue that is already gone succeeds on RabbitMQ 3.10 and 4.x.
        self._channel.queue_delete(name)
        return True

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> bool:
        try:
            self._channel.exchange_delete(name, if_unused=if_unused)
        except pika.exceptions.ChannelClosedByBroker as exc:
            self._reopen(exc, _IN_USE)
            return False
        return True

    def _reopen(self, exc: pika.exceptions.ChannelClosedByBroker, expected: int) -> None:
        if exc.reply_code != expected:
            raise BrokerError(
                f"the broker refused a teardown step: {exc.reply_code} {exc.reply_text}"
            ) from exc
        self._channel = self._connection.channel()
