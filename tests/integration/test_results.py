"""ResultStore and AsyncResult on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest

from taskq import App, ResultTimeout, TaskFailed
from taskq.db import create_engine
from taskq.errors import ResultError
from taskq.results import AsyncResult, ResultState, ResultStore
from tests.conftest import postgres_schema, schema_url


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


def test_a_task_id_of_255_bytes_keeps_its_result(app: App) -> None:
    # Task ids may be any AMQP short string (apply_async(task_id=...)), not only uuids.
    task_id = "r" * 255

    app.results.succeeded(task_id, "ship", 0, 7)

    assert app.result(task_id).get(timeout_s=1) == 7


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


# -- final states stay final (docs/reliability.md: a duplicate never changes a finished one) --

FINAL = [ResultState.SUCCESS, ResultState.FAILURE, ResultState.DEAD]


def _finish(store: ResultStore, task_id: str, state: ResultState) -> None:
    if state is ResultState.SUCCESS:
        store.succeeded(task_id, "ship", 1, {"total": 12})
    else:
        store.failed(task_id, "ship", 1, state=state, error="ValueError: no",
                     traceback="Traceback...\nValueError: no")


@pytest.mark.parametrize("final", FINAL, ids=lambda state: state.value)
def test_a_finished_result_is_not_changed_by_a_start_or_retry_of_any_attempt(
    app: App, final: ResultState
) -> None:
    # Given a finished task, and a second store on its own engine (another worker process)
    _finish(app.results, "t5", final)
    before = app.results.get("t5")
    other = ResultStore(create_engine(app.settings.database_url))
    try:
        # When duplicates and stragglers of older, the same and later attempts report in
        for store in (app.results, other):
            for retries in (0, 1, 2, 9):
                store.started("t5", "ship", retries)
                store.failed("t5", "ship", retries, state=ResultState.RETRY,
                             error="ValueError: late", traceback="Traceback...")
    finally:
        other.engine.dispose()

    # Then the stored row is exactly what the attempt that finished wrote
    assert app.results.get("t5") == before
    assert before is not None and before.state is final


@pytest.mark.parametrize("final", FINAL, ids=lambda state: state.value)
def test_a_success_is_never_replaced_even_by_another_final_state(
    app: App, final: ResultState
) -> None:
    app.results.succeeded("t6", "ship", 0, 42)
    before = app.results.get("t6")

    _finish(app.results, "t6", final)  # a copy without an idempotency key ran again

    assert app.results.get("t6") == before


def test_a_replayed_dead_letter_that_succeeds_replaces_the_failure(app: App) -> None:
    app.results.failed("t7", "ship", 3, state=ResultState.FAILURE, error="ValueError: no",
                       traceback="Traceback...")

    app.results.started("t7", "ship", 0)  # `taskq dlq replay` starts over at retries 0
    assert app.results.get("t7").state is ResultState.FAILURE  # type: ignore[union-attr]
    app.results.succeeded("t7", "ship", 0, "shipped")

    assert app.result("t7").get(timeout_s=1) == "shipped"


def test_a_late_retry_of_an_attempt_does_not_hide_the_next_attempt(app: App) -> None:
    # The retry copy is published (and may start elsewhere) before RETRY is written.
    app.results.started("t8", "ship", 1)
    app.results.failed("t8", "ship", 0, state=ResultState.RETRY, error="E: first",
                       traceback="tb")
    record = app.results.get("t8")
    assert record is not None and (record.state, record.retries) == (ResultState.STARTED, 1)

    app.results.failed("t8", "ship", 1, state=ResultState.RETRY, error="E: second",
                       traceback="tb")
    app.results.started("t8", "ship", 1)  # a redelivered copy of attempt 2, late
    record = app.results.get("t8")
    assert record is not None and (record.state, record.retries) == (ResultState.RETRY, 1)
    assert record.error == "E: second"

    app.results.started("t8", "ship", 2)
    assert app.result("t8").state is ResultState.STARTED


def test_get_before_a_worker_made_the_embedded_sqlite_tables_waits_for_the_task(
    make_app: Callable[..., App], tmp_path
) -> None:
    # The embedded default's tables are made by the first worker: a caller may come first.
    app = make_app(database_url=f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    result = AsyncResult("t-fresh", task="ship", queue="q", app=app)

    assert result.state is ResultState.PENDING
    with pytest.raises(ResultTimeout):
        result.get(timeout_s=0.3)


def test_get_on_a_postgresql_database_without_the_tables_says_to_create_them_first(
    make_app: Callable[..., App]
) -> None:
    with postgres_schema("tqbare", taskq_tables=False) as schema:
        app = make_app(database_url=schema_url(schema))
        with pytest.raises(ResultError) as info:
            AsyncResult("t-bare", task="ship", queue="q", app=app).get(timeout_s=0.3)
    assert str(info.value).startswith("taskq's tables are missing: run `taskq db create")
