"""A workflow message the worker cannot enqueue: a failure while handling a failure.

A worker enqueues a workflow's later steps and its ``link_error`` itself, through the outbox,
in the transaction that counts or fails a member. What it enqueues can be refused there and
only there: a worker whose app declares a queue differently than the producer's (a rolling
deploy), a previous step's result too large for the next message. Such a refusal must never
stop the worker, dead-letter the member twice or run it again: the workflow ends ``FAILURE``
with the refusal recorded, and the worker goes on with the next message.

Real ``taskq worker`` processes (with their relay), RabbitMQ and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App, TaskFailed, chain
from taskq.broker.topology import dlq_name
from taskq.schema import outbox_table
from taskq.workflows import MemberState, WorkflowState
from tests import tasks_workflow_faults as ft
from tests.support.waiting import wait_until
from tests.system.test_workflows import bound, count
from tests.system.workers import Worker, count_runs
from tests.tasks import read_lines

APP_PATH = "tests.tasks_workflow_faults:app"


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str) -> App:
    """The producer's App on PostgreSQL (the workers use the same database)."""
    return make_app(database_url=postgres_url)


def _workers(start_worker: Callable[..., Worker], env: dict[str, str] | None = None) -> Worker:
    worker = start_worker("-c", "2", relay=True, app_path=APP_PATH, loglevel="INFO", env=env)
    worker.wait_consuming(2)
    return worker


def _wait_idle(app: App, broker: Any, worker: Worker) -> None:
    queue = app.settings.default_queue
    wait_until(
        lambda: count(app, outbox_table) == 0 and broker.depth(queue) == 0,
        timeout_s=30, message=lambda: f"an idle queue; log:\n{worker.log()[-4000:]}",
    )


def _assert_worker_goes_on(app: App, worker: Worker, runs: str) -> None:
    """No process stopped: the supervisor lives and a new chain runs to its end."""
    step = bound(app, ft.step)
    assert chain(step.s(0, runs, "after1"), step.s(runs, "after2")).apply_async().get(
        timeout_s=30) == 2
    assert worker.process.poll() is None, worker.log()[-4000:]
    assert "cannot run (configuration)" not in worker.log()
    assert "exiting so that the supervisor replaces it" not in worker.log()


def test_a_link_error_the_worker_cannot_enqueue_fails_the_workflow_once(
    app: App, make_app: Callable[..., App], start_worker: Callable[..., Worker], runs: str,
    broker: Any, namespace: str,
) -> None:
    # Given a producer that sends link_error to a plain queue, and workers whose app declares
    # that queue ordered (so the errback, which has no ordering key, cannot be enqueued there)
    errbacks = f"{namespace}.errbacks"
    app.queue(errbacks)
    make_app("worker-view").queue(errbacks, partitions=2)  # deletes its partitions after
    step, boom, errback = bound(app, ft.step), bound(app, ft.boom), bound(app, ft.errback)
    worker = _workers(start_worker, {"TASKQ_TEST_ORDERED_QUEUE": errbacks})

    # When a member of the chain fails for good
    result = chain(step.s(0, runs, "first"), boom.s(runs, "second"), step.s(runs, "third")
                   ).apply_async(link_error=errback.s(runs).set(queue=errbacks))

    # Then the workflow fails once, naming the member and the errback that could not go
    with pytest.raises(TaskFailed) as failed:
        result.get(timeout_s=30)
    members = result.members()
    assert failed.value.task_id == members[1].task_id  # type: ignore[attr-defined]
    assert "ValueError: boom in second" in str(failed.value)
    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    assert record.error is not None
    assert f"link_error {ft.errback.name} for queue {errbacks!r} was not enqueued" in (
        record.error)
    assert "ConfigurationError" in record.error
    _wait_idle(app, broker, worker)
    # the member ran once and was dead-lettered once; the errback never ran
    assert sorted(line[1] for line in read_lines(runs) if line[0] == "ran") == [
        "first", "second"]
    assert broker.depth(dlq_name(app.settings.default_queue)) == 1
    assert count_runs(runs, "errback") == 0
    assert [m.state for m in members] == [
        MemberState.SUCCESS, MemberState.FAILURE, MemberState.PENDING]
    log = worker.log()
    assert f"its link_error {ft.errback.name} for queue {errbacks!r}" in log
    # and the workers go on
    _assert_worker_goes_on(app, worker, runs)


def test_a_step_whose_message_is_too_large_fails_the_workflow_not_the_member(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any,
) -> None:
    # Given workers whose messages may carry 64 KiB
    limit = 64 * 1024
    big, step, errback = bound(app, ft.big), bound(app, ft.step), bound(app, ft.errback)
    worker = _workers(start_worker, {"TASKQ_MAX_MESSAGE_SIZE_BYTES": str(limit)})

    # When a member returns more than that for the next step's message
    result = chain(big.s(runs, 2 * limit), step.s(runs, "second")).apply_async(
        link_error=errback.s(runs))

    # Then the member succeeded (ran once, not dead-lettered); the next step failed the
    # workflow with the refusal, and link_error ran once for it
    with pytest.raises(TaskFailed) as failed:
        result.get(timeout_s=30)
    members = result.members()
    assert [m.state for m in members] == [MemberState.SUCCESS, MemberState.FAILURE]
    assert failed.value.task_id == members[1].task_id  # type: ignore[attr-defined]
    assert failed.value.exc_type == "MessageTooLarge"  # type: ignore[attr-defined]
    assert f"for queue {app.settings.default_queue!r}" in str(failed.value)
    assert members[1].error is not None and "max_message_size_bytes" in members[1].error
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-4000:]}")
    _wait_idle(app, broker, worker)
    assert count_runs(runs, "errback") == 1
    errback_line = next(line for line in read_lines(runs) if line[0] == "errback")
    assert errback_line[1:4] == [result.id, members[1].task_id, "MessageTooLarge"]
    assert [line[1] for line in read_lines(runs) if line[0] == "ran"] == ["big"]
    assert broker.depth(dlq_name(app.settings.default_queue)) == 0
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(outbox_table)
                            ).scalar_one() == 0
    _assert_worker_goes_on(app, worker, runs)
