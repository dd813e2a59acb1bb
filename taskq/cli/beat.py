"""``taskq beat``: run the scheduler of periodic tasks, or list the schedules."""

from __future__ import annotations

import sys

import click

from taskq.cli._common import (
    LOGLEVEL_OPTION,
    SCHEDULE_TABLES,
    fail,
    load,
    require_tables,
    stop_on_signals,
)

_APP_OPTION = click.option(
    "-A", "--app", "app_path", metavar="MODULE:APP",
    help="The taskq.App, e.g. myproject.tasks:app.",
)


@click.group(invoke_without_command=True,
             short_help="Run the scheduler of periodic tasks; `beat list` shows them.")
@_APP_OPTION
@LOGLEVEL_OPTION
@click.pass_context
def beat(ctx: click.Context, app_path: str | None, loglevel: str) -> None:
    """Run the scheduler of the app's periodic tasks (`taskq beat -A app`) until SIGTERM or
    Ctrl-C; `taskq beat list -A app` shows the schedules.

    Each tick is enqueued once through the outbox (the relay of `taskq worker` or `taskq
    relay` publishes it). Several schedulers may run at once on PostgreSQL; on SQLite one.
    """
    ctx.obj = {"app_path": app_path}
    if ctx.invoked_subcommand is None:
        ctx.invoke(run, app_path=app_path, loglevel=loglevel)


@beat.command("run")
@_APP_OPTION
@LOGLEVEL_OPTION
@click.pass_context
def run(ctx: click.Context, app_path: str | None, loglevel: str) -> None:
    """Run the scheduler (what `taskq beat -A app` does)."""
    from taskq.schedules.beat_process import run_beat
    from taskq.worker.process import EXIT_FATAL, configure_logging

    configure_logging(loglevel)
    stopping = stop_on_signals()
    path = _app_path(ctx, app_path)
    app = load(path)
    if len(app.schedules):
        require_tables(app, path, SCHEDULE_TABLES, exit_code=EXIT_FATAL, created=True)
    sys.exit(run_beat(app, stopping))


@beat.command("list", short_help="Show every schedule with its next and last run.")
@_APP_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_context
def list_schedules(ctx: click.Context, app_path: str | None, as_json: bool) -> None:
    """Show every schedule with its next and last run, and the schedulers seen."""
    import json
    from dataclasses import asdict

    from taskq.schedules.report import collect, render

    path = _app_path(ctx, app_path)
    app = load(path)
    if len(app.schedules):
        require_tables(app, path, SCHEDULE_TABLES[:2], exit_code=1)
    try:
        report = collect(app)
    finally:
        app.close()
    if as_json:
        click.echo(json.dumps(asdict(report), sort_keys=True))
    elif not report.schedules:
        click.echo(f"app {app.name} defines no periodic tasks")
    else:
        click.echo(f"periodic tasks of app {app.name}")
        click.echo("\n".join(render(report)))
    if report.error:
        fail(f"cannot read the schedules: {report.error}; run `taskq db create -A ...`?")


def _app_path(ctx: click.Context, app_path: str | None) -> str:
    given = app_path or (ctx.obj or {}).get("app_path")
    if not given:
        raise click.UsageError("give the app with -A MODULE:APP, e.g. -A myproject.tasks:app")
    return str(given)
