from __future__ import annotations

import pytest

from taskq import App, ConfigurationError
from taskq.broker import topology as topo


def test_names_follow_the_namespace() -> None:
    assert topo.exchange_name("shop") == "shop"
    assert topo.dlx_name("shop") == "shop.dlx"
    assert topo.unroutable_name("shop") == "shop.unroutable"
    assert topo.dlq_name("emails") == "emails.dlq"
    assert topo.delayed_exchange_name("shop") == "shop.delayed"


def test_base_declares_exchange_with_alternate_exchange_and_parking_queue() -> None:
    decl = topo.base_declarations("shop")

    exchanges = {e.name: e for e in decl.exchanges}
    assert exchanges["shop"].type == "direct"
    assert exchanges["shop"].arguments == {"alternate-exchange": "shop.unroutable"}
    assert exchanges["shop.unroutable"].type == "fanout"
    assert exchanges["shop.dlx"].type == "direct"
    assert [q.name for q in decl.queues] == ["shop.unroutable"]
    assert decl.bindings == (topo.BindingSpec("shop.unroutable", "shop.unroutable", ""),)


def test_classic_queue_gets_priority_and_dead_letter_arguments() -> None:
    decl = topo.queue_declarations(
        "shop", "emails", topo.QueueOptions(), default_max_priority=10
    )

    work, parking = decl.queues
    assert work.name == "emails"
    assert work.arguments == {
        "x-dead-letter-exchange": "shop.dlx",
        "x-dead-letter-routing-key": "emails",
        "x-max-priority": 10,
    }
    assert parking.name == "emails.dlq"
    assert set(decl.bindings) == {
        topo.BindingSpec("emails", "shop", "emails"),
        topo.BindingSpec("emails.dlq", "shop.dlx", "emails"),
    }


def test_quorum_queue_gets_delivery_limit_and_no_priority() -> None:
    options = topo.QueueOptions(type="quorum", delivery_limit=5)

    args = topo.queue_arguments("shop", "billing", options, default_max_priority=10)

    assert args["x-queue-type"] == "quorum"
    assert args["x-delivery-limit"] == 5
    assert "x-max-priority" not in args


def test_background_lane_sheds_load() -> None:
    options = topo.QueueOptions(max_length=1000, message_ttl_s=60, overflow="drop-head")

    args = topo.queue_arguments("shop", "notify", options, default_max_priority=10)

    assert args["x-max-length"] == 1000
    assert args["x-message-ttl"] == 60000
    assert args["x-overflow"] == "drop-head"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type": "stream"},
        {"type": "quorum", "max_priority": 5},
        {"delivery_limit": 3},
        {"max_priority": 0},
        {"overflow": "explode"},
        {"message_ttl_s": 0},
    ],
)
def test_invalid_queue_options_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        topo.QueueOptions(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "has space", "emails.dlq", "x" * 201])
def test_invalid_queue_names_are_rejected(name: str) -> None:
    app = App("shop")

    with pytest.raises(ConfigurationError):
        app.queue(name)


def test_app_queue_options_reach_the_topology() -> None:
    app = App("shop", namespace="shop")
    app.queue("billing", type="quorum")

    decl = app.topology.for_queue("billing")

    assert decl.queues[0].arguments["x-queue-type"] == "quorum"
    assert "billing" in app.queue_names()


def test_with_the_plugin_backend_a_work_queue_is_declared_with_its_delayed_binding() -> None:
    topology = topo.Topology("shop")

    plain = topology.for_queue("emails")
    delayed = topology.for_queue("emails", delayed=True)

    # Whoever declares Q (supervisor, worker processes at every connect) binds it too.
    assert delayed.exchanges == (
        topo.ExchangeSpec("shop.delayed", "x-delayed-message", {"x-delayed-type": "direct"}),
    )
    assert delayed.queues == plain.queues
    assert delayed.bindings == (
        *plain.bindings, topo.BindingSpec("emails", "shop.delayed", "emails"),
    )
    assert all(binding.exchange != "shop.delayed" for binding in plain.bindings)
    assert plain == topo.queue_declarations("shop", "emails", topo.QueueOptions(),
                                            default_max_priority=10)


# -- quorum queues as a lane of their own (issue 15) -----------------------------------------


def test_default_queue_type_quorum_makes_every_unconfigured_queue_quorum() -> None:
    app = App("shop", namespace="shop", default_queue_type="quorum")
    app.queue("reports", max_length=100)
    app.queue("legacy", type="classic")

    def arguments(queue: str) -> dict[str, object]:
        return dict(app.topology.for_queue(queue).queues[0].arguments)

    assert arguments("emails")["x-queue-type"] == "quorum"
    assert arguments("reports")["x-queue-type"] == "quorum"
    assert "x-max-priority" not in arguments("emails")
    assert arguments("legacy")["x-max-priority"] == 10
    assert app.topology.for_queue("emails").queues[1].arguments["x-queue-type"] == "quorum"
    # ... and the parking queue of unroutable messages, which every client declares on
    # connect: a classic one would fail every declaration while its node is down
    [unroutable] = app.topology.base().queues
    assert unroutable.arguments == {"x-queue-type": "quorum"}
    assert topo.Topology("shop").base().queues[0].arguments == {}


def test_quorum_delivery_limit_is_generous_by_default() -> None:
    args = topo.queue_arguments("shop", "q", topo.QueueOptions(type="quorum"),
                                default_max_priority=10)

    # Node deaths and channel closes raise the count too: a small limit dead-letters
    # healthy messages during failovers (docs/cluster.md).
    assert args["x-delivery-limit"] == 10_000


def test_a_priority_for_a_quorum_queue_is_refused_before_publishing() -> None:
    # Nothing listens on port 1: a publish would fail with PublishError, not this
    app = App("shop", namespace="shop", broker_url="amqp://guest:guest@127.0.0.1:1/%2F")
    app.queue("billing", type="quorum")
    # As if a connection had met RabbitMQ 3.10, whose quorum queues take no priorities.
    app.topology.broker.learn({"product": "RabbitMQ", "version": "3.10.8"})

    @app.task(queue="billing", priority=5)
    def charge(n: int = 0) -> None: ...

    @app.task(queue="billing")
    def refund() -> None: ...

    with pytest.raises(ConfigurationError, match="'billing' is a quorum queue.*priorit"):
        charge.delay()
    with pytest.raises(ConfigurationError, match="quorum queue"):
        refund.apply_async(priority=3)
    with pytest.raises(ConfigurationError, match="quorum queue"):
        charge.map([1, 2])
