"""Queue figures for ``taskq status``: the management HTTP API when enabled, AMQP otherwise.

The management API is asked over HTTPS (port 15671) when the broker URL is ``amqps://`` and
over plain HTTP (port 15672) when it is ``amqp://``; see :mod:`taskq.broker._management`.

The management API reports ready and unacked messages, consumers, and the publish and ack
rates (``message_stats``, averaged by the broker over its statistics interval) per queue.
Without it, a passive ``queue.declare`` over AMQP reports ready messages and consumers only:
unacked counts and rates are then unknown (``None``), and ``taskq status`` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import pika
import pika.exceptions

from taskq.broker import _management as management
from taskq.broker.connection import connection_parameters, open_connection
from taskq.settings import Settings

logger = logging.getLogger(__name__)

_MANAGEMENT_TIMEOUT_S = 1.5


@dataclass(frozen=True)
class QueueStats:
    """Figures of one queue; ``unacked`` and the rates are ``None`` when the source cannot
    tell (AMQP). Rates are messages per second as the management plugin computes them."""

    name: str
    ready: int
    unacked: int | None
    consumers: int
    published_per_s: float | None = None
    acked_per_s: float | None = None


@dataclass(frozen=True)
class BrokerSnapshot:
    """Figures of several queues and where they came from (``management`` or ``amqp``).

    Queues that do not exist are absent from ``queues``.
    """

    source: str
    queues: dict[str, QueueStats]


def snapshot(settings: Settings, names: Iterable[str]) -> BrokerSnapshot:
    """Read the figures of ``names`` (missing queues are left out).

    Raises:
        BrokerConnectionError: the broker cannot be reached over AMQP (one line, URL masked).
    """
    wanted = list(dict.fromkeys(names))
    from_api = _from_management(settings, wanted)
    if from_api is not None:
        return BrokerSnapshot("management", from_api)
    return BrokerSnapshot("amqp", _from_amqp(settings, wanted))


def _from_amqp(settings: Settings, names: list[str]) -> dict[str, QueueStats]:
    connection = open_connection(settings, client_name="taskq status")
    stats: dict[str, QueueStats] = {}
    try:
        channel = connection.channel()
        for name in names:
            try:
                method = channel.queue_declare(name, passive=True).method
            except pika.exceptions.ChannelClosedByBroker:
                channel = connection.channel()  # 404: the queue does not exist
                continue
            stats[name] = QueueStats(name, method.message_count, None, method.consumer_count)
    finally:
        if connection.is_open:
            connection.close()
    return stats


def _from_management(settings: Settings, names: list[str]) -> dict[str, QueueStats] | None:
    """All queues of the vhost in one request, or ``None`` when the API does not answer.

    Over HTTPS for an ``amqps://`` broker, never plain HTTP (see :mod:`._management`).
    """
    params = connection_parameters(settings, client_name="taskq status")
    path = (
        f"/api/queues/{management.vhost_path(params)}"
        "?columns=name,messages_ready,messages_unacknowledged,consumers,"
        "message_stats.publish_details.rate,message_stats.ack_details.rate"
    )
    try:
        rows = management.get_json(params, path, timeout_s=_MANAGEMENT_TIMEOUT_S)
    except (OSError, ValueError):
        logger.debug("management API not available at %s", management.base_url(params))
        return None
    wanted = set(names)
    return {
        row["name"]: QueueStats(
            row["name"],
            int(row.get("messages_ready") or 0),
            int(row.get("messages_unacknowledged") or 0),
            int(row.get("consumers") or 0),
            _rate(row, "publish_details"),
            _rate(row, "ack_details"),
        )
        for row in rows
        if row.get("name") in wanted
    }


def _rate(row: dict[str, object], details: str) -> float:
    """A ``message_stats`` rate; a queue nothing has happened to yet has no stats: 0."""
    stats = row.get("message_stats")
    value = stats.get(details, {}) if isinstance(stats, dict) else {}
    rate = value.get("rate", 0.0) if isinstance(value, dict) else 0.0
    return float(rate) if isinstance(rate, (int, float)) else 0.0
