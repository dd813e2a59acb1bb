"""What taskq decides from the broker's version, on the test broker (3.10 or 4.3).

Run on both: ``TASKQ_TEST_BROKER_URL=amqp://...:5673/...`` for the 4.3 node. Each test reads
the broker's version the way taskq does (at connect) and asserts what that broker must do.
"""

from __future__ import annotations

import logging
from typing import Any

import pika
import pytest

from taskq import ConfigurationError, dlq
from taskq.broker.versions import BrokerVersion
from tests.support.waiting import wait_until


def _broker_version(broker: Any) -> BrokerVersion:
    broker.channel  # noqa: B018 - connects
    return BrokerVersion.from_server_properties(broker._connection._impl.server_properties)


def test_the_app_learns_the_brokers_version_at_its_first_connect(
    make_app: Any, broker: Any
) -> None:
    app = make_app()

    @app.task
    def noop() -> None: ...

    assert app.topology.broker.version is None
    noop.delay()

    assert app.topology.broker.version == _broker_version(broker)


def test_quorum_queue_priorities_follow_the_brokers_version(make_app: Any, broker: Any) -> None:
    # Given a quorum queue and tasks of priorities 0, 9, 5, 1, 7, three of each, interleaved
    app = make_app()
    queue = f"{app.settings.namespace}.billing"
    app.queue(queue, type="quorum")

    @app.task(queue=queue)
    def charge(n: int) -> None: ...

    version = _broker_version(broker)
    sent = [p for _ in range(3) for p in (0, 9, 5, 1, 7)]
    if not version.quorum_priority_levels:
        # Then RabbitMQ 3.x, whose quorum queues ignore priorities, refuses them at the call
        with pytest.raises(ConfigurationError, match="quorum queue.*only from RabbitMQ 4.0"):
            charge.apply_async((1,), priority=9)
        return

    # When they are all published before anything consumes
    for n, priority in enumerate(sent):
        charge.apply_async((n,), priority=priority)
    wait_until(lambda: broker.depth(queue) == len(sent), timeout_s=10, message="all queued")

    # Then they come out by priority: each of 0-9 on 4.3, high (5-9) before normal on 4.0-4.2
    got = [props.priority for _, props, _ in broker.get_all(queue)]
    if version.quorum_priority_levels == 10:
        assert got == [9, 9, 9, 7, 7, 7, 5, 5, 5, 1, 1, 1, 0, 0, 0]
    else:
        assert sorted(got[:9]) == [5, 5, 5, 7, 7, 7, 9, 9, 9]


def _park(app: Any, broker: Any, queue: str, n: int) -> list[str]:
    @app.task(queue=queue)
    def charge(i: int) -> None: ...

    ids = [charge.delay(i).id for i in range(n)]
    wait_until(lambda: broker.depth(queue) == n, timeout_s=10, message="queued")
    for _ in range(n):
        method, _, _ = broker.channel.basic_get(queue)
        broker.channel.basic_reject(method.delivery_tag, requeue=False)  # dead-letters it
    wait_until(lambda: broker.depth(f"{queue}.dlq") == n, timeout_s=10, message="parked")
    return ids


def _wait_ready(broker: Any, queue: str, n: int) -> None:
    wait_until(lambda: broker.depth(queue) == n, timeout_s=10, message=f"{n} ready in {queue}")


def test_a_quorum_dlq_listed_50_times_still_holds_every_dead_letter(
    make_app: Any, broker: Any
) -> None:
    # Given three dead letters in the quorum parking lot of a quorum queue
    app = make_app()
    queue = f"{app.settings.namespace}.billing"
    app.queue(queue, type="quorum")
    ids = _park(app, broker, queue, 3)

    # When `taskq dlq list` (and the dashboard, which reads the same way) lists it 50 times
    for _ in range(50):
        # (a listing gives its messages back asynchronously: wait until they are ready)
        _wait_ready(broker, f"{queue}.dlq", 3)
        assert sorted(info.task_id for info in dlq.list_parked(app, queue)) == sorted(ids)

    # Then every dead letter is still there (RabbitMQ 4.x's default delivery limit, 20,
    # would have dropped them after about 20 listings)
    wait_until(lambda: broker.depth(f"{queue}.dlq") == 3, timeout_s=10, message="all 3 kept")


