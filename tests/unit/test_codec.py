"""The msgpack codec: what round-trips, what is refused at enqueue, what a worker rejects."""

from __future__ import annotations

import enum
import math
import threading
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import msgpack
import pytest

from taskq import codec
from taskq.codec import decode_body, encode_body
from taskq.errors import DecodeError, SerializationError

TASK = "shop.send_invoice"
PLUS_0530 = timezone(timedelta(hours=5, minutes=30))
MINUS_0345 = timezone(-timedelta(hours=3, minutes=45))


def round_trip(args: Any = (), kwargs: Any = None) -> tuple[list[Any], dict[str, Any]]:
    return decode_body(encode_body(args, kwargs, task=TASK))


class Color(enum.IntEnum):
    RED = 1


# -- round trips ------------------------------------------------------------------------------

SCALARS = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    2**1000,
    -(2**1000) + 7,
    0.0,
    -1.5,
    1e308,
    float("inf"),
    "",
    "héllo ✓",
    b"",
    b"\x00\xffbytes",
    datetime(2024, 5, 1, 12, 30, 1, 123456, tzinfo=timezone.utc),
    datetime(2024, 5, 1, 12, 30, 1, 999999, tzinfo=PLUS_0530),
    datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=MINUS_0345),
    datetime.min.replace(tzinfo=timezone(timedelta(hours=14))),
    datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),
    date(2024, 2, 29),
    date.min,
    date.max,
    Decimal("19.99"),
    Decimal("-0.000"),
    Decimal("1.50E+3"),
    Decimal("3.14159265358979323846264338327950288419716939937510582097494459"),
    Decimal("Infinity"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    uuid.uuid4(),
]


@pytest.mark.parametrize("value", SCALARS, ids=repr)
def test_scalar_round_trips_in_args_and_kwargs(value: Any) -> None:
    args, kwargs = round_trip([value], {"v": value})
    for decoded in (args[0], kwargs["v"]):
        assert decoded == value
        assert type(decoded) is type(value)


def test_datetime_keeps_its_offset_wall_clock_and_microseconds() -> None:
    value = datetime(2025, 1, 31, 9, 30, 0, 654321, tzinfo=ZoneInfo("Asia/Kolkata"))
    (decoded,), _ = round_trip([value])
    assert decoded == value
    assert decoded.utcoffset() == timedelta(hours=5, minutes=30)
    assert (decoded.hour, decoded.minute, decoded.microsecond) == (9, 30, 654321)


def test_datetime_offset_with_seconds_survives() -> None:
    # Historical zones have offsets like +00:19:32 (Amsterdam before 1937).
    value = datetime(1930, 6, 1, 12, 0, tzinfo=ZoneInfo("Europe/Amsterdam"))
    (decoded,), _ = round_trip([value])
    assert decoded == value
    assert decoded.utcoffset() == value.utcoffset()


def test_decimal_keeps_digits_exponent_and_nan() -> None:
    values = [Decimal("1.10"), Decimal("-0"), Decimal("NaN"), Decimal("1E+2")]
    args, _ = round_trip(values)
    assert [str(v) for v in args] == ["1.10", "-0", "NaN", "1E+2"]


def test_float_nan_round_trips() -> None:
    (decoded,), _ = round_trip([float("nan")])
    assert math.isnan(decoded)


def test_nested_containers_and_tuples_become_lists() -> None:
    value: dict[str, Any] = {
        "items": [(1, 2), [3, (4, {"d": date(2024, 1, 1)})]],
        "empty": ((), [], {}),
    }
    (decoded,), kwargs = round_trip((value,), {"t": (1, (2, 3))})
    assert decoded == {"items": [[1, 2], [3, [4, {"d": date(2024, 1, 1)}]]], "empty": [[], [], {}]}
    assert kwargs == {"t": [1, [2, 3]]}


def test_bytes_and_str_stay_apart() -> None:
    (as_str, as_bytes), _ = round_trip(["abc", b"abc"])
    assert type(as_str) is str
    assert type(as_bytes) is bytes


def test_dict_keys_may_be_scalars_and_tuples() -> None:
    key_uuid = uuid.UUID(int=5)
    value = {1: "int", None: "nil", b"k": "bin", 1.5: "float", key_uuid: "uuid", (1, (2, 3)): "t"}
    (decoded,), _ = round_trip([value])
    assert decoded == value
    # A tuple key comes back a tuple (a list cannot be a key); values inside stay lists.
    (with_tuple_key,), _ = round_trip([{(1, 2): [(3,)]}])
    assert with_tuple_key == {(1, 2): [[3]]}


