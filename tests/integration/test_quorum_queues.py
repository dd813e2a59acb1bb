"""Quorum queues on the test broker: a message that hits x-delivery-limit says why it is parked.

RabbitMQ itself dead-letters such a message (no worker put taskq-error-* headers on it), so
``taskq dlq list`` reads the broker's reason from ``x-first-death-reason``.
"""

from __future__ import annotations

from typing import Any

from taskq import dlq
from tests.support.waiting import wait_until


def test_a_message_over_the_delivery_limit_is_parked_with_the_reason(
    make_app: Any, broker: Any
) -> None:
    # Given a quorum queue with a delivery limit of 2, and a task published to it
    app = make_app()
    queue = f"{app.settings.namespace}.billing"
    app.queue(queue, type="quorum", delivery_limit=2)

    @app.task(queue=queue)
    def charge() -> None: ...

    task_id = charge.delay().id

    # When it is delivered and put back more often than that (as dying processes and nodes do)
    def deliver_and_requeue() -> bool:
        method, _, _ = broker.channel.basic_get(queue)
        if method is not None:
            broker.channel.basic_reject(method.delivery_tag, requeue=True)
        return broker.depth(f"{queue}.dlq") == 1

    wait_until(deliver_and_requeue, timeout_s=10, message="the message in the dlq")

    # Then the parked message names the broker's reason and what it means
    [info] = dlq.list_parked(app, queue)
    assert info.task_id == task_id
    assert info.error_type == "broker:delivery_limit"
    assert info.error is not None and "x-delivery-limit" in info.error
