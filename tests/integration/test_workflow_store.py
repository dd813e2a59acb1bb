"""The workflow tables and the join, on SQLite and PostgreSQL, without a broker.

Members are completed the way a worker completes them (:class:`MemberCompletion` in the
transaction that records the key, :meth:`WorkflowHooks.failed` for a dead letter); the
outbox rows show what the relay would publish next.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgpack
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.orm import Session

from taskq import App, chain, chord, group
from taskq.cli import main
from taskq.codec import decode_body
from taskq.errors import IdempotencyError
from taskq.message import WORKFLOW
from taskq.schema import (
    metadata,
    outbox_table,
    processed_table,
    workflow_members_table,
    workflows_table,
)
from taskq.task import Task
from taskq.workflows import MemberState, WorkflowResult, WorkflowState
from taskq.workflows.completion import MemberCompletion, WorkflowHooks
from taskq.workflows.store import prune_workflows, read_members
from tests import tasks_workflows as wt


@pytest.fixture
def app(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app(database_url=database_url)
    metadata.create_all(app.engine)
    return app


def bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    """``task`` on the test's App, registered there: the completions below play the
    worker, which builds each later step from the task it has registered."""
    copy: Task[Any, Any] = Task(app, task.fn, name=task.name, options=task.options)
    app.registry.add(copy)
    return copy


def outbox(app: App) -> list[tuple[str, str, list[Any], dict[str, Any]]]:
    """(task id, task, args, headers) of each outbox row."""
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox_table)).all()
    return [(r.id, r.task, decode_body(r.body)[0],
             msgpack.unpackb(r.headers)) for r in rows]


def clear_outbox(app: App) -> None:
    """What the relay does once it published the rows."""
    with app.engine.begin() as conn:
        conn.execute(outbox_table.delete())


def complete(app: App, task_id: str, task: str, result: Any) -> bool:
    """Complete one member as a worker does: key and count in one transaction."""
    return MemberCompletion(WorkflowHooks(app), task_id, task).record(task_id, task, result)


def test_first_step_is_in_the_outbox_and_each_member_carries_the_workflow(app: App) -> None:
    square, tsum = bound(app, wt.square), bound(app, wt.tsum)

    result = chord(group(square.s(i) for i in range(3)), tsum.s()).apply_async()

    rows = outbox(app)
    assert [(task, args) for _, task, args, _ in rows] == [(wt.square.name, [i]) for i in range(3)]
    assert {headers[WORKFLOW] for *_, headers in rows} == {result.id}
    assert result.state is WorkflowState.RUNNING
    assert [m.state for m in result.members()] == [MemberState.ENQUEUED] * 3 + [
        MemberState.PENDING]


def test_the_last_member_enqueues_the_callback_once_with_results_in_member_order(
    app: App,
) -> None:
    square, tsum = bound(app, wt.square), bound(app, wt.tsum)
    result = chord(group(square.s(i) for i in range(4)), tsum.s()).apply_async()
    members = result.members()
    clear_outbox(app)

    # members finish out of order; a redelivered member (same key) counts once
    for index in (2, 0, 3):
        assert complete(app, members[index].task_id, wt.square.name, index * index)
    assert not complete(app, members[2].task_id, wt.square.name, 4)
    assert outbox(app) == []  # one member still missing: nothing enqueued
    assert complete(app, members[1].task_id, wt.square.name, 1)

    rows = outbox(app)
    assert [(task_id, task, args) for task_id, task, args, _ in rows] == [
        (members[4].task_id, wt.tsum.name, [[0, 1, 4, 9]])
    ]
    assert not complete(app, members[1].task_id, wt.square.name, 1)
    assert len(outbox(app)) == 1
    assert complete(app, members[4].task_id, wt.tsum.name, 14)
    assert result.get(timeout_s=1) == 14


def test_a_counted_member_whose_key_was_pruned_does_not_count_twice(app: App) -> None:
    add = bound(app, wt.add)
    result = group(add.s(1, 1), add.s(2, 2)).apply_async()
    first = result.members()[0]
    assert complete(app, first.task_id, wt.add.name, 2)
    with app.engine.begin() as conn:
        conn.execute(processed_table.delete())

    assert complete(app, first.task_id, wt.add.name, 2)  # the key is recorded again...
    record = result.record()
    assert record is not None and record.remaining == 1  # ...but the member row said done


def test_a_crash_between_finishing_and_counting_leaves_neither(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    add, tsum = bound(app, wt.add), bound(app, wt.tsum)
    result = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply_async()
    members = result.members()
    clear_outbox(app)
    assert complete(app, members[0].task_id, wt.add.name, 2)
    real = WorkflowHooks.count

    def dies(self: WorkflowHooks, target: Any, task_id: str, task: str, value: Any) -> None:
        real(self, target, task_id, task, value)
        raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(WorkflowHooks, "count", dies)
    with pytest.raises(IdempotencyError):
        complete(app, members[1].task_id, wt.add.name, 4)
    monkeypatch.setattr(WorkflowHooks, "count", real)

    assert outbox(app) == []
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(processed_table.c.key)
                            .where(processed_table.c.key == members[1].task_id)).first() is None
    # the redelivery runs the member again and counts it then: the callback once
    assert complete(app, members[1].task_id, wt.add.name, 4)
    assert [args for _, _, args, _ in outbox(app)] == [[[2, 4]]]


def test_a_chain_prepends_results_and_immutable_signatures_ignore_them(app: App) -> None:
    add = bound(app, wt.add)
    result = chain(add.s(1, 2), add.si(10, 20), add.s(5)).apply_async()
    members = result.members()
    clear_outbox(app)

    complete(app, members[0].task_id, wt.add.name, 3)
    assert [args for _, _, args, _ in outbox(app)] == [[10, 20]]
    clear_outbox(app)
    complete(app, members[1].task_id, wt.add.name, 30)
    assert [args for _, _, args, _ in outbox(app)] == [[30, 5]]


def test_a_failed_member_fails_the_workflow_and_enqueues_link_error_once(app: App) -> None:
    add, tsum, errback = bound(app, wt.add), bound(app, wt.tsum), bound(app, wt.errback)
    result = chord([add.s(1, 1), add.s(2, 2), add.s(3, 3)], tsum.s()).apply_async(
        link_error=errback.s("/tmp/runs"))
    members = result.members()
    clear_outbox(app)
    hooks = WorkflowHooks(app)

    hooks.failed(members[1].task_id, "ValueError", "bad input", "Traceback ...")
    hooks.failed(members[1].task_id, "ValueError", "bad input", "Traceback ...")  # again
    hooks.failed(members[2].task_id, "KeyError", "x", None)  # a second member fails

    rows = outbox(app)
    assert [(task, args) for _, task, args, _ in rows] == [
        (wt.errback.name, [result.id, members[1].task_id, "ValueError: bad input", "/tmp/runs"])
    ]
    assert WORKFLOW not in rows[0][3]
    clear_outbox(app)
    assert complete(app, members[0].task_id, wt.add.name, 2)  # a late success: no callback
    assert outbox(app) == []
    assert [m.state for m in read_members(app.engine, result.id)] == [
        MemberState.SUCCESS, MemberState.FAILURE, MemberState.FAILURE, MemberState.PENDING]
    with pytest.raises(Exception, match=rf"member {wt.add.name} \({members[1].task_id}\) "
                       "failed: ValueError: bad input"):
        result.get(timeout_s=1)


def test_an_unstorable_result_fails_the_workflow(app: App) -> None:
    add = bound(app, wt.add)
    result = chain(add.s(1, 1), add.s(2)).apply_async()
    first = result.members()[0]

    assert complete(app, first.task_id, wt.add.name, {1, 2})  # a set: msgpack cannot

    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    assert record.error is not None and record.error.startswith("SerializationError")


def test_a_workflow_in_a_rolled_back_transaction_leaves_no_row(app: App) -> None:
    add = bound(app, wt.add)
    with Session(app.engine) as session:
        result = chain(add.s(1, 1), add.s(1)).apply_async(session=session)
        session.rollback()

    assert isinstance(result, WorkflowResult) and result.state is WorkflowState.PENDING
    with app.engine.connect() as conn:
        for table in (workflows_table, workflow_members_table, outbox_table):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_prune_deletes_finished_workflows_and_their_members_only(app: App) -> None:
    add = bound(app, wt.add)
    done = group(add.s(1, 1)).apply_async()
    running = group(add.s(1, 1), add.s(2, 2)).apply_async()
    complete(app, done.members()[0].task_id, wt.add.name, 2)
    complete(app, running.members()[0].task_id, wt.add.name, 2)

    assert prune_workflows(app.engine, older_than=timedelta(days=1)) == 0
    assert prune_workflows(app.engine, older_than=timedelta(0)) == 1

    assert done.record() is None and done.members() == []
    assert running.state is WorkflowState.RUNNING and len(running.members()) == 2


def test_concurrent_last_members_trigger_the_callback_exactly_once(app: App) -> None:
    # On PostgreSQL the workflow row's lock orders the decrements; SQLite has one writer.
    square, tsum = bound(app, wt.square), bound(app, wt.tsum)
    members_n = 40
    result = chord(group(square.s(i) for i in range(members_n)), tsum.s()).apply_async()
    members = result.members()[:members_n]
    clear_outbox(app)
    barrier = threading.Barrier(members_n)
    errors: list[BaseException] = []

    def finish(index: int) -> None:
        try:
            barrier.wait(10)
            complete(app, members[index].task_id, wt.square.name, index * index)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(members_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert errors == []
    assert [args for _, _, args, _ in outbox(app)] == [[[i * i for i in range(members_n)]]]
    record = result.record()
    assert record is not None and record.remaining == 1 and record.step == 1


def test_inspect_shows_the_members_and_their_states(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    add, tsum = bound(app, wt.add), bound(app, wt.tsum)
    result = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).apply_async()
    members = result.members()
    complete(app, members[0].task_id, wt.add.name, 2)
    module = types.ModuleType("taskq_workflow_probe")
    module.app = App("probe", database_url=app.settings.database_url)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    by_workflow = CliRunner().invoke(main, ["inspect", "-A", "taskq_workflow_probe:app",
                                            result.id])
    by_member = CliRunner().invoke(main, ["inspect", "-A", "taskq_workflow_probe:app",
                                          "--json", "--scan-limit", "0", members[1].task_id])

    assert by_workflow.exit_code == 0, by_workflow.output
    lines = by_workflow.output.splitlines()
    assert f"workflow:    {result.id} (chord)" in lines
    assert "state:       RUNNING" in lines
    assert "step:        1 of 2, waiting for 1 member(s)" in lines
    table = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"])]
    assert [(row[2], row[3]) for row in table] == [
        ("SUCCESS", members[0].task_id), ("ENQUEUED", members[1].task_id),
        ("PENDING", members[2].task_id),
    ]
    assert by_member.exit_code == 0, by_member.output
    data = json.loads(by_member.output)
    assert (data["task_id"], data["workflow_id"]) == (members[1].task_id, result.id)
    assert data["workflow"]["workflow_id"] == result.id
    assert [m["state"] for m in data["workflow"]["members"]] == [
        "SUCCESS", "ENQUEUED", "PENDING"]


def test_db_prune_deletes_workflows_that_finished_before_the_age(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    add = bound(app, wt.add)
    old, recent = group(add.s(1, 1)).apply_async(), group(add.s(2, 2)).apply_async()
    for result in (old, recent):
        complete(app, result.members()[0].task_id, wt.add.name, 2)
    with app.engine.begin() as conn:
        conn.execute(workflows_table.update().where(workflows_table.c.id == old.id).values(
            finished_at=workflows_table.c.created_at - timedelta(days=9)))
    module = types.ModuleType("taskq_workflow_prune_probe")
    module.app = App("probe", database_url=app.settings.database_url)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    pruned = CliRunner().invoke(main, ["db", "prune", "-A", "taskq_workflow_prune_probe:app",
                                       "--older-than", "7d"])
    module.app.close()  # type: ignore[attr-defined]  # `db prune` leaves its app open

    assert pruned.exit_code == 0, pruned.output
    assert "deleted 1 finished workflows (and their members) older than 7 days" in pruned.output
    assert old.record() is None and old.members() == []
    assert recent.state is WorkflowState.SUCCESS and len(recent.members()) == 1
