"""``taskq worker`` and ``taskq relay``: the long-running commands."""

from __future__ import annotations

import sys
from typing import Any

import click

from taskq.cli._common import (
    APP_OPTION,
    LOG_LEVELS,
    LOGLEVEL_OPTION,
    OUTBOX_TABLES,
    SCHEDULE_TABLES,
    import_from_cwd,
    load,
    queue_names,
    reported,
    require_tables,
    stop_on_signals,
    without_none,
)
from taskq.cli.dashboard import ENV_TOKEN, dashboard_server
from taskq.errors import ConfigurationError, TaskqError
from taskq.worker.monitoring import LOOPBACK, Monitoring
from taskq.worker.preflight import DECLARE_NEW_QUEUES_FLAG, check_known_queues
from taskq.worker.process import EXIT_FATAL, configure_logging, load_app
from taskq.worker.supervisor import Supervisor


@click.command(short_help="Run tasks: a supervisor and N processes consuming the queues.")
@click.option(
    "-A", "--app", "app_path", required=True, metavar="MODULE:APP",
    help="The taskq.App to run, e.g. myproject.tasks:app.",
)
@click.option(
    "-Q", "--queues", metavar="Q1,Q2",
    help="Comma-separated queues to consume (default: every queue the app knows); a queue "
    "the app does not know is refused.",
)
@click.option(
    DECLARE_NEW_QUEUES_FLAG, "declare_new_queues", is_flag=True,
    help="Consume (and declare) -Q queues that the app's code does not name, e.g. queues "
    "other code sends to with apply_async(queue=...).",
)
@click.option(
    "-c", "--concurrency", "processes", type=click.IntRange(min=0),
    help="Worker processes (setting worker_processes; 0 = one per CPU).",
)
@click.option(
    "--prefetch", type=click.IntRange(min=1),
    help="Unacked messages per process and queue (setting prefetch_count).",
)
@click.option(
    "--max-tasks-per-child", type=click.IntRange(min=0),
    help="Replace a process after this many tasks; 0 = never.",
)
@click.option(
    "--shutdown-timeout", type=click.FloatRange(min=0),
    help="Seconds running tasks get to finish after SIGTERM (setting shutdown_timeout_s).",
)
@click.option(
    "--relay/--no-relay", default=True, show_default=True,
    help="Also run the outbox relay, supervised, beside the worker processes.",
)
@click.option(
    "--beat", is_flag=True,
    help="Also run the scheduler of periodic tasks, supervised (see `taskq beat`).",
)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
    help="Serve Prometheus metrics on /metrics and a health probe on /healthz.",
)
@click.option(
    "--metrics-host", default=LOOPBACK, show_default=True, metavar="HOST",
    help="Interface of --metrics-port; 0.0.0.0 when Prometheus or a probe on another host "
    "(or outside a container) must reach it.",
)
@click.option(
    "--dashboard-port", type=click.IntRange(0, 65535), metavar="PORT",
    help="Serve the dashboard from the supervisor on 127.0.0.1:PORT (taskq[dashboard]).",
)
@click.option(
    "--dashboard-host", default="127.0.0.1", show_default=True, metavar="HOST",
    help="Interface of the dashboard; anything but loopback needs --dashboard-token.",
)
@click.option(
    "--dashboard-token", envvar=ENV_TOKEN, metavar="TOKEN",
    help=f"The dashboard's token for replay and purge (env {ENV_TOKEN}).",
)
@click.option(
    "--health-file", type=click.Path(dir_okay=False), metavar="PATH",
    help="Touch PATH about every second while every worker process is consuming.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json: one JSON object per line with task_id, task, queue, attempt, duration_s.",
)
@click.option(
    "-l", "--loglevel", type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO", show_default=True, help="Logging level.",
)
def worker(
    app_path: str,
    queues: str | None,
    declare_new_queues: bool,
    processes: int | None,
    prefetch: int | None,
    max_tasks_per_child: int | None,
    shutdown_timeout: float | None,
    relay: bool,
    beat: bool,
    metrics_port: int | None,
    metrics_host: str,
    dashboard_port: int | None,
    dashboard_host: str,
    dashboard_token: str | None,
    health_file: str | None,
    log_format: str,
    loglevel: str,
) -> None:
    """Run tasks: a supervisor and N worker processes consuming the app's queues.

    SIGTERM or Ctrl-C stops warmly (running tasks finish and are acked); a second one
    ends the running tasks, whose messages return to their queue.
    """
    configure_logging(loglevel, log_format)
    import_from_cwd()
    overrides = without_none(
        worker_processes=processes,
        prefetch_count=prefetch,
        max_tasks_per_child=max_tasks_per_child,
        shutdown_timeout_s=shutdown_timeout,
    )
    try:
        app = load_app(app_path)
    except TaskqError as exc:
        raise click.BadParameter(str(exc), param_hint="'-A' / '--app'") from None
    try:
        app.configure(**overrides)
        names = queue_names(app, queues)
        # Before the supervisor declares anything: a typo must not create a queue.
        check_known_queues(app, names, allow_new=declare_new_queues)
        require_tables(app, app_path, _worker_tables(app, relay=relay, beat=beat),
                       exit_code=ConfigurationError.exit_code, created=True)
        supervisor = Supervisor(
            app,
            app_path=app_path,
            queues=names,
            overrides=overrides,
            loglevel=loglevel.upper(),
            relay=relay,
            monitoring=Monitoring(
                metrics_port=metrics_port, metrics_host=metrics_host, health_file=health_file,
                sidecars=_dashboard(app, dashboard_port, dashboard_host, dashboard_token),
            ),
            log_format=log_format,
            beat=beat,
        )
        code = supervisor.run()
    except TaskqError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)


def _worker_tables(app: Any, *, relay: bool, beat: bool) -> list[str]:
    tables = ["taskq_processed"] if any(t.options.idempotent for t in app.registry) else []
    if relay:
        tables += OUTBOX_TABLES
    if beat and len(app.schedules):
        tables += SCHEDULE_TABLES
    return list(dict.fromkeys(tables))


def _dashboard(app: Any, port: int | None, host: str, token: str | None) -> tuple[Any, ...]:
    if port is None:
        return ()
    return (dashboard_server(app, host=host, port=port, token=token),)


@click.command(short_help="Publish committed outbox rows (the relay without workers).")
@APP_OPTION
@LOGLEVEL_OPTION
def relay(app_path: str, loglevel: str) -> None:
    """Run the outbox relay alone: publish committed outbox rows until SIGTERM or Ctrl-C.

    Several relays may run at once on PostgreSQL (rows are claimed with SKIP LOCKED);
    on SQLite run one.
    """
    from taskq.worker.relay_process import check_relay_start, run_relay

    configure_logging(loglevel)
    stopping = stop_on_signals()
    app = load(app_path)
    with reported():
        check_relay_start(app)
    require_tables(app, app_path, OUTBOX_TABLES, exit_code=EXIT_FATAL, created=True)
    sys.exit(run_relay(app, stopping))
