"""``taskq status`` and ``taskq inspect``: what the queues, the outbox and a task hold."""

from __future__ import annotations

import json
import sys
from typing import Any

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


# `taskq inspect` of an id nothing is known about (scripts tell it from a read error, 1).
EXIT_UNKNOWN = 3


@click.command(short_help="Show the state of a task id or a workflow.")
@APP_OPTION
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--scan-limit", type=click.IntRange(min=0), default=1000, show_default=True,
    metavar="N", help="Messages read per queue at most when looking in the broker "
    "(0: taskq's tables only).",
)
def inspect(app_path: str, task_id: str, as_json: bool, scan_limit: int) -> None:
    """Show what happened to TASK_ID: waiting in the outbox, queued, delayed, started (where,
    when), retrying, succeeded, failed, dead-lettered (in which Q.dlq), skipped as a
    duplicate, or unknown (exit status 3). Given a workflow id (chain, group, chord), show
    its members and their states. See docs/states.md."""
    from taskq.cli._workflow_view import show_workflow
    from taskq.states import lookup
    from taskq.states.workflow_view import workflow_dict
    from taskq.workflows.store import read_workflow

    app = load(app_path)
    require_tables(app, app_path, RESULT_TABLES, exit_code=1)
    try:
        if read_workflow(app.engine, task_id) is not None:
            show_workflow(app, task_id, as_json)
            return
        status = lookup(app, task_id, broker=scan_limit > 0, scan_limit=scan_limit)
        workflow = (workflow_dict(app.engine, status.workflow_id)
                    if as_json and status.workflow_id else None)
        if as_json:
            click.echo(json.dumps({**status.to_dict(), "workflow": workflow}, sort_keys=True))
        else:
            _print(status)
            if status.workflow_id:
                click.echo()
                show_workflow(app, task_id, as_json=False)
    except TaskqError as exc:
        fail(str(exc).splitlines()[0])
    finally:
        app.close()
    if not status.is_known:
        sys.exit(EXIT_UNKNOWN)


def _print(status: Any) -> None:
    click.echo(f"{status.task_id}: {status.state.value}")
    click.echo(f"  {status.summary}")
    fields = (("task", status.task), ("queue", status.queue), ("attempt", status.attempt),
              ("worker", status.worker), ("started_at", status.started_at),
              ("finished_at", status.finished_at), ("due_at", status.due_at),
              ("dead letter", status.dead_letter_queue), ("workflow", status.workflow_id))
    for name, value in fields:
        if value is not None:
            shown = value.isoformat() if hasattr(value, "isoformat") else value
            click.echo(f"{name + ':':<12} {shown}")
    if status.has_result:
        click.echo(f"{'result:':<12} {status.result!r}")
    if status.error and status.state.value != "SKIPPED":
        click.echo(f"{'error:':<12} {status.error}")
    for note in status.notes:
        click.echo(f"note: {note}")
    if status.traceback:
        click.echo("traceback:\n" + status.traceback.rstrip())
