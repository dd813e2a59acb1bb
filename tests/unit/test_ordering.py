"""Ordered queues without a broker: the hash, names, topology, routing, refusals, spreading."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from taskq import App, ConfigurationError
from taskq.broker.topology import Topology
from taskq.message import ORDERING_KEY
from taskq.ordering.changes import partition_count_change
from taskq.ordering.keys import partition_of, partition_queue_name, split_partition_queue
from taskq.ordering.routing import route
from taskq.ordering.spread import consume_order

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens: refusals come first


@pytest.fixture
def app(tmp_path: Any) -> App:
    app = App("orders", broker_url=UNREACHABLE, database_url=f"sqlite:///{tmp_path}/t.db",
              namespace="ns", publish_timeout_s=0.5)
    app.queue("ledger", partitions=16)
    return app


def test_the_partition_hash_is_crc32_of_the_utf8_key() -> None:
    # Pinned: producers in other languages compute the same (docs/PROTOCOL.md).
    assert partition_of("acct-42", 16) == 0x476AA849 % 16 == 9
    assert partition_of("hello", 16) == 6
    assert partition_of("k\u00e9y", 16) == 15
    assert all(partition_of(f"k{i}", 7) in range(7) for i in range(200))


def test_partition_queue_names_round_trip() -> None:
    assert partition_queue_name("ledger", 3) == "ledger.p3"
    assert split_partition_queue("a.b.p12") == ("a.b", 12)
    assert split_partition_queue("ledger.p03") is None
    assert split_partition_queue("ledger") is None


def test_an_ordered_queue_declares_partitions_with_single_active_consumer(app: App) -> None:
    declarations = app.topology.for_queue("ledger")
    queues = {q.name: q.arguments for q in declarations.queues}
    # Highest first: a concurrent count check never sees p0 without p15
    assert [q.name for q in declarations.queues][::15] == ["ledger.p15", "ledger.p0"]
    assert sorted(queues) == sorted([f"ledger.p{i}" for i in range(16)] + ["ledger.dlq"])
    assert queues["ledger.p5"] == {
        "x-dead-letter-exchange": "ns.dlx",
        "x-dead-letter-routing-key": "ledger.p5",
        "x-single-active-consumer": True,
        "x-taskq-partitions": 16,
    }
    bindings = {(b.queue, b.exchange, b.routing_key) for b in declarations.bindings}
    assert ("ledger.p5", "ns", "ledger.p5") in bindings
    assert ("ledger.dlq", "ns.dlx", "ledger.p5") in bindings
    # One partition declares them all: the partition-count check needs all or none
    assert app.topology.for_queue("ledger.p5") == declarations


def test_quorum_partitions_keep_their_delivery_limit() -> None:
    app = App("q", broker_url=UNREACHABLE, namespace="ns")
    options = app.queue("billing", type="quorum", partitions=2)
    topology = Topology("ns", queues={"billing": options})
    arguments = topology.for_queue("billing").queues[0].arguments
    assert arguments["x-queue-type"] == "quorum"
    assert arguments["x-single-active-consumer"] is True
    assert "x-delivery-limit" in arguments


def test_partitions_are_validated(app: App) -> None:
    for bad in (0, -1, 1025, True, 2.0):
        with pytest.raises(ConfigurationError, match="partitions"):
            app.queue("x", partitions=bad)
    with pytest.raises(ConfigurationError, match="no priorities"):
        app.queue("x", partitions=4, max_priority=5)


def test_route_sends_a_key_to_its_partition_and_refuses_mismatches(app: App) -> None:
    topology = app.topology
    assert route(topology, {ORDERING_KEY: "acct-42"}, "ledger", "t") == "ledger.p9"
    assert route(topology, {}, "emails", "t") == "emails"
    assert route(topology, {ORDERING_KEY: "x"}, "ledger.p3", "t") == "ledger.p3"  # a replay
    with pytest.raises(ConfigurationError, match="without an ordering key"):
        route(topology, {}, "ledger", "t")
    with pytest.raises(ConfigurationError, match="is not ordered"):
        route(topology, {ORDERING_KEY: "x"}, "emails", "t")


def test_apply_async_refuses_a_missing_key_and_a_key_for_an_unordered_queue(app: App) -> None:
    @app.task(queue="ledger")
    def post(account: str) -> None: ...

    @app.task(queue="emails")
    def mail(to: str) -> None: ...

    with pytest.raises(ConfigurationError, match="'ledger' without an ordering key"):
        post.delay("a")
    with pytest.raises(ConfigurationError, match="'emails' is not ordered"):
        mail.apply_async(("a",), ordering_key="acct-1")
    with pytest.raises(ConfigurationError, match="without an ordering key"):
        post.map(["a", "b"])  # bulk enqueue is refused the same way


def test_ordering_key_names_an_argument_of_the_task(app: App) -> None:
    @app.task(queue="ledger", ordering_key="account_id")
    def post(account_id: int, amount: int = 0) -> None: ...

    assert post.ordering_key_of((42,), None, "ledger") == "42"
    assert post.ordering_key_of((), {"account_id": uuid.UUID(int=1)}, "ledger") == str(
        uuid.UUID(int=1)
    )
    assert post.ordering_key_of((42,), None, "ledger", "given") == "given"  # the call wins
    with pytest.raises(ConfigurationError, match="no 'account_id' argument"):
        post.ordering_key_of((), {"amount": 1}, "ledger")
    with pytest.raises(ConfigurationError, match="str, int or UUID"):
        post.ordering_key_of(([1],), None, "ledger")
    with pytest.raises(ConfigurationError, match="names no parameter"):
        app.task(queue="ledger", ordering_key="acount_id")(lambda account_id: None)


def test_a_priority_on_an_ordered_queue_is_refused(app: App) -> None:
    @app.task(queue="ledger", ordering_key="key")
    def post(key: str) -> None: ...

    with pytest.raises(ConfigurationError, match="overtake"):
        post.apply_async(("a",), priority=5)


def test_eager_mode_runs_ordered_tasks_in_process(tmp_path: Any) -> None:
    app = App("e", broker_url=UNREACHABLE, task_always_eager=True)
    app.queue("ledger", partitions=4)
    seen: list[str] = []

    @app.task(queue="ledger", ordering_key="key")
    def post(key: str) -> None:
        seen.append(key)

    post.delay("a")
    post.map(["b", "c"])
    assert seen == ["a", "b", "c"]


def test_each_process_registers_first_for_its_share_of_partitions(app: App) -> None:
    orders = [
        consume_order(app.topology, ["ledger", "emails"], index=i, process_count=4)
        for i in (1, 2, 3, 4)
    ]
    assert orders[0].first == ("ledger.p0", "ledger.p4", "ledger.p8", "ledger.p12", "emails")
    assert len(orders[0].standby) == 12
    firsts = [name for order in orders for name in order.first if name != "emails"]
    assert sorted(firsts) == sorted(app.topology.partition_queues("ledger"))  # each once
    single = consume_order(app.topology, ["ledger"], index=1, process_count=1)
    assert len(single.first) == 16 and single.standby == ()


def test_a_changed_partition_count_explains_how_to_migrate() -> None:
    text = partition_count_change(
        "ledger.p0", {"x-taskq-partitions": 8}, {"x-taskq-partitions": 16}
    )
    assert text is not None
    assert "exists with 16 partitions" in text and "declares 8" in text
    assert "drain" in text and "delete the queues ledger.p0" in text
    assert partition_count_change("ledger.p0", {"x-max-priority": 10}, None) is None
