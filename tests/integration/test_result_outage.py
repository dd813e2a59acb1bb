"""A result write that cannot reach the database is an infrastructure fault (docs/reliability.md).

WorkerLoop with the broker recorder of tests/unit/test_loop.py; the results and idempotency
tables are on the real PostgreSQL, reached through a TcpProxy that the task itself cuts, so
the outage starts exactly between the task's return and its result write.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskq.results import ResultState
from taskq.worker import infra_faults
from taskq.worker.deaths import DeathLedger
from taskq.worker.events import Observers
from taskq.worker.loop import WorkerLoop
from taskq.worker.observers import ResultRecorder
from taskq.worker.time_limits import Slot, SoftTimeLimit
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_until
from tests.unit.test_loop import Recorder, _App, delivery, wire

ACK, REQUEUE = 0, 2


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", 5432) as proxy:
        yield proxy


@pytest.fixture
def app(postgres_url: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[_App]:
    monkeypatch.setattr(infra_faults, "HOLD_FIRST_PAUSE_S", 0.05)  # the backoff, not tested
    app = _App(Recorder(), database_url=proxy.url(postgres_url))
    ran = app.ran = []  # type: ignore[attr-defined]

    @app.task(name="cut", store_result=True)
    def cut(x: int) -> int:
        ran.append(x)
        proxy.cut()  # the database goes away as the task returns
        return x * 10

    @app.task(name="stored", store_result=True)
    def stored(x: int) -> int:
        ran.append(x)
        return x * 10

    @app.task(name="cut_unkeyed", store_result=True, idempotent=False)
    def cut_unkeyed(x: int) -> int:
        ran.append(x)
        proxy.cut()
        return x * 10

    app.loops = []  # type: ignore[attr-defined]
    yield app
    for loop in app.loops:  # type: ignore[attr-defined]
        loop._dedupe.store.close()  # its kept connection
    app.close()


def _loop(app: _App, tmp_path: Path) -> WorkerLoop:
    loop = WorkerLoop(
        app, app._recorder, slot=Slot(multiprocessing.get_context("spawn")),  # type: ignore[arg-type]
        ledger=DeathLedger(str(tmp_path)), soft_limit=SoftTimeLimit(),
        observers=Observers([ResultRecorder(app)]),
    )
    app.loops.append(loop)  # type: ignore[attr-defined]
    return loop


@pytest.mark.parametrize("task", ["cut", "cut_unkeyed"])
def test_a_success_that_cannot_be_stored_is_held_until_it_is_stored_not_rerun(
    app: _App, proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture, task: str
) -> None:
    recorder: Recorder = app._recorder
    loop = _loop(app, tmp_path)
    # The outage ends once the loop has failed to store the result a few times.
    healer = threading.Thread(target=_restore_after_failures, args=(caplog, proxy, 3))
    healer.start()

    # When the task succeeds but the database is gone before its result is written
    loop.handle(delivery(recorder, wire(task, 4)))
    healer.join(timeout=30)

    # Then the delivery was held (never requeued) until the result was stored, then acked,
    # and the task ran once
    assert recorder.events == [("settle", 7, ACK)]
    assert app.ran == [4]  # type: ignore[attr-defined]
    assert app.result("id-1").get(timeout_s=1) == 40
    record: Any = app.results.get("id-1")
    assert record.state is ResultState.SUCCESS and record.error is None


def test_a_success_still_unstored_when_the_worker_stops_goes_back_and_is_stored_not_rerun(
    app: _App, proxy: TcpProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder: Recorder = app._recorder
    loop = _loop(app, tmp_path)
    stopper = threading.Thread(target=_stop_after_failures, args=(caplog, loop, 2))
    stopper.start()

    # When the worker is asked to stop while the result cannot be stored
    loop.handle(delivery(recorder, wire("cut", 4)))
    stopper.join(timeout=30)

    # Then the delivery goes back to the queue instead of being acked
    assert recorder.events == [("settle", 7, REQUEUE)]

    # And when it comes back after the database did, the held result is stored and the
    # delivery acked, without running the task again
    proxy.restore()
    loop.stop_requested = False
    loop.handle(delivery(recorder, wire("cut", 4), redelivered=True))

    assert recorder.events[1:] == [("settle", 7, ACK)]
    assert app.ran == [4]  # type: ignore[attr-defined]
    assert app.result("id-1").get(timeout_s=1) == 40


def _failures(caplog: pytest.LogCaptureFixture) -> int:
    """How often the loop held the delivery because the database was gone (its key or its
    result could not be written)."""
    return sum("holding the delivery" in r.getMessage() for r in caplog.records)


def _restore_after_failures(caplog: pytest.LogCaptureFixture, proxy: TcpProxy, n: int) -> None:
    wait_until(lambda: _failures(caplog) >= n, timeout_s=20)
    proxy.restore()


def _stop_after_failures(caplog: pytest.LogCaptureFixture, loop: WorkerLoop, n: int) -> None:
    wait_until(lambda: _failures(caplog) >= n, timeout_s=20)
    loop.request_stop()


def test_a_result_the_database_refuses_is_logged_and_the_message_acked(
    app: _App, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A refused row (here by a CHECK constraint the test adds) cannot succeed later:
    # requeueing it would loop forever, so the message is acked and the refusal logged.
    recorder: Recorder = app._recorder
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "ALTER TABLE taskq_results ADD CONSTRAINT refuse_stored CHECK (task <> 'stored')"
        ))
    try:
        _loop(app, tmp_path).handle(delivery(recorder, wire("stored", 4)))
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE taskq_results DROP CONSTRAINT refuse_stored"))
        engine.dispose()

    assert recorder.events == [("settle", 7, ACK)]
    assert app.ran == [4]  # type: ignore[attr-defined]
    assert "stored[id-1] from work succeeded but its result cannot be stored" in caplog.text
