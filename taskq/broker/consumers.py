"""Which consumer is the active one of each single-active-consumer queue (``taskq status``).

AMQP 0-9-1 tells nobody, not even the consumer, that it became the active one. RabbitMQ's
management API does: ``/api/consumers/<vhost>`` lists every consumer with ``active`` and its
channel's connection, whose client-given name (``/api/vhosts/<vhost>/connections``) for a
taskq worker process is ``taskq worker <n> pid=<pid> host=<host>``. Without the
management plugin the answer is ``None``: unknown, and ``taskq status`` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from taskq.broker import _management as management
from taskq.broker.connection import connection_parameters
from taskq.settings import Settings

logger = logging.getLogger(__name__)

_TIMEOUT_S = 1.5


def active_consumers(settings: Settings, queues: Iterable[str]) -> dict[str, str] | None:
    """``{queue: connection name of its active consumer}`` for ``queues`` that have one.

    Returns:
        ``None`` when the management API does not answer (the information is unavailable).
    """
    params = connection_parameters(settings, client_name="taskq status")
    path = f"/api/consumers/{management.vhost_path(params)}"
    try:
        rows = management.get_json(params, path, timeout_s=_TIMEOUT_S)
    except (OSError, ValueError):
        logger.debug("management API not available at %s", management.base_url(params))
        return None
    wanted = set(queues)
    found = {
        (row.get("queue") or {}).get("name"): (row.get("channel_details") or {}).get(
            "connection_name", "?")
        for row in (rows if isinstance(rows, list) else [])
        if row.get("active", True)
    }
    named = _client_names(params) if found else {}
    return {q: named.get(c) or str(c) for q, c in found.items() if q in wanted}


def _client_names(params: Any) -> dict[str, str]:
    """Broker connection name (``ip:port -> ip:port``) -> the name the client gave it."""
    path = f"/api/vhosts/{management.vhost_path(params)}/connections"
    try:
        rows = management.get_json(params, path, timeout_s=_TIMEOUT_S)
    except (OSError, ValueError):
        return {}
    return {
        str(row.get("name")): str(row.get("user_provided_name") or (
            row.get("client_properties") or {}).get("connection_name") or row.get("name"))
        for row in (rows if isinstance(rows, list) else [])
    }
