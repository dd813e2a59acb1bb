"""`taskq dlq list|replay|purge` on Q.dlq and the unroutable queue, as subprocesses.

The commands run as ``python -m taskq`` with the test's ``TASKQ_*`` variables, like a user's
shell: an in-process CliRunner would reuse app modules imported with other settings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pika
import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.message import Envelope, encode
from taskq.republish import dead_letter_headers
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, count_runs, dead_letters, declare_topology


def _env(app: App, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": app.settings.broker_url,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
        **extra,
    }


def taskq(app: App, *args: str, stdin: str | None = None, **env: str) -> Any:
    """Run ``python -m taskq dlq ARGS`` with the app's settings in the environment."""
    return subprocess.run(
        [sys.executable, "-m", "taskq", "dlq", *args], cwd=ROOT, env=_env(app, **env),
        input=stdin, capture_output=True, text=True, timeout=60,
    )


def park_dead_letters(app: App, broker: Any, calls: list[tuple[str, str]]) -> None:
    """Put dead letters ``(task_id, task)`` in Q.dlq as a worker would, with an x-death."""
    declare_topology(app)
    queue = app.settings.default_queue
    for task_id, task in calls:
        wire = encode(Envelope(task_id=task_id, task=task, args=[task_id], retries=2))
        headers = dead_letter_headers(
            {**wire.headers, "x-death": [{"count": 1, "queue": queue}]},
            error_type="ValueError", error="boom", traceback=None, attempts=3,
            origin_queue=queue, traceback_max_chars=100,
        )
        headers["x-death"] = [{"count": 1, "queue": queue}]  # as RabbitMQ would add it
        properties = pika.BasicProperties(
            message_id=task_id, headers=headers, delivery_mode=2,
            content_type=wire.content_type, timestamp=wire.timestamp,
        )
        broker.channel.basic_publish(app.topology.dlx, queue, wire.body, properties)
    wait_until(lambda: broker.depth(topo.dlq_name(queue)) == len(calls))


def test_list_shows_dead_letters_without_removing_them(app: App, broker) -> None:
    queue = app.settings.default_queue
    park_dead_letters(app, broker, [("a1", "t.a"), ("a2", "t.a"), ("b1", "t.b")])

    listed = taskq(app, "list", queue, "-A", "tests.tasks:app", "--json")
    table = taskq(app, "list", queue, "-A", "tests.tasks:app", "--limit", "2")

    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [row["task_id"] for row in rows] == ["a1", "a2", "b1"]
    assert rows[0]["task"] == "t.a" and rows[0]["attempts"] == 3
    assert (rows[0]["error_type"], rows[0]["error"]) == ("ValueError", "boom")
    assert rows[0]["destination"] == queue and rows[0]["age_s"] >= 0
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["ID", "TASK", "ATTEMPTS", "AGE", "ERROR"]
    assert "ValueError: boom" in table.stdout and "b1" not in table.stdout
    assert "3 message(s) parked; 2 shown" in table.stdout
    assert broker.depth(topo.dlq_name(queue)) == 3  # nothing was removed


def test_replay_filters_reset_retries_and_drop_failure_headers(app: App, broker) -> None:
    queue = app.settings.default_queue
    dlq = topo.dlq_name(queue)
    park_dead_letters(
        app, broker, [("a1", "t.a"), ("a2", "t.a"), ("a3", "t.a"), ("b1", "t.b"), ("b2", "t.b")]
    )

    by_id = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--id", "b2")
    by_task = taskq(app, "replay", queue, "-A", "tests.tasks:app", "--task", "t.a",
                    "--limit", "2")

    assert by_id.returncode == 0, by_id.stderr
    assert "1 replayed, 4 not selected (left in place)" in by_id.stdout
    assert by_task.returncode == 0, by_task.stderr
    assert "2 replayed" in by_task.stdout
    moved = broker.get_all(queue)
    assert [props.message_id for _, props, _ in moved] == ["b2", "a1", "a2"]
    assert broker.depth(dlq) == 2
    headers = moved[0][1].headers
    assert headers["taskq-retries"] == 0 and headers["taskq-task"] == "t.b"
    assert not {"x-death", "taskq-error-type", "taskq-attempts", "taskq-error"} & set(headers)
    assert moved[0][2] == encode(Envelope(task_id="b2", task="t.b", args=["b2"])).body

    rest = taskq(app, "replay", queue, "-A", "tests.tasks:app")
    assert rest.returncode == 0, rest.stderr
    assert "2 replayed" in rest.stdout
    assert broker.depth(dlq) == 0
    assert sorted(p.message_id for _, p, _ in broker.get_all(queue)) == ["a3", "b1"]


