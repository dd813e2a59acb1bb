"""PluginPublisher's confirmed, non-mandatory publishing, on the test broker.

The delayed-message plugin itself may be missing here, so a plain direct exchange stands in
for it: what is tested is the publishing path (confirms without ``mandatory``), which is
what the plugin needs because it returns every mandatory message as unroutable, and the
re-declaring of the queue before every publish. The test marked ``plugin`` runs against
the plugin itself and is skipped, with the reason, where it is missing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskq import App, PublishError
from taskq.broker.delayed import PluginPublisher, declare_now
from taskq.broker.topology import BindingSpec, Declarations, ExchangeSpec, QueueSpec
from taskq.message import WireMessage
from taskq.settings import Settings
from tests.conftest import BROKER_URL
from tests.contract.test_delay_backends import plugin_enabled
from tests.support.waiting import wait_until


@pytest.fixture
def names(broker: Any) -> Iterator[tuple[str, str]]:
    exchange, queue = f"tq{uuid.uuid4().hex[:10]}.ex", f"tq{uuid.uuid4().hex[:10]}.q"
    yield exchange, queue
    broker.delete_queue(queue)
    broker.delete_exchange(exchange)


def stand_in(exchange: str, queue: str) -> Declarations:
    return Declarations(
        exchanges=(ExchangeSpec(exchange, "direct"),),
        queues=(QueueSpec(queue),),
        bindings=(BindingSpec(queue, exchange, queue),),
    )


def test_unroutable_messages_are_confirmed_not_returned(
    names: tuple[str, str], broker: Any
) -> None:
    exchange, queue = names
    settings = Settings(broker_url=BROKER_URL)
    publisher = PluginPublisher(settings, lambda key: stand_in(exchange, queue))
    try:
        # The queue's key routes; "nowhere" does not, and a mandatory publish would be returned.
        publisher.publish_many([
            (exchange, queue, WireMessage(b"1", "m-1")),
            (exchange, "nowhere", WireMessage(b"2", "m-2")),
        ])
        publisher.publish_many([(exchange, queue, WireMessage(b"3", "m-3"))])
    finally:
        publisher.close()

    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["m-1", "m-3"]


def test_a_missing_exchange_is_a_publish_error_not_a_retry(names: tuple[str, str]) -> None:
    exchange, queue = names
    publisher = PluginPublisher(Settings(broker_url=BROKER_URL), lambda key: Declarations())
    try:
        with pytest.raises(PublishError) as caught:
            publisher.publish_many([(exchange, queue, WireMessage(b"1", "m-1"))])
        assert caught.value.reason == "channel_error"  # type: ignore[attr-defined]
        assert caught.value.unconfirmed_ids == ["m-1"]  # type: ignore[attr-defined]
    finally:
        publisher.close()


@pytest.mark.parametrize("recreated", [False, True], ids=["deleted", "recreated-unbound"])
def test_a_queue_that_went_away_gets_later_messages_again(
    names: tuple[str, str], broker: Any, recreated: bool
) -> None:
    # The plugin routes a delayed message only when it is due and returns nothing to a
    # non-mandatory publisher: a publisher that declared the queue once per connection
    # would have every later message dropped once the queue was deleted, or re-created
    # (by an older worker, by hand) without its binding to the delayed exchange.
    exchange, queue = names
    publisher = PluginPublisher(
        Settings(broker_url=BROKER_URL), lambda key: stand_in(exchange, queue)
    )
    try:
        publisher.publish_many([(exchange, queue, WireMessage(b"1", "m-1"))])
        broker.delete_queue(queue)
        if recreated:
            broker.declare_queue(queue)
        publisher.publish_many([(exchange, queue, WireMessage(b"2", "m-2"))])
    finally:
        publisher.close()

    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["m-2"]


@pytest.mark.plugin
def test_with_the_plugin_a_queue_recreated_without_its_binding_gets_later_delays(
    make_app: Callable[..., App], broker: Any
) -> None:
    if not plugin_enabled():
        pytest.skip(
            "rabbitmq_delayed_message_exchange is not enabled on the test broker "
            f"({BROKER_URL.split('@')[-1]}); enable it (rabbitmq-plugins enable "
            "rabbitmq_delayed_message_exchange) to run this test against the plugin"
        )
    app = make_app(delay_backend="plugin")
    queue = app.settings.default_queue
    app.publish_delayed(WireMessage(b"-", "d-1"), queue=queue, delay_s=0.2)
    wait_until(lambda: broker.depth(queue) == 1, message="the first delayed message")

    # Re-created as a declarer unaware of the plugin would: no binding to ns.delayed.
    broker.delete_queue(queue)
    declare_now(app.settings, app.topology.for_queue(queue))
    app.publish_delayed(WireMessage(b"-", "d-2"), queue=queue, delay_s=0.2)

    wait_until(lambda: broker.depth(queue) == 1, message="the second delayed message")
    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["d-2"]


def test_a_lost_connection_is_published_again_until_publish_timeout(
    names: tuple[str, str], broker: Any
) -> None:
    import threading

    from tests.support.proxy import TcpProxy

    # Given a delayed publisher whose connection is cut, the broker back 1 s later
    exchange, queue = names
    with TcpProxy.for_url(BROKER_URL) as proxy:
        settings = Settings(broker_url=proxy.url(BROKER_URL), publish_timeout_s=10.0)
        publisher = PluginPublisher(settings, lambda key: stand_in(exchange, queue))
        try:
            publisher.publish_many([(exchange, queue, WireMessage(b"1", "m-1"))])
            proxy.cut()
            timer = threading.Timer(1.0, proxy.restore)  # the fault schedule, not a wait
            timer.start()

            # When it publishes meanwhile, it keeps trying and the message gets through
            publisher.publish_many([(exchange, queue, WireMessage(b"2", "m-2"))])
            timer.join()
        finally:
            publisher.close()

    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["m-1", "m-2"]


def test_an_unencodable_header_is_refused_naming_task_and_queue_not_retried(
    names: tuple[str, str], broker: Any
) -> None:
    import time

    # Given a delayed publisher and a batch in which one message has a float header
    exchange, queue = names
    settings = Settings(broker_url=BROKER_URL, publish_timeout_s=30.0)
    publisher = PluginPublisher(settings, lambda key: stand_in(exchange, queue))
    bad = WireMessage(b"2", "m-2", {"taskq-task": "shop.charge", "ratio": 0.5})
    try:
        # When it publishes the batch
        started = time.monotonic()
        with pytest.raises(PublishError) as caught:
            publisher.publish_many([
                (exchange, queue, WireMessage(b"1", "m-1")),
                (exchange, queue, bad),
                (exchange, queue, WireMessage(b"3", "m-3")),
            ])
        took_s = time.monotonic() - started
        # ... and the publisher still works afterwards
        publisher.publish_many([(exchange, queue, WireMessage(b"4", "m-4"))])
    finally:
        publisher.close()

    # Then only that message is refused, at once (no reconnect, no retry), with a reason
    # that names the task, the queue and the message; the others were confirmed
    error = caught.value
    assert error.reason == "unencodable"
    assert error.unconfirmed_ids == ["m-2"]
    assert "shop.charge" in str(error) and queue in str(error) and "m-2" in str(error)
    assert "float" in str(error)
    assert took_s < 5.0
    assert [p.message_id for _, p, _ in broker.get_all(queue)] == ["m-1", "m-3", "m-4"]
