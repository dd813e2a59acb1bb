"""The worker's consumer on the real broker: a channel the broker closes is consumed again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskq import App
from taskq.broker.delivery import Delivery
from taskq.broker.subscription import Subscription
from taskq.broker.topology import dlq_name
from taskq.message import WireMessage
from tests.support.waiting import wait_until


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app(prefetch_count=4, delay_backend="tiers")


@pytest.fixture
def subscription(app: App) -> Iterator[Subscription]:
    subscription = Subscription(
        app.settings, app.topology, [app.settings.default_queue], client_name="taskq test"
    )
    subscription.start()
    wait_until(lambda: subscription.is_connected, message="the subscription consumes")
    yield subscription
    subscription.close()


def publish(app: App, *message_ids: str) -> None:
    for message_id in message_ids:
        app.publisher.publish(
            WireMessage(b"-", message_id), exchange=app.topology.exchange,
            routing_key=app.settings.default_queue,
        )


def provoke_channel_error(subscription: Subscription) -> None:
    """Ack a delivery tag the channel never had: the broker closes the channel (406).

    The connection stays up. The same close ends a channel whose delivery outlived the
    broker's consumer_timeout, which cannot be shortened on the shared test broker.
    """
    channel: Any = subscription._channel  # the I/O thread's own channel, on purpose
    subscription._call_in_io_thread(lambda: channel.basic_ack(10_000))


def take(subscription: Subscription, count: int) -> list[Delivery]:
    taken: list[Delivery] = []

    def more() -> bool:
        delivery = subscription.get(0.2)
        if delivery is not None:
            taken.append(delivery)
        return len(taken) >= count

    wait_until(more, timeout_s=15, message=lambda: f"{count} deliveries; got {taken}")
    return taken


def test_a_channel_closed_by_the_broker_is_consumed_again_while_the_task_in_hand_hangs(
    app: App, subscription: Subscription, broker: Any
) -> None:
    queue = app.settings.default_queue
    # Given one delivery in hand (its task "hangs": never settled meanwhile) and two
    # prefetched behind it,
    publish(app, "m1", "m2", "m3")
    in_hand = take(subscription, 1)[0]
    wait_until(lambda: broker.depth(queue) == 0, message="all three delivered")
    dead_generation = subscription.generation

    # when the broker closes the consumer's channel while the connection stays up,
    provoke_channel_error(subscription)
    wait_until(lambda: subscription.generation != dead_generation and subscription.is_connected,
               message="the consumer is re-established")
    # then consuming resumes: the three come back on the new channel, and a later message
    # arrives too;
    publish(app, "m4")
    live = take(subscription, 4)
    generation = subscription.generation
    assert [d.message.message_id for d in live] == ["m1", "m2", "m3", "m4"]
    assert all(d.generation == generation for d in live), live
    assert [d.is_redelivered for d in live] == [True, True, True, False]
    # the late ack of the dead channel's delivery is dropped, never sent on the new channel
    # (its tag would ack another message there),
    in_hand.ack()
    subscription.close()

    # so all four return to the queue when the subscription closes without acking them.
    assert subscription.generation == generation
    assert wait_until(lambda: broker.depth(queue) == 4, message="four messages back")


_SETTLE_THEN_DIE = """
import os, sys
from taskq import App
from taskq.broker.subscription import Subscription

app = App("t", broker_url=sys.argv[1], namespace=sys.argv[2], prefetch_count=4)
subscription = Subscription(app.settings, app.topology, [sys.argv[3]], client_name="die")
subscription.start()
delivery = subscription.get(15)
delivery.reject(requeue=False)  # dead-lettered, as after a task's last failure
if sys.argv[4] == "wait":
    assert subscription.wait_sent(5)
os._exit(1)  # the next task crashes the process at once
"""


def test_a_settlement_waited_for_is_not_lost_when_the_process_dies_right_after(
    app: App, broker: Any
) -> None:
    import subprocess
    import sys

    from tests.conftest import BROKER_URL

    queue = app.settings.default_queue
    publish(app, "m1")
    # Given a process that dead-letters a delivery, waits until that is sent, then dies
    subprocess.run(
        [sys.executable, "-c", _SETTLE_THEN_DIE, BROKER_URL, app.settings.namespace, queue,
         "wait"],
        timeout=60, check=False,
    )
    # Then the broker got the reject: the message is parked, not back in the work queue
    wait_until(lambda: broker.depth(dlq_name(queue)) == 1,
               message="the message is in Q.dlq")
    assert broker.depth(queue) == 0


def test_a_consumer_whose_node_dies_consumes_again_from_the_next_node(
    make_app: Callable[..., App],
) -> None:
    from tests.conftest import BROKER_URL
    from tests.support.proxy import TcpProxy

    # Given a worker's consumer with two "nodes" (two proxies to the broker) in broker_url,
    # holding one delivery it has not settled
    with TcpProxy.for_url(BROKER_URL) as node1, TcpProxy.for_url(BROKER_URL) as node2:
        nodes = {node1.port: node1, node2.port: node2}
        app = make_app(prefetch_count=4, delay_backend="tiers",
                       broker_url=[node1.url(BROKER_URL), node2.url(BROKER_URL)])
        subscription = Subscription(
            app.settings, app.topology, [app.settings.default_queue], client_name="taskq test"
        )
        subscription.start()
        try:
            wait_until(lambda: subscription.is_connected, message="the subscription consumes")
            connection: Any = subscription._connection
            first_port = connection._impl.params.port
            publish(app, "m1")
            in_hand = take(subscription, 1)[0]

            # When the node it consumes from dies
            nodes[first_port].cut()

            # Then it consumes again from the other node: the delivery of the dead
            # connection comes back (redelivered), and new messages arrive
            publish(app, "m2")
            again = take(subscription, 2)
            assert sorted(d.message.message_id for d in again) == ["m1", "m2"]
            assert next(d for d in again if d.message.message_id == "m1").is_redelivered
            assert subscription._connection._impl.params.port != first_port  # type: ignore[union-attr]
            in_hand.ack()  # a late ack of the dead channel is a logged no-op
            for delivery in again:
                delivery.ack()
        finally:
            subscription.close()
