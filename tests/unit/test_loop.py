"""WorkerLoop.handle(): each delivery ends in exactly one action, dead letters before acks.

The broker is not involved: deliveries are built by hand and the publisher is a recorder
standing in for taskq's own Publisher seam (the system tests run the real thing).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.broker.delivery import Delivery
from taskq.errors import PublishError
from taskq.message import Envelope, WireMessage, encode
from taskq.worker import dead_letters, infra_faults
from taskq.worker.deaths import DeathLedger
from taskq.worker.loop import WorkerLoop
from taskq.worker.time_limits import Slot, SoftTimeLimit, message_key

QUEUE = "work"


class Recorder:
    """Stands in for the Subscription (settle) and the Publisher (publish); logs both.

    ``publish_fails``: how many publishes fail before they succeed (``True``: all of them).
    """

    generation = 0

    def __init__(self, *, publish_fails: bool | int = False) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.publish_fails = publish_fails
        self.failed_publishes = 0

    def settle(self, delivery: Delivery, action: int) -> None:
        self.events.append(("settle", delivery.delivery_tag, action))

    def _maybe_fail(self) -> None:
        if self.publish_fails is True or self.failed_publishes < self.publish_fails:
            self.failed_publishes += 1
            raise PublishError("broker unreachable")

    def publish(self, wire: WireMessage, *, exchange: str, routing_key: str, task: Any) -> None:
        self._maybe_fail()
        self.events.append(("publish", exchange, routing_key, wire))

    def publish_delayed(self, wire: WireMessage, *, queue: str, delay_s: float) -> None:
        self._maybe_fail()
        self.events.append(("delayed", queue, delay_s, wire))

    def stop_consuming(self) -> None:
        pass

    def wait_sent(self, timeout_s: float) -> bool:
        self.events.append(("wait_sent",))
        return True


class _App(App):
    def __init__(self, recorder: Recorder, **settings: Any) -> None:
        super().__init__("unit", namespace="ns", **settings)
        self._recorder = recorder

    @property
    def publisher(self) -> Any:  # type: ignore[override]
        return self._recorder

    def publish_delayed(self, wire: WireMessage, *, queue: str, delay_s: Any) -> None:
        # The delay backends have their own tests; here only the order of actions matters.
        self._recorder.publish_delayed(wire, queue=queue, delay_s=delay_s)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def app(recorder: Recorder, tmp_path: Path) -> _App:
    app = _App(
        recorder, max_message_size_bytes=500, database_url=f"sqlite:///{tmp_path}/taskq.db"
    )
    app.create_tables()  # tasks are idempotent by default: taskq_processed is consulted
    ran = app.ran = []  # type: ignore[attr-defined]

    @app.task(name="ok")
    def ok(x: int) -> int:
        ran.append(x)
        return x

    @app.task(name="bad")
    def bad() -> None:
        raise KeyError("missing")

    return app


def make_loop(
    app: _App, recorder: Recorder, tmp_path: Path, siblings: tuple[Slot, ...] = ()
) -> WorkerLoop:
    slot = Slot(multiprocessing.get_context("spawn"))
    ledger = DeathLedger(str(tmp_path))
    return WorkerLoop(
        app, recorder, slot=slot, ledger=ledger, soft_limit=SoftTimeLimit(),  # type: ignore[arg-type]
        sibling_slots=siblings,
    )


def delivery(recorder: Recorder, wire: WireMessage, *, redelivered: bool = False) -> Delivery:
    return Delivery(wire, QUEUE, redelivered, 7, 0, recorder)  # type: ignore[arg-type]


def wire(task: str, *args: Any, task_id: str = "id-1") -> WireMessage:
    return encode(Envelope(task_id=task_id, task=task, args=list(args)))


def test_success_is_acked_once(app: _App, recorder: Recorder, tmp_path: Path) -> None:
    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("ok", 5)))

    assert recorder.events == [("settle", 7, 0)]
    assert app.ran == [5]  # type: ignore[attr-defined]


def test_failure_is_published_to_the_dlx_before_the_ack(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("bad")))

    (publish, exchange, routing_key, letter), settle = recorder.events
    assert (publish, exchange, routing_key) == ("publish", "ns.dlx", QUEUE)
    assert letter.headers["taskq-error-type"] == "KeyError"
    assert letter.body == wire("bad").body and letter.message_id == "id-1"
    assert settle == ("settle", 7, 0)


def test_a_dead_letter_that_cannot_be_published_is_held_and_retried_never_acked_before(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(infra_faults, "HOLD_FIRST_PAUSE_S", 0.01)
    recorder = Recorder(publish_fails=3)
    app._recorder = recorder

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("bad")))

    (publish, exchange, _, letter), settle = recorder.events
    assert recorder.failed_publishes == 3
    assert (publish, exchange, settle) == ("publish", "ns.dlx", ("settle", 7, 0))


def test_a_dead_letter_that_cannot_be_published_is_requeued_when_the_worker_stops(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dead_letters, "DEAD_LETTER_RETRY_PAUSE_S", 0)
    recorder = Recorder(publish_fails=True)
    app._recorder = recorder
    loop = make_loop(app, recorder, tmp_path)
    threading.Timer(0.3, loop.request_stop).start()

    loop.handle(delivery(recorder, wire("bad")))

    assert recorder.events == [("settle", 7, 2)]  # reject with requeue
    assert recorder.failed_publishes >= 1


@pytest.mark.parametrize(
    ("message", "error_type"),
    [
        (WireMessage(b"x" * 600, "big", {}), "MessageTooLarge"),
        (WireMessage(b"\xc1", "junk", {"taskq-v": 1, "taskq-task": "ok"}), "DecodeError"),
        (wire("nobody", task_id="who"), "TaskNotRegistered"),
    ],
)
def test_bad_input_is_dead_lettered_with_its_reason(
    app: _App, recorder: Recorder, tmp_path: Path, message: WireMessage, error_type: str
) -> None:
    make_loop(app, recorder, tmp_path).handle(delivery(recorder, message))

    (_, _, _, letter), settle = recorder.events
    assert letter.headers["taskq-error-type"] == error_type
    assert settle == ("settle", 7, 0)
    assert app.ran == []  # type: ignore[attr-defined]


def test_a_redelivered_message_that_killed_three_processes_is_not_run_again(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    ledger = DeathLedger(str(tmp_path))
    for _ in range(3):
        ledger.record_death("id-1")

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("ok", 1), redelivered=True))

    assert recorder.events[0][3].headers["taskq-error-type"] == "ProcessCrashLoop"
    assert recorder.events[0][3].headers["taskq-attempts"] == 3
    assert app.ran == []  # type: ignore[attr-defined]
    assert ledger.read("id-1") is None


def test_a_redelivered_message_with_fewer_deaths_runs_again(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    DeathLedger(str(tmp_path)).record_death("id-1")

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, wire("ok", 1), redelivered=True))

    assert recorder.events == [("settle", 7, 0)]
    assert app.ran == [1]  # type: ignore[attr-defined]


def test_a_time_limit_kill_dead_letters_the_redelivered_message_with_no_retries_left(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    DeathLedger(str(tmp_path)).record_death("id-1", time_limit_s=2.0)
    exhausted = encode(Envelope(task_id="id-1", task="ok", args=[1], retries=3))

    make_loop(app, recorder, tmp_path).handle(delivery(recorder, exhausted, redelivered=True))

    headers = recorder.events[0][3].headers
    assert headers["taskq-error-type"] == "TimeLimitExceeded"
    assert "hard time limit of 2s" in headers["taskq-error"]


def test_a_redelivery_waits_until_the_supervisor_recorded_the_sibling_death(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    # Given two recorded deaths, and a third process that died holding the message but
    # whose death the supervisor has not written yet (its slot still holds the id)...
    ledger = DeathLedger(str(tmp_path))
    ledger.record_death("id-1")
    ledger.record_death("id-1")
    sibling = Slot(multiprocessing.get_context("spawn"))
    sibling.hold(message_key("id-1"))

    def supervisor() -> None:
        time.sleep(0.2)
        ledger.record_death("id-1")
        sibling.clear()

    threading.Thread(target=supervisor).start()
    loop = make_loop(app, recorder, tmp_path, siblings=(sibling,))

    # ...the redelivered message is judged on all three deaths, not run a fourth time.
    loop.handle(delivery(recorder, wire("ok", 1), redelivered=True))

    assert recorder.events[0][3].headers["taskq-error-type"] == "ProcessCrashLoop"
    assert app.ran == []  # type: ignore[attr-defined]


def test_after_a_dead_letter_its_ack_is_on_the_wire_before_the_next_delivery(
    app: _App, recorder: Recorder, tmp_path: Path
) -> None:
    # A process that died in the next task would otherwise lose the ack: the broker would
    # redeliver the parked message and it would be dead-lettered (and counted) again.
    loop = make_loop(app, recorder, tmp_path)

    loop.handle(delivery(recorder, wire("bad")))
    loop.handle(delivery(recorder, wire("ok", 1)))
    loop.handle(delivery(recorder, wire("ok", 2, task_id="id-2")))

    kinds = [event[0] for event in recorder.events]
    # dead letter, its ack, the wait; then two successes, with no wait between them
    assert kinds == ["publish", "settle", "wait_sent", "settle", "settle"]
