"""The Flask app factory of the dashboard: :func:`create_app`."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from taskq.dashboard import api, pages
from taskq.dashboard.context import EXTENSION, Dashboard, dashboard
from taskq.dashboard.hosts import AllowedHosts, split_names
from taskq.dashboard.rates import RateTracker, worker_finished_counts
from taskq.dashboard.security import SECURITY_HEADERS, Guard, csrf_token
from taskq.errors import TaskqError

if TYPE_CHECKING:
    from flask.typing import ResponseReturnValue
    from werkzeug.wrappers import Response

    from taskq.app import App
    from taskq.worker.sidecars import SupervisedProcesses

logger = logging.getLogger(__name__)

# How often the pages ask /api/overview for fresh counts (milliseconds).
REFRESH_MS = 3000
# The address a bare create_app() assumes it is served on: loopback, the safe guess.
DEFAULT_BOUND_HOST = "127.0.0.1"


def create_app(
    app: App,
    *,
    token: str | None = None,
    read_only: bool = False,
    reads_need_login: bool | None = None,
    processes: SupervisedProcesses | None = None,
    host: str = DEFAULT_BOUND_HOST,
    allowed_hosts: Iterable[str] = (),
) -> Flask:
    """Build the dashboard's WSGI app for ``app``.

    Args:
        app: The taskq app whose queues, dead letters, outbox and results to show.
        token: Needed for replay and purge; without one they are disabled.
        read_only: Hide and refuse every action, token or not.
        reads_need_login: Every page needs the token. ``None`` (the default): whenever a
            token is given, since the server this app is handed to may listen on any
            address; :class:`~taskq.dashboard.server.DashboardServer` lets reads on
            loopback go without it.
        processes: The supervisor serving the dashboard, for worker processes and restarts.
        host: The address the server listens on; decides which ``Host`` names are
            answered (docs/dashboard.md, "Safety").
        allowed_hosts: Further names the dashboard is reached by, besides those of the
            ``dashboard_allowed_hosts`` setting.
    """
    web = Flask("taskq.dashboard")
    web.config.update(
        SECRET_KEY=secrets.token_bytes(32),
        SESSION_COOKIE_NAME="taskq_dashboard",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
    )
    finished = worker_finished_counts if processes is not None else None
    hosts = AllowedHosts.of(host, [*split_names(app.settings.dashboard_allowed_hosts),
                                   *allowed_hosts])
    if reads_need_login is None:
        reads_need_login = token is not None
    guard = Guard(token, read_only, reads_need_login, hosts)
    web.extensions[EXTENSION] = Dashboard(app, guard, processes, RateTracker(finished))
    web.register_blueprint(pages.blueprint)
    web.register_blueprint(api.blueprint, url_prefix="/api")
    web.before_request(_check_request)
    web.after_request(_secure)
    web.register_error_handler(HTTPException, _http_error)
    web.register_error_handler(TaskqError, _taskq_error)
    web.context_processor(_template_globals)
    return web


def _check_request() -> None:
    guard = dashboard().guard
    guard.check_host()  # every path: a rebound page must not even see the login form
    if request.endpoint not in ("pages.login", "static", "pages.login_form"):
        guard.check_read()


def _secure(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _template_globals() -> dict[str, Any]:
    board = dashboard()
    return {"guard": board.guard, "csrf_token": csrf_token, "app_name": board.app.name,
            "refresh_ms": REFRESH_MS, "logged_in": board.guard.logged_in()}


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def _http_error(exc: HTTPException) -> ResponseReturnValue:
    code = exc.code or 500
    if _wants_json():
        return jsonify({"error": exc.description, "status": code}), code
    return render_template("error.html", code=code, message=exc.description), code


def _taskq_error(exc: TaskqError) -> ResponseReturnValue:
    # The broker or database could not be read, or a queue does not exist: say so.
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    logger.warning("dashboard %s %s: %s", request.method, request.path, message)
    if _wants_json():
        return jsonify({"error": message, "status": 503}), 503
    return render_template("error.html", code=503, message=message), 503
