"""`taskq inspect ID`: every state a task can be in, reached for real, read by the real CLI.

The command runs as ``python -m taskq inspect`` with the test's ``TASKQ_*`` variables, like
a user's shell, against the shared broker (``TASKQ_TEST_BROKER_URL`` picks 3.10 or 4.3) and
the test's own SQLite file. Delays use the plugin-free tiers, which the lookup can read.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session

from taskq import App, ResultNotKept, TaskFailed
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, count_runs, declare_topology, send

EXIT_UNKNOWN = 3


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    made = make_app(delay_backend="tiers")  # the tiers can be read; the plugin's store cannot
    made.create_tables()
    return made


def _env(app: App) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": app.settings.broker_url,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url, "TASKQ_DELAY_BACKEND": "tiers",
    }


def inspect(app: App, task_id: str, *args: str) -> tuple[int, dict[str, Any], str]:
    """``taskq inspect ID --json`` and the same without ``--json``: (exit, document, text)."""
    env = _env(app)
    command = [sys.executable, "-m", "taskq", "inspect", "-A", "tests.tasks:app", task_id,
               *args]
    as_json = subprocess.run([*command, "--json"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    as_text = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
    assert as_json.returncode == as_text.returncode, (as_json.stderr, as_text.stderr)
    return as_json.returncode, json.loads(as_json.stdout), as_text.stdout


def state_of(app: App, task_id: str) -> str:
    """The state ``taskq inspect ID --json`` prints."""
    done = subprocess.run(
        [sys.executable, "-m", "taskq", "inspect", "-A", "tests.tasks:app", task_id, "--json"],
        cwd=ROOT, env=_env(app), capture_output=True, text=True, timeout=60,
    )
    return str(json.loads(done.stdout)["state"])


def test_waiting_queued_delayed_and_unknown_without_a_worker(app: App, runs: str) -> None:
    # Given no worker: one task committed to the outbox (no relay runs), one published now,
    # one published to run in an hour
    declare_topology(app)
    with Session(app.engine) as session, session.begin():
        waiting = send(app, tasks.record, runs, session=session)
    queued = send(app, tasks.record, runs)
    delayed = send(app, tasks.record, runs, countdown=3600)

    # When taskq inspect is asked about each, and about an id nobody ever used
    code_w, waiting_doc, waiting_text = inspect(app, waiting.id)
    code_q, queued_doc, queued_text = inspect(app, queued.id)
    code_d, delayed_doc, delayed_text = inspect(app, delayed.id)
    made_up = str(uuid.uuid4())
    code_u, unknown_doc, unknown_text = inspect(app, made_up)

    # Then each says where it is, and only the made-up id exits non-zero
    assert (code_w, waiting_doc["state"], waiting_doc["queue"]) == (
        0, "WAITING", app.settings.default_queue)
    assert "waiting in the outbox" in waiting_text
    assert (code_q, queued_doc["state"], queued_doc["queue"]) == (
        0, "QUEUED", app.settings.default_queue)
    assert "position 1" in queued_text
    assert (code_d, delayed_doc["state"]) == (0, "DELAYED")
    assert delayed_doc["due_at"] is not None and "delayed until" in delayed_text
    assert (code_u, unknown_doc["state"]) == (EXIT_UNKNOWN, "UNKNOWN")
    assert f"{made_up}: UNKNOWN" in unknown_text
    assert any("worker holds" in note for note in unknown_doc["notes"])
    # and looking did not take anything out of the queue
    assert state_of(app, queued.id) == "QUEUED"


def test_each_outcome_of_a_worker_is_told_by_inspect(
    app: App, runs: str, start_worker: Any
) -> None:
    # Given a worker with two processes and tasks that end every way a task can end
    worker = start_worker("-c", "2", env={"TASKQ_DELAY_BACKEND": "tiers"}, loglevel="INFO")
    kept = send(app, tasks.add, 2, 3)
    plain = send(app, tasks.record, runs, "plain")
    unkeyed = send(app, tasks.record_unkeyed, runs, "unkeyed")
    failed = send(app, tasks.fail, runs)
    rejected = send(app, tasks.reject, runs)
    key = f"order-{uuid.uuid4().hex[:8]}"
    first = send(app, tasks.record, runs, "first", idempotency_key=key)
    assert kept.get(timeout_s=30) == 5
    wait_until(lambda: count_runs(runs, "ran") == 3, timeout_s=60,
               message="three record runs")
    second = send(app, tasks.record, runs, "second", idempotency_key=key)
    wait_until(lambda: "is a duplicate" in worker.log(), timeout_s=60,
               message="the duplicate skipped")
    wait_until(lambda: state_of(app, rejected.id) == "DEAD", timeout_s=20)

    # When taskq inspect is asked about each
    answers = {name: inspect(app, result.id) for name, result in {
        "kept": kept, "plain": plain, "unkeyed": unkeyed, "failed": failed,
        "rejected": rejected, "first": first, "second": second}.items()}

    # Then each has its own state, said in words, and all exit 0
    assert {name: (code, doc["state"]) for name, (code, doc, _) in answers.items()} == {
        "kept": (0, "SUCCESS"), "plain": (0, "SUCCESS"), "unkeyed": (0, "SUCCESS"),
        "failed": (0, "FAILURE"), "rejected": (0, "DEAD"), "first": (0, "SUCCESS"),
        "second": (0, "SKIPPED"),
    }
    assert answers["kept"][1]["result"] == "5"
    for name in ("plain", "unkeyed"):
        assert "no value kept: set store_result=True" in answers[name][2]
        assert answers[name][1]["worker"].startswith(socket.gethostname())
    dlq = f"{app.settings.default_queue}.dlq"
    assert answers["failed"][1]["dead_letter_queue"] == dlq
    assert "ValueError: the answer is not 42" in answers["failed"][2]
    assert answers["rejected"][1]["dead_letter_queue"] == dlq
    assert f"a duplicate of idempotency key '{key}'" in answers["second"][2]

    # And AsyncResult answers at once for tasks that keep no result
    with pytest.raises(ResultNotKept, match="no value kept: set store_result=True"):
        plain.get(timeout_s=30)
    with pytest.raises(TaskFailed, match="not 42"):
        failed.get(timeout_s=30)
    assert plain.state.value == "SUCCESS" and second.state.value == "SKIPPED"


def test_started_where_and_when_then_retrying_with_the_next_attempt(
    app: App, runs: str, start_worker: Any
) -> None:
    # Given a worker running a task that waits for a go-ahead, and one whose first attempt
    # fails and is retried two minutes later
    # (prefetch 1: the process that holds the first must not hold the second as well)
    start_worker("-c", "2", env={"TASKQ_DELAY_BACKEND": "tiers", "TASKQ_PREFETCH_COUNT": "1"},
                 loglevel="INFO")
    running = send(app, tasks.blocked, runs, "held")
    retried = send(app, tasks.fail_then_retry_in_two_minutes, runs)
    wait_until(lambda: count_runs(runs, "start") == 1, timeout_s=60,
               message="the blocked task started")
    wait_until(lambda: count_runs(runs, "failed") == 1, timeout_s=60,
               message="the first attempt")

    # When inspect is asked while the first runs and the second waits for its retry
    wait_until(lambda: state_of(app, running.id) == "STARTED", timeout_s=30)
    _, started, started_text = inspect(app, running.id)
    wait_until(lambda: state_of(app, retried.id) == "RETRY", timeout_s=30)
    _, retrying, retrying_text = inspect(app, retried.id)

    # Then it says where and since when the first runs, and when the retry is due
    assert started["worker"].startswith(socket.gethostname()) and started["started_at"]
    assert "started at" in started_text and "(attempt 1)" in started_text
    assert retrying["due_at"] is not None and "attempt 2 runs at" in retrying_text
    with open(runs + ".go", "w"):
        pass
    wait_until(lambda: state_of(app, running.id) == "SUCCESS", timeout_s=30)
