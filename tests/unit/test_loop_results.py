"""WorkerLoop and stored results: the final state is written before the delivery is acked.

Same recorder as tests/unit/test_loop.py for the broker; the results live in a real SQLite
file. At every settle the recorder reads the task's stored row, which shows the order of the
result write and the ack.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from taskq.broker.delivery import Delivery
from taskq.idempotency import IdempotencyStore
from taskq.results import ResultState
from taskq.worker.deaths import DeathLedger
from taskq.worker.events import Observers
from taskq.worker.loop import WorkerLoop
from taskq.worker.observers import ResultRecorder
from taskq.worker.time_limits import Slot, SoftTimeLimit
from tests.unit.test_loop import Recorder, _App, delivery, wire

ACK, REQUEUE = 0, 2


class StateAtSettle(Recorder):
    """Records each settle with the task's stored state at that moment."""

    app: _App

    def settle(self, delivery: Delivery, action: int) -> None:
        record = self.app.results.get(delivery.message.message_id or "")
        self.events.append(("settle", action, record.state if record else None))


@pytest.fixture
def recorder() -> StateAtSettle:
    return StateAtSettle()


@pytest.fixture
def app(recorder: StateAtSettle, tmp_path: Path) -> _App:
    app = recorder.app = _App(recorder, database_url=f"sqlite:///{tmp_path}/taskq.db")
    app.create_tables()
    ran = app.ran = []  # type: ignore[attr-defined]

    @app.task(name="stored", store_result=True)
    def stored(x: int) -> int:
        ran.append(x)
        return x * 10

    @app.task(name="stored_failing", store_result=True)
    def stored_failing(x: int) -> int:
        raise ValueError(f"no {x}")

    @app.task(name="stored_unkeyed", store_result=True, idempotent=False)
    def stored_unkeyed(x: int) -> int:
        ran.append(x)
        return x * 10

    return app


def results_loop(app: _App, recorder: Recorder, tmp_path: Path) -> WorkerLoop:
    """A loop with the observers a worker process registers for results."""
    return WorkerLoop(
        app, recorder, slot=Slot(multiprocessing.get_context("spawn")),  # type: ignore[arg-type]
        ledger=DeathLedger(str(tmp_path)), soft_limit=SoftTimeLimit(),
        observers=Observers([ResultRecorder(app)]),
    )


@pytest.mark.parametrize("task", ["stored", "stored_unkeyed"])
def test_the_success_is_stored_before_the_delivery_is_acked(
    app: _App, recorder: StateAtSettle, tmp_path: Path, task: str
) -> None:
    results_loop(app, recorder, tmp_path).handle(delivery(recorder, wire(task, 4)))

    assert recorder.events == [("settle", ACK, ResultState.SUCCESS)]
    assert app.result("id-1").get(timeout_s=1) == 40
    assert app.ran == [4]  # type: ignore[attr-defined]


def test_a_duplicate_stores_a_success_the_first_run_could_not_write(
    app: _App, recorder: StateAtSettle, tmp_path: Path
) -> None:
    # Given a run whose key was recorded but whose SUCCESS never reached the table (the
    # database went away in between), so the row still says STARTED
    app.results.started("id-1", "stored", 0)
    IdempotencyStore(app.engine).record("id-1", "stored")

    # When the redelivery comes to a process that does not hold the outcome
    results_loop(app, recorder, tmp_path).handle(
        delivery(recorder, wire("stored", 4), redelivered=True)
    )

    # Then it is acked without running, and the task no longer looks STARTED forever
    assert app.ran == []  # type: ignore[attr-defined]
    record = app.results.get("id-1")
    assert record is not None and record.state is ResultState.SUCCESS
    assert record.result is None and record.error and "not run again" in record.error


def test_a_failure_is_stored_before_its_dead_lettered_delivery_is_acked(
    app: _App, recorder: StateAtSettle, tmp_path: Path
) -> None:
    # A crash between the ack and the write would leave the task STARTED forever.
    results_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("stored_failing", 4)))

    assert recorder.events[-1] == ("settle", ACK, ResultState.FAILURE)
