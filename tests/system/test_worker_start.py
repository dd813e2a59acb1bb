"""`taskq worker` start-up errors are clear and end the command with their exit code."""

from __future__ import annotations

from taskq import App


def test_a_queue_declared_with_other_arguments_stops_the_worker_with_exit_code_3(
    app: App, start_worker, broker
):
    queue = app.settings.default_queue
    broker.declare_queue(queue, {"x-max-priority": 3})

    worker = start_worker("-c", "1")

    assert worker.wait(20) == 3
    log = worker.log()
    assert f"queue {queue!r} already exists with other arguments" in log
    assert "'x-max-priority': 10" in log
    assert "Traceback" not in log


def test_an_app_that_cannot_be_imported_stops_the_worker_with_exit_code_2(start_worker):
    worker = start_worker("-A", "tests.no_such_module:app")

    assert worker.wait(20) == 2
    assert "cannot import module 'tests.no_such_module'" in worker.log()
