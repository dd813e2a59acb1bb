"""AMQP 0-9-1 frames of a Basic.Publish, marshalled straight from a :class:`WireMessage`.

Private to the broker package. pika builds a ``BasicProperties`` object per message, encodes
it field by field through generic helpers and marshals the method, header and body frames one
by one: about 30 µs of CPU per message, which on a 2-core machine is CPU the broker then lacks
(benchmarks/README.md, "bulk enqueue"). A task message has a fixed shape — seven properties,
a few ``taskq-*`` headers of type str or int — so the header frame is packed here in a few
``struct`` calls, the method frame of each (exchange, routing key) is marshalled once, and the
bytes are identical to pika's (tests/unit/test_frames.py checks them against pika's own
marshalling). Header values of other types go through pika's table encoder.

A message taskq received is republished as it came (dead letters, retries, DLQ replays), so
short strings given as ``bytes`` (what pika decodes from invalid UTF-8) are written as they
are, and anything that still cannot be framed raises :class:`~taskq.errors.SerializationError`
naming the message, never a raw ``TypeError`` or ``struct.error`` out of the publisher.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.data
import pika.exceptions
import pika.frame
import pika.spec

from taskq.errors import SerializationError
from taskq.message import IDEMPOTENCY_KEY, WireMessage

_FRAME_HEADER = 2
_FRAME_BODY = 3
_FRAME_END = b"\xce"
_BASIC_CLASS = 60
_PERSISTENT = b"\x02"
# delivery mode 2 and each possible priority octet, ready to append
_PERSISTENT_WITH_PRIORITY = [_PERSISTENT + bytes((p,)) for p in range(256)]

# Property flags of BasicProperties (AMQP 0-9-1 §4.2.6.1 / pika.spec), in wire order.
_CONTENT_TYPE = 1 << 15
_HEADERS = 1 << 13
_DELIVERY_MODE = 1 << 12
_PRIORITY = 1 << 11
_MESSAGE_ID = 1 << 7
_TIMESTAMP = 1 << 6
_APP_ID = 1 << 3

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_frame_head = struct.Struct(">BHI").pack
# header frame head + content header up to the property flags: frame type, channel, payload
# size, class id, weight (0), body size, flags
_content_head = struct.Struct(">BHIHHQH").pack
_uint32 = struct.Struct(">I").pack
_int32_field = struct.Struct(">ci").pack
_uint64 = struct.Struct(">Q").pack
_int64_field = struct.Struct(">cq").pack

# Short strings repeat (content type, app id, header names): encode each once.
_short_strings: dict[str | bytes, bytes] = {}
# Encoded header fields of type str or int, by (name, value, type); emptied when full.
_pairs: dict[tuple[str | bytes, Any, type], bytes] = {}
_MAX_CACHED_PAIRS = 4096


def _short_string(value: str | bytes) -> bytes:
    encoded = _short_strings.get(value)
    if encoded is None:
        encoded = _uncached_short_string(value)
        if len(_short_strings) < 1024:
            _short_strings[value] = encoded
    return encoded


def _uncached_short_string(value: str | bytes) -> bytes:
    # bytes: a received short string that was not valid UTF-8, sent back as it came.
    raw = value if value.__class__ is bytes else value.encode()  # type: ignore[union-attr]
    if len(raw) > 255:
        raise ValueError(
            "an AMQP short string (content type, app id, message id or header name) is "
            f"longer than 255 bytes: {value[:60]!r}..."
        )
    return bytes((len(raw),)) + raw


# What framing raises for a value it cannot carry (pika's encoder, struct, str.encode).
_UNFRAMEABLE = (
    ValueError, TypeError, OverflowError, IndexError, AttributeError, struct.error,
    pika.exceptions.AMQPError,
)


def encode_table(table: dict[str, Any] | dict[str | bytes, Any]) -> bytes:
    """An AMQP field table, byte for byte as ``pika.data.encode_table`` writes it."""
    pieces: list[bytes] = []
    pairs = _pairs
    for key, value in table.items():
        kind = type(value)
        if kind is str or kind is int:
            # Most fields repeat from message to message (version, task name, retries).
            cache_key = (key, value, kind)
            piece = pairs.get(cache_key)
            if piece is None:
                piece = _short_string(key) + _field_value(value)
                if key != IDEMPOTENCY_KEY:  # unique per message: never seen again
                    if len(pairs) >= _MAX_CACHED_PAIRS:
                        pairs.clear()
                    pairs[cache_key] = piece
            pieces.append(piece)
        else:
            pieces.append(_short_string(key))
            pika.data.encode_value(pieces, value)
    payload = b"".join(pieces)
    return _uint32(len(payload)) + payload


def _field_value(value: str | int) -> bytes:
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _uint32(len(raw)) + raw
    if _INT32_MIN <= value <= _INT32_MAX:
        return _int32_field(b"I", value)
    return _int64_field(b"l", value)


def method_frame(channel_number: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
    """The marshalled Basic.Publish method frame (the same for every message to one route)."""
    method = pika.spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                     mandatory=mandatory)
    marshalled: bytes = pika.frame.Method(channel_number, method).marshal()
    return marshalled


def content_frames(channel_number: int, wire: WireMessage, body_max: int) -> bytes:
    """The header frame and body frame(s) of ``wire``: always persistent (docs/PROTOCOL.md).

    ``body_max`` is the largest body frame payload the connection negotiated (frame_max - 8).

    Raises:
        SerializationError: A property or header cannot be framed (a short string longer
            than 255 bytes, a header value AMQP has no type for, a priority or timestamp
            out of range, more headers than fit one frame); ``task_id`` names the message.
    """
    flags = _DELIVERY_MODE
    content_type, headers, priority = wire.content_type, wire.headers, wire.priority
    message_id, timestamp, app_id = wire.message_id, wire.timestamp, wire.app_id
    props = b""
    try:  # free in CPython 3.11+ until something raises
        if content_type is not None:
            flags |= _CONTENT_TYPE
            props = _short_string(content_type)
        if headers:
            flags |= _HEADERS
            props += encode_table(headers)
        if priority is not None:
            flags |= _PRIORITY
            # A negative index would pick another octet; 256 and up raise IndexError.
            props += _PERSISTENT_WITH_PRIORITY[priority if priority >= 0 else 256]
        else:
            props += _PERSISTENT
        if message_id is not None:
            flags |= _MESSAGE_ID
            props += _uncached_short_string(message_id)
        if timestamp is not None:
            flags |= _TIMESTAMP
            props += _uint64(timestamp)
        if app_id is not None:
            flags |= _APP_ID
            props += _short_string(app_id)
    except _UNFRAMEABLE as exc:
        raise _unframeable(wire, f"{type(exc).__name__}: {exc}") from exc
    header_size = 14 + len(props)
    if header_size > body_max:
        # The broker would close the whole connection (FRAME_ERROR) over this one message.
        raise _unframeable(wire, f"{header_size} bytes of properties, more than one frame "
                                 f"holds ({body_max})")
    body = wire.body
    size = len(body)
    head = _content_head(_FRAME_HEADER, channel_number, header_size, _BASIC_CLASS, 0, size,
                         flags)
    if size <= body_max:
        if not size:
            return head + props + _FRAME_END
        return b"".join((head, props, _FRAME_END, _frame_head(_FRAME_BODY, channel_number, size),
                         body, _FRAME_END))
    parts = [head, props, _FRAME_END]
    for start in range(0, size, body_max):
        chunk = body[start:start + body_max]
        parts += (_frame_head(_FRAME_BODY, channel_number, len(chunk)), chunk, _FRAME_END)
    return b"".join(parts)


def _unframeable(wire: WireMessage, problem: str) -> SerializationError:
    task = (wire.headers or {}).get("taskq-task")
    return SerializationError(
        f"message {wire.message_id!r} cannot be published: its AMQP properties or headers "
        f"cannot be encoded ({problem}); drop or fix the offending header",
        task_id=wire.message_id, task=task if isinstance(task, str) else None,
    )
