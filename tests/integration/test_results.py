"""ResultStore and AsyncResult on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest

from taskq import App, ResultTimeout, TaskFailed
from taskq.results import AsyncResult, ResultState


@pytest.fixture
def app(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app(database_url=database_url)
    app.create_tables()
    return app


def test_unknown_task_is_pending(app: App) -> None:
    result = app.result("nope")

    assert result.state is ResultState.PENDING
    assert not result.ready()


def test_success_round_trips_the_return_value(app: App) -> None:
    app.results.started("t1", "ship", 0)
    assert app.result("t1").state is ResultState.STARTED

    app.results.succeeded("t1", "ship", 0, {"total": Decimal("12.50"), "items": (1, 2)})

    result = AsyncResult("t1", task="ship", queue="q", app=app)
    assert result.ready()
    assert result.get(timeout_s=1) == {"total": Decimal("12.50"), "items": [1, 2]}
    record = app.results.get("t1")
    assert record is not None and record.started_at and record.finished_at


def test_failure_raises_task_failed_with_the_remote_traceback(app: App) -> None:
    app.results.failed("t2", "ship", 1, state=ResultState.RETRY,
                       error="ValueError: flaky", traceback="Traceback...\nValueError")
    assert not app.result("t2").ready()
    app.results.failed("t2", "ship", 3, state=ResultState.DEAD,
                       error="ValueError: still flaky", traceback="Traceback...\nValueError")

    with pytest.raises(TaskFailed) as info:
        AsyncResult("t2", task="ship", queue="q", app=app).get(timeout_s=1)

    assert info.value.exc_type == "ValueError"  # type: ignore[attr-defined]
    assert info.value.state == "DEAD"  # type: ignore[attr-defined]
    assert "Traceback..." in str(info.value)
    assert "4 attempt(s)" in str(info.value)


def test_get_waits_for_the_result_and_times_out_otherwise(app: App) -> None:
    result = AsyncResult("t3", task="ship", queue="q", app=app)
    with pytest.raises(ResultTimeout, match="no result after 0.2s"):
        result.get(timeout_s=0.2)

    timer = threading.Timer(0.2, app.results.succeeded, args=("t3", "ship", 0, 42))
    timer.start()
    try:
        assert result.get(timeout_s=10, interval_s=0.02) == 42
    finally:
        timer.join()


def test_unencodable_result_is_noted_not_fatal(app: App) -> None:
    app.results.succeeded("t4", "ship", 0, {1, 2})

    record = app.results.get("t4")
    assert record is not None and record.state is ResultState.SUCCESS
    assert record.result is None
    assert record.error and "not stored" in record.error


def test_prune_removes_only_old_finished_results(app: App) -> None:
    app.results.succeeded("old", "ship", 0, 1)
    app.results.started("running", "ship", 0)

    assert app.results.prune(older_than=timedelta(seconds=-1)) == 1
    assert app.results.get("old") is None
    assert app.results.get("running") is not None
