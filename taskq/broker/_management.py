"""The RabbitMQ management HTTP API: read-only requests, as a best-effort extra.

taskq reads it to show unacked counts in ``taskq status`` and to name every argument of an
object that conflicts with a declaration; nothing depends on it being there.

The requests carry the broker credentials as HTTP Basic auth, so they are never sent less
protected than the AMQP login itself: for an ``amqps://`` broker the API is reached over
HTTPS on port 15671 (the management plugin's usual TLS listener), with the TLS context of the
AMQP connection (its CA file and client certificate, or the system's CAs), and never over
plain HTTP. For an ``amqp://`` broker it is plain HTTP on port 15672: the AMQP login already
sends the same password in clear over that network.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any
from urllib.parse import quote

import pika

MANAGEMENT_PORT = 15672
MANAGEMENT_TLS_PORT = 15671


def base_url(params: pika.ConnectionParameters) -> str:
    """``https://host:15671`` for a TLS broker, ``http://host:15672`` otherwise."""
    host = f"[{params.host}]" if ":" in params.host else params.host
    if params.ssl_options is not None:
        return f"https://{host}:{MANAGEMENT_TLS_PORT}"
    return f"http://{host}:{MANAGEMENT_PORT}"


def vhost_path(params: pika.ConnectionParameters) -> str:
    """The connection's virtual host as one URL path segment."""
    return quote(params.virtual_host, safe="")


def get_json(params: pika.ConnectionParameters, path: str, *, timeout_s: float) -> Any:
    """GET ``path`` (``/api/...``) from the broker's management API; return the JSON.

    Raises:
        OSError: the API cannot be reached, refused the request or the TLS handshake failed
            (``urllib.error.URLError`` is an ``OSError``).
        ValueError: the answer is not JSON.
    """
    credentials = params.credentials
    user = getattr(credentials, "username", "")
    password = getattr(credentials, "password", "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request = urllib.request.Request(
        base_url(params) + path, headers={"Authorization": f"Basic {token}"}
    )
    # No proxies: the request carries the broker credentials.
    handlers: list[Any] = [urllib.request.ProxyHandler({})]
    if params.ssl_options is not None:
        handlers.append(urllib.request.HTTPSHandler(context=params.ssl_options.context))
    opener = urllib.request.build_opener(*handlers)
    with opener.open(request, timeout=timeout_s) as response:
        return json.load(response)
