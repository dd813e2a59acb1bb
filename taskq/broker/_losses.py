"""How the consumer waits and what it logs after losing its connection or channel."""

from __future__ import annotations

import logging
import random

import pika.exceptions

logger = logging.getLogger("taskq.broker.subscription")  # where these lines always appeared

# First reconnect delay; it doubles per failed attempt up to settings.reconnect_max_delay_s.
_RECONNECT_BASE_DELAY_S = 0.5


def reconnect_delay_s(
    attempt: int, max_delay_s: float, *, rand: random.Random | None = None
) -> float:
    """Seconds to wait before reconnect attempt ``attempt`` (0-based).

    Exponential from 0.5 s, capped at ``max_delay_s``, with "equal jitter": a random value
    between half the delay and the full delay, so that the processes of a worker that lost
    the broker together do not all come back in the same instant.
    """
    delay = min(max_delay_s, _RECONNECT_BASE_DELAY_S * (2 ** min(attempt, 30)))
    uniform = rand.uniform if rand is not None else random.uniform
    return float(delay / 2 + uniform(0, delay / 2))


def log_loss(exc: BaseException, delay_s: float, attempt: int) -> None:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        hint = ""
        if "timed out" in str(exc.reply_text):
            hint = (" A task kept its delivery unacked past the broker's consumer_timeout: "
                    "see the worker's start-up warning about time limits and prefetch.")
        logger.warning(
            "the broker closed the consumer's channel (%s %s); its unfinished deliveries are "
            "dropped here and redelivered by the broker; consuming again in %.1fs "
            "(attempt %d).%s", exc.reply_code, exc.reply_text, delay_s, attempt, hint,
        )
        return
    logger.warning(
        "broker connection lost (%s: %s); reconnecting in %.1fs (attempt %d)",
        type(exc).__name__, exc or "no detail", delay_s, attempt,
    )
