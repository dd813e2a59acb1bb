"""Pure delay arithmetic: epoch milliseconds, tier bits, ``x-delay`` validation, headers.

No I/O. The tier walk these numbers drive is drawn in :mod:`taskq.delay.tiers`.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

from taskq.broker.topology import (
    DELAY_LEVEL_HEADER_PREFIX,
    DELAY_LEVEL_PASS,
    DELAY_LEVEL_WAIT,
    DELAY_PLUGIN_MAX_MS,
    DELAY_TIERS_MAX_MS,
    delay_level_header,
)
from taskq.errors import ConfigurationError
from taskq.message import ETA, WireMessage
from taskq.republish import republish_headers

X_DELAY = "x-delay"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
_MILLISECOND = timedelta(milliseconds=1)


def epoch_ms(at: datetime | None = None) -> int:
    """``at`` (an aware datetime; ``None`` is now) in whole epoch milliseconds, rounded down."""
    if at is None:
        return time.time_ns() // 1_000_000
    return (at - _EPOCH) // _MILLISECOND


def delay_ms_from_s(delay_s: float) -> int:
    """Seconds to whole milliseconds, rounded up so that a message is never early."""
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)):
        raise ConfigurationError(f"a delay must be a number of seconds, not {delay_s!r}")
    if not math.isfinite(delay_s):
        raise ConfigurationError(f"a delay must be a number of seconds, not {delay_s!r}")
    return max(0, math.ceil(delay_s * 1000))


def eta_ms_of(eta: datetime) -> int:
    """An aware datetime in epoch milliseconds, rounded up (never early)."""
    if eta.utcoffset() is None:
        raise ConfigurationError(f"eta {eta!r} is naive; pass an aware datetime")
    microseconds = (eta - _EPOCH) // _MICROSECOND
    return -(-microseconds // 1000)


def tier_levels(delay_ms: int) -> list[int]:
    """The tiers a message of ``delay_ms`` waits in, longest first: its set bits.

    Raises:
        ConfigurationError: ``delay_ms`` is not an int in 0 .. ``DELAY_TIERS_MAX_MS``.
    """
    check_delay_ms(delay_ms, DELAY_TIERS_MAX_MS, "the delay tiers")
    return [level for level in range(delay_ms.bit_length() - 1, -1, -1) if delay_ms >> level & 1]


def tier_headers(delay_ms: int) -> dict[str, int]:
    """The ``taskq-delay-level-NN`` headers that walk a message down ``delay_ms``.

    One header per tier from the entry (highest set bit) down to tier 00: 1 means wait in
    that tier, 0 pass it by. Tiers above the entry are never visited and get no header.
    """
    waits = set(tier_levels(delay_ms))
    return {
        delay_level_header(level): DELAY_LEVEL_WAIT if level in waits else DELAY_LEVEL_PASS
        for level in range(delay_ms.bit_length() - 1, -1, -1)
    }


def x_delay(delay_ms: int) -> int:
    """Validate an ``x-delay`` value for the delayed-message plugin.

    The plugin crashes (and the broker closes the connection) on an ``x-delay`` that is not
    an integer, and delivers one above ``2**32 - 1`` at once.

    Raises:
        ConfigurationError: not an int in 0 .. ``DELAY_PLUGIN_MAX_MS``.
    """
    check_delay_ms(delay_ms, DELAY_PLUGIN_MAX_MS, "the delayed-message plugin")
    return delay_ms


def check_delay_ms(delay_ms: int, limit_ms: int, what: str) -> None:
    """Refuse a delay that is not whole milliseconds in 0 .. ``limit_ms`` (``what`` holds it).

    Raises:
        ConfigurationError: it is not, with what to do instead.
    """
    if delay_ms.__class__ is not int:
        raise ConfigurationError(f"a delay must be whole milliseconds (int), not {delay_ms!r}")
    if not 0 <= delay_ms <= limit_ms:
        raise ConfigurationError(
            f"a delay of {delay_ms} ms is outside what {what} can hold (0 .. {limit_ms} ms, "
            f"about {limit_ms / 86_400_000:.0f} days); enqueue longer delays through the "
            "outbox (apply_async(..., session=...)), which keeps them in the database"
        )


def delayed_headers(wire: WireMessage, eta_ms: int) -> dict[str, object]:
    """Headers of a republished delayed message: no x-death, no stale tier bits, the eta."""
    headers = {
        name: value
        for name, value in republish_headers(wire.headers).items()
        if not name.startswith(DELAY_LEVEL_HEADER_PREFIX) and name != X_DELAY
    }
    headers[ETA] = eta_ms
    return headers


def with_headers(wire: WireMessage, headers: dict[str, object]) -> WireMessage:
    """``wire`` with ``headers`` in place of its own."""
    return WireMessage(
        wire.body,
        wire.message_id,
        headers,
        wire.priority,
        wire.timestamp,
        wire.app_id,
        wire.content_type,
    )
