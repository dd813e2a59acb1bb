"""`taskq worker` under faults: long tasks, killed and crashing processes, time limits."""

from __future__ import annotations

import os
import re
import signal

import pytest

from taskq import App
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, dead_letters, send
from tests.tasks import read_lines

pytestmark = pytest.mark.slow


def test_a_task_longer_than_the_heartbeat_timeout_keeps_its_connection(
    app: App, start_worker, runs, broker
):
    # Given a 2 s heartbeat (the broker drops a silent connection after two missed beats)...
    worker = start_worker("-c", "1", env={"TASKQ_HEARTBEAT_S": "2"})
    result = send(app, tasks.slow, runs, 10, "long")

    # ...a 10 s task runs to the end, once, on its first delivery.
    wait_until(lambda: count_runs(runs, "done") == 1, timeout_s=30)
    wait_until(lambda: f"[{result.id}] from {app.settings.default_queue} succeeded" in worker.log())
    log = worker.log()
    assert log.count(f"[{result.id}] from {app.settings.default_queue} (redelivered=") == 0
    assert log.count(f"[{result.id}] received") == 1
    assert f"[{result.id}] received from {app.settings.default_queue} (redelivered=False)" in log
    assert "connection lost" not in log
    assert count_runs(runs, "start") == 1
    assert broker.depth(app.settings.default_queue) == 0


def test_a_process_killed_mid_task_is_replaced_and_the_task_runs_again(
    app: App, start_worker, runs
):
    worker = start_worker("-c", "2")
    worker.wait_consuming(2)
    result = send(app, tasks.slow, runs, 1.5, "victim")
    victim = int(wait_until(lambda: read_lines(runs), timeout_s=15)[0][2])

    os.kill(victim, signal.SIGKILL)

    wait_until(lambda: count_runs(runs, "done") == 1, timeout_s=20)
    assert count_runs(runs, "start") == 2
    assert victim not in {int(line[2]) for line in read_lines(runs) if line[0] == "done"}
    assert f"[{result.id}] received from {app.settings.default_queue} (redelivered=True)" in (
        worker.log()
    )
    wait_until(lambda: len(worker.children()) == 2 and victim not in worker.children())
    assert f"died (signal SIGKILL) while running message {result.id}" in worker.log()


def test_a_message_that_kills_its_process_three_times_is_dead_lettered(
    app: App, start_worker, runs, broker
):
    worker = start_worker("-c", "2")
    result = send(app, tasks.crash, runs)

    letters = dead_letters(broker, app.settings.default_queue, 1, timeout_s=30)

    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "ProcessCrashLoop"
    assert "killed its worker process 3 times" in headers["taskq-error"]
    assert headers["taskq-attempts"] == 3
    assert count_runs(runs, "crash") == 3
    # The worker is still healthy: a good task behind it runs.
    send(app, tasks.record, runs, "after")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=20)
    wait_until(lambda: len(worker.children()) == 2)


def test_a_task_past_its_hard_time_limit_is_killed_dead_lettered_and_replaced(
    app: App, start_worker, runs, broker
):
    worker = start_worker("-c", "1")
    result = send(app, tasks.overrun, runs)
    first = int(wait_until(lambda: read_lines(runs), timeout_s=15)[0][1])

    letters = dead_letters(broker, app.settings.default_queue, 1, timeout_s=20)

    headers = letters[result.id][0].headers
    assert headers["taskq-error-type"] == "TimeLimitExceeded"
    assert "hard time limit of 1s" in headers["taskq-error"]
    assert [line[0] for line in read_lines(runs)] == ["start"]  # never run a second time
    wait_until(lambda: len(worker.children()) == 1 and first not in worker.children())


def test_max_tasks_per_child_recycles_processes_without_losing_tasks(
    app: App, start_worker, runs, broker
):
    worker = start_worker("-c", "2", "--max-tasks-per-child", "5", loglevel="INFO")
    for i in range(30):
        send(app, tasks.record, runs, str(i))

    wait_until(lambda: count_runs(runs) >= 30, timeout_s=40)

    lines = read_lines(runs)
    assert sorted(int(line[1]) for line in lines) == list(range(30))
    pids = [line[2] for line in lines]
    assert len(set(pids)) >= 6
    assert max(pids.count(pid) for pid in set(pids)) <= 5
    wait_until(lambda: len(re.findall(r"\) recycled", worker.log())) >= 5)
    assert broker.depth(app.settings.default_queue) == 0


@pytest.mark.parametrize("task_id", ["nul\x00one", "\x00"])
def test_a_message_whose_id_holds_a_nul_byte_and_kills_its_process_is_dead_lettered(
    app: App, start_worker, runs, broker, task_id
):
    # Given a crashing task whose message id holds a NUL byte (valid UTF-8, valid AMQP):
    # the supervisor must count its deaths under the id the redelivery is looked up by.
    # (A key with NUL cannot be stored in taskq_processed, so the producer gives the key:
    # without one the message would be refused at decode, see test_hostile_messages.)
    worker = start_worker("-c", "2")
    send(app, tasks.crash, runs, task_id=task_id, idempotency_key=f"key-{len(task_id)}")

    letters = dead_letters(broker, app.settings.default_queue, 1, timeout_s=30)

    [(props, _)] = letters.values()
    assert props.message_id == task_id
    assert props.headers["taskq-error-type"] == "ProcessCrashLoop"
    assert count_runs(runs, "crash") == 3
    wait_until(lambda: len(worker.children()) == 2)


def test_a_dead_letter_goes_only_to_its_own_dlq_whatever_cc_header_it_came_with(
    app: App, start_worker, runs, broker
):
    # Given a queue bound to the dead-letter exchange under another queue's name, and a
    # message whose producer asked RabbitMQ to also route it there (sender-selected
    # distribution: a CC header)
    from taskq.broker.topology import dlq_name

    queue = app.settings.default_queue
    stray = f"{app.settings.namespace}.stray"
    start_worker("-c", "1").wait_consuming(1)  # it declared the topology
    channel = broker.channel
    # exclusive: a transient non-exclusive queue is a deprecated feature on RabbitMQ 4.x
    channel.queue_declare(stray, exclusive=True)
    channel.queue_bind(stray, app.topology.dlx, routing_key="other")

    # When its task fails for good (taskq refuses a CC header at enqueue since issue 26, so
    # the message is published as another producer or an older taskq would have sent it)
    import dataclasses

    from taskq.message import encode
    from taskq.task import Task

    bound = Task(app, tasks.fail.fn, name=tasks.fail.name, options=tasks.fail.options)
    wire = encode(bound.envelope((runs,)))
    wire = dataclasses.replace(wire, headers={**wire.headers, "CC": ["other"]})
    app.publisher.publish(wire, exchange=app.topology.exchange, routing_key=queue)

    # Then its dead letter is in Q.dlq, and no copy went where the CC header pointed
    letters = dead_letters(broker, queue, 1)
    [(props, _)] = letters.values()
    assert "CC" not in props.headers
    assert broker.depth(stray) == 0
    assert broker.depth(dlq_name(queue)) == 0  # dead_letters() took it