def test_empty_and_missing_arguments() -> None:
    assert round_trip() == ([], {})
    assert round_trip([], {}) == ([], {})
    assert round_trip((), None) == ([], {})


def test_subclasses_travel_as_their_base_type() -> None:
    (color, blob), _ = round_trip([Color.RED, bytearray(b"ab")])
    assert (type(color), color) == (int, 1)
    assert (type(blob), blob) == (bytes, b"ab")


def test_body_is_the_documented_map() -> None:
    body = encode_body((1,), {"a": "b"}, task=TASK)
    assert msgpack.unpackb(body) == {"args": [1], "kwargs": {"a": "b"}}
    assert body.startswith(b"\x82\xa4args")


def test_common_case_never_walks_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: Any) -> None:
        raise AssertionError("the failure-path walk ran for encodable arguments")

    monkeypatch.setattr(codec, "_find_problem", forbidden)
    encode_body(SCALARS, {"nested": [{"x": SCALARS}]}, task=TASK)


# -- ext layouts (docs/PROTOCOL.md) -----------------------------------------------------------


def ext_of(value: Any) -> Any:
    body = encode_body([value], {}, task=TASK)
    payload = msgpack.unpackb(body, ext_hook=lambda code, data: (code, data))
    return payload["args"][0]


def test_ext_layouts_are_the_documented_bytes() -> None:
    paris_winter = datetime(2025, 1, 31, 9, 30, tzinfo=timezone(timedelta(hours=1)))
    assert ext_of(paris_winter) == (1, (1738312200000000).to_bytes(8, "big") + b"\x00\x00\x0e\x10")
    assert ext_of(date(1, 1, 1)) == (2, b"\x00\x00\x00\x01")
    assert ext_of(Decimal("-1.50")) == (3, b"-1.50")
    assert ext_of(uuid.UUID(int=1)) == (4, b"\x00" * 15 + b"\x01")
    assert ext_of(2**64) == (5, b"\x01" + b"\x00" * 8)
    assert ext_of(-(2**63) - 1) == (5, b"\xff\x7f" + b"\xff" * 7)
    assert ext_of(-(2**63)) == -(2**63)  # still native


# -- refused at enqueue -----------------------------------------------------------------------


def refuse(args: Any = (), kwargs: Any = None) -> SerializationError:
    with pytest.raises(SerializationError) as info:
        encode_body(args, kwargs, task=TASK)
    # Exactly SerializationError: not a subclass (DecodeError, MessageTooLarge), nothing else.
    assert type(info.value) is SerializationError
    assert vars(info.value)["task"] == TASK
    assert repr(TASK) in str(info.value)
    return info.value


def unserializable_function() -> None:
    """A function is not data."""


@pytest.mark.parametrize(
    ("args", "kwargs", "path", "words"),
    [
        ([1, {1, 2}], None, "args[1]", "is a set; pass a list"),
        ([frozenset()], None, "args[0]", "is a frozenset"),
        ([], {"when": datetime(2024, 1, 1)}, "kwargs['when']", "pass an aware datetime"),
        ([], {"items": [0, 1, 2, {"x": object()}]}, "kwargs['items'][3]['x']", "type object"),
        ([unserializable_function], None, "args[0]", "type function"),
        ([(1, (2, {"deep": [1, 2, 3j]}))], None, "args[0][1][1]['deep'][2]", "type complex"),
        ([["ok", "\udc80"]], None, "args[0][1]", "not valid UTF-8"),
        ([{frozenset({1}): 1}], None, "args[0]", "has the key frozenset({1})"),
        ([], {1: "x"}, "kwargs", "keyword names must be str"),
        ("abc", None, "args", "pass a list or tuple"),
        (
            [datetime(2024, 1, 1, tzinfo=timezone(timedelta(microseconds=5)))],
            None,
            "args[0]",
            "fraction of a second",
        ),
    ],
)
def test_unsupported_value_names_task_and_argument_path(
    args: Any, kwargs: Any, path: str, words: str
) -> None:
    error = refuse(args, kwargs)
    assert vars(error)["argument"] == path
    assert f"argument {path} " in str(error)
    assert words in str(error)


def test_unsupported_object_message_lists_supported_types() -> None:
    error = refuse([object()])
    assert "supported types are None, bool, int" in str(error)


def test_circular_reference_is_refused_not_a_crash() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    error = refuse([loop])
    assert vars(error)["argument"] == "args[0][1]"
    assert "circular reference" in str(error)


def test_too_deep_nesting_is_a_serialization_error() -> None:
    value: Any = 1
    for _ in range(5000):
        value = [value]
    error = refuse([value])
    assert "recursion limit" in str(error)


