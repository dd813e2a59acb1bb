"""A worker process that consumes nothing while alive is noticed by its supervisor and replaced."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable

import pytest

from taskq import App
from taskq.worker.monitoring import stalled_after_s
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs, send

pytestmark = pytest.mark.slow


def test_a_frozen_worker_process_is_replaced_and_its_queue_consumed_again(
    app: App, start_worker: Callable[..., Worker], runs: str
) -> None:
    # Given one worker process, consuming, with 2 s heartbeats (the stall limit counts two)
    worker = start_worker("-c", "1", env={"TASKQ_HEARTBEAT_S": "2"})
    worker.wait_consuming(1)
    (frozen,) = worker.children()
    # When it is frozen (SIGSTOP): alive, its connection open until the broker's heartbeat
    # timeout, consuming nothing
    os.kill(frozen, signal.SIGSTOP)
    # Then its supervisor kills it and starts another within the stall limit,
    limit_s = stalled_after_s(dataclasses.replace(app.settings, heartbeat_s=2))
    wait_until(lambda: worker.children() - {frozen}, timeout_s=limit_s + 15,
               message=lambda: f"never replaced; log:\n{worker.log()}")
    assert "shown no progress of its broker consumer" in worker.log()
    # which runs the queue's tasks
    send(app, tasks.record, runs, "after")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=30, message=worker.log)