def test_purge_asks_first_and_needs_yes_to_run_unattended(app: App, broker) -> None:
    queue = app.settings.default_queue
    park_dead_letters(app, broker, [("a1", "t.a"), ("a2", "t.a")])

    declined = taskq(app, "purge", queue, "-A", "tests.tasks:app", stdin="n\n")
    assert declined.returncode == 1
    assert f"Delete all 2 message(s) in {topo.dlq_name(queue)}?" in declined.stdout
    assert broker.depth(topo.dlq_name(queue)) == 2

    purged = taskq(app, "purge", queue, "-A", "tests.tasks:app", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert f"purged 2 message(s) from {topo.dlq_name(queue)}" in purged.stdout
    assert broker.depth(topo.dlq_name(queue)) == 0


def test_replay_after_a_deploy_that_registers_the_unknown_task(
    app: App, start_worker, runs, broker
) -> None:
    # Given a worker of the first deploy, which does not know tests.deploy.greet...
    queue = app.settings.default_queue
    old = start_worker("-c", "1")
    greet = Envelope(task_id="greet-1", task="tests.deploy.greet", args=[runs, "world"])
    app.publisher.publish(encode(greet), exchange=app.topology.exchange, routing_key=queue)
    letters = dead_letters(broker, queue, 1)
    assert letters["greet-1"][0].headers["taskq-error-type"] == "TaskNotRegistered"
    old.signal(signal.SIGTERM)
    assert old.wait(30) == 0
    park_again = letters["greet-1"]  # dead_letters() took it off: put it back as it was
    broker.channel.basic_publish(app.topology.dlx, queue, park_again[1], park_again[0])

    # When the next deploy runs and the dead letter is replayed...
    new = start_worker("-c", "1", app_path="tests.tasks_v2:app")
    replayed = taskq(app, "replay", queue, "-A", "tests.tasks_v2:app")

    # ...the task runs once and nothing is left anywhere.
    assert replayed.returncode == 0, replayed.stderr
    assert "1 replayed" in replayed.stdout
    wait_until(lambda: count_runs(runs, "hello") == 1, timeout_s=20,
               message=lambda: f"greet did not run; log:\n{new.log()}")
    assert broker.depth(queue) == 0
    assert broker.depth(topo.dlq_name(queue)) == 0


def test_unroutable_messages_are_listed_replayed_once_routable_and_never_looped(
    app: App, namespace: str, broker
) -> None:
    # Given two messages no queue took: one for a queue a later deploy declares, one for
    # a queue that never comes...
    declare_topology(app)
    later, never = f"{namespace}.later", f"{namespace}.never"
    for task_id, key in (("u1", later), ("u2", never)):
        wire = encode(Envelope(task_id=task_id, task=tasks.record.name, args=["x"]))
        properties = pika.BasicProperties(
            message_id=task_id, headers=wire.headers, delivery_mode=2,
            content_type=wire.content_type,
        )
        broker.channel.basic_publish(app.topology.exchange, key, wire.body, properties)
    unroutable = app.topology.unroutable
    wait_until(lambda: broker.depth(unroutable) == 2)
    try:
        listed = taskq(app, "list", "--unroutable", "-A", "tests.tasks:app", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [(r["task_id"], r["destination"]) for r in json.loads(listed.stdout)] == [
            ("u1", later), ("u2", never)
        ]

        # When the first queue exists and the unroutable queue is replayed (twice)...
        broker.declare_queue(later)
        broker.channel.queue_bind(later, app.topology.exchange, routing_key=later)
        first = taskq(app, "replay", "--unroutable", "-A", "tests.tasks:app")
        second = taskq(app, "replay", "--unroutable", "-A", "tests.tasks:app")

        # ...the routable one moved, the other stayed put, and nothing looped.
        assert first.returncode == 0, first.stderr
        assert "1 replayed" in first.stdout and "1 still unroutable" in first.stdout
        assert "0 replayed" in second.stdout and "1 still unroutable" in second.stdout
        assert [p.message_id for _, p, _ in broker.get_all(later)] == ["u1"]
        assert broker.depth(unroutable) == 1
        purged = taskq(app, "purge", "--unroutable", "-A", "tests.tasks:app", "--yes")
        assert "purged 1 message(s)" in purged.stdout
        assert broker.depth(unroutable) == 0
    finally:
        broker.delete_queue(later)


def test_errors_are_one_line_with_the_password_masked(app: App) -> None:
    unreachable = taskq(
        app, "list", "emails", "-A", "tests.tasks:app",
        TASKQ_BROKER_URL="amqp://guest:s3cret@127.0.0.1:1/%2F",
    )
    missing = taskq(app, "list", "no-such-queue", "-A", "tests.tasks:app")
    both = taskq(app, "list", "emails", "--unroutable", "-A", "tests.tasks:app")

    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("Error: cannot connect to RabbitMQ at amqp://guest:***@")
    assert unreachable.stderr.count("\n") == 1 and "s3cret" not in unreachable.stderr
    assert missing.returncode == 1
    assert "queue 'no-such-queue.dlq' does not exist" in missing.stderr
    assert both.returncode == 2 and "not both" in both.stderr


def test_replay_of_an_empty_dead_letter_queue_is_a_no_op(app: App) -> None:
    declare_topology(app)

    result = taskq(app, "replay", app.settings.default_queue, "-A", "tests.tasks:app")

    assert result.returncode == 0, result.stderr
    assert "0 replayed" in result.stdout


@pytest.mark.slow
def test_an_interrupted_replay_loses_nothing_and_duplicates_at_most_one(
    app: App, broker
) -> None:
    # Given 2000 dead letters...
    queue, dlq = app.settings.default_queue, topo.dlq_name(app.settings.default_queue)
    ids = [f"m{n:04d}" for n in range(2000)]
    park_dead_letters(app, broker, [(task_id, "t.a") for task_id in ids])

    # ...and a replay killed (SIGKILL: no cleanup at all) in the middle of its work...
    process = subprocess.Popen(
        [sys.executable, "-m", "taskq", "dlq", "replay", queue, "-A", "tests.tasks:app"],
        cwd=ROOT, env=_env(app), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: broker.depth(queue) >= 300, timeout_s=60, interval_s=0.005)
    finally:
        process.kill()
        process.wait(10)

    # ...every message is in one queue or the other, and at most one in both.
    wait_until(lambda: broker.depth(queue) + broker.depth(dlq) >= len(ids), timeout_s=10)
    moved = [p.message_id for _, p, _ in broker.get_all(queue)]
    parked = [p.message_id for _, p, _ in broker.get_all(dlq)]
    assert 300 <= len(moved) < len(ids)
    assert set(moved) | set(parked) == set(ids)
    assert len(moved) + len(parked) - len(ids) <= 1
    assert len(set(moved)) == len(moved) and len(set(parked)) == len(parked)
