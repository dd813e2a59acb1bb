"""Chains, groups and chords run by real ``taskq worker`` processes (PostgreSQL, RabbitMQ).

Each test starts workers of ``tests.tasks_workflows:app`` with their outbox relay (the relay
publishes every step after the first) and reads what the workflow tables and the run files
show.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, TaskFailed, chain, chord, group
from taskq.schema import outbox_table, workflow_members_table, workflows_table
from taskq.task import Task
from taskq.workflows import MemberState, WorkflowState
from tests import tasks_workflows as wt
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs
from tests.tasks import read_lines

APP_PATH = "tests.tasks_workflows:app"


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str) -> App:
    """The test's App on PostgreSQL (the workers use the same database)."""
    engine = sa.create_engine(postgres_url)
    wt.effects.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(wt.effects.delete())
    engine.dispose()
    return make_app(database_url=postgres_url)


def bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    """``task`` of tests.tasks_workflows, sending through the test's App."""
    return Task(app, task.fn, name=task.name, options=task.options)


def workers(start_worker: Callable[..., Worker], processes: int = 2) -> Worker:
    worker = start_worker("-c", str(processes), relay=True, app_path=APP_PATH, loglevel="INFO")
    worker.wait_consuming(processes)
    return worker


def count(app: App, table: sa.Table, *where: Any) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where))
                   .scalar_one())


def test_chain_of_three_passes_each_result_to_the_next(
    app: App, start_worker: Callable[..., Worker]
) -> None:
    add, mul = bound(app, wt.add), bound(app, wt.mul)
    workers(start_worker)

    result = chain(add.s(1, 2), mul.s(10), add.s(5)).apply_async()

    assert result.get(timeout_s=30) == 35  # ((1 + 2) * 10) + 5
    assert result.state is WorkflowState.SUCCESS
    members = result.members()
    assert [(m.task, m.state, m.result) for m in members] == [
        (wt.add.name, MemberState.SUCCESS, 3),
        (wt.mul.name, MemberState.SUCCESS, 30),
        (wt.add.name, MemberState.SUCCESS, 35),
    ]


def test_group_of_100_returns_results_in_member_order(
    app: App, start_worker: Callable[..., Worker]
) -> None:
    square = bound(app, wt.square)
    workers(start_worker)

    result = group(square.s(i) for i in range(100)).apply_async()

    assert result.get(timeout_s=60) == [i * i for i in range(100)]
    assert count(app, workflow_members_table,
                 workflow_members_table.c.state == MemberState.SUCCESS.value) == 100


def test_immutable_signature_ignores_the_previous_result(
    app: App, start_worker: Callable[..., Worker]
) -> None:
    add = bound(app, wt.add)
    workers(start_worker, 1)

    result = (add.s(1, 1) | add.si(10, 20) | add.s(1)).apply_async()

    assert result.get(timeout_s=30) == 31


@pytest.mark.slow
def test_chord_of_1000_calls_back_once_with_the_sum(
    app: App, start_worker: Callable[..., Worker], runs: str
) -> None:
    square, total_once = bound(app, wt.square), bound(app, wt.total_once)
    workers(start_worker)

    result = chord(group(square.s(i) for i in range(1000)), total_once.s(runs)).apply_async()

    expected = sum(i * i for i in range(1000))
    assert result.get(timeout_s=120) == expected
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(wt.effects.c.count, wt.effects.c.total)).all()
    assert [tuple(row) for row in rows] == [(1000, expected)]
    assert count_runs(runs, "callback") == 1


def _wait_idle(app: App, broker: Any, worker: Worker) -> None:
    """Wait until the outbox is empty and the queue has nothing ready."""
    queue = app.settings.default_queue
    wait_until(
        lambda: count(app, outbox_table) == 0 and broker.depth(queue) == 0,
        timeout_s=30, message=lambda: f"an idle queue; log:\n{worker.log()[-3000:]}",
    )


