"""Received messages can be framed again, and no header value can abort a connection.

Issue 12 item 2, the broker side: pika hands over invalid UTF-8 short strings as bytes and
fails on some field values while reading a frame; a dead letter or retry copies the message.
"""

from __future__ import annotations

import struct

import pika.data
import pika.spec
import pytest

from taskq.broker._frames import content_frames, encode_table
from taskq.errors import SerializationError
from taskq.message import CONTENT_TYPE, WireMessage


def test_short_strings_received_as_bytes_are_framed_as_they_came() -> None:
    wire = WireMessage(b"x", b"id-\xff", {b"k\xff": 1}, 0, 1, b"\xfe", CONTENT_TYPE)  # type: ignore[arg-type, dict-item]

    frames = content_frames(1, wire, 4096)

    assert b"\x04id-\xff" in frames and b"\x01\xfe" in frames and b"\x02k\xffI" in frames


@pytest.mark.parametrize(
    "wire",
    [
        WireMessage(b"x", "id", {"k": {1, 2}}),
        WireMessage(b"x", "id", {"k": 1.5}),
        WireMessage(b"x", "i" * 256),
        WireMessage(b"x", "id", {}, timestamp=-1),
        WireMessage(b"x", "id", {}, priority=256),
        WireMessage(b"x", "id", {}, priority=-1),
        WireMessage(b"x", "id", {"big": "x" * 4096}),
    ],
    ids=["set", "float", "long id", "negative timestamp", "priority 256", "priority -1",
         "header > frame"],
)
def test_what_cannot_be_framed_is_a_serialization_error(wire: WireMessage) -> None:
    with pytest.raises(SerializationError, match="cannot be published"):
        content_frames(1, wire, 4096)


def test_encode_table_accepts_bytes_names_like_pika() -> None:
    pieces: list[bytes] = []
    pika.data.encode_table(pieces, {b"\xff": 1, "n": {b"\xfe": "v"}})
    assert encode_table({b"\xff": 1, "n": {b"\xfe": "v"}}) == b"".join(pieces)


# -- decoding: no header value can kill the consumer's connection -----------------------------


def _table(*fields: bytes) -> bytes:
    payload = b"".join(fields)
    return struct.pack(">I", len(payload)) + payload


def test_headers_pika_cannot_decode_are_read_instead_of_aborting_the_connection() -> None:
    import taskq.broker  # noqa: F401 - installs the total decoder

    nan = b"\x03nan" + b"d" + struct.pack(">d", float("nan"))
    inf = b"\x03inf" + b"f" + struct.pack(">f", float("-inf"))
    later = b"\x05later" + b"T" + struct.pack(">Q", 2**62)
    nested = b"\x06nested" + b"A" + struct.pack(">I", 9) + b"T" + struct.pack(">Q", 2**64 - 1)
    finite = b"\x04half" + b"d" + struct.pack(">d", 2.5)
    huge = b"\x04huge" + b"d" + struct.pack(">d", 1e300)
    raw = struct.pack(">H", 1 << 13) + _table(nan, inf, later, nested, finite, huge)

    properties = pika.spec.BasicProperties()
    properties.decode(raw)

    assert properties.headers == {
        "nan": "nan", "inf": "-inf", "later": 2**62, "nested": [str(2**64 - 1)],
        "half": 2,  # pika's own (lossy) reading of finite floats is kept...
        "huge": "1e+300",  # ...where the int it gives could travel again
    }
    assert encode_table(properties.headers)  # and the copy can be published again
