"""taskq's own Basic.Publish frames are byte for byte the frames pika marshals."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pika.frame
import pika.spec
import pytest

from taskq.broker._frames import content_frames, encode_table, method_frame
from taskq.errors import SerializationError
from taskq.message import CONTENT_TYPE, WireMessage


def pika_frames(channel: int, exchange: str, key: str, wire: WireMessage, mandatory: bool,
                body_max: int) -> bytes:
    """What pika's Connection._send_message writes for basic_publish (pika 1.x)."""
    properties = pika.BasicProperties(
        content_type=wire.content_type, delivery_mode=2, priority=wire.priority,
        timestamp=wire.timestamp, app_id=wire.app_id, message_id=wire.message_id,
        headers=wire.headers or None,
    )
    method = pika.spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory)
    frames = [
        pika.frame.Method(channel, method).marshal(),
        pika.frame.Header(channel, len(wire.body), properties).marshal(),
    ]
    for i in range(math.ceil(len(wire.body) / body_max)):
        frames.append(pika.frame.Body(channel, wire.body[i * body_max:(i + 1) * body_max])
                      .marshal())
    return b"".join(frames)


def task_wire(**overrides: Any) -> WireMessage:
    task_id = str(uuid.uuid4())
    fields: dict[str, Any] = {
        "body": b"\x82\xa4args\x91\x01\xa6kwargs\x80",
        "message_id": task_id,
        "headers": {"taskq-v": 1, "taskq-task": "shop.send_receipt", "taskq-retries": 0,
                    "taskq-idempotency-key": task_id},
        "priority": 0,
        "timestamp": 1_790_000_000,
        "app_id": "shop",
        "content_type": CONTENT_TYPE,
    }
    fields.update(overrides)
    return WireMessage(**fields)


CASES = {
    "task message": task_wire(),
    "delayed retry": task_wire(headers={"taskq-v": 1, "taskq-task": "t", "taskq-retries": 3,
                                       "taskq-idempotency-key": "order-7",
                                       "taskq-eta": 1_790_000_000_123}),
    "priority 9, unicode": task_wire(priority=9, app_id="bürö",
                                     headers={"taskq-task": "zähler", "note": "ünïcode ✓"}),
    "negative and 64-bit ints": task_wire(headers={"a": -(2**31), "b": 2**31 - 1, "c": 2**31,
                                                   "d": -(2**31) - 1, "e": 2**62}),
    "other header types": task_wire(headers={
        "flag": True, "raw": b"\x00\x01", "none": None, "nested": {"x": [1, "two", False]},
        "when": datetime(2026, 11, 30, tzinfo=timezone.utc), "amount": Decimal("12.50"),
        "list": [1, 2, 3],
    }),
    "dead letter": task_wire(headers={"taskq-v": 1, "taskq-task": "t",
                                      "taskq-error-type": "ValueError",
                                      "taskq-error": "bad " * 200,
                                      "taskq-traceback": "Traceback...\n" * 50,
                                      "taskq-attempts": 4}),
    "no headers, no optional properties": WireMessage(body=b"raw"),
    "empty body": task_wire(body=b""),
    "body of exactly one frame": task_wire(body=b"x" * 4096),
    "body of several frames": task_wire(body=bytes(range(256)) * 70),
}


@pytest.mark.parametrize("wire", CASES.values(), ids=list(CASES))
@pytest.mark.parametrize("mandatory", [True, False])
def test_frames_equal_pikas(wire: WireMessage, mandatory: bool) -> None:
    channel, body_max = 7, 4096
    ours = method_frame(channel, "shop", "emails", mandatory) + content_frames(
        channel, wire, body_max
    )
    assert ours == pika_frames(channel, "shop", "emails", wire, mandatory, body_max)


def test_table_matches_pika_for_every_int_width() -> None:
    for value in (0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63 - 1, -(2**63)):
        pieces: list[bytes] = []
        pika.data.encode_table(pieces, {"v": value})
        assert encode_table({"v": value}) == b"".join(pieces), value


def test_over_long_short_strings_are_refused_like_pika() -> None:
    with pytest.raises(SerializationError, match="255"):
        content_frames(1, task_wire(app_id="a" * 256), 4096)
    with pytest.raises(ValueError, match="255"):
        encode_table({"k" * 300: 1})


def test_cached_fields_stay_exact_across_messages() -> None:
    """Repeated fields come from a cache; True and 1 (equal in Python) must not share it."""
    for headers in ({"v": 1, "t": "a"}, {"v": True, "t": "a"}, {"v": 1, "t": "a"},
                    {"v": "1", "t": "a"}, {"v": Decimal(1), "t": "a"}, {"v": 1, "t": "a"}):
        pieces: list[bytes] = []
        pika.data.encode_table(pieces, headers)
        assert encode_table(headers) == b"".join(pieces), headers
