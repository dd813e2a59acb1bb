"""The envelope <-> wire message mapping, dead-letter headers, and docs/PROTOCOL.md."""

from __future__ import annotations

import base64
import dataclasses
import re
import time
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgpack
import pytest

from taskq import message
from taskq.codec import encode_body
from taskq.errors import ConfigurationError, DecodeError
from taskq.message import (
    CONTENT_TYPE,
    PROTOCOL_VERSION,
    Envelope,
    WireMessage,
    decode,
    encode,
    strip_x_death,
)
from taskq.republish import dead_letter_headers

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
TASK_ID = "0b7e2c1a-5d4f-4f0e-9a57-3c2d1e0f9a8b"


def make_envelope(**changes: Any) -> Envelope:
    fields: dict[str, Any] = {
        "task_id": TASK_ID,
        "task": "billing.charge",
        "args": [42, Decimal("19.99")],
        "kwargs": {"at": datetime(2025, 1, 31, 9, 30, tzinfo=timezone(timedelta(hours=1)))},
        "priority": 5,
        "retries": 0,
        "idempotency_key": None,
        "eta": None,
        "timestamp": 1738312200,
        "app_id": "shop",
        "headers": {},
    }
    fields.update(changes)
    return Envelope(**fields)


def make_wire(*, headers: Any = None, **changes: Any) -> WireMessage:
    base = encode(make_envelope())
    merged = dict(base.headers)
    for name, value in (headers or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return dataclasses.replace(base, headers=merged, **changes)


# -- encode / decode --------------------------------------------------------------------------


def test_encode_sets_properties_and_headers() -> None:
    wire = encode(make_envelope())
    assert wire.message_id == TASK_ID
    assert wire.content_type == CONTENT_TYPE == "application/x-msgpack"
    assert (wire.priority, wire.timestamp, wire.app_id) == (5, 1738312200, "shop")
    assert wire.headers == {
        "taskq-v": 1,
        "taskq-task": "billing.charge",
        "taskq-retries": 0,
        "taskq-idempotency-key": TASK_ID,
    }
    assert wire.body == encode_body(make_envelope().args, make_envelope().kwargs, task="x")


def test_round_trip_with_eta_key_retries_and_extra_headers() -> None:
    eta = datetime(2030, 6, 1, 12, 0, 0, 123000, tzinfo=timezone.utc)
    envelope = make_envelope(
        retries=3,
        idempotency_key="order-17",
        eta=eta,
        priority=9,
        headers={"trace-id": "abc", "tenant": 7},
    )
    wire = encode(envelope)
    assert wire.headers["taskq-eta"] == 1906545600123  # 2030-06-01T12:00:00.123Z
    assert decode(wire) == envelope


def test_eta_is_an_aware_utc_datetime_to_the_millisecond() -> None:
    eta = datetime(2030, 6, 1, 14, 0, 0, 123999, tzinfo=timezone(timedelta(hours=2)))
    decoded = decode(encode(make_envelope(eta=eta))).eta
    assert decoded == eta.replace(microsecond=123000)
    assert decoded is not None and decoded.tzinfo == timezone.utc


def test_round_trip_of_every_body_type() -> None:
    args = [
        None,
        True,
        2**70,
        1.5,
        "s",
        b"b",
        (1, 2),
        {"k": [1]},
        date(2024, 2, 29),
        uuid.UUID(int=9),
        Decimal("0.10"),
    ]
    decoded = decode(encode(make_envelope(args=args, kwargs={})))
    assert decoded.args == [*args[:6], [1, 2], *args[7:]]


def test_missing_idempotency_key_means_the_task_id() -> None:
    assert encode(make_envelope()).headers["taskq-idempotency-key"] == TASK_ID
    wire = make_wire(headers={"taskq-idempotency-key": None})
    assert decode(wire).idempotency_key == TASK_ID


def test_missing_retries_means_zero_and_missing_priority_means_zero() -> None:
    envelope = decode(make_wire(headers={"taskq-retries": None}, priority=None))
    assert (envelope.retries, envelope.priority) == (0, 0)


def test_priority_above_nine_is_read_as_nine() -> None:
    assert decode(make_wire(priority=200)).priority == 9


def test_missing_timestamp_is_filled_with_now() -> None:
    before = int(time.time())
    stamp = encode(make_envelope(timestamp=None)).timestamp
    assert stamp is not None and before <= stamp <= int(time.time())


def test_unknown_headers_land_in_envelope_headers() -> None:
    wire = make_wire(headers={"x-death": [{"count": 1}], "x-custom": "y"})
    assert decode(wire).headers == {"x-death": [{"count": 1}], "x-custom": "y"}


def test_encode_drops_x_death_from_extra_headers() -> None:
    envelope = make_envelope(
        headers={
            "x-death": [{}],
            "x-first-death-queue": "q",
            "x-last-death-reason": "expired",
            "keep": 1,
        }
    )
    assert encode(envelope).headers["keep"] == 1
    assert not {"x-death", "x-first-death-queue", "x-last-death-reason"} & set(
        encode(envelope).headers
    )


def test_no_headers_at_all_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(DecodeError, match="taskq-v is missing"):
        decode(WireMessage(body=b"\x80", message_id=TASK_ID, headers=None))  # type: ignore[arg-type]


@pytest.mark.parametrize("priority", [-1, 10, "5", True, 2.0])
def test_invalid_priority_is_a_configuration_error(priority: Any) -> None:
    with pytest.raises(ConfigurationError, match="priority must be an int from 0 to 9"):
        encode(make_envelope(priority=priority))


def test_naive_eta_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="naive"):
        encode(make_envelope(eta=datetime(2030, 1, 1)))


