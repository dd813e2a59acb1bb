"""What a worker enqueues for a workflow is refused: the store records it, never raises it.

The worker adds a workflow's next step and its ``link_error`` call to the outbox in the
transaction that counts or fails a member. Whatever refuses one of those rows (a check of
the worker's app, the database rejecting the INSERT) must not undo that transaction nor
escape to the worker: the workflow ends ``FAILURE`` with the refusal recorded. On
PostgreSQL a statement that fails aborts the whole transaction, so these tests make the
database itself refuse a statement, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, chain
from taskq.schema import metadata, outbox_table, processed_table
from taskq.workflows import MemberState, WorkflowState
from taskq.workflows.messages import WorkflowMessages
from taskq.workflows.store import MemberCall, Target, WorkflowStore, encode_value, read_members
from taskq.workflows.transactions import in_completion_transaction, in_failure_transaction
from tests import tasks_workflows as wt
from tests.integration.test_workflow_store import bound, clear_outbox, outbox


@pytest.fixture
def app(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app(database_url=database_url)
    metadata.create_all(app.engine)
    return app


def _refused_by_the_database(target: Target) -> None:
    """A statement the database refuses (not an outage): PostgreSQL aborts the transaction."""
    target.execute(sa.text("SELECT * FROM taskq_no_such_table"))


def test_an_errback_the_database_refuses_is_recorded_on_the_failed_workflow(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    add, errback = bound(app, wt.add), bound(app, wt.errback)
    result = chain(add.s(1, 1), add.s(2)).apply_async(link_error=errback.s("/tmp/runs"))
    first = result.members()[0]
    clear_outbox(app)
    messages = WorkflowMessages(app)

    def refuse_errback(target: Target, *_: Any) -> None:
        _refused_by_the_database(target)

    store = WorkflowStore(messages.enqueue_step, refuse_errback)
    in_failure_transaction(app.engine, first.task_id, lambda conn: store.member_failed(
        conn, first.task_id, "ValueError: bad input", None))

    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    assert record.failed_task_id == first.task_id
    assert record.error is not None and record.error.startswith("ValueError: bad input; ")
    assert f"its link_error {wt.errback.name} for queue {app.settings.default_queue!r} was " \
           "not enqueued (" in record.error
    assert "taskq_no_such_table" in record.error
    assert outbox(app) == []
    assert [m.state for m in read_members(app.engine, result.id)] == [
        MemberState.FAILURE, MemberState.PENDING]
    assert any(f"its link_error {wt.errback.name}" in r.getMessage() for r in caplog.records)


def test_an_errback_refused_by_any_error_is_recorded_and_not_raised(app: App) -> None:
    add, errback = bound(app, wt.add), bound(app, wt.errback)
    result = chain(add.s(1, 1), add.s(2)).apply_async(link_error=errback.s("/tmp/runs"))
    first = result.members()[0]
    messages = WorkflowMessages(app)

    def broken(*_: Any) -> None:
        raise RuntimeError("a bug in what builds the errback")

    store = WorkflowStore(messages.enqueue_step, broken)
    in_failure_transaction(app.engine, first.task_id, lambda conn: store.member_failed(
        conn, first.task_id, "KeyError: x", None))

    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    assert record.error is not None
    assert "was not enqueued (RuntimeError: a bug in what builds the errback)" in record.error


def test_a_next_step_the_database_refuses_fails_the_workflow_not_the_member(app: App) -> None:
    add, tsum, errback = bound(app, wt.add), bound(app, wt.tsum), bound(app, wt.errback)
    # the second step's outbox row is written, then the database refuses a statement: the
    # row must not stay
    result = chain(add.s(1, 1), tsum.s(), add.s(5)).apply_async(
        link_error=errback.s("/tmp/runs"))
    first, second = result.members()[:2]
    clear_outbox(app)
    messages = WorkflowMessages(app)
    calls: list[str] = []

    def refuse_second_step(
        target: Target, workflow_id: str, step: Sequence[MemberCall], previous: Any,
        has_previous: bool,
    ) -> None:
        calls.extend(call.task_id for call in step)
        messages.enqueue_step(target, workflow_id, step, previous, has_previous)
        _refused_by_the_database(target)

    store = WorkflowStore(refuse_second_step, messages.enqueue_errback)
    counted = in_completion_transaction(
        app.engine, first.task_id, wt.add.name,
        lambda conn: store.member_succeeded(conn, first.task_id, encode_value(2, wt.add.name)))

    assert counted
    assert calls == [second.task_id]
    members = read_members(app.engine, result.id)
    assert [m.state for m in members] == [
        MemberState.SUCCESS, MemberState.FAILURE, MemberState.PENDING]
    assert members[0].result == 2
    assert members[1].error is not None
    assert f"its message for queue {app.settings.default_queue!r} could not be enqueued" in (
        members[1].error)
    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    assert record.failed_task_id == second.task_id
    # the step's own row was rolled back with its savepoint; the errback's row is there,
    # and the member's key committed with its count
    assert [(task, args[:2]) for _, task, args, _ in outbox(app)] == [
        (wt.errback.name, [result.id, second.task_id])]
    with app.engine.connect() as conn:
        keys = conn.execute(sa.select(processed_table.c.key)).scalars().all()
        assert keys == [first.task_id]
        assert conn.execute(sa.select(sa.func.count()).select_from(outbox_table)
                            ).scalar_one() == 1


def test_a_next_step_refused_inside_a_transactional_members_session_keeps_its_writes(
    app: App,
) -> None:
    # A transactional member counts in its own Session, before that commits: a refusal of
    # the next step rolls back only its savepoint, and the member's writes and key commit.
    add = bound(app, wt.add)
    result = chain(add.s(1, 1), add.s(2)).apply_async()
    first = result.members()[0]
    clear_outbox(app)
    messages = WorkflowMessages(app)

    def refuse(target: Target, *_: Any) -> None:
        _refused_by_the_database(target)

    store = WorkflowStore(refuse, messages.enqueue_errback)
    with Session(app.engine) as session:
        session.execute(processed_table.insert().values(
            key=first.task_id, task=wt.add.name, finished_at=sa.func.now()))
        assert store.member_succeeded(session, first.task_id, encode_value(2, wt.add.name))
        session.commit()

    assert [m.state for m in read_members(app.engine, result.id)] == [
        MemberState.SUCCESS, MemberState.FAILURE]
    record = result.record()
    assert record is not None and record.state is WorkflowState.FAILURE
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(processed_table.c.key)).scalars().all() == [first.task_id]
