"""WorkerLoop retries: publish the retry (confirmed) before the ack, requeue if it fails.

Same recorder as tests/unit/test_loop.py: the order of broker actions is what is asserted;
the system tests run the real broker.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from taskq.message import Envelope, WireMessage, encode
from taskq.worker import infra_faults, retrying
from taskq.worker.deaths import DeathLedger
from tests.unit.test_loop import QUEUE, Recorder, _App, delivery, make_loop

ACK, REQUEUE = 0, 2


class Flaky(Exception):
    pass


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def app(recorder: Recorder, tmp_path: Path) -> _App:
    app = _App(
        recorder,
        database_url=f"sqlite:///{tmp_path}/taskq.db",
        task_retry_jitter=False,
        task_retry_backoff_s=0.5,
    )
    app.create_tables()
    seen = app.seen = []  # type: ignore[attr-defined]

    @app.task(name="flaky", autoretry_for=(Flaky,), max_retries=2)
    def flaky() -> None:
        raise Flaky("try again")

    @app.task(name="bound", bind=True)
    def bound(self: Any) -> None:
        seen.append((self.request.retries, self.request.queue, self.request.is_redelivered))
        raise self.retry(countdown=0.2)

    @app.task(name="plain")
    def plain() -> None:
        seen.append("ran")

    @app.task(name="plain_fails", autoretry_for=(Flaky,), max_retries=2)
    def plain_fails() -> None:
        seen.append("failed")
        raise Flaky("try again")

    @app.task(name="odd_countdown", bind=True)
    def odd_countdown(self: Any) -> None:
        raise self.retry(countdown=app.countdown)  # type: ignore[attr-defined]

    return app


def message(task: str, *, retries: int = 0, eta: datetime | None = None) -> WireMessage:
    return encode(Envelope(task_id="id-1", task=task, retries=retries, eta=eta))


def test_a_retry_is_published_with_one_more_retry_before_the_ack(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("flaky", retries=1)))

    (kind, queue, delay_s, copy), settle = recorder.events
    assert (kind, queue, delay_s) == ("delayed", QUEUE, 1.0)  # 0.5 * 2**1
    assert copy.headers["taskq-retries"] == 2
    assert copy.body == message("flaky").body and copy.message_id == "id-1"
    assert settle == ("settle", 7, ACK)


def test_a_retry_that_cannot_be_published_is_held_and_retried_not_run_again(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(infra_faults, "HOLD_FIRST_PAUSE_S", 0.01)
    recorder = Recorder(publish_fails=3)
    app._recorder = recorder

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("plain_fails")))

    (kind, _, _, copy), settle = recorder.events
    assert recorder.failed_publishes == 3
    assert (kind, copy.headers["taskq-retries"], settle) == ("delayed", 1, ("settle", 7, ACK))
    assert app.seen == ["failed"]  # type: ignore[attr-defined]


def test_a_retry_that_cannot_be_published_is_requeued_when_the_worker_stops(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retrying, "REQUEUE_PAUSE_S", 0)
    recorder = Recorder(publish_fails=True)
    app._recorder = recorder
    loop = make_loop(app, recorder, tmp_path)
    threading.Timer(0.3, loop.request_stop).start()

    loop.handle(delivery(recorder, message("flaky")))

    assert recorder.events == [("settle", 7, REQUEUE)]


@pytest.mark.parametrize("countdown", [float("nan"), float("inf")])
def test_a_retry_countdown_that_is_not_a_delay_is_replaced_before_publishing(
    app: _App, recorder: Recorder, tmp_path: Path, countdown: float
) -> None:
    app.countdown = countdown  # type: ignore[attr-defined]

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("odd_countdown")))

    (kind, _, delay_s, _), settle = recorder.events
    assert kind == "delayed" and math.isfinite(delay_s) and delay_s >= 0
    assert settle == ("settle", 7, ACK)


def test_exhausted_retries_dead_letter_with_the_number_of_attempts(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("flaky", retries=2)))

    (kind, exchange, _, letter), settle = recorder.events
    assert (kind, exchange) == ("publish", "ns.dlx")
    assert letter.headers["taskq-error-type"] == "Flaky"
    assert letter.headers["taskq-attempts"] == 3
    assert letter.headers["taskq-retries"] == 2
    assert settle == ("settle", 7, ACK)


def test_a_bound_task_reads_its_request_and_asks_for_a_retry(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    make_loop(app, recorder, tmp_path).handle(
        delivery(recorder, message("bound", retries=1), redelivered=False)
    )

    assert app.seen == [(1, QUEUE, False)]  # type: ignore[attr-defined]
    (kind, _, delay_s, copy), settle = recorder.events
    assert (kind, delay_s, copy.headers["taskq-retries"]) == ("delayed", 0.2, 2)
    assert settle == ("settle", 7, ACK)


def test_a_time_limit_kill_with_retries_left_is_retried_and_its_record_forgotten(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    ledger = DeathLedger(str(tmp_path))
    ledger.record_death("id-1", time_limit_s=2.0)

    make_loop(app, recorder, tmp_path).handle(
        delivery(recorder, message("plain"), redelivered=True)
    )

    (kind, _, delay_s, copy), settle = recorder.events
    assert (kind, delay_s, copy.headers["taskq-retries"]) == ("delayed", 0.5, 1)
    assert settle == ("settle", 7, ACK)
    assert ledger.read("id-1") is None
    assert app.seen == []  # type: ignore[attr-defined]


def test_a_time_limit_kill_without_retries_left_counts_it_as_an_attempt(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    DeathLedger(str(tmp_path)).record_death("id-1", time_limit_s=2.0)

    make_loop(app, recorder, tmp_path).handle(
        delivery(recorder, message("plain", retries=3), redelivered=True)
    )

    letter = recorder.events[0][3]
    assert letter.headers["taskq-error-type"] == "TimeLimitExceeded"
    assert letter.headers["taskq-attempts"] == 4


def test_a_crash_loop_counts_deaths_and_earlier_retries_as_attempts(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    ledger = DeathLedger(str(tmp_path))
    for _ in range(3):
        ledger.record_death("id-1")

    make_loop(app, recorder, tmp_path).handle(
        delivery(recorder, message("plain", retries=2), redelivered=True)
    )

    letter = recorder.events[0][3]
    assert letter.headers["taskq-error-type"] == "ProcessCrashLoop"
    assert letter.headers["taskq-attempts"] == 5


def test_a_delivery_long_before_its_eta_is_sent_back_to_wait_never_run(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    eta = datetime.now(timezone.utc) + timedelta(seconds=30)

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("plain", eta=eta)))

    (kind, _, delay_s, copy), settle = recorder.events
    assert kind == "delayed" and 28 < delay_s <= 30
    assert copy.headers["taskq-retries"] == 0
    assert settle == ("settle", 7, ACK)
    assert app.seen == []  # type: ignore[attr-defined]


def test_a_delivery_within_a_second_of_its_eta_runs(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    eta = datetime.fromtimestamp(time.time() + 0.5, timezone.utc)

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message("plain", eta=eta)))

    assert recorder.events == [("settle", 7, ACK)]
    assert app.seen == ["ran"]  # type: ignore[attr-defined]


def test_an_eta_read_back_by_pika_as_its_long_type_is_understood(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    from pika.compat import long  # what pika makes of an AMQP long-long header

    wire = message("plain", eta=datetime.now(timezone.utc) - timedelta(seconds=1))
    wire.headers["taskq-eta"] = long(wire.headers["taskq-eta"])

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire))

    assert recorder.events == [("settle", 7, ACK)]
    assert app.seen == ["ran"]  # type: ignore[attr-defined]
