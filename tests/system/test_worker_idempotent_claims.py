"""Two worker processes holding copies of one idempotent task: it runs once (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from taskq import App
from taskq.broker.topology import dlq_name
from taskq.message import encode
from taskq.task import Task
from tests import tasks_infra
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", ["1", "4"], ids=["one-by-one", "prefetch-batch"])
def test_two_copies_taken_by_two_processes_at_once_run_once(
    make_app: Callable[..., App], postgres_url: str, start_worker: Callable[..., Worker],
    broker: Any, runs: str, prefetch: str,
) -> None:
    # Given two processes that each take one copy of the same idempotent task at once
    app = make_app(database_url=postgres_url)
    worker = start_worker(
        "-c", "2", "--prefetch", prefetch, env={"TASKQ_DATABASE_URL": postgres_url},
        loglevel="INFO", app_path="tests.tasks_infra:app",
    )
    worker.wait_consuming(2)
    bound: Task[Any, Any] = Task(
        app, tasks_infra.slow_mark.fn, name=tasks_infra.slow_mark.name,
        options=tasks_infra.slow_mark.options,
    )
    wire = encode(bound.envelope((runs, 1.0)))
    app.publisher.publish_many([(app.topology.exchange, bound.queue, wire)] * 2)

    # Then one copy runs; the other is sent back while the first holds the key's claim and
    # is acked as a duplicate afterwards
    wait_until(lambda: "is a duplicate" in worker.log() or count_runs(runs, "done") >= 2,
               timeout_s=30, message=worker.log)
    assert count_runs(runs, "start") == 1
    assert count_runs(runs, "done") == 1
    assert broker.depth(app.settings.default_queue) == 0
    assert broker.depth(dlq_name(app.settings.default_queue)) == 0
