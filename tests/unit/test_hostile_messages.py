"""Messages from any AMQP client: whatever their properties and headers, the loop survives.

Each test is one defect of issue 12 item 2. The broker is not involved (see test_loop.py for
the recorder that stands in for the Subscription and the Publisher); the system test
tests/system/test_worker_hostile_messages.py sends the same shapes through RabbitMQ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika.compat
import pytest

from taskq.broker._frames import content_frames
from taskq.broker.delivery import Delivery
from taskq.message import Envelope, WireMessage, decode, encode
from taskq.worker import loop
from tests.unit.test_loop import QUEUE, Recorder, _App, make_loop

_ACK, _REJECT, _REQUEUE = 0, 1, 2


class Feed(Recorder):
    """A Recorder that also hands out deliveries, as Subscription.get/get_ready do."""

    def __init__(self, wires: list[WireMessage], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.generation = 0
        self.is_connected = True
        self._ready = [
            Delivery(w, QUEUE, False, tag, 0, self)  # type: ignore[arg-type]
            for tag, w in enumerate(wires, 1)
        ]

    def get(self, timeout_s: float) -> Delivery | None:
        return self._ready.pop(0) if self._ready else None

    def get_ready(self, max_n: int) -> list[Delivery]:
        taken, self._ready = self._ready[:max_n], self._ready[max_n:]
        return taken

    def watch_progress(self, stamp: Any) -> None:
        """As Subscription.watch_progress; no I/O thread here to stamp it."""


@pytest.fixture
def app(tmp_path: Path) -> _App:
    # prefetch > 1 with an idempotent task: the loop pre-checks keys batch by batch.
    app = _App(Recorder(), prefetch_count=4, database_url=f"sqlite:///{tmp_path}/taskq.db")
    app.create_tables()
    ran = app.ran = []  # type: ignore[attr-defined]

    @app.task(name="ok")
    def ok(x: int) -> int:
        ran.append(x)
        return x

    @app.task(name="bad")
    def bad(x: int) -> None:
        raise KeyError("missing")

    return app


def run_all(app: _App, feed: Feed, tmp_path: Path) -> None:
    """Run the loop over everything the feed holds, then stop."""
    app._recorder = feed
    worker = make_loop(app, feed, tmp_path)
    worker._check_parent = lambda: worker.request_stop()  # type: ignore[method-assign]
    worker.run()


def letters(feed: Feed) -> list[WireMessage]:
    return [event[3] for event in feed.events if event[0] == "publish"]


def settles(feed: Feed) -> list[tuple[int, int]]:
    return [(event[1], event[2]) for event in feed.events if event[0] == "settle"]


def task_wire(task: Any = "ok", task_id: str = "id-1", **headers: Any) -> WireMessage:
    wire = encode(Envelope(task_id=task_id, task="ok", args=[1]))
    wire.headers["taskq-task"] = task
    wire.headers.update(headers)
    return wire


@pytest.mark.parametrize("task", [["ok", "bad"], {"name": "ok"}, b"\xff", 1.5, None])
def test_a_task_header_of_any_amqp_type_is_dead_lettered_and_the_loop_goes_on(
    app: _App, tmp_path: Path, task: Any
) -> None:
    feed = Feed([task_wire(task, "id-1"), task_wire("ok", "id-2")])

    run_all(app, feed, tmp_path)

    (letter,) = letters(feed)
    assert letter.message_id == "id-1" and letter.headers["taskq-error-type"] == "DecodeError"
    assert settles(feed) == [(1, _ACK), (2, _ACK)]
    assert app.ran == [1]  # type: ignore[attr-defined]


def test_non_utf8_properties_and_header_names_give_a_publishable_dead_letter(
    app: _App, tmp_path: Path
) -> None:
    # pika hands over short strings that are not UTF-8 as bytes, also as header names.
    hostile = task_wire("bad")
    hostile.message_id = b"id-\xff"  # type: ignore[assignment]
    hostile.app_id = b"\xc3("  # type: ignore[assignment]
    hostile.headers[b"n\xe9e"] = {b"\xff": [1, {b"\xfe": "x"}]}  # type: ignore[index]
    feed = Feed([hostile, task_wire("ok", "id-2")])

    run_all(app, feed, tmp_path)

    (letter,) = letters(feed)
    assert letter.headers["taskq-error-type"] == "KeyError"  # the task ran and failed
    assert letter.message_id == "id-\\xff" and letter.app_id == "\\xc3("
    assert letter.headers["n\\xe9e"] == {"\\xff": [1, {"\\xfe": "x"}]}
    assert content_frames(1, letter, 4096)  # the copy can go back to the broker
    assert settles(feed) == [(1, _ACK), (2, _ACK)]


def test_a_non_utf8_content_type_is_dead_lettered_as_not_a_taskq_message(
    app: _App, tmp_path: Path
) -> None:
    hostile = task_wire("ok")
    hostile.content_type = b"application/\xff"  # type: ignore[assignment]
    feed = Feed([hostile])

    run_all(app, feed, tmp_path)

    (letter,) = letters(feed)
    assert letter.headers["taskq-error-type"] == "DecodeError"
    assert "content type" in letter.headers["taskq-error"]
    assert content_frames(1, letter, 4096)


@pytest.mark.parametrize("key", ["k" * 256, "a\x00b"])
def test_an_idempotency_key_the_table_cannot_hold_is_a_decode_error(key: str) -> None:
    with pytest.raises(Exception, match="idempotency key") as caught:
        decode(task_wire(**{"taskq-idempotency-key": key}))
    assert type(caught.value).__name__ == "DecodeError"


def test_an_unexpected_error_is_contained_to_its_delivery(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_decode = loop.decode

    def decode_or_fail(wire: WireMessage) -> Envelope:
        if wire.message_id == "id-1":
            raise RuntimeError("a bug nobody foresaw")
        return real_decode(wire)

    monkeypatch.setattr(loop, "decode", decode_or_fail)
    feed = Feed([task_wire("ok", "id-1"), task_wire("ok", "id-2")])

    run_all(app, feed, tmp_path)

    (letter,) = letters(feed)
    assert letter.message_id == "id-1"
    assert letter.headers["taskq-error-type"] == "WorkerError"
    assert "RuntimeError: a bug nobody foresaw" in letter.headers["taskq-error"]
    assert "decode_or_fail" in letter.headers["taskq-traceback"]
    assert settles(feed) == [(1, _ACK), (2, _ACK)]
    assert app.ran == [1]  # type: ignore[attr-defined]


def test_a_contained_delivery_that_cannot_be_dead_lettered_goes_to_the_queues_dlx(
    app: _App, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Requeueing would bring it back to the same bug: rejected without requeue, the queue's
    # x-dead-letter-exchange parks it in Q.dlq, and the loop goes on.
    monkeypatch.setattr(loop, "decode", lambda wire: 1 / 0)

    def publish_fails(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the dead-letter path is broken too")

    feed = Feed([task_wire("ok", "id-1"), task_wire("ok", "id-2")])
    monkeypatch.setattr(feed, "publish", publish_fails)

    run_all(app, feed, tmp_path)

    assert settles(feed) == [(1, _REJECT), (2, _REJECT)]


def test_envelope_ints_of_any_amqp_integer_type_are_read() -> None:
    # pika hands over a long-long ("l") as its own int subclass; other clients send taskq-v
    # and taskq-retries with whatever integer type they like.
    wire = task_wire(**{"taskq-v": pika.compat.long(1), "taskq-retries": pika.compat.long(2)})

    envelope = decode(wire)

    assert envelope.retries == 2 and envelope.retries.__class__ is int


@pytest.mark.parametrize("header", ["taskq-v", "taskq-retries"])
def test_a_bool_is_not_an_envelope_int(header: str) -> None:
    with pytest.raises(Exception, match=header) as caught:
        decode(task_wire(**{header: True}))
    assert type(caught.value).__name__ == "DecodeError"


def test_a_huge_retry_count_is_a_decode_error_whose_dead_letter_can_be_published(
    app: _App, tmp_path: Path
) -> None:
    # taskq-attempts is taskq-retries + 1: past the int64 range no AMQP type carries it.
    feed = Feed([task_wire("ok", **{"taskq-retries": 2**63 - 1})])

    run_all(app, feed, tmp_path)

    (letter,) = letters(feed)
    assert letter.headers["taskq-error-type"] == "DecodeError"
    assert "taskq-retries" in letter.headers["taskq-error"]
    assert content_frames(1, letter, 4096)
    assert app.ran == []  # type: ignore[attr-defined]
