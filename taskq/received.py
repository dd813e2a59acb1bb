"""Messages as any AMQP client may send them, made readable for the rest of taskq.

Any client can publish to a work queue, and pika hands over a short string (``message_id``,
``app_id``, ``content_type``, a header name, also in nested tables) that is not valid UTF-8
as ``bytes``. taskq's code, its logs and the republish path (dead letters, retries) take
these for ``str``: :func:`normalize_received` makes them so before any check reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskq.message import WireMessage

# Longest AMQP short string (message_id, app_id, content_type, header names), in bytes.
SHORT_STRING_MAX_BYTES = 255


def normalize_received(wire: WireMessage) -> WireMessage:
    """``wire`` with every property and header name a ``str`` (``wire`` itself if they are).

    Any AMQP client may send a short string (``message_id``, ``app_id``, ``content_type``,
    a header name, also in nested tables) that is not valid UTF-8, and pika then hands it
    over as ``bytes``. taskq's code, its logs and the republish path (dead letters, retries)
    take these for ``str``, so such a value becomes one: the valid UTF-8 as it was, each
    invalid byte as a ``\\xNN`` escape, cut to 255 bytes so that it still fits a short
    string. Header values are kept as received (``bytes`` values travel as byte arrays).

    Args:
        wire: A message as the broker adapter received it.

    Returns:
        A message whose properties and header names are ``str`` or ``None``.
    """
    # Any: the declared types are what this function establishes, not what pika gives.
    received: Any = wire
    headers = received.headers
    if (
        received.message_id.__class__ is not bytes
        and received.app_id.__class__ is not bytes
        and received.content_type.__class__ is not bytes
        and headers.__class__ is dict
        and _names_are_str(headers)
    ):
        return wire
    return WireMessage(
        wire.body,
        _short_text(wire.message_id),
        _readable_table(headers) if isinstance(headers, Mapping) else {},
        wire.priority,
        wire.timestamp,
        _short_text(wire.app_id),
        _short_text(wire.content_type),
    )


def _names_are_str(value: Any) -> bool:
    # Flat str-keyed headers are the common case: one pass, no copy.
    if value.__class__ is dict:
        for name, item in value.items():
            if name.__class__ is not str:
                return False
            if (item.__class__ is dict or item.__class__ is list) and not _names_are_str(item):
                return False
        return True
    if value.__class__ is list:
        return all(_names_are_str(item) for item in value)
    return True


def _readable_table(table: Mapping[Any, Any]) -> dict[str, Any]:
    return {_short_text(name) or "": _readable_value(item) for name, item in table.items()}


def _readable_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _readable_table(value)
    if isinstance(value, list):
        return [_readable_value(item) for item in value]
    return value


def _short_text(value: Any) -> str | None:
    """A received short string as ``str``: invalid UTF-8 escaped, at most 255 bytes."""
    if value is None or value.__class__ is str:
        return value
    text = (
        bytes(value).decode("utf-8", "backslashreplace")
        if isinstance(value, (bytes, bytearray)) else str(value)
    )
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) > SHORT_STRING_MAX_BYTES:
        text = raw[:SHORT_STRING_MAX_BYTES].decode("utf-8", "ignore")
    return text
