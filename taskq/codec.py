"""The msgpack codec of task arguments: the body of wire protocol v1 (docs/PROTOCOL.md).

A body is the msgpack map ``{"args": [...], "kwargs": {...}}``. Native msgpack carries
``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``, lists and maps; tuples
travel as arrays and come back as lists. Everything else taskq supports travels as a msgpack
ext type with a fixed code:

====  ==============  ==========================================================
code  Python type     data (big-endian)
====  ==============  ==========================================================
1     aware datetime  int64 microseconds since 1970-01-01 UTC, int32 UTC offset (s)
2     date            uint32 proleptic Gregorian ordinal (``date.toordinal()``)
3     Decimal         ASCII ``str(value)``, e.g. ``b"-1.50"``, ``b"NaN"``
4     UUID            the 16 bytes of ``value.bytes``
5     int             two's-complement signed integer, minimal length; only for ints
                      outside int64/uint64, which msgpack cannot hold natively
====  ==============  ==========================================================

A body written by another msgpack library may also use msgpack's standard timestamp ext
(code -1); it is read as an aware UTC datetime. taskq never writes it: it has no UTC offset.

Big ints use an ext type rather than failing because Python code passes them without
thinking (ids, hashes); the cost is paid only by those values.

Anything else (sets, naive datetimes, arbitrary objects...) raises
:class:`~taskq.errors.SerializationError` naming the task and the argument path, before
anything is published. Nothing is ever pickled.

Both directions stay on msgpack's C fast path: encoding is one ``packb`` call whose ``default``
hook only sees ext values; only when it fails are the arguments walked to find the culprit.
"""

from __future__ import annotations

import struct
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, NoReturn

import msgpack

from taskq.errors import DecodeError, SerializationError

EXT_DATETIME = 1
EXT_DATE = 2
EXT_DECIMAL = 3
EXT_UUID = 4
EXT_BIGINT = 5

_REPR_MAX_CHARS = 60

_DATETIME = struct.Struct(">qi")
_DATE = struct.Struct(">I")
_EPOCH_NAIVE = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)
_SUPPORTED = (
    "supported types are None, bool, int, float, str, bytes, list, tuple, dict, "
    "timezone-aware datetime, date, Decimal and UUID"
)

# msgpack's own timestamp ext (-1) bypasses ext_hook; have it read as an aware UTC datetime
# (other languages' producers use it) rather than leak msgpack.Timestamp objects.
_AS_DATETIME = 3
_unpackb = msgpack.unpackb
_ExtType = msgpack.ExtType


class _Unsupported(TypeError):
    """Raised by the ``default`` hook; carries a sentence saying what to do instead."""


class _Packers(threading.local):
    """One msgpack Packer per thread: ``msgpack.packb`` builds a new one per call, which
    costs more than packing a small body (1.8 µs against 0.6, benchmarks/README.md)."""

    pack: Callable[[Any], bytes]

    def __init__(self) -> None:
        self.fresh()

    def fresh(self) -> None:
        """Start over with a new Packer (after a failed pack)."""
        self.pack = msgpack.Packer(default=_default, use_bin_type=True).pack


# -- encoding ---------------------------------------------------------------------------------


def encode_body(args: Sequence[Any], kwargs: Mapping[str, Any] | None, *, task: str) -> bytes:
    """Encode call arguments as the msgpack body ``{"args": [...], "kwargs": {...}}``.

    Args:
        args: Positional arguments (a list or tuple).
        kwargs: Keyword arguments; ``None`` means none.
        task: Registered task name, used only in error messages.

    Returns:
        The msgpack bytes of the body.

    Raises:
        SerializationError: An argument has a type the codec does not carry. Its ``task`` and
            ``argument`` attributes (e.g. ``"kwargs['items'][3]"``) say which.
    """
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, dict):
        kwargs = dict(kwargs)
    if not isinstance(args, (list, tuple)):
        _fail(task, "args", f"is a {type(args).__name__}; pass a list or tuple of arguments")
    for key in kwargs:
        if key.__class__ is not str:
            _fail(task, "kwargs", f"has the key {_short_repr(key)}; keyword names must be str")
    try:
        body: bytes = _packers.pack({"args": args, "kwargs": kwargs})
        return body
    except (TypeError, ValueError, OverflowError) as exc:
        _packers.fresh()  # a failed pack may leave bytes in the packer's buffer
        try:
            found = _find_problem(args, kwargs)
        except RecursionError:  # nesting deeper than Python's stack; msgpack said so too
            found = None
        path, problem = found or ("args/kwargs", f"cannot be encoded by msgpack: {exc}")
        _fail(task, path, problem, cause=exc)


