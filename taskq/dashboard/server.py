"""Serve the dashboard: standalone (``taskq dashboard``) or on a thread of the supervisor
(``taskq worker --dashboard-port``, as a :class:`~taskq.worker.sidecars.Sidecar`).

The server is Werkzeug's threaded WSGI server (Werkzeug comes with Flask): one thread per
request, enough for the few operators a dashboard has, and it runs inside the supervisor
without a process of its own. :func:`taskq.dashboard.web.create_app` is a plain WSGI app
for any other server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from taskq.dashboard.hosts import is_loopback
from taskq.dashboard.security import ENV_TOKEN
from taskq.dashboard.web import create_app
from taskq.errors import ConfigurationError

if TYPE_CHECKING:
    from taskq.app import App
    from taskq.worker.sidecars import SupervisedProcesses

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def check_binding(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token.

    Raises:
        ConfigurationError: ``host`` is not a loopback address and ``token`` is empty.
    """
    if token is not None and not token.strip():
        raise ConfigurationError(f"the dashboard token is empty: set {ENV_TOKEN} (or "
                                 "--token / --dashboard-token) to a real one")
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host}, which is not a loopback address, "
            f"without a token: set {ENV_TOKEN} (or --token for taskq dashboard, "
            f"--dashboard-token for taskq worker), or bind 127.0.0.1; everyone who can reach "
            f"{host} could read task arguments and replay or purge dead letters"
        )


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        logger.debug("dashboard %s %s %s", self.command, self.path, code)


class DashboardServer:
    """The dashboard's HTTP server.

    Args:
        app: The taskq app to show.
        host: Interface to bind (default loopback only).
        port: TCP port (0 picks a free one; see :attr:`port` once started).
        token: Needed for replay and purge (and for every page off loopback).
        read_only: Hide and refuse replay and purge.
        allowed_hosts: Names the dashboard is reached by besides ``host`` and
            ``localhost`` (``--allow-host``; the ``dashboard_allowed_hosts`` setting adds
            its own); requests for any other ``Host`` are refused (DNS rebinding).

    Raises:
        ConfigurationError: a non-loopback ``host`` without ``token``.
    """

    def __init__(self, app: App, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 token: str | None = None, read_only: bool = False,
                 allowed_hosts: Iterable[str] = ()) -> None:
        check_binding(host, token)
        self.app, self.host, self.port = app, host, port
        self._token, self._read_only = token, read_only
        self._allowed_hosts = tuple(allowed_hosts)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def bind(self, processes: SupervisedProcesses | None = None) -> None:
        """Build the app and open the socket (does not serve yet).

        Raises:
            ConfigurationError: the address cannot be bound (port in use, no such address).
        """
        web = create_app(self.app, token=self._token, read_only=self._read_only,
                         reads_need_login=not is_loopback(self.host), processes=processes,
                         host=self.host, allowed_hosts=self._allowed_hosts)
        try:
            self._server = make_server(self.host, self.port, web, threaded=True,
                                       request_handler=_QuietHandler)
        except (OSError, SystemExit) as exc:  # werkzeug exits (1) when the port is in use
            why = "the address is in use" if isinstance(exc, SystemExit) else str(exc)
            raise ConfigurationError(f"cannot serve the dashboard on {self.host}:{self.port}: "
                                     f"{why}; pick another --port (taskq dashboard) or "
                                     "--dashboard-port (taskq worker)") from None
        self.port = self._server.server_port
        mode = "read-only" if self._read_only else (
            "replay and purge with the token" if self._token else "no token: read only")
        logger.info("dashboard on %s (%s)", self.url, mode)

    def start(self, processes: SupervisedProcesses | None = None) -> None:
        """Serve on a daemon thread (what the supervisor calls)."""
        self.bind(processes)
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="taskq-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (safe to call when never started)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()
            self._thread.join(5)
        server.server_close()
