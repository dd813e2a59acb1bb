"""Makes pika's decoding of AMQP field tables total: no header value can kill a connection.

pika decodes the headers of each incoming message inside its frame reader, and reads every
float and double as an int (``int(value)``, pika/pika#599). Two kinds of value any AMQP client
may send go wrong there:

- a NaN or infinite float raises in ``int()``, and so does a timestamp past year 9999 in
  ``datetime``. The exception aborts the whole connection; the broker requeues the message,
  the consumer reconnects, receives it again and dies again, forever, and the worker never
  sees the message to dead-letter it;
- a float beyond the signed 64-bit range (``1e300``) becomes a 300-digit int that no AMQP
  type carries, so the message can never be republished (dead letter, retry, replay).

Installed on import of :mod:`taskq.broker`, this wrapper reads such a float as its text
(``"nan"``, ``"inf"``, ``"1e+300"``) and such a timestamp as its epoch seconds (an int; text
past 2**63 - 1). Every other value decodes exactly as pika decodes it.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pika.compat
import pika.data

_FLOATS = {b"f": struct.Struct(">f"), b"d": struct.Struct(">d")}
_TIMESTAMP = b"T"
_UINT64 = struct.Struct(">Q")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# What datetime.fromtimestamp(huge) raises.
_OUT_OF_RANGE = (ValueError, OverflowError, OSError)


def _total_decode_value(
    encoded: bytes, offset: int, _decode: Any = pika.data.decode_value
) -> tuple[Any, int]:
    kind = encoded[offset:offset + 1]
    number = _FLOATS.get(kind)
    if number is not None:
        value = number.unpack_from(encoded, offset + 1)[0]
        end = offset + 1 + number.size
        if math.isfinite(value) and _INT64_MIN <= value <= _INT64_MAX:
            return pika.compat.long(value), end  # what pika itself answers
        return str(value), end
    try:
        return _decode(encoded, offset)  # type: ignore[no-any-return]
    except _OUT_OF_RANGE:
        # Nested arrays and tables call pika.data.decode_value, i.e. this function, for each
        # item: an exception reaching here comes from the value at this offset itself.
        if kind != _TIMESTAMP:
            raise
        seconds = _UINT64.unpack_from(encoded, offset + 1)[0]
        # An int where it can travel back as a signed long-long, else its text.
        return (seconds if seconds <= _INT64_MAX else str(seconds)), offset + 1 + _UINT64.size


def install() -> None:
    """Replace ``pika.data.decode_value`` with the total version (idempotent)."""
    if pika.data.decode_value is not _total_decode_value:
        pika.data.decode_value = _total_decode_value


install()