def _default(value: Any) -> object:
    """msgpack's hook for values it cannot pack itself; checked most common first."""
    if isinstance(value, datetime):
        return _ExtType(EXT_DATETIME, _pack_datetime(value))
    if isinstance(value, date):
        return _ExtType(EXT_DATE, _DATE.pack(value.toordinal()))
    if isinstance(value, Decimal):
        return _ExtType(EXT_DECIMAL, str(value).encode("ascii"))
    if isinstance(value, uuid.UUID):
        return _ExtType(EXT_UUID, value.bytes)
    if isinstance(value, int):
        # msgpack calls the hook for ints outside int64/uint64.
        size = (value.bit_length() + 8) // 8
        return _ExtType(EXT_BIGINT, value.to_bytes(size, "big", signed=True))
    raise _Unsupported(_unsupported_hint(value))


_packers = _Packers()


def _pack_datetime(value: datetime) -> bytes:
    offset = value.utcoffset()
    if offset is None:
        raise _Unsupported(
            "is a naive datetime (no tzinfo), which would be read in the worker's local time; "
            "pass an aware datetime, e.g. datetime.now(timezone.utc) or "
            "value.replace(tzinfo=timezone.utc)"
        )
    if offset.microseconds:
        raise _Unsupported(
            "is a datetime whose UTC offset has a fraction of a second; convert it to UTC "
            "with value.astimezone(timezone.utc)"
        )
    # Pure timedelta arithmetic: no overflow even at datetime.min/max with an offset.
    micros = (value.replace(tzinfo=None) - _EPOCH_NAIVE - offset) // _MICROSECOND
    return _DATETIME.pack(micros, offset.days * 86400 + offset.seconds)


def _unsupported_hint(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, (set, frozenset)):
        return f"is a {kind}; pass a list instead, e.g. sorted(value)"
    return (
        f"is of type {kind}, which taskq cannot serialize ({_SUPPORTED}); pass plain data, "
        "e.g. a database id instead of the object"
    )


def _fail(task: str, path: str, problem: str, *, cause: BaseException | None = None) -> NoReturn:
    message = f"cannot enqueue task {task!r}: argument {path} {problem}"
    raise SerializationError(message, task=task, argument=path) from cause


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _REPR_MAX_CHARS else text[: _REPR_MAX_CHARS - 3] + "..."


# -- finding the culprit (only after a failed packb) -------------------------------------------


