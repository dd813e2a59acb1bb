"""`taskq worker` runs tasks: each exactly once, by priority, and bad input goes to Q.dlq."""

from __future__ import annotations

import signal

import msgpack
import pika

from taskq import App
from taskq.broker.topology import dlq_name
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, dead_letters, declare_topology, send, send_many
from tests.tasks import read_lines


def test_1000_tasks_on_three_processes_each_run_exactly_once(app: App, start_worker, runs, broker):
    worker = start_worker("-c", "3", loglevel="INFO")
    worker.wait_consuming(3)

    send_many(app, tasks.record, [(runs, str(i)) for i in range(1000)])

    wait_until(lambda: count_runs(runs) >= 1000, timeout_s=60, message="1000 runs")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    lines = read_lines(runs)
    assert sorted(int(line[1]) for line in lines) == list(range(1000))
    assert len({line[2] for line in lines}) == 3  # every process took part
    queue = app.settings.default_queue
    assert (broker.depth(queue), broker.depth(dlq_name(queue))) == (0, 0)


def test_with_a_backlog_higher_priority_tasks_run_first(app: App, start_worker, runs):
    # Given a backlog published while no worker runs: low priorities first, then high.
    for i in range(4):
        send(app, tasks.record, runs, f"low{i}", priority=1)
    for i in range(4):
        send(app, tasks.record, runs, f"high{i}", priority=8)

    start_worker("-c", "1", "--prefetch", "1")

    wait_until(lambda: count_runs(runs) == 8, timeout_s=20)
    order = [line[1] for line in read_lines(runs)]
    assert order == [f"high{i}" for i in range(4)] + [f"low{i}" for i in range(4)]


def test_a_raising_task_is_dead_lettered_with_type_message_and_traceback(
    app: App, start_worker, runs, broker
):
    result = send(app, tasks.fail, runs)
    start_worker("-c", "1")

    letters = dead_letters(broker, app.settings.default_queue, 1)

    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "ValueError"
    assert headers["taskq-error"] == "the answer is not 42"
    assert 'raise ValueError("the answer is not 42")' in headers["taskq-traceback"]
    assert headers["taskq-attempts"] == 1
    assert headers["taskq-origin-queue"] == app.settings.default_queue
    assert headers["taskq-task"] == tasks.fail.name
    assert count_runs(runs, "fail") == 1


def test_a_task_that_rejects_is_dead_lettered_with_its_reason(app: App, start_worker, runs, broker):
    result = send(app, tasks.reject, runs)
    start_worker("-c", "1")

    headers = dead_letters(broker, app.settings.default_queue, 1)[result.id][0].headers

    assert (headers["taskq-error-type"], headers["taskq-error"]) == (
        "Reject", "the order was cancelled"
    )


def test_malformed_messages_are_dead_lettered_and_the_worker_keeps_going(
    app: App, start_worker, runs, broker
):
    queue = app.settings.default_queue
    good_headers = {"taskq-v": 1, "taskq-task": tasks.record.name}
    good_body = msgpack.packb({"args": [runs, "x"], "kwargs": {}})
    bad = {
        "not-msgpack": (b"\xc1\xc1 not msgpack", good_headers),
        "no-headers": (good_body, None),
        "unknown-task": (good_body, {"taskq-v": 1, "taskq-task": "tests.tasks.nope"}),
        "oversized": (msgpack.packb({"args": ["x" * 3000], "kwargs": {}}), good_headers),
    }
    declare_topology(app)
    channel = broker.channel
    for message_id, (body, headers) in bad.items():
        properties = pika.BasicProperties(message_id=message_id, headers=headers)
        channel.basic_publish(app.topology.exchange, queue, body, properties)
    good = send(app, tasks.record, runs, "after-the-bad-ones")

    start_worker("-c", "1", env={"TASKQ_MAX_MESSAGE_SIZE_BYTES": "2000"})

    wait_until(lambda: count_runs(runs) == 1, timeout_s=20)
    letters = dead_letters(broker, queue, 4)
    error_types = {mid: props.headers["taskq-error-type"] for mid, (props, _) in letters.items()}
    assert error_types == {
        "not-msgpack": "DecodeError",
        "no-headers": "DecodeError",
        "unknown-task": "TaskNotRegistered",
        "oversized": "MessageTooLarge",
    }
    assert "taskq-v is missing" in letters["no-headers"][0].headers["taskq-error"]
    assert "tests.tasks.nope" in letters["unknown-task"][0].headers["taskq-error"]
    assert letters["not-msgpack"][1] == b"\xc1\xc1 not msgpack"  # the body, untouched
    assert read_lines(runs)[0][1] == "after-the-bad-ones"
    assert good.id not in letters


def test_soft_time_limit_raises_inside_the_task(app: App, start_worker, runs, broker):
    result = send(app, tasks.soft_overrun, runs)
    start_worker("-c", "1")

    headers = dead_letters(broker, app.settings.default_queue, 1)[result.id][0].headers

    assert [line[0] for line in read_lines(runs)] == ["start", "caught"]
    assert headers["taskq-error-type"] == "SoftTimeLimitExceeded"


