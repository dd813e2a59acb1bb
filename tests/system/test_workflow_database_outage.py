"""A database outage when a workflow member finishes is an infrastructure fault
(docs/reliability.md).

The worker counts a member and adds the next step's outbox rows in one transaction. If the
database goes away in the middle of it (here: the moment the worker sends the INSERT of the
next step's outbox row), nothing of it commits; the member's delivery is held and the write
retried until the database is back: the member is not run again, uses no retry attempt, is
not dead-lettered, and the workflow goes on to its end. The same holds for the ``link_error``
row written while a dead-lettered member fails its workflow.

The workers reach PostgreSQL through a :class:`StatementCutProxy`; the shared server is
never touched. Real ``taskq worker`` processes (with their relay) and RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskq import App, TaskFailed, chain
from taskq.broker.topology import dlq_name
from taskq.workflows import MemberState
from tests import tasks_workflow_faults as ft
from tests.support.statement_cut_proxy import StatementCutProxy
from tests.support.waiting import wait_until
from tests.system.test_workflows import bound
from tests.system.workers import Worker, count_runs
from tests.tasks import read_lines

APP_PATH = "tests.tasks_workflow_faults:app"


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str) -> App:
    """The producer's App, on PostgreSQL directly (only the workers go through the proxy)."""
    return make_app(database_url=postgres_url)


@pytest.fixture
def pg_proxy() -> Iterator[StatementCutProxy]:
    with StatementCutProxy("127.0.0.1", 5432) as proxy:
        yield proxy


def _through(proxy: StatementCutProxy, url: str) -> str:
    assert "@127.0.0.1:5432/" in url
    # Without TLS, so that the proxy can read which statement is sent.
    return url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{proxy.port}/") + "&sslmode=disable"


def test_an_outage_while_the_next_step_is_enqueued_holds_the_member_and_the_chain_completes(
    app: App, pg_proxy: StatementCutProxy, start_worker: Callable[..., Worker], runs: str,
    broker: Any, postgres_url: str,
) -> None:
    # Given a worker whose database connections go through the proxy, armed to cut the
    # moment the next step's outbox row is sent (after the member's key and count were)
    worker = start_worker(
        "-c", "1", relay=True, app_path=APP_PATH, loglevel="INFO",
        env={"TASKQ_DATABASE_URL": _through(pg_proxy, postgres_url)},
    )
    worker.wait_consuming(1)
    pg_proxy.arm(b"INSERT INTO taskq_outbox")
    step = bound(app, ft.step)

    # When the first member finishes and the database goes away mid-transaction
    result = chain(step.s(0, runs, "first"), step.s(runs, "second")).apply_async()
    assert pg_proxy.tripped.wait(30), worker.log()[-4000:]
    wait_until(lambda: "holding the delivery" in worker.log(), timeout_s=30,
               message=lambda: f"the delivery held; log:\n{worker.log()[-4000:]}")
    pg_proxy.restore()

    # Then the chain completes once the database is back: each member ran once, nothing
    # was retried or dead-lettered
    assert result.get(timeout_s=60) == 2, worker.log()[-4000:]
    assert [m.state for m in result.members()] == [MemberState.SUCCESS, MemberState.SUCCESS]
    assert [line[1] for line in read_lines(runs) if line[0] == "ran"] == ["first", "second"]
    assert broker.depth(dlq_name(app.settings.default_queue)) == 0
    log = worker.log()
    assert "WorkerError" not in log
    assert "failed on attempt" not in log  # no retry attempt was used


def test_an_outage_while_link_error_is_enqueued_holds_the_dead_letter_and_calls_it_once(
    app: App, pg_proxy: StatementCutProxy, start_worker: Callable[..., Worker], runs: str,
    broker: Any, postgres_url: str,
) -> None:
    # Given the same worker, the proxy armed to cut when the link_error row is sent
    worker = start_worker(
        "-c", "1", relay=True, app_path=APP_PATH, loglevel="INFO",
        env={"TASKQ_DATABASE_URL": _through(pg_proxy, postgres_url)},
    )
    worker.wait_consuming(1)
    pg_proxy.arm(b"INSERT INTO taskq_outbox")
    boom, step, errback = bound(app, ft.boom), bound(app, ft.step), bound(app, ft.errback)

    # When a member is dead-lettered and the database goes away while its workflow fails
    result = chain(boom.s(0, runs, "first"), step.s(runs, "second")).apply_async(
        link_error=errback.s(runs))
    assert pg_proxy.tripped.wait(30), worker.log()[-4000:]
    wait_until(lambda: "holding the delivery" in worker.log(), timeout_s=30,
               message=lambda: f"the delivery held; log:\n{worker.log()[-4000:]}")
    pg_proxy.restore()

    # Then the workflow fails with the member's own error, link_error runs once, and the
    # member was dead-lettered once
    with pytest.raises(TaskFailed) as failed:
        result.get(timeout_s=60)
    assert failed.value.exc_type == "ValueError"  # type: ignore[attr-defined]
    wait_until(lambda: count_runs(runs, "errback") >= 1, timeout_s=30,
               message=lambda: f"link_error ran; log:\n{worker.log()[-4000:]}")
    wait_until(lambda: broker.depth(app.settings.default_queue) == 0, timeout_s=30,
               message=lambda: f"an idle queue; log:\n{worker.log()[-4000:]}")
    assert count_runs(runs, "errback") == 1
    assert [line[1] for line in read_lines(runs) if line[0] == "ran"] == ["first"]
    assert broker.depth(dlq_name(app.settings.default_queue)) == 1
    assert "WorkerError" not in worker.log()