def _find_problem(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return ``(path, problem)`` of the first value that cannot be encoded, if any."""
    active: set[int] = set()
    for index, value in enumerate(args):
        found = _check(value, f"args[{index}]", active)
        if found:
            return found
    for key, value in kwargs.items():
        found = _check(value, f"kwargs[{key!r}]", active)
        if found:
            return found
    return None


def _check(value: Any, path: str, active: set[int]) -> tuple[str, str] | None:
    # Mirrors what msgpack accepts natively (subclasses included), then asks the hook.
    if value is None or isinstance(value, (bool, float, bytes, bytearray, memoryview)):
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "is a str with lone surrogates, which is not valid UTF-8"
        return None
    if isinstance(value, (list, tuple, dict)):
        return _check_container(value, path, active)
    try:
        _default(value)
    except (_Unsupported, OverflowError, ValueError) as exc:
        return path, str(exc)
    return None


def _check_container(
    value: list[Any] | tuple[Any, ...] | dict[Any, Any], path: str, active: set[int]
) -> tuple[str, str] | None:
    if id(value) in active:
        return path, "contains itself (a circular reference)"
    active.add(id(value))
    if isinstance(value, dict):
        found = _check_dict(value, path, active)
    else:
        found = None
        for index, item in enumerate(value):
            found = _check(item, f"{path}[{index}]", active)
            if found:
                break
    active.discard(id(value))
    return found


def _check_dict(value: dict[Any, Any], path: str, active: set[int]) -> tuple[str, str] | None:
    for key, item in value.items():
        found = _check(key, path, active)
        if found:
            return path, f"has the key {_short_repr(key)}, which {found[1]}"
        found = _check(item, f"{path}[{_short_repr(key)}]", active)
        if found:
            return found
    return None


# -- decoding ---------------------------------------------------------------------------------


def decode_body(body: bytes) -> tuple[list[Any], dict[str, Any]]:
    """Decode a msgpack body into ``(args, kwargs)``.

    Args:
        body: The raw message body.

    Returns:
        The positional arguments as a list and the keyword arguments as a dict.

    Raises:
        DecodeError: The body is not msgpack, has trailing bytes, is not a map with an
            ``args`` array and a ``kwargs`` map with str keys, or holds an unknown or
            malformed ext type. ``reason`` says which, in words.
    """
    try:
        payload = _unpackb(
            body, ext_hook=_ext_hook, strict_map_key=False, raw=False, timestamp=_AS_DATETIME
        )
    except TypeError:
        payload = _decode_with_array_keys(body)
    except msgpack.ExtraData as exc:
        _reject(f"trailing bytes after the msgpack value ({len(exc.extra)} extra)")
    except (ValueError, OverflowError, msgpack.UnpackException) as exc:
        _reject(f"not valid msgpack ({_describe(exc)})")
    if payload.__class__ is not dict:
        _reject(f"top level is {_kind(payload)}, expected a map with 'args' and 'kwargs'")
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    if args.__class__ is not list:
        _reject_field(payload, "args", "an array")
    if kwargs.__class__ is not dict:
        _reject_field(payload, "kwargs", "a map")
    for key in kwargs:
        if key.__class__ is not str:
            _reject(f"'kwargs' has the key {_short_repr(key)}, keyword names must be strings")
    return args, kwargs


def _decode_with_array_keys(body: bytes) -> Any:
    """Slow path for maps keyed by arrays (tuple keys), unhashable when decoded as lists."""
    try:
        payload = _unpackb(
            body,
            ext_hook=_ext_hook,
            strict_map_key=False,
            raw=False,
            timestamp=_AS_DATETIME,
            use_list=False,
        )
        return _tuples_to_lists(payload)
    except (TypeError, ValueError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        _reject(f"not valid msgpack ({_describe(exc)})")


def _tuples_to_lists(value: Any) -> Any:
    # Arrays become lists as on the fast path, except in key position where a tuple is needed.
    if value.__class__ is tuple:
        return [_tuples_to_lists(item) for item in value]
    if value.__class__ is dict:
        return {key: _tuples_to_lists(item) for key, item in value.items()}
    return value


def _ext_hook(code: int, data: bytes) -> Any:
    unpack = _EXT_DECODERS.get(code)
    if unpack is None:
        _reject(f"unknown msgpack ext type {code} (known: 1-5)")
    try:
        return unpack(data)
    except (struct.error, ValueError, OverflowError, ArithmeticError) as exc:
        _reject(f"malformed ext type {code} ({len(data)} bytes): {_describe(exc)}")


_TIMEZONES: dict[int, timezone] = {0: timezone.utc}


def _unpack_datetime(data: bytes) -> datetime:
    micros, offset_s = _DATETIME.unpack(data)
    tz = _TIMEZONES.get(offset_s)
    if tz is None:
        tz = timezone(timedelta(seconds=offset_s))
        if len(_TIMEZONES) < 1024:  # bounded: offsets come from untrusted input
            _TIMEZONES[offset_s] = tz
    # Build the local wall time directly: going through UTC would overflow near date limits.
    local = _EPOCH_NAIVE + timedelta(microseconds=micros + offset_s * 1_000_000)
    return local.replace(tzinfo=tz)


def _unpack_date(data: bytes) -> date:
    return date.fromordinal(_DATE.unpack(data)[0])


def _unpack_decimal(data: bytes) -> Decimal:
    return Decimal(data.decode("ascii"))


def _unpack_uuid(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=data)


def _unpack_bigint(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


_EXT_DECODERS: dict[int, Callable[[bytes], Any]] = {
    EXT_DATETIME: _unpack_datetime,
    EXT_DATE: _unpack_date,
    EXT_DECIMAL: _unpack_decimal,
    EXT_UUID: _unpack_uuid,
    EXT_BIGINT: _unpack_bigint,
}


def _reject(reason: str) -> NoReturn:
    raise DecodeError(f"message body cannot be decoded: {reason}", reason=reason)


_KINDS = {
    type(None): "nil",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    bytes: "binary",
    list: "an array",
    dict: "a map",
}


def _reject_field(payload: dict[Any, Any], name: str, expected: str) -> NoReturn:
    if name not in payload:
        _reject(f"{name!r} is missing")
    _reject(f"{name!r} is {_kind(payload[name])}, expected {expected}")


def _kind(value: Any) -> str:
    """Name a decoded value's msgpack type, as the sender would know it."""
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
