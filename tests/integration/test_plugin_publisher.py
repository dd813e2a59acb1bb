"""PluginPublisher's confirmed, non-mandatory publishing, on the test broker.

The delayed-message plugin itself may be missing here, so a plain direct exchange stands in
for it: what is tested is the publishing path (confirms without ``mandatory``), which is
what the plugin needs because it returns every mandatory message as unroutable.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from taskq import PublishError
from taskq.broker.delayed import PluginPublisher
from taskq.broker.topology import BindingSpec, Declarations, ExchangeSpec, QueueSpec
from taskq.message import WireMessage
from taskq.settings import Settings
from tests.conftest import BROKER_URL


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
