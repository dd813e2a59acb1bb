"""Makes pika's decoding of AMQP field tables total: no header value can kill a connection.

pika decodes the headers of each incoming message inside its frame reader. Three field types
raise there for values any AMQP client may send: a float or double that is NaN or infinite
(pika turns every float into an int, pika/pika#599) and a timestamp past year 9999. The
exception aborts the whole connection; the broker requeues the message, the consumer
reconnects, receives it again and dies again, forever, and the worker never sees the message
to dead-letter it. Installed on import of :mod:`taskq.broker`, this wrapper answers those
values instead: a non-finite float as its text (``"nan"``, ``"inf"``, ``"-inf"``), a
timestamp out of ``datetime``'s range as its epoch seconds (an int; text past 2**63 - 1).
Every value pika could decode before decodes exactly as before.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.data

_FLOATS = {b"f": struct.Struct(">f"), b"d": struct.Struct(">d")}
_TIMESTAMP = b"T"
_UINT64 = struct.Struct(">Q")
_INT64_MAX = 2**63 - 1
# What int(nan), int(inf) and datetime.fromtimestamp(huge) raise.
_OUT_OF_RANGE = (ValueError, OverflowError, OSError)


def _total_decode_value(
    encoded: bytes, offset: int, _decode: Any = pika.data.decode_value
) -> tuple[Any, int]:
    try:
        return _decode(encoded, offset)  # type: ignore[no-any-return]
    except _OUT_OF_RANGE:
        # Nested arrays and tables call pika.data.decode_value, i.e. this function, for each
        # item: an exception reaching here comes from the value at this offset itself.
        kind = encoded[offset:offset + 1]
        number = _FLOATS.get(kind)
        if number is not None:
            value = number.unpack_from(encoded, offset + 1)[0]
            return str(value), offset + 1 + number.size
        if kind == _TIMESTAMP:
            seconds = _UINT64.unpack_from(encoded, offset + 1)[0]
            # An int where it can travel back as a signed long-long, else its text.
            value = seconds if seconds <= _INT64_MAX else str(seconds)
            return value, offset + 1 + _UINT64.size
        raise


def install() -> None:
    """Replace ``pika.data.decode_value`` with the total version (idempotent)."""
    if pika.data.decode_value is not _total_decode_value:
        pika.data.decode_value = _total_decode_value


install()