def test_quorum_queues_an_older_taskq_declared_are_adopted_and_keep_their_dead_letters(
    make_app: Any, broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a quorum queue and its parking lot as taskq declared them before (no
    # dead-letter strategy, no overflow, the parking lot without a delivery limit)
    app = make_app()
    ns = app.settings.namespace
    queue = f"{ns}.billing"
    app.queue(queue, type="quorum")
    broker.channel.exchange_declare(f"{ns}.dlx", "direct", durable=True)
    broker.declare_queue(queue, {
        "x-queue-type": "quorum", "x-delivery-limit": 10_000,
        "x-dead-letter-exchange": f"{ns}.dlx", "x-dead-letter-routing-key": queue,
    })
    broker.declare_queue(f"{queue}.dlq", {"x-queue-type": "quorum"})

    # When this taskq declares them (at its first publish): no TopologyError, a warning
    with caplog.at_level(logging.WARNING, logger="taskq.broker.connection"):
        ids = _park(app, broker, queue, 2)
    assert "exists with other arguments than this taskq declares" in caplog.text
    assert "x-dead-letter-strategy" in caplog.text

    # Then listing its parking lot 50 times keeps every dead letter (on 4.3 reading gives
    # them back by nack, which does not count against the default limit of 20)
    version = _broker_version(broker)
    if version.is_4x and not version.consumer_timeout_cancels:
        pytest.skip("RabbitMQ 4.0-4.2 may count a nack: see docs/rabbitmq.md")
    for _ in range(50):
        _wait_ready(broker, f"{queue}.dlq", 2)
        assert len(dlq.list_parked(app, queue)) == 2
    _wait_ready(broker, f"{queue}.dlq", 2)
    assert sorted(i.task_id for i in dlq.list_parked(app, queue)) == sorted(ids)


def test_a_queue_that_differs_in_what_the_user_chose_still_fails_clearly(
    make_app: Any, broker: Any
) -> None:
    from taskq import TopologyError

    app = make_app()
    queue = f"{app.settings.namespace}.billing"
    app.queue(queue, type="quorum", delivery_limit=5)
    broker.declare_queue(queue, {"x-queue-type": "quorum", "x-delivery-limit": 7})

    @app.task(queue=queue)
    def charge() -> None: ...

    with pytest.raises(TopologyError, match="x-delivery-limit"):
        charge.delay()


def test_auto_delays_pick_the_tiers_where_the_plugin_cannot_exist(
    make_app: Any, broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    version = _broker_version(broker)
    app = make_app(delay_backend="auto")

    with caplog.at_level(logging.INFO, logger="taskq.delay.choosing"):
        kind = app.delay_backend_name

    if version.may_have_delay_plugin:
        assert kind in ("plugin", "tiers")
    else:
        assert kind == "tiers"
        assert f"is {version}, which has no delayed-message plugin" in caplog.text


def test_a_requeue_by_taskq_does_not_spend_a_quorum_delivery(broker: Any, namespace: str) -> None:
    # basic.nack(requeue) is what the worker sends to give a delivery back (subscription);
    # on 4.3 it does not count against the delivery limit, basic.reject does.
    version = _broker_version(broker)
    queue = f"{namespace}.limit"
    broker.declare_queue(queue, {"x-queue-type": "quorum", "x-delivery-limit": 1})
    try:
        broker.channel.basic_publish("", queue, b"x", pika.BasicProperties(delivery_mode=2))
        wait_until(lambda: broker.depth(queue) == 1, timeout_s=10, message="queued")
        if version.is_4x and not version.consumer_timeout_cancels:
            pytest.skip("not measured on RabbitMQ 4.0-4.2")
        delivered = 0
        for _ in range(5):
            if delivered < 2 or version.is_4x:  # 3.10 drops it after the second
                _wait_ready(broker, queue, 1)
            method, _, _ = broker.channel.basic_get(queue)
            if method is None:
                break
            delivered += 1
            broker.channel.basic_nack(method.delivery_tag, requeue=True)
        # 4.3: nacks are free; 3.10 counts them: a limit of 1 allows two deliveries
        assert delivered == (5 if version.consumer_timeout_cancels else 2)
    finally:
        broker.delete_queue(queue)
