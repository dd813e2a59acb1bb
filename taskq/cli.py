"""The ``taskq`` command line: parse, build settings, delegate.

Commands only translate flags into settings overrides (which win over the app's own
settings and the environment) and hand over to the library; defaults live in
:class:`~taskq.settings.Settings`, never here.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from taskq.broker.topology import validate_queue_name
from taskq.errors import TaskqError
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
        )
        code = supervisor.run()
    except TaskqError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)


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
