"""`taskq worker` retries (docs/delays.md, docs/reliability.md): delayed retries per policy,
then Q.dlq.

Workers use the plugin-free delay tiers (``TASKQ_DELAY_BACKEND=tiers``), as on any broker.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.message import Envelope, encode
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, dead_letters, send
from tests.tasks import read_lines

TIERS = {"TASKQ_DELAY_BACKEND": "tiers"}


def test_a_task_failing_twice_then_succeeding_runs_three_times_and_is_acked(
    app: App, start_worker, runs, broker
) -> None:
    worker = start_worker("-c", "1", env=TIERS)
    queue = app.settings.default_queue
    result = send(app, tasks.flaky, runs, 2)

    wait_until(lambda: f"[{result.id}] from {queue} succeeded" in worker.log(), timeout_s=30,
               message=lambda: f"no success; log:\n{worker.log()}")

    assert count_runs(runs, "flaky") == 3
    log = worker.log()
    assert f"[{result.id}] from {queue} failed on attempt 1 (ConnectionError: run 1" in log
    assert "; retry 2 in 0.200s" in log  # 0.1 s * 2**1, no jitter
    assert broker.depth(queue) == 0
    assert broker.depth(topo.dlq_name(queue)) == 0


def test_exhausted_retries_dead_letter_with_attempts_and_reason(
    app: App, start_worker, runs, broker
) -> None:
    start_worker("-c", "1", env=TIERS)
    result = send(app, tasks.always_down, runs)

    letters = dead_letters(broker, app.settings.default_queue, 1, timeout_s=30)

    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "ConnectionError"
    assert headers["taskq-error"] == "the provider is down"
    assert headers["taskq-attempts"] == 3
    assert headers["taskq-retries"] == 2
    assert "x-death" not in headers
    assert count_runs(runs, "down") == 3


def test_self_retry_with_a_countdown_increments_request_retries(
    app: App, start_worker, runs, broker
) -> None:
    worker = start_worker("-c", "1", env=TIERS)
    queue = app.settings.default_queue
    started = time.monotonic()
    result = send(app, tasks.asks_for_retries, runs, 2)

    wait_until(lambda: f"[{result.id}] from {queue} succeeded" in worker.log(), timeout_s=30,
               message=lambda: f"no success; log:\n{worker.log()}")

    assert [line[1] for line in read_lines(runs)] == ["0", "1", "2"]
    assert time.monotonic() - started >= 0.4  # two countdowns of 0.2 s
    assert worker.log().count("retry 2 in 0.200s") == 1
    assert broker.depth(queue) == 0
    assert broker.depth(topo.dlq_name(queue)) == 0


@pytest.mark.slow
def test_a_hard_time_limit_kill_counts_as_a_failed_attempt(
    app: App, start_worker, runs, broker
) -> None:
    worker = start_worker("-c", "1", env=TIERS)
    result = send(app, tasks.overrun_retried, runs)

    letters = dead_letters(broker, app.settings.default_queue, 1, timeout_s=40)

    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "TimeLimitExceeded"
    assert headers["taskq-attempts"] == 2
    assert headers["taskq-retries"] == 1
    assert count_runs(runs, "start") == 2  # the first run and its one retry
    assert "(TimeLimitExceeded: the task ran past its hard time limit" in worker.log()


@pytest.mark.slow
def test_a_retry_that_cannot_be_published_is_held_and_published_once_repaired(
    app: App, namespace: str, start_worker, runs, broker, tmp_path: Path
) -> None:
    # Given a delay tier that cannot be declared (an exchange of the wrong type), so that
    # publishing any retry fails with a TopologyError...
    blocker = topo.delay_tier_name(namespace, 0, "classic")
    broker.channel.exchange_declare(blocker, exchange_type="fanout", durable=True)
    flag = tmp_path / "provider-is-up"
    try:
        worker = start_worker("-c", "1", env=TIERS)
        queue = app.settings.default_queue
        result = send(app, tasks.down_until, runs, str(flag))

        # ...the failed delivery is held while the publish is retried (never acked, never
        # dead-lettered, and the task body does not run again)...
        wait_until(lambda: worker.log().count("its retry could not be published") >= 2,
                   timeout_s=30, message=lambda: f"no held retry; log:\n{worker.log()}")
        assert broker.depth(topo.dlq_name(queue)) == 0
        assert count_runs(runs, "run") == 1

        # ...and once the broker takes retries again, the retry is published and runs.
        broker.delete_exchange(blocker)
        wait_until(lambda: f"[{result.id}] from {queue} failed on attempt 1" in worker.log(),
                   timeout_s=40, message=lambda: f"no retry; log:\n{worker.log()}")
        flag.touch()  # the retry waits 2 s in the tiers: the provider is up by then
        wait_until(lambda: f"[{result.id}] from {queue} succeeded" in worker.log(),
                   timeout_s=30, message=lambda: f"no success; log:\n{worker.log()}")
    finally:
        _delete_tiers(broker, namespace)

    assert count_runs(runs, "run") == 2  # the failed attempt and its retry, nothing more
    assert broker.depth(queue) == 0
    assert broker.depth(topo.dlq_name(queue)) == 0


@pytest.mark.slow
def test_a_delivery_long_before_its_eta_waits_in_the_broker_not_the_worker(
    app: App, start_worker, runs, broker
) -> None:
    worker = start_worker("-c", "1", env=TIERS)
    worker.wait_consuming(1)
    queue = app.settings.default_queue
    eta = datetime.now(timezone.utc) + timedelta(seconds=3)
    # Published straight to the queue, as a delay backend that delivered early would.
    envelope = Envelope(task_id="early-1", task=tasks.record.name, args=[runs, "x"], eta=eta)
    app.publisher.publish(encode(envelope), exchange=app.topology.exchange, routing_key=queue)

    wait_until(lambda: "[early-1] from" in worker.log() and "before its eta" in worker.log(),
               timeout_s=20, message=lambda: f"not postponed; log:\n{worker.log()}")
    assert count_runs(runs) == 0
    wait_until(lambda: count_runs(runs) == 1, timeout_s=20)

    assert datetime.now(timezone.utc) >= eta
    assert broker.depth(queue) == 0


def _delete_tiers(broker: Any, namespace: str) -> None:
    for level in range(topo.DELAY_TIER_LEVELS):
        name = topo.delay_tier_name(namespace, level, "classic")
        broker.delete_queue(name)
        broker.delete_exchange(name)