def test_non_dict_mapping_kwargs_are_accepted() -> None:
    from types import MappingProxyType

    assert round_trip([], MappingProxyType({"a": 1})) == ([], {"a": 1})


# -- rejected by a worker ---------------------------------------------------------------------


def body_of(payload: Any, **options: Any) -> bytes:
    return msgpack.packb(payload, **options)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack (FormatError)"),
        (b'{"args": [], "kwargs": {}}', "trailing bytes"),  # JSON: '{' is msgpack int 123
        (b"\x01", "top level is an integer"),
        (b"\x82\xa4args", "not valid msgpack"),
        (body_of({"args": [], "kwargs": {}}) + b"\x00\x00", "trailing bytes"),
        (body_of([1, 2]), "top level is an array"),
        (body_of("hello"), "top level is a string"),
        (body_of({"kwargs": {}}), "'args' is missing"),
        (body_of({"args": []}), "'kwargs' is missing"),
        (body_of({"args": None, "kwargs": {}}), "'args' is nil, expected an array"),
        (body_of({"args": {}, "kwargs": {}}), "'args' is a map, expected an array"),
        (body_of({"args": [], "kwargs": []}), "'kwargs' is an array, expected a map"),
        (body_of({"args": [], "kwargs": {1: 2}}), "'kwargs' has the key 1"),
        (body_of({"args": [msgpack.ExtType(42, b"")], "kwargs": {}}), "unknown msgpack ext"),
        (b"\x82\xa4args\x91\xd5\xff\x00\x00\xa6kwargs\x80", "invalid timestamp"),
        (body_of({"args": [msgpack.ExtType(1, b"\0" * 3)], "kwargs": {}}), "malformed ext type 1"),
        (body_of({"args": [msgpack.ExtType(2, b"\0" * 4)], "kwargs": {}}), "malformed ext type 2"),
        (body_of({"args": [msgpack.ExtType(3, b"1.2.3")], "kwargs": {}}), "malformed ext type 3"),
        (body_of({"args": [msgpack.ExtType(3, b"\xff")], "kwargs": {}}), "malformed ext type 3"),
        (body_of({"args": [msgpack.ExtType(4, b"\0" * 15)], "kwargs": {}}), "malformed ext type 4"),
        (
            body_of({"args": [msgpack.ExtType(1, (2**62).to_bytes(8, "big") + b"\0" * 4)]}),
            "malformed ext type 1",
        ),
        (
            body_of({"args": [msgpack.ExtType(1, b"\0" * 8 + (86400).to_bytes(4, "big"))]}),
            "malformed ext type 1",
        ),
        (b"\x82\xa4args\x91\xa2\xff\xfe\xa6kwargs\x80", "not valid msgpack (UnicodeDecodeError"),
        (b"\x82\xa4args\x91\x81\x81\x01\x01\x01\xa6kwargs\x80", "unhashable type: 'dict'"),
        (b"\x82\xa4args" + b"\x91" * 3000 + b"\x01\xa6kwargs\x80", "not valid msgpack"),
    ],
)
def test_malformed_body_raises_decode_error_with_reason(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_body(body)
    assert reason in vars(info.value)["reason"]
    assert vars(info.value)["reason"] in str(info.value)


def test_standard_msgpack_timestamp_reads_as_aware_utc_datetime() -> None:
    body = body_of({"args": [msgpack.Timestamp(1700000000, 123456789)], "kwargs": {}})
    (decoded,), _ = decode_body(body)
    assert decoded == datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=timezone.utc)
    assert decoded.utcoffset() == timedelta(0)


def test_unknown_top_level_keys_are_ignored() -> None:
    body = body_of({"args": [1], "kwargs": {}, "future": "field"})
    assert decode_body(body) == ([1], {})


def test_str_instead_of_bytes_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="bytes-like"):
        decode_body("not bytes")  # type: ignore[arg-type]


def test_a_failed_encoding_leaves_nothing_behind_for_the_next() -> None:
    """The per-thread packer is replaced after a failure, so no half-packed bytes leak."""
    with pytest.raises(SerializationError):
        encode_body([1, "two", object()], None, task="t")
    assert msgpack.unpackb(encode_body([3], {"k": "v"}, task="t")) == {
        "args": [3], "kwargs": {"k": "v"}
    }


def test_threads_encoding_at_once_each_get_their_own_bodies() -> None:
    errors: list[str] = []

    def encode_many(n: int) -> None:
        for i in range(2000):
            args = [n, i, "x" * (i % 50)]
            if msgpack.unpackb(encode_body(args, None, task="t"))["args"] != args:
                errors.append(f"thread {n} call {i}")

    threads = [threading.Thread(target=encode_many, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
