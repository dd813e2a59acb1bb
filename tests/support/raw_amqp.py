"""Publish Basic.Publish frames built by hand: what any AMQP client may send, taskq or not.

taskq's publisher (and pika's) refuse much of what the wire allows: short strings that are
not UTF-8, NaN doubles, timestamps past year 9999, every integer width. Tests that check
how a worker copes with other clients' messages build the frames here, field type by field
type (AMQP 0-9-1 §4.2.5 with RabbitMQ's errata), and write them on a pika connection's
channel. Without publisher confirms: :meth:`RawPublisher.sync` makes a round trip on the
same channel, after which the broker has taken every message sent before it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.frame
import pika.spec

# A typed AMQP field value: (type octet, value); "A" holds a list of typed values and "F"
# a list of (name, typed value) pairs (names are bytes: any octets).
Typed = tuple[str, Any]

_PACK = {
    "t": ">B", "b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I",
    "l": ">q", "f": ">f", "d": ">d", "T": ">Q",
}

# Property flags of Basic content headers, in wire order (pika.spec.BasicProperties).
_FLAGS = {
    "content_type": 1 << 15, "headers": 1 << 13, "delivery_mode": 1 << 12,
    "priority": 1 << 11, "correlation_id": 1 << 10, "message_id": 1 << 7,
    "timestamp": 1 << 6, "type": 1 << 5, "app_id": 1 << 3,
}


@dataclass
class RawMessage:
    """Properties as raw values: short strings are bytes (any octets), headers are typed."""

    body: bytes
    content_type: bytes | None = None
    headers: list[tuple[bytes, Typed]] | None = None
    delivery_mode: int | None = 2
    priority: int | None = None
    correlation_id: bytes | None = None
    message_id: bytes | None = None
    timestamp: int | None = None
    type: bytes | None = None
    app_id: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def short_string(raw: bytes) -> bytes:
    """An AMQP short string: length octet, then the octets (at most 255)."""
    assert len(raw) <= 255, raw
    return bytes((len(raw),)) + raw


def encode_value(typed: Typed) -> bytes:
    """One field value with its type octet."""
    kind, value = typed
    head = kind.encode()
    if kind in _PACK:
        return head + struct.pack(_PACK[kind], value)
    if kind == "D":
        decimals, raw = value
        return head + struct.pack(">Bi", decimals, raw)
    if kind in ("S", "x"):
        return head + struct.pack(">I", len(value)) + value
    if kind == "A":
        items = b"".join(encode_value(item) for item in value)
        return head + struct.pack(">I", len(items)) + items
    if kind == "F":
        return head + encode_table(value)
    if kind == "V":
        return head
    raise ValueError(f"unknown field type {kind!r}")


def encode_table(pairs: list[tuple[bytes, Typed]]) -> bytes:
    """A field table from ``(name, typed value)`` pairs, in their order (names may repeat)."""
    payload = b"".join(short_string(name) + encode_value(value) for name, value in pairs)
    return struct.pack(">I", len(payload)) + payload


def content_header(channel: int, message: RawMessage) -> bytes:
    """The content header frame of ``message``."""
    flags, props = 0, b""
    for name, flag in _FLAGS.items():
        value = getattr(message, name)
        if value is None:
            continue
        flags |= flag
        if name == "headers":
            props += encode_table(value)
        elif name in ("delivery_mode", "priority"):
            props += bytes((value,))
        elif name == "timestamp":
            props += struct.pack(">Q", value)
        else:
            props += short_string(value)
    payload = struct.pack(">HHQH", 60, 0, len(message.body), flags) + props
    return struct.pack(">BHI", 2, channel, len(payload)) + payload + b"\xce"


class RawPublisher:
    """Writes hand-built Basic.Publish frames on a channel of its own connection.

    Args:
        url: AMQP URL of the broker.
    """

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self._impl = self.connection._impl
        self._body_max: int = self._impl._body_max_length

    def send(self, exchange: str, routing_key: str, message: RawMessage) -> None:
        """Write one message's frames (method, content header, body frames)."""
        number = self.channel.channel_number
        method = pika.frame.Method(
            number, pika.spec.Basic.Publish(exchange=exchange, routing_key=routing_key)
        ).marshal()
        frames = [method, content_header(number, message)]
        body = message.body
        for start in range(0, len(body), self._body_max):
            chunk = body[start:start + self._body_max]
            frames.append(struct.pack(">BHI", 3, number, len(chunk)) + chunk + b"\xce")
        self._impl._adapter_emit_data(b"".join(frames))

    def sync(self, queue: str) -> None:
        """Round trip on the channel: everything sent before is with the broker.

        Raises:
            pika.exceptions.AMQPError: the broker closed the channel or the connection over
                something sent.
        """
        self.channel.queue_declare(queue, passive=True)

    def close(self) -> None:
        """Close the connection (best effort)."""
        try:
            self.connection.close()
        except Exception:  # the broker may have closed it already
            pass
