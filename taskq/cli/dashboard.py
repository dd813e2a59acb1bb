"""``taskq dashboard``: the operators' web page (docs/dashboard.md)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click

from taskq.cli._common import APP_OPTION, LOGLEVEL_OPTION, fail, load, reported

ENV_TOKEN = "TASKQ_DASHBOARD_TOKEN"
INSTALL_HINT = (
    "the dashboard needs Flask, which the core install leaves out: "
    "pip install 'taskq[dashboard]'"
)
_WEB_MODULES = {"flask", "werkzeug", "jinja2", "markupsafe", "itsdangerous", "blinker"}

TOKEN_OPTION = click.option(
    "--token", envvar=ENV_TOKEN, metavar="TOKEN",
    help=f"Needed for replay and purge (env {ENV_TOKEN}); required off loopback.",
)


def dashboard_server(app: Any, **options: Any) -> Any:
    """A :class:`taskq.dashboard.server.DashboardServer`, or exit saying how to install it.

    Raises:
        ConfigurationError: a non-loopback host without a token.
    """
    try:
        from taskq.dashboard.server import DashboardServer
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in _WEB_MODULES:
            fail(f"{INSTALL_HINT} ({exc})")
        raise
    return DashboardServer(app, **options)


@click.command(short_help="Serve the web dashboard: queues, dead letters, tasks, schedules.")
@APP_OPTION
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind; anything but loopback needs --token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port (0 picks a free one).")
@click.option("--read-only", is_flag=True, help="Hide and refuse replay and purge.")
@click.option("--allow-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A name the dashboard is reached by (repeatable; setting "
                   "dashboard_allowed_hosts adds more). Requests for any other Host than "
                   "these, --host and localhost are refused (DNS rebinding).")
@TOKEN_OPTION
@LOGLEVEL_OPTION
def dashboard(app_path: str, host: str, port: int, read_only: bool,
              allowed_hosts: tuple[str, ...], token: str | None, loglevel: str) -> None:
    """Serve the dashboard: queues, dead letters (replay, purge), outbox, tasks, schedules.

    Stops on SIGTERM or Ctrl-C.
    """
    from taskq.worker.process import configure_logging

    configure_logging(loglevel)
    app = load(app_path)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    with reported():
        server = dashboard_server(app, host=host, port=port, token=token,
                                  read_only=read_only, allowed_hosts=allowed_hosts)
        server.start()
    click.echo(f"taskq dashboard of app {app.name} on {server.url}", err=True)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stop.wait()
    finally:
        server.stop()
        app.close()
