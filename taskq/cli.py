"""The ``taskq`` command line: parse, build settings, delegate.

Commands only translate flags into settings overrides (which win over the app's own
settings and the environment) and hand over to the library; defaults live in
:class:`~taskq.settings.Settings`, never here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any, NoReturn

import click

from taskq.broker.topology import validate_queue_name
from taskq.errors import TaskqError
from taskq.settings import redact_url
from taskq.worker.process import configure_logging, load_app
from taskq.worker.supervisor import Monitoring, Supervisor

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
    "--metrics-port", type=click.IntRange(0, 65535), metavar="PORT",
    help="Serve Prometheus metrics on /metrics and a health probe on /healthz.",
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
    metrics_port: int | None,
    health_file: str | None,
    log_format: str,
    loglevel: str,
) -> None:
    """Run tasks: a supervisor and N worker processes consuming the app's queues.

    SIGTERM or Ctrl-C stops warmly (running tasks finish and are acked); a second one
    ends the running tasks, whose messages return to their queue.
    """
    configure_logging(loglevel, log_format)
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
            monitoring=Monitoring(metrics_port=metrics_port, health_file=health_file),
            log_format=log_format,
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


@main.command()
@_APP_OPTION
@click.option("-Q", "--queues", metavar="Q1,Q2", help="Queues to show (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--watch", type=click.FloatRange(min=0.5), metavar="SECONDS",
    help="Print again every SECONDS until Ctrl-C.",
)
def status(app_path: str, queues: str | None, as_json: bool, watch: float | None) -> None:
    """Show queues (ready, unacked, consumers, dead letters), parked and delayed messages,
    the delay backend and the outbox backlog. Exits 1 when the broker or the database
    cannot be read (the rest is still shown)."""
    import json
    import time

    from taskq.status import collect, render

    app = _load(app_path)
    names = list(_queue_names(app, queues)) if queues else None
    while True:
        report = collect(app, names)
        if as_json:
            click.echo(json.dumps(report.to_dict(), sort_keys=True))
        else:
            click.echo(render(report))
        if watch is None:
            break
        time.sleep(watch)
        click.echo()
    app.close()
    if report.broker_error or report.outbox.error:
        sys.exit(1)


@main.command()
@_APP_OPTION
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def inspect(app_path: str, task_id: str, as_json: bool) -> None:
    """Show the stored state, result or error of TASK_ID (tasks with store_result=True)."""
    import json

    app = _load(app_path)
    try:
        record = app.results.get(task_id)
    except TaskqError as exc:
        _fail(str(exc).splitlines()[0])
    finally:
        app.close()
    if record is None:
        if as_json:
            click.echo(json.dumps({"task_id": task_id, "state": "PENDING"}))
        else:
            click.echo(f"{task_id}: PENDING (no stored state: not started yet, unknown, or "
                       "its task does not store results)")
        return
    data = record.to_dict()
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
        return
    for key in ("task_id", "task", "state", "attempts", "result", "error", "created_at",
                "started_at", "finished_at"):
        if data[key] is not None:
            click.echo(f"{key + ':':<12} {data[key]}")
    if record.traceback:
        click.echo("traceback:\n" + record.traceback.rstrip())


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
    """Delete old idempotency keys (taskq_processed) and finished results (taskq_results)
    in small batches, without long locks."""
    from taskq.idempotency import IdempotencyStore

    app = _load(app_path)
    age_s = parse_duration(older_than) if older_than else app.settings.processed_retention_s
    try:
        deleted = IdempotencyStore(app.engine).prune(
            older_than=timedelta(seconds=age_s), batch_size=batch_size
        )
        results = app.results.prune(older_than=timedelta(seconds=age_s), batch_size=batch_size)
    except Exception as exc:
        _fail(f"cannot prune keys in {redact_url(app.settings.database_url)}: {exc}")
    click.echo(f"deleted {deleted} idempotency keys older than {timedelta(seconds=age_s)}")
    click.echo(f"deleted {results} finished task results older than {timedelta(seconds=age_s)}")


@main.group()
def dlq() -> None:
    """Inspect, replay and purge dead letters (Q.dlq) and unroutable messages.

    Give the work queue Q to work on Q.dlq, or --unroutable for the namespace's
    unroutable queue. The runbook: docs/dlq.md.
    """


_QUEUE_ARGUMENT = click.argument("queue", required=False, metavar="[Q]")
_UNROUTABLE_OPTION = click.option(
    "--unroutable", is_flag=True,
    help="Work on <namespace>.unroutable instead of Q.dlq (replay uses each message's "
    "original routing key).",
)


@dlq.command("list")
@_QUEUE_ARGUMENT
@_APP_OPTION
@_UNROUTABLE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many messages (oldest first).")
def dlq_list(
    queue: str | None, app_path: str, unroutable: bool, as_json: bool, limit: int
) -> None:
    """List parked messages without removing them: id, task, attempts, age, error."""
    from taskq import dlq as runbook

    app = _load(app_path)
    with _reported():
        total = runbook.depth(app, queue, unroutable=unroutable)
        infos = runbook.list_parked(app, queue, unroutable=unroutable, limit=limit)
    if as_json:
        click.echo(json.dumps([info.as_dict() for info in infos], indent=2))
        return
    click.echo(_parked_table(infos))
    click.echo(f"{total} message(s) parked; {len(infos)} shown")


@dlq.command("replay")
@_QUEUE_ARGUMENT
@_APP_OPTION
@_UNROUTABLE_OPTION
@click.option("--id", "ids", multiple=True, metavar="ID", help="Only this task id (repeatable).")
@click.option("--task", "tasks", multiple=True, metavar="NAME",
              help="Only this task name (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most this many.")
def dlq_replay(
    queue: str | None,
    app_path: str,
    unroutable: bool,
    ids: tuple[str, ...],
    tasks: tuple[str, ...],
    limit: int | None,
) -> None:
    """Republish parked messages to their queue, each confirmed before it leaves the DLQ.

    Dead letters start again with taskq-retries 0. Messages not selected stay where they
    are. Safe to interrupt: nothing is lost, and at most the one message in flight is then
    in both queues.
    """
    from taskq import dlq as runbook

    app = _load(app_path)
    report = runbook.ReplayReport()
    with _reported(), click.progressbar(length=0, label="replaying", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = total
            bar.update(1)

        try:
            runbook.replay(
                app, queue, unroutable=unroutable, ids=ids, tasks=tasks, limit=limit,
                progress=progress, report=report,
            )
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted: {_replay_summary(report)}", err=True)
            sys.exit(130)
    click.echo(_replay_summary(report))


@dlq.command("purge")
@_QUEUE_ARGUMENT
@_APP_OPTION
@_UNROUTABLE_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(queue: str | None, app_path: str, unroutable: bool, yes: bool) -> None:
    """Delete every parked message of Q.dlq (or the unroutable queue). Asks first."""
    from taskq import dlq as runbook

    app = _load(app_path)
    with _reported():
        source = runbook.source_queue(app, queue, unroutable=unroutable)
        if not yes:
            count = runbook.depth(app, queue, unroutable=unroutable)
            click.confirm(f"Delete all {count} message(s) in {source}?", abort=True)
        deleted = runbook.purge(app, queue, unroutable=unroutable)
    click.echo(f"purged {deleted} message(s) from {source}")


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """Turn taskq errors into one ``Error: ...`` line and the error's exit code."""
    try:
        yield
    except TaskqError as exc:
        _fail(str(exc), exc.exit_code)


def _parked_table(infos: Sequence[Any]) -> str:
    rows = [("ID", "TASK", "ATTEMPTS", "AGE", "ERROR")]
    for info in infos:
        error = ": ".join(part for part in (info.error_type, info.error) if part) or "-"
        rows.append((
            info.task_id or "-",
            info.task or "-",
            "-" if info.attempts is None else str(info.attempts),
            "-" if info.age_s is None else _age(info.age_s),
            error if len(error) <= 70 else error[:67] + "...",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(row[i].ljust(widths[i]) for i in range(4)) + "  " + row[4]
        for row in rows
    )


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _replay_summary(report: Any) -> str:
    parts = [f"{report.replayed} replayed", f"{report.skipped} not selected (left in place)"]
    if report.unroutable:
        parts.append(f"{report.unroutable} still unroutable (left in place)")
    return f"{', '.join(parts)}; {report.examined} examined"


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
