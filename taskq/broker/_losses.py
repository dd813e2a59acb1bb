"""How the consumer waits and logs after losing its connection, and how it ends one."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

logger = logging.getLogger("taskq.broker.subscription")  # where these lines always appeared

# Reply code given to pika for a connection taskq drops on purpose (AMQP's connection-forced).
_DROPPED_CODE = 320
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


def wait_stamping(wake: threading.Event, delay_s: float, stamp: Callable[[], None]) -> None:
    """Wait ``delay_s`` (or until ``wake`` is set), calling ``stamp()`` about every second."""
    remaining_s = delay_s
    while remaining_s > 0 and not wake.is_set():
        step_s = min(1.0, remaining_s)
        wake.wait(step_s)
        remaining_s -= step_s
        stamp()


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
    if isinstance(exc, pika.exceptions.ConsumerCancelled):  # text: taskq.broker.cancels
        logger.warning("%s; consuming again in %.1fs (attempt %d)", exc, delay_s, attempt)
        return
    logger.warning(
        "broker connection lost (%s: %s); reconnecting in %.1fs (attempt %d)",
        type(exc).__name__, exc or "no detail", delay_s, attempt,
    )


def drop_connection(connection: Any) -> None:
    """Close ``connection``'s TCP socket without AMQP's closing handshake; never raises.

    For a consumer of ordered partitions (``x-single-active-consumer``). pika's ``close()``
    first cancels every consumer (``basic.cancel``), upon which RabbitMQ makes each partition's
    standby consumer active at once and hands it the next messages, while this process still
    holds earlier ones unacked: those go back to the queue only when the channel closes,
    *behind* what the standby got meanwhile. When the connection drops instead, the broker
    ends the channel as one event: its unacked messages go back to their places, then the
    next consumer becomes active, as when a worker process dies. Acks already written to the
    socket are still sent (the kernel flushes them before the FIN) and processed first.

    The drop goes through pika's own way of ending a connection on a local decision (what it
    does on a missed heartbeat), with a "closed by client" reason, so pika finalizes the
    connection and its channels without raising. Aborting the transport alone left pika with
    no reason and made it fail an assertion inside ``process_data_events``; in the I/O
    thread's recovery path that ended the thread and left the process connected to nothing.
    This runs on recovery paths, so whatever goes wrong here is logged, never raised: the
    caller goes on to reconnect (or to stop) either way.
    """
    impl = getattr(connection, "_impl", None)
    if impl is None or not connection.is_open:
        return
    try:
        impl._terminate_stream(pika.exceptions.ConnectionClosedByClient(
            _DROPPED_CODE, "dropped by taskq: ordered partitions are handed over on close"))
        connection.process_data_events(0)  # lets pika see the loss and finalize
    except Exception:  # noqa: BLE001 - see the docstring: a drop must not end the caller
        logger.debug("error while dropping the broker connection", exc_info=True)
        _abort_socket(impl)


def _abort_socket(impl: Any) -> None:
    """Last resort of :func:`drop_connection`: close the socket under pika."""
    transport = getattr(impl, "_transport", None)
    sock = getattr(transport, "_sock", None)
    if sock is not None:
        try:
            sock.close()
        except OSError:
            logger.debug("closing the socket of a dropped connection failed", exc_info=True)


def closing_reason(channel: BlockingChannel) -> BaseException:
    """Why pika closed ``channel`` (the broker's reply), for the reconnect log."""
    reason: object = getattr(channel, "_closing_reason", None)  # set by pika when it closed
    if isinstance(reason, BaseException):
        return reason
    closed: BaseException = pika.exceptions.ChannelClosed(0, "the consumer's channel closed")
    return closed


def close_quietly(connection: pika.BlockingConnection) -> None:
    """Close ``connection`` if it is open; errors are logged, not raised."""
    if connection.is_open:
        try:
            connection.close()
        except (pika.exceptions.AMQPError, OSError):
            logger.debug("error closing a failed connection", exc_info=True)


def reject(channel: BlockingChannel, tag: int, *, requeue: bool) -> None:
    """``basic.reject``, or with ``requeue`` a ``basic.nack``."""
    # A requeue goes as basic.nack: RabbitMQ 4.3 counts basic.reject(requeue) against a
    # quorum queue's delivery limit and basic.nack not, so a delivery taskq gives back (a
    # fault that is not the message's) spends nothing; 3.x treats both alike.
    if requeue:
        channel.basic_nack(tag, requeue=True)
    else:
        channel.basic_reject(tag, requeue=False)


def nothing() -> None:
    """A no-op callback: scheduling it wakes the I/O thread out of process_data_events."""
