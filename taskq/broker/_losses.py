"""How the consumer waits and logs after losing its connection, and how it drops one."""

from __future__ import annotations

import logging
import random
from typing import Any

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


def drop_connection(connection: Any) -> None:
    """Close ``connection``'s TCP socket without AMQP's closing handshake.

    For a consumer of ordered partitions (``x-single-active-consumer``). pika's ``close()``
    first cancels every consumer (``basic.cancel``), upon which RabbitMQ makes each partition's
    standby consumer active at once and hands it the next messages, while this process still
    holds earlier ones unacked: those go back to the queue only when the channel closes,
    *behind* what the standby got meanwhile. When the connection drops instead, the broker
    ends the channel as one event: its unacked messages go back to their places, then the
    next consumer becomes active, as when a worker process dies. Acks already written to the
    socket are still sent (the kernel flushes them before the FIN) and processed first.
    """
    transport = getattr(getattr(connection, "_impl", None), "_transport", None)
    if transport is None:
        return
    transport.abort()
    try:
        connection.process_data_events(0)  # lets pika see the loss and finalize
    except (pika.exceptions.AMQPError, OSError):
        logger.debug("connection dropped", exc_info=True)
