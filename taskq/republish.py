"""Headers of the copies taskq republishes: retries, delay hops, dead letters, replays.

A copy keeps body and properties; its headers lose what would misroute or drop it:
RabbitMQ's ``x-death`` family (a broker before 4.0.1 silently drops a message whose
``x-death`` shows a dead-letter cycle) and the ``CC``/``BCC`` routing headers. A dead letter
also gains the ``taskq-error-*`` headers of docs/PROTOCOL.md.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from taskq.message import (
    ATTEMPTS,
    ERROR,
    ERROR_MAX_CHARS,
    ERROR_TYPE,
    FAILED_AT,
    ORIGIN_QUEUE,
    TRACEBACK,
    strip_x_death,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MILLISECOND = timedelta(milliseconds=1)
_INT64_MAX = 2**63 - 1

# Sender-selected distribution: RabbitMQ also routes a message to the routing keys its CC and
# BCC headers name (and keeps CC on the delivered copy). A copy taskq republishes (retry,
# delay hop, dead letter, replay) goes where taskq sends it, and only there.
_ROUTING_HEADERS = frozenset({"CC", "BCC"})


def republish_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers for a copy taskq republishes: without ``x-death`` (see :func:`strip_x_death`)
    and without ``CC``/``BCC``, which would make RabbitMQ route extra copies of a retry or a
    dead letter to the queues they name."""
    return {
        name: value
        for name, value in strip_x_death(headers).items()
        if name not in _ROUTING_HEADERS
    }


def dead_letter_headers(
    headers: Mapping[str, Any] | None,
    *,
    error_type: str,
    error: str,
    traceback: str | None,
    attempts: int,
    origin_queue: str,
    traceback_max_chars: int,
    failed_at: datetime | None = None,
) -> dict[str, Any]:
    """Headers for the copy of a failed message published to ``Q.dlq``.

    Args:
        headers: The failed message's headers (copied, minus the ``x-death`` family).
        error_type: Exception class name, or a reason such as ``DecodeError``.
        error: Error message; cut to ``ERROR_MAX_CHARS``.
        traceback: Traceback text, or ``None``; cut to ``traceback_max_chars``, keeping its
            end, where the raising line is.
        attempts: How many times the task ran (or the message was delivered).
        origin_queue: The work queue the message came from.
        traceback_max_chars: Longest traceback kept (setting ``traceback_max_chars``).
        failed_at: When it failed (aware; a naive value is taken as UTC); ``None`` is now.

    Returns:
        A new dict of headers.
    """
    result = republish_headers(headers)
    result[ERROR_TYPE] = error_type
    result[ERROR] = error if len(error) <= ERROR_MAX_CHARS else error[: ERROR_MAX_CHARS - 3] + "..."
    result[TRACEBACK] = _keep_end(traceback or "", traceback_max_chars)
    # Clamped: the count may come from a hostile taskq-retries, and must still be sent.
    result[ATTEMPTS] = min(max(attempts, 0), _INT64_MAX)
    result[FAILED_AT] = _epoch_ms(failed_at)
    result[ORIGIN_QUEUE] = origin_queue
    return result


def _keep_end(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    marker = f"[... start truncated, {len(text)} characters in all ...]\n"
    if len(marker) >= max_chars:
        return text[len(text) - max(max_chars, 0) :]
    return marker + text[len(text) - (max_chars - len(marker)) :]


def _epoch_ms(at: datetime | None) -> int:
    if at is None:
        return time.time_ns() // 1_000_000
    if at.utcoffset() is None:
        # Never fail while dead-lettering: a naive value is most likely utcnow().
        at = at.replace(tzinfo=timezone.utc)
    return (at - _EPOCH) // _MILLISECOND