def test_extra_header_may_not_shadow_an_envelope_header() -> None:
    with pytest.raises(ConfigurationError, match="'taskq-task' is reserved"):
        encode(make_envelope(headers={"taskq-task": "other"}))


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"ratio": 1.5}, "holds a float, which AMQP headers cannot carry"),
        ({"pair": (1, 2)}, "holds a tuple"),
        ({"big": 2**64}, "outside the signed 64-bit range"),
        ({"n" * 256: 1}, "name longer than 255 bytes"),
        ({"meta": {"inner": {"x": object()}}}, "holds a field 'inner' that holds a field 'x'"),
        ({"tags": ["a", 0.5]}, "holds a float"),
    ],
)
def test_extra_headers_amqp_cannot_carry_are_refused_at_enqueue(
    headers: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(reason)) as caught:
        encode(make_envelope(headers=headers))
    assert caught.value.task == make_envelope().task


def test_extra_headers_of_every_amqp_type_encode() -> None:
    headers = {
        "s": "text", "b": b"\x00", "t": True, "i": -(2**63), "d": Decimal("1.5"),
        "when": datetime(2026, 1, 1, tzinfo=timezone.utc), "none": None,
        "list": [1, "two", [3]], "map": {"k": {"deep": "v"}},
    }
    assert encode(make_envelope(headers=headers)).headers["map"] == {"k": {"deep": "v"}}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"body": b"\xc1"}, "not valid msgpack"),
        ({"body": msgpack.packb([1])}, "top level is an array"),
        ({"headers": {"taskq-v": None}}, "header taskq-v is missing: not a taskq message"),
        ({"headers": {"taskq-v": 2}}, "unsupported protocol version 2"),
        ({"headers": {"taskq-v": "1"}}, "unsupported protocol version '1'"),
        ({"headers": {"taskq-v": True}}, "unsupported protocol version True"),
        ({"headers": {"taskq-task": None}}, "header taskq-task is missing"),
        ({"headers": {"taskq-task": b"billing.charge"}}, "header taskq-task is b'billing.charge'"),
        ({"headers": {"taskq-task": ""}}, "header taskq-task is '' (str)"),
        ({"headers": {"taskq-retries": "1"}}, "header taskq-retries is '1' (str)"),
        ({"headers": {"taskq-retries": -1}}, "expected an int >= 0"),
        ({"headers": {"taskq-eta": "soon"}}, "header taskq-eta is 'soon' (str)"),
        ({"headers": {"taskq-eta": 10**20}}, "expected epoch milliseconds"),
        ({"headers": {"taskq-eta": 1.5}}, "header taskq-eta is 1.5 (float)"),
        ({"headers": {"taskq-idempotency-key": 5}}, "taskq-idempotency-key is 5 (int)"),
        ({"message_id": None}, "message_id property (the task id) is missing"),
        ({"message_id": ""}, "message_id property (the task id) is missing"),
        ({"content_type": "application/json"}, "content type is 'application/json'"),
    ],
)
def test_malformed_message_raises_decode_error_with_reason(
    changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(DecodeError) as info:
        decode(make_wire(**changes))
    assert reason in vars(info.value)["reason"]
    assert vars(info.value)["reason"] in str(info.value)


def test_decode_error_names_the_message_and_task_when_known() -> None:
    with pytest.raises(DecodeError) as info:
        decode(make_wire(body=b"\x90"))
    assert vars(info.value)["task_id"] == TASK_ID
    assert vars(info.value)["task"] == "billing.charge"
    assert TASK_ID in str(info.value)


def test_missing_content_type_is_accepted() -> None:
    assert decode(make_wire(content_type=None)).task == "billing.charge"


# -- dead letters -----------------------------------------------------------------------------

DEATHS = {
    "x-death": [{"count": 2, "queue": "billing"}],
    "x-first-death-queue": "billing",
    "x-first-death-reason": "rejected",
    "x-first-death-exchange": "taskq",
    "x-last-death-queue": "billing",
    "x-last-death-reason": "rejected",
    "x-last-death-exchange": "taskq",
}


def dead_letter(**changes: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "error_type": "ValueError",
        "error": "bad card",
        "traceback": "Traceback (most recent call last):\nValueError: bad card\n",
        "attempts": 3,
        "origin_queue": "billing",
        "traceback_max_chars": 4000,
        "failed_at": datetime(2025, 1, 31, 8, 30, 0, 250000, tzinfo=timezone.utc),
    }
    headers = changes.pop("headers", {"taskq-v": 1, "taskq-task": "billing.charge", **DEATHS})
    options.update(changes)
    return dead_letter_headers(headers, **options)


def test_dead_letter_headers_drop_x_death_and_add_the_reason() -> None:
    original = {"taskq-v": 1, "taskq-task": "billing.charge", **DEATHS}
    result = dead_letter(headers=original)
    assert result == {
        "taskq-v": 1,
        "taskq-task": "billing.charge",
        "taskq-error-type": "ValueError",
        "taskq-error": "bad card",
        "taskq-traceback": "Traceback (most recent call last):\nValueError: bad card\n",
        "taskq-attempts": 3,
        "taskq-failed-at": 1738312200250,
        "taskq-origin-queue": "billing",
    }
    assert "x-death" in original  # the input is not modified


def test_dead_letter_traceback_keeps_its_end() -> None:
    traceback = "".join(f'  File "app.py", line {n}\n' for n in range(500)) + "KeyError: 'x'\n"
    kept = dead_letter(traceback=traceback, traceback_max_chars=300)["taskq-traceback"]
    assert len(kept) <= 300
    assert kept.endswith("line 499\nKeyError: 'x'\n")
    assert kept.startswith(f"[... start truncated, {len(traceback)} characters in all ...]\n")


@pytest.mark.parametrize("max_chars", [0, 1, 10])
def test_dead_letter_traceback_tiny_limit_still_bounded(max_chars: int) -> None:
    traceback = "x" * 50 + "END"
    kept = dead_letter(traceback=traceback, traceback_max_chars=max_chars)["taskq-traceback"]
    assert kept == traceback[len(traceback) - max_chars :]


def test_dead_letter_error_is_cut_and_none_traceback_is_empty() -> None:
    result = dead_letter(error="e" * 50_000, traceback=None)
    assert len(result["taskq-error"]) == message.ERROR_MAX_CHARS
    assert result["taskq-error"].endswith("...")
    assert result["taskq-traceback"] == ""


def test_dead_letter_failed_at_defaults_to_now_in_epoch_ms() -> None:
    before = time.time_ns() // 1_000_000
    stamp = dead_letter(failed_at=None, headers=None)["taskq-failed-at"]
    assert before <= stamp <= time.time_ns() // 1_000_000
    assert dead_letter(failed_at=datetime(1970, 1, 1, 0, 0, 1))["taskq-failed-at"] == 1000


def test_strip_x_death_keeps_everything_else() -> None:
    assert strip_x_death({**DEATHS, "x-delay": 5, "a": 1}) == {"x-delay": 5, "a": 1}
    assert strip_x_death(None) == {}


# -- docs/PROTOCOL.md matches the code --------------------------------------------------------


def header_constants() -> set[str]:
    return {
        value
        for name, value in vars(message).items()
        if name.isupper() and isinstance(value, str) and value.startswith("taskq-")
    }


def test_protocol_doc_names_exactly_the_header_constants() -> None:
    documented = set(re.findall(r"`(taskq-[a-z-]+)`", PROTOCOL_MD.read_text()))
    assert documented == header_constants()
    assert len(header_constants()) == 15  # with taskq-workflow (workflow members)
    assert PROTOCOL_VERSION == 1


def test_protocol_doc_ext_table_matches_the_codec() -> None:
    samples = {
        "datetime": datetime(2025, 1, 1, tzinfo=timezone.utc),
        "date": date(2025, 1, 1),
        "Decimal": Decimal("1"),
        "UUID": uuid.UUID(int=1),
        "int": 2**64,
    }
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (\w+) \|", PROTOCOL_MD.read_text(), re.M)
    assert {name for _, name, _ in rows} == set(samples)
    for code, name, length in rows:
        body = encode_body([samples[name]], {}, task="doc")
        ext_code, data = msgpack.unpackb(body, ext_hook=lambda c, d: (c, d))["args"][0]
        assert ext_code == int(code), name
        assert length == "variable" or len(data) == int(length), name


def test_protocol_doc_example_is_what_the_code_produces() -> None:
    doc = PROTOCOL_MD.read_text()
    wire = encode(make_envelope())
    dump = "\n".join(
        f"{offset:08x}  {wire.body[offset : offset + 16].hex(' ')}"
        for offset in range(0, len(wire.body), 16)
    )
    assert dump in doc
    assert f"Payload      {len(wire.body)} bytes" in doc
    assert base64.b64encode(wire.body).decode() in doc
    for name, value in wire.headers.items():
        assert re.search(rf"{name}:\s+{re.escape(str(value))}\n", doc), name
    assert f"content_type:   {wire.content_type}" in doc
    assert f"message_id:     {wire.message_id}" in doc


@pytest.mark.parametrize("make", [
    pytest.param(lambda: [message.new_task_id() for _ in range(2000)], id="one by one"),
    pytest.param(lambda: message.new_task_ids(2000), id="in bulk"),
])
def test_new_task_ids_are_random_uuid4_strings(make: Any) -> None:
    ids = make()
    assert len(set(ids)) == len(ids)
    for task_id in ids:
        parsed = uuid.UUID(task_id)
        assert str(parsed) == task_id
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_bulk_task_ids_use_all_four_variant_digits() -> None:
    assert {task_id[19] for task_id in message.new_task_ids(400)} == set("89ab")
    assert message.new_task_ids(0) == []


def test_gc_paused_restores_the_collector_as_it_found_it() -> None:
    import gc

    assert gc.isenabled()
    with message.gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), message.gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with message.gc_paused():
            pass
        assert not gc.isenabled()  # left off: whoever turned it off turns it back on
    finally:
        gc.enable()
