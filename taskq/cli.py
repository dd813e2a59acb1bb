"""The ``taskq`` command line: parse, build settings, delegate.

Commands only translate flags into settings overrides (which win over the app's own
settings and the environment) and hand over to the library; defaults live in
:class:`~taskq.settings.Settings`, never here.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from datetime import timedelta
from typing import Any, NoReturn

import click

from taskq.broker.topology import validate_queue_name
from taskq.errors import TaskqError
from taskq.settings import redact_url
from taskq.worker.process import configure_logging, load_app
from taskq.worker.supervisor import Supervisor

logger = logging.getLogger(__name__)

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@click.group()
@click.version_option(package_name="taskq", message="taskq %(version)s")
def main() -> None:
    """taskq: a task queue on RabbitMQ where nothing is silently lost."""


@main.command()
@click.option(
    "-A", "--app", "app_path", required=True, metavar="MODULE:APP",
    help="The taskq.App to run, e.g. myproject.tasks:app.",
)
@click.option(
    "-Q", "--queues", metavar="Q1,Q2",
    help="Comma-separated queues to consume (default: every queue the app knows).",
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
    "-l", "--loglevel", type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    default="INFO", show_default=True, help="Logging level.",
)
def worker(
    app_path: str,
    queues: str | None,
    processes: int | None,
    prefetch: int | None,
    max_tasks_per_child: int | None,
    shutdown_timeout: float | None,
    relay: bool,
    loglevel: str,
) -> None:
    """Run tasks: a supervisor and N worker processes consuming the app's queues.

    SIGTERM or Ctrl-C stops warmly (running tasks finish and are acked); a second one
    ends the running tasks, whose messages return to their queue.
    """
    configure_logging(loglevel)
    _import_from_cwd()
    overrides = _without_none(
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
        supervisor = Supervisor(
            app,
            app_path=app_path,
            queues=_queue_names(app, queues),
            overrides=overrides,
            loglevel=loglevel.upper(),
            relay=relay,
        )
        code = supervisor.run()
    except TaskqError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)


_APP_OPTION = click.option(
    "-A", "--app", "app_path", required=True, metavar="MODULE:APP",
    help="The taskq.App, e.g. myproject.tasks:app.",
)
_LOGLEVEL_OPTION = click.option(
    "-l", "--loglevel", type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    default="INFO", show_default=True, help="Logging level.",
)


@main.command()
@_APP_OPTION
@_LOGLEVEL_OPTION
def relay(app_path: str, loglevel: str) -> None:
    """Run the outbox relay alone: publish committed outbox rows until SIGTERM or Ctrl-C.

    Several relays may run at once on PostgreSQL (rows are claimed with SKIP LOCKED);
    on SQLite run one.
    """
    from taskq.worker.relay_process import run_relay

    configure_logging(loglevel)
    app = _load(app_path)
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        if stop:
            raise KeyboardInterrupt
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(run_relay(app, lambda: stop))


@main.group()
def db() -> None:
    """Manage taskq's tables (taskq_outbox, taskq_processed, taskq_results)."""


@db.command("create")
@_APP_OPTION
def db_create(app_path: str) -> None:
    """Create taskq's tables in the app's database_url if they are missing.

    Production databases are better served by a migration: add taskq.metadata to Alembic's
    target_metadata.
    """
    app = _load(app_path)
    try:
        app.create_tables()
    except Exception as exc:  # SQLAlchemy errors name the database; the URL is redacted
        _fail(f"cannot create tables in {redact_url(app.settings.database_url)}: {exc}")
    click.echo(f"taskq tables ready in {redact_url(app.settings.database_url)}")


@db.command("prune")
@_APP_OPTION
@click.option(
    "--older-than", "older_than", metavar="AGE",
    help="Delete idempotency keys older than AGE (e.g. 7d, 12h, 30m, 90s); "
    "default: the processed_retention_s setting.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
def db_prune(app_path: str, older_than: str | None, batch_size: int) -> None:
    """Delete old idempotency keys (taskq_processed) in small batches, without long locks."""
    from taskq.idempotency import IdempotencyStore

    app = _load(app_path)
    age_s = parse_duration(older_than) if older_than else app.settings.processed_retention_s
    try:
        deleted = IdempotencyStore(app.engine).prune(
            older_than=timedelta(seconds=age_s), batch_size=batch_size
        )
    except Exception as exc:
        _fail(f"cannot prune keys in {redact_url(app.settings.database_url)}: {exc}")
    click.echo(f"deleted {deleted} idempotency keys older than {timedelta(seconds=age_s)}")


_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Parse ``7d``, ``12h``, ``30m``, ``90s`` or a plain number of seconds.

    Raises:
        click.BadParameter: not a positive duration.
    """
    value = text.strip().lower()
    unit = _UNITS_S.get(value[-1:]) if value else None
    number = value[:-1] if unit else value
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration like 7d, 12h, 30m or 90s") from None
    if seconds <= 0:
        raise click.BadParameter(f"{text!r} must be a positive duration")
    return seconds


def _load(app_path: str) -> Any:
    _import_from_cwd()
    try:
        return load_app(app_path)
    except TaskqError as exc:
        raise click.BadParameter(str(exc), param_hint="'-A' / '--app'") from None


def _fail(message: str, exit_code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(exit_code)


def _queue_names(app: Any, option: str | None) -> tuple[str, ...]:
    if not option:
        return tuple(app.queue_names())
    names = tuple(dict.fromkeys(name.strip() for name in option.split(",") if name.strip()))
    if not names:
        raise click.BadParameter("give at least one queue name", param_hint="'-Q'")
    for name in names:
        validate_queue_name(name)
    return names


def _import_from_cwd() -> None:
    # Like `python -m`, let -A name modules of the directory the command runs in; the
    # console script alone would not (its sys.path[0] is the script's directory).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _without_none(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}
