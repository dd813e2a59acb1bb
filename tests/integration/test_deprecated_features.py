"""The deprecated-feature check (tests/support/deprecations.py) sees a use on RabbitMQ 4.x.

Each test uses a deprecated feature on purpose, in a vhost of its own on the 4.x node, and
reads the node's log through the same functions as the session's check, with a window of its
own. The lines it caused are excused, and the node is made to warn again afterwards, so that
the session's check neither counts them nor misses a later real use. They run in the sessions
the check watches, those on the 4.x node (``make test``'s 4.3 pass); elsewhere they skip,
saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.conftest import BROKER_URL, on_rabbitmq4_node
from tests.support import deprecations
from tests.support.rabbitmq4 import Rabbit4


@pytest.fixture
def rabbit4() -> Rabbit4:
    if not on_rabbitmq4_node():
        pytest.skip(f"the deprecated-feature check watches sessions on the RabbitMQ 4.x node; "
                    f"this one runs on {BROKER_URL.split('@')[-1]}")
    node = Rabbit4()
    reason = node.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return node


def _transient_non_exclusive_queue(channel: BlockingChannel) -> None:
    channel.queue_declare(f"tq-transient-{uuid.uuid4().hex[:8]}", durable=False,
                          exclusive=False, auto_delete=False)


def _global_qos(channel: BlockingChannel) -> None:
    channel.basic_qos(prefetch_count=5, global_qos=True)


def _what_taskq_does(channel: BlockingChannel) -> None:
    # durable queues, exclusive transient ones, per-consumer prefetch: none is deprecated
    channel.queue_declare(f"tq-durable-{uuid.uuid4().hex[:8]}", durable=True)
    channel.queue_declare("", exclusive=True)
    channel.basic_qos(prefetch_count=5)


@pytest.mark.parametrize(("use", "feature"), [
    (_transient_non_exclusive_queue, "transient_nonexcl_queues"),
    (_global_qos, "global_qos"),
])
def test_the_check_reports_a_deprecated_feature_used_on_the_4x_node(
    rabbit4: Rabbit4, use: Callable[[BlockingChannel], None], feature: str
) -> None:
    with rabbit4.vhost("tqdeprecated") as vhost:
        # Given a window on the node's log, the node's earlier warnings forgotten
        deprecations.forget_warnings(rabbit4)
        window = deprecations.open_window()
        found: list[str] = []
        try:
            # When the broker sees what taskq does, then a use of the deprecated feature
            connection = pika.BlockingConnection(pika.URLParameters(rabbit4.vhost_url(vhost)))
            try:
                _what_taskq_does(connection.channel())
                use(connection.channel())
            finally:
                connection.close()
            found = deprecations.close_window(window, rabbit4)
        finally:
            found = found or deprecations.deprecated_lines(window)
            deprecations.excuse(found)
            deprecations.forget_warnings(rabbit4)

    # Then the check reports that use, and only that one (what taskq does came first)
    assert found and all(f"`{feature}`" in line for line in found), found
