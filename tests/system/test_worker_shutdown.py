"""SIGTERM: warm shutdown loses nothing; a second signal or the timeout ends tasks hard."""

from __future__ import annotations

import os
import signal
import time

import pytest

from taskq import App
from taskq.worker.supervisor import DUPLICATE_SIGNAL_WINDOW_S
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send
from tests.tasks import read_lines

pytestmark = pytest.mark.slow


def test_warm_shutdown_finishes_running_tasks_and_loses_nothing(
    app: App, start_worker, runs, broker
):
    queue = app.settings.default_queue
    for i in range(6):
        send(app, tasks.slow, runs, 1.5, str(i))
    worker = start_worker("-c", "2", "--prefetch", "2")
    wait_until(lambda: count_runs(runs, "start") == 2, timeout_s=15)

    # When SIGTERM arrives while two tasks run -- sent as `timeout` or systemd send it, to
    # the supervisor and to its whole process group, so that each process gets it twice...
    worker.signal(signal.SIGTERM)
    os.killpg(worker.pid, signal.SIGTERM)

    # ...both finish and are acked, the rest go back to the queue, and the exit is clean.
    assert worker.wait(20) == 0
    started = {line[1] for line in read_lines(runs) if line[0] == "start"}
    done = {line[1] for line in read_lines(runs) if line[0] == "done"}
    assert len(started) == 2 and done == started
    wait_until(lambda: broker.depth(queue) == 4, message=lambda: f"depth {broker.depth(queue)}")
    # After a restart every task has run exactly once and the queue is empty.
    start_worker("-c", "2")
    wait_until(lambda: count_runs(runs, "done") == 6, timeout_s=20)
    assert sorted(line[1] for line in read_lines(runs) if line[0] == "start") == [
        str(i) for i in range(6)
    ]
    assert broker.depth(queue) == 0


def test_a_second_sigterm_ends_running_tasks_and_their_messages_return(
    app: App, start_worker, runs, broker
):
    queue = app.settings.default_queue
    send(app, tasks.slow, runs, 60, "stuck")
    worker = start_worker("-c", "1")
    wait_until(lambda: count_runs(runs, "start") == 1, timeout_s=15)

    worker.signal(signal.SIGTERM)
    wait_until(lambda: "warm shutdown" in worker.log())
    # A signal repeated within this window is the same request delivered twice.
    time.sleep(DUPLICATE_SIGNAL_WINDOW_S)
    worker.signal(signal.SIGTERM)

    assert worker.wait(10) == 1
    assert count_runs(runs, "done") == 0
    wait_until(lambda: broker.depth(queue) == 1, message="the unfinished message back in Q")


def test_the_shutdown_timeout_ends_running_tasks_and_their_messages_return(
    app: App, start_worker, runs, broker
):
    queue = app.settings.default_queue
    send(app, tasks.slow, runs, 60, "stuck")
    worker = start_worker("-c", "1", "--shutdown-timeout", "1")
    wait_until(lambda: count_runs(runs, "start") == 1, timeout_s=15)

    worker.signal(signal.SIGTERM)

    assert worker.wait(10) == 1
    assert "shutdown timeout (1s) passed" in worker.log()
    wait_until(lambda: broker.depth(queue) == 1, message="the unfinished message back in Q")