def test_failed_member_stops_the_chain_and_link_error_runs_once(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    step, boom, errback = bound(app, wt.step), bound(app, wt.boom), bound(app, wt.errback)
    worker = workers(start_worker)

    result = chain(step.s(0, runs, "first"), boom.s(runs, "second"), step.s(runs, "third")
                   ).apply_async(link_error=errback.s(runs))

    with pytest.raises(TaskFailed) as failed:
        result.get(timeout_s=30)
    members = result.members()
    assert f"member {wt.boom.name} ({members[1].task_id}) failed" in str(failed.value)
    assert "ValueError: boom in second" in str(failed.value)
    assert failed.value.task_id == members[1].task_id  # type: ignore[attr-defined]
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-3000:]}")
    _wait_idle(app, broker, worker)
    assert count_runs(runs, "errback") == 1
    errback_line = next(line for line in read_lines(runs) if line[0] == "errback")
    assert errback_line[1:4] == [result.id, members[1].task_id, "ValueError"]
    assert sorted(line[1] for line in read_lines(runs) if line[0] == "ran") == [
        "first", "second"
    ]
    assert [m.state for m in members] == [
        MemberState.SUCCESS, MemberState.FAILURE, MemberState.PENDING
    ]
    assert result.state is WorkflowState.FAILURE


def test_failed_member_of_a_chord_means_no_callback(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    square, boom = bound(app, wt.square), bound(app, wt.boom)
    total_once, errback = bound(app, wt.total_once), bound(app, wt.errback)
    worker = workers(start_worker)
    header = [square.s(i, runs) for i in range(20)]
    header.insert(7, boom.si(0, runs, "member"))

    result = chord(header, total_once.s(runs)).apply_async(link_error=errback.s(runs))

    with pytest.raises(TaskFailed, match=rf"member {wt.boom.name} .* boom in member"):
        result.get(timeout_s=30)
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-3000:]}")
    _wait_idle(app, broker, worker)
    assert count_runs(runs, "errback") == 1
    assert count_runs(runs, "callback") == 0
    assert count(app, wt.effects) == 0
    assert result.members()[-1].state is MemberState.PENDING


def test_workflow_in_a_rolled_back_transaction_never_runs_committed_it_runs(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    step = bound(app, wt.step)
    worker = workers(start_worker)

    with Session(app.engine) as session:
        rolled_back = chain(step.s(0, runs, "rb1"), step.s(runs, "rb2")).apply_async(
            session=session)
        assert count(app, workflows_table) == 0  # nothing visible before the commit
        session.rollback()
    with Session(app.engine) as session:
        committed = chain(step.s(0, runs, "ok1"), step.s(runs, "ok2")).apply_async(
            session=session)
        session.commit()

    assert committed.get(timeout_s=30) == 2
    _wait_idle(app, broker, worker)
    assert sorted(line[1] for line in read_lines(runs)) == ["ok1", "ok2"]
    assert rolled_back.state is WorkflowState.PENDING
    assert count(app, workflows_table) == 1


def test_a_member_retried_inside_a_chain_then_passes_its_result_on(
    app: App, start_worker: Callable[..., Worker], runs: str
) -> None:
    add, flaky = bound(app, wt.add), bound(app, wt.flaky_step)
    workers(start_worker)

    result = chain(add.s(1, 1), flaky.s(runs, 2), add.s(10)).apply_async()

    assert result.get(timeout_s=60) == 13  # ((1 + 1) + 1) + 10
    assert count_runs(runs) == 3  # two failures retried, then the success


def test_a_rejected_member_stops_the_chain(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    add, refuse, step = bound(app, wt.add), bound(app, wt.refuse), bound(app, wt.step)
    errback = bound(app, wt.errback)
    worker = workers(start_worker)

    result = chain(add.s(1, 1), refuse.s(runs), step.s(runs, "after")).apply_async(
        link_error=errback.s(runs))

    with pytest.raises(TaskFailed, match="failed: Reject: refused on purpose"):
        result.get(timeout_s=30)
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-3000:]}")
    _wait_idle(app, broker, worker)
    assert [line[1] for line in read_lines(runs) if line[0] == "ran"] == ["refuse"]
    assert count_runs(runs, "errback") == 1


@pytest.mark.slow
def test_a_member_over_its_time_limit_fails_the_chord(
    app: App, start_worker: Callable[..., Worker], runs: str, broker: Any
) -> None:
    add, overrun, tsum = bound(app, wt.add), bound(app, wt.overrun), bound(app, wt.tsum)
    errback = bound(app, wt.errback)
    worker = workers(start_worker)

    result = chord([add.s(1, 1), overrun.si(0, runs)], tsum.s()).apply_async(
        link_error=errback.s(runs))

    with pytest.raises(TaskFailed, match=f"member {wt.overrun.name} .* TimeLimitExceeded"):
        result.get(timeout_s=60)
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-3000:]}")
    _wait_idle(app, broker, worker)
    assert count_runs(runs, "errback") == 1
    assert result.members()[-1].state is MemberState.PENDING
