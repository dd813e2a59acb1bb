"""``taskq status`` and ``taskq inspect``: what the queues, the outbox and a task hold."""

from __future__ import annotations

import sys

import click

from taskq.cli._common import (
    APP_OPTION,
    OUTBOX_TABLES,
    RESULT_TABLES,
    SCHEDULE_TABLES,
    fail,
    load,
    queue_names,
    require_tables,
    tables_advice,
)
from taskq.errors import TaskqError


@click.command(short_help="Show queues, dead letters, delays, the outbox and schedules.")
@APP_OPTION
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

    app = load(app_path)
    names = list(queue_names(app, queues)) if queues else None
    # What to run comes first; the broker's side is still shown below it.
    advice = tables_advice(app, app_path, SCHEDULE_TABLES if len(app.schedules) else OUTBOX_TABLES)
    if advice:
        click.echo(f"Error: {advice}", err=True)
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
    if report.broker_error or report.outbox.error or advice:
        sys.exit(1)


@click.command(short_help="Show the state of a task id or a workflow.")
@APP_OPTION
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def inspect(app_path: str, task_id: str, as_json: bool) -> None:
    """Show the stored state, result or error of TASK_ID (tasks with store_result=True), or
    the members and states of a workflow (chain, group, chord) given its id or a member's."""
    import json

    from taskq.cli._workflow_view import show_workflow

    app = load(app_path)
    require_tables(app, app_path, RESULT_TABLES, exit_code=1)
    try:
        record = app.results.get(task_id)
        if record is None and show_workflow(app, task_id, as_json):
            return
    except TaskqError as exc:
        fail(str(exc).splitlines()[0])
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
