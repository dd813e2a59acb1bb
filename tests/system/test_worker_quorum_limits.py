"""`taskq worker` on quorum queues: the broker's consumer timeout and delivery limit.

RabbitMQ 4.3 enforces the consumer timeout only on quorum queues, by cancelling the stuck
consumer and handing its messages out again (no channel close); a consumer may ask for its
own timeout (``x-consumer-timeout``). Quorum queues also count failed deliveries against a
delivery limit (20 by default on 4.x). These tests run on the test broker; the consumer
timeout ones need 4.3 (``TASKQ_TEST_BROKER_URL=amqp://guest:guest@127.0.0.1:5673/%2F``),
the crash-loop one runs on both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from taskq import App
from taskq.broker.versions import BrokerVersion
from tests import consumer_timeout_tasks, tasks
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs, dead_letters, send

pytestmark = pytest.mark.slow

# What the workers of these tests are told the consumer timeout is (seconds).
SHORT_TIMEOUT = "3"


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    """The test's App, its default queue a quorum queue (as its workers are told)."""
    return make_app(default_queue_type="quorum")


@pytest.fixture
def quorum_worker(start_worker: Callable[..., Worker]) -> Callable[..., Worker]:
    def start(*args: str, env: dict[str, str] | None = None, **options: Any) -> Worker:
        return start_worker(*args, env={"TASKQ_DEFAULT_QUEUE_TYPE": "quorum", **(env or {})},
                            **options)

    return start


def _version(broker: Any) -> BrokerVersion:
    broker.channel  # noqa: B018 - connects
    return BrokerVersion.from_server_properties(broker._connection._impl.server_properties)


def _need_consumer_timeout_cancels(broker: Any) -> None:
    version = _version(broker)
    if not version.consumer_timeout_cancels:
        pytest.skip(f"the test broker is {version}: a consumer timeout closes the channel "
                    "there (tests/system/test_ordered_connection_loss.py covers it)")


def test_a_task_past_the_consumer_timeout_of_a_quorum_queue_ends_once_and_never_loops(
    app: App, quorum_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    _need_consumer_timeout_cancels(broker)
    queue = app.settings.default_queue
    # Given two worker processes of an app without time limits, whose quorum consumers
    # therefore ask for a consumer timeout of consumer_timeout_s: 3 s
    worker = quorum_worker("-c", "2", env={"TASKQ_CONSUMER_TIMEOUT_S": SHORT_TIMEOUT},
                           app_path="tests.consumer_timeout_tasks:app")
    worker.wait_consuming(2)
    # When a task without time limit, idempotency check or retries runs for 30 s
    result = send(app, consumer_timeout_tasks.slow_unkeyed, runs, 30, "long")

    # Then the broker takes it back after 3 s, the run is ended and the message lands in
    # Q.dlq with the reason, naming the task, the queue and the setting to change
    letters = dead_letters(broker, queue, 1, timeout_s=25)
    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "TimeLimitExceeded"
    error = headers["taskq-error"]
    assert "tests.consumer_timeout_tasks.slow_unkeyed" in error and repr(queue) in error, error
    assert "consumer timeout" in error and "TASKQ_CONSUMER_TIMEOUT_S" in error, error
    # it ran once (the copy the broker handed out again did not run beside it), never ended
    assert count_runs(runs, "start") == 1
    assert count_runs(runs, "done") == 0
    wait_until(lambda: broker.depth(queue) == 0, timeout_s=10, message="nothing left")
    log = worker.log()
    assert f"cancelled the consumer of quorum queue {queue!r}" in log
    assert "x-consumer-timeout=3s" in log
    assert "node failover" not in log
    # and the worker goes on: its processes were replaced and a later task runs
    send(app, consumer_timeout_tasks.record, runs, "after")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=20, message=worker.log)
    assert count_runs(runs, "start") == 1


def test_a_task_within_its_time_limit_outlives_a_shorter_consumer_timeout(
    app: App, quorum_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    _need_consumer_timeout_cancels(broker)
    # Given a worker told the consumer timeout is 3 s, and a task whose hard limit is 20 s
    worker = quorum_worker("-c", "1", env={"TASKQ_CONSUMER_TIMEOUT_S": SHORT_TIMEOUT})
    worker.wait_consuming(1)
    # When the task runs for 6 s
    send(app, tasks.slow_limited, runs, 6, "long")

    # Then its consumer asked for a timeout above its longest hold, and it ran once, to the end
    wait_until(lambda: count_runs(runs, "done") == 1, timeout_s=30, message=worker.log)
    log = worker.log()
    assert "for a consumer timeout of" in log and "(x-consumer-timeout)" in log
    assert count_runs(runs, "start") == 1
    assert "cancelled the consumer" not in log
    wait_until(lambda: broker.depth(app.settings.default_queue) == 0, timeout_s=10)


def test_a_message_that_keeps_killing_its_process_on_a_quorum_queue_lands_in_its_dlq(
    app: App, quorum_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    queue = app.settings.default_queue
    # Given a quorum work queue (on 4.x the broker counts each death of a process holding a
    # message against the queue's delivery limit)
    quorum_worker("-c", "2")
    # When a message kills its worker process each time it runs
    result = send(app, tasks.crash, runs)

    # Then after max_process_deaths (3) it is in Q.dlq with taskq's reason, not dropped or
    # dead-lettered by the broker's delivery limit
    letters = dead_letters(broker, queue, 1, timeout_s=40)
    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "ProcessCrashLoop"
    assert headers["taskq-attempts"] == 3
    assert "x-death" not in headers  # not the broker's dead-lettering
    assert count_runs(runs, "crash") == 3
    # and the broker counted the same three failed deliveries (4.x: x-delivery-count)
    if _version(broker).is_4x:
        assert headers.get("x-delivery-count") == 3, headers
    wait_until(lambda: broker.depth(queue) == 0, timeout_s=10, message="nothing left")
