"""Queue figures for ``taskq status``: the management HTTP API when enabled, AMQP otherwise.

The management API reports ready and unacked messages and consumers per queue. Without it,
a passive ``queue.declare`` over AMQP reports ready messages and consumers only: unacked
counts are then unknown (``None``), and ``taskq status`` says so.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

import pika
import pika.exceptions

from taskq.broker.connection import open_connection
from taskq.settings import Settings

logger = logging.getLogger(__name__)

MANAGEMENT_PORT = 15672
_MANAGEMENT_TIMEOUT_S = 1.5


@dataclass(frozen=True)
class QueueStats:
    """Figures of one queue; ``unacked`` is ``None`` when the source cannot tell."""

    name: str
    ready: int
    unacked: int | None
    consumers: int


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
    """All queues of the vhost in one request, or ``None`` when the API does not answer."""
    params = pika.URLParameters(settings.broker_url)
    credentials = params.credentials
    user = getattr(credentials, "username", "guest")
    password = getattr(credentials, "password", "guest")
    vhost = urllib.parse.quote(params.virtual_host, safe="")
    url = (
        f"http://{params.host}:{MANAGEMENT_PORT}/api/queues/{vhost}"
        "?columns=name,messages_ready,messages_unacknowledged,consumers"
    )
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=_MANAGEMENT_TIMEOUT_S) as response:
            rows = json.load(response)
    except (OSError, ValueError, urllib.error.URLError):
        logger.debug("management API not available at %s:%d", params.host, MANAGEMENT_PORT)
        return None
    wanted = set(names)
    return {
        row["name"]: QueueStats(
            row["name"],
            int(row.get("messages_ready") or 0),
            int(row.get("messages_unacknowledged") or 0),
            int(row.get("consumers") or 0),
        )
        for row in rows
        if row.get("name") in wanted
    }
