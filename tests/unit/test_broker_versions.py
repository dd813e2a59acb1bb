"""What taskq decides from the broker's version read at connect (taskq.broker.versions)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from taskq import App, ConfigurationError
from taskq.broker.topology import QueueOptions, Topology
from taskq.broker.versions import BrokerFacts, BrokerVersion

CLOSED = "amqp://guest:guest@127.0.0.1:1/%2F"


def _version(text: str, product: str = "RabbitMQ") -> BrokerVersion:
    return BrokerVersion.from_server_properties(
        {"product": product.encode(), "version": text.encode(),
         "capabilities": {"consumer_cancel_notify": True, "basic.nack": True, "x": False}}
    )


@pytest.mark.parametrize(
    ("text", "levels", "limit", "cancels", "plugin"),
    [("3.10.8", 0, None, False, True), ("4.0.5", 2, 20, False, True),
     ("4.2.1", 2, 20, False, True), ("4.3.6", 10, 20, True, False),
     ("4.3.0-rc.1", 10, 20, True, False)],
)
def test_each_version_answers_from_what_it_can_do(
    text: str, levels: int, limit: int | None, cancels: bool, plugin: bool
) -> None:
    version = _version(text)

    assert version.quorum_priority_levels == levels
    assert version.quorum_default_delivery_limit == limit
    assert version.lifts_delivery_limit is (limit is not None)
    assert version.consumer_timeout_cancels is cancels
    assert version.may_have_delay_plugin is plugin
    assert version.capabilities == frozenset({"consumer_cancel_notify", "basic.nack"})
    assert str(version) == f"RabbitMQ {text}"


def test_an_unknown_product_or_version_gets_the_answers_of_rabbitmq_3() -> None:
    for version in (_version("4.3.6", product="LavinMQ"), _version("garbage")):
        assert version.number == (0, 0, 0)
        assert version.quorum_priority_levels == 0
    assert BrokerFacts().known.quorum_priority_levels == 0


def _parking(topology: Topology) -> dict[str, dict[str, Any]]:
    queues = (*topology.base().queues, *topology.for_queue("billing").queues)
    return {q.name: q.arguments for q in queues}


def test_quorum_parking_lots_lift_the_delivery_limit_on_4x_only() -> None:
    topology = Topology("ns", queues={"billing": QueueOptions(type="quorum")},
                        default_queue_type="quorum")
    topology.broker.learn({"product": "RabbitMQ", "version": "3.10.8"})
    on_3 = _parking(topology)
    topology.broker.learn({"product": "RabbitMQ", "version": "4.3.6"})
    on_4 = _parking(topology)

    # 3.10 counts -1 as a limit of 0: no argument there (its quorum queues have no limit).
    assert "x-delivery-limit" not in on_3["billing.dlq"]
    assert "x-delivery-limit" not in on_3["ns.unroutable"]
    assert on_4["billing.dlq"]["x-delivery-limit"] == -1
    assert on_4["ns.unroutable"]["x-delivery-limit"] == -1
    for arguments in (on_3["billing"], on_4["billing"]):
        assert arguments["x-dead-letter-strategy"] == "at-least-once"
        assert arguments["x-overflow"] == "reject-publish"
        assert arguments["x-delivery-limit"] == 10_000


def test_a_quorum_queue_with_another_overflow_keeps_at_most_once() -> None:
    topology = Topology("ns", queues={
        "shed": QueueOptions(type="quorum", max_length=10, overflow="drop-head")})
    [work, _] = topology.for_queue("shed").queues

    assert "x-dead-letter-strategy" not in work.arguments
    assert work.arguments["x-overflow"] == "drop-head"
    assert work.adoptable == frozenset()


def test_a_quorum_priority_is_taken_on_4x_and_refused_on_3x() -> None:
    app = App("shop", namespace="shop", broker_url=CLOSED)
    app.queue("billing", type="quorum")
    app.queue("ledger", type="quorum", partitions=2)

    @app.task(queue="billing")
    def charge() -> None: ...

    app.topology.broker.learn({"product": "RabbitMQ", "version": "4.0.5"})
    assert app.road.build(charge, priority=7).envelope.priority == 7
    assert app.road.takes_priorities("billing")
    assert not app.road.takes_priorities("ledger")
    with pytest.raises(ConfigurationError, match="'ledger' is ordered"):
        app.road.build(charge, queue="ledger", priority=1, ordering_key="k")

    app.topology.broker.learn({"product": "RabbitMQ", "version": "3.10.8"})
    with pytest.raises(ConfigurationError, match="RabbitMQ 3.10.8.*from RabbitMQ 4.0"):
        app.road.build(charge, priority=7)
    assert not app.road.takes_priorities("billing")


def test_a_quorum_priority_before_any_connection_asks_the_broker_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("shop", namespace="shop", broker_url=CLOSED)
    app.queue("billing", type="quorum")

    @app.task(queue="billing")
    def charge() -> None: ...

    # The broker cannot be reached: the outbox must still take the call; it is accepted
    # with a warning saying what 3.x would do with it.
    with caplog.at_level(logging.WARNING):
        outgoing = app.road.build(charge, priority=7)
    assert outgoing.envelope.priority == 7
    assert "accepted without knowing the broker's version" in caplog.text
    assert "cannot read the broker's version" in caplog.text
