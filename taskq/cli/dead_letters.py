"""``taskq dlq``: list, replay and purge dead letters and unroutable messages."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click

from taskq.cli._common import APP_OPTION, fail, load, reported


@click.group(short_help="List, replay and purge dead letters and unroutable messages.")
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


@dlq.command("list", short_help="List parked messages: id, task, attempts, age, error.")
@_QUEUE_ARGUMENT
@APP_OPTION
@_UNROUTABLE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="Show at most this many messages (oldest first).")
def dlq_list(
    queue: str | None, app_path: str, unroutable: bool, as_json: bool, limit: int
) -> None:
    """List parked messages without removing them: id, task, attempts, age, error."""
    from taskq import dlq as runbook

    app = load(app_path)
    with reported():
        total = runbook.depth(app, queue, unroutable=unroutable)
        infos = runbook.list_parked(app, queue, unroutable=unroutable, limit=limit)
    if as_json:
        click.echo(json.dumps([info.as_dict() for info in infos], indent=2))
        return
    click.echo(_parked_table(infos))
    click.echo(f"{total} message(s) parked; {len(infos)} shown")


@dlq.command("replay", short_help="Republish parked messages to their queue, confirmed.")
@_QUEUE_ARGUMENT
@APP_OPTION
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

    app = load(app_path)
    report = runbook.ReplayReport()
    with reported(), _progress("replaying") as progress:
        try:
            runbook.replay(
                app, queue, unroutable=unroutable, ids=ids, tasks=tasks, limit=limit,
                progress=progress, report=report,
            )
        except KeyboardInterrupt:
            click.echo(f"\ninterrupted: {_replay_summary(report)}", err=True)
            sys.exit(130)
    click.echo(_replay_summary(report))
    unmatched = report.unmatched(ids=ids, tasks=tasks)
    if unmatched:
        fail(unmatched)


@contextlib.contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on a terminal; nothing when stderr is a pipe or a file (a script)."""
    if not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=0, label=label, file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = total
            bar.update(1)

        yield progress


@dlq.command("purge", short_help="Delete every parked message of a queue (asks first).")
@_QUEUE_ARGUMENT
@APP_OPTION
@_UNROUTABLE_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(queue: str | None, app_path: str, unroutable: bool, yes: bool) -> None:
    """Delete every parked message of Q.dlq (or the unroutable queue). Asks first."""
    from taskq import dlq as runbook

    app = load(app_path)
    with reported():
        source = runbook.source_queue(app, queue, unroutable=unroutable)
        if not yes:
            count = runbook.depth(app, queue, unroutable=unroutable)
            click.confirm(f"Delete all {count} message(s) in {source}?", abort=True)
        deleted = runbook.purge(app, queue, unroutable=unroutable)
    click.echo(f"purged {deleted} message(s) from {source}")


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
