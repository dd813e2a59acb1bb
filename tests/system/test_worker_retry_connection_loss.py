"""A retry whose original delivery is never acked (its connection dropped) loses nothing."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.broker.topology import dlq_name
from tests import tasks
from tests.conftest import on_rabbitmq4_node
from tests.support.rabbitmq4 import Rabbit4
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send

pytestmark = pytest.mark.slow


def _ctl(*args: str) -> str:
    """``rabbitmqctl args...`` of the session's broker (the 4.x node's own, in its root)."""
    if on_rabbitmq4_node():
        return Rabbit4().ctl(*args)
    return subprocess.run(["rabbitmqctl", *args], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def _close_worker_connections(pid: int) -> int:
    """Ask the broker to close the consumer connections of worker process ``pid``."""
    listing = _ctl("-q", "list_connections", "pid", "client_properties")
    closed = 0
    for line in listing.splitlines():
        conn_pid, _, properties = line.partition("\t")
        # client_properties carries connection_name "taskq worker N pid=P host=H"
        if "taskq worker" in properties and f"pid={pid} " in properties:
            _ctl("-q", "close_connection", conn_pid, "test: connection lost")
            closed += 1
    return closed


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl")
def test_connection_lost_before_the_ack_of_a_retried_delivery_loses_nothing(
    app: App, start_worker: Callable[..., Any], runs: str, broker: Any, tmp_path: Path
) -> None:
    # Given a task whose first attempt fails after its consumer connection was dropped
    worker = start_worker("-c", "1", loglevel="INFO")
    worker.wait_consuming(1)
    send(app, tasks.fail_first_attempt, runs)
    wait_until(lambda: count_runs(runs, "attempt0") == 1, timeout_s=30)
    [child] = worker.children()
    assert _close_worker_connections(child) == 1

    # When the attempt fails: its retry is published (own connection), its ack cannot be sent
    Path(runs + ".go").touch()

    # Then the retry runs; the unacked original is redelivered and runs its first attempt
    # again (the allowed duplicate), publishing a second retry copy; that copy carries the
    # same idempotency key, so it is recognised as done and skipped. Nothing is lost.
    wait_until(lambda: count_runs(runs, "ok") >= 1, timeout_s=60,
               message=lambda: f"no retry ran; log:\n{worker.log()}")
    wait_until(lambda: count_runs(runs, "attempt0") == 2, timeout_s=30,
               message=lambda: f"the original was not redelivered:\n{read(runs)}")
    wait_until(lambda: "is a duplicate" in worker.log(), timeout_s=30,
               message=lambda: f"{read(runs)}\n{worker.log()}")
    assert count_runs(runs, "ok") == 1
    assert broker.depth(app.settings.default_queue) == 0
    assert broker.depth(dlq_name(app.settings.default_queue)) == 0


def read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()
