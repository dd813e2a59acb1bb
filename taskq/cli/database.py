"""``taskq db``: create and prune taskq's tables."""

from __future__ import annotations

from datetime import timedelta

import click

from taskq.cli._common import APP_OPTION, fail, load, parse_duration
from taskq.db import describe_database_error, reach_advice
from taskq.errors import ConfigurationError
from taskq.schema import metadata
from taskq.settings import redact_url


def _tables_help() -> str:
    # Read from taskq.metadata, so that a table added there is named here too.
    names = ", ".join(sorted(table.name for table in metadata.sorted_tables))
    return (f"Manage taskq's tables in the app's database_url: {names}.\n\n"
            "Every database but the embedded SQLite default needs `taskq db create` (or a "
            "migration with taskq.metadata) before the first worker starts.")


@click.group(help=_tables_help(), short_help="Create and prune taskq's tables.")
def db() -> None:
    pass


@db.command("create", short_help="Create taskq's tables that are missing.")
@APP_OPTION
def db_create(app_path: str) -> None:
    """Create taskq's tables in the app's database_url if they are missing.

    Production databases are better served by a migration: add taskq.metadata to Alembic's
    target_metadata.
    """
    app = load(app_path)
    url = app.settings.database_url
    try:
        app.create_tables()
    except ConfigurationError as exc:  # a URL that cannot work names itself
        fail(str(exc), exc.exit_code)
    except Exception as exc:  # SQLAlchemy errors name the database; the URL is redacted
        fail(f"cannot create tables in {redact_url(url)}: {describe_database_error(exc)}; "
             f"{reach_advice(url)}")
    click.echo(f"taskq tables ready in {redact_url(app.settings.database_url)}")


@db.command("prune", short_help="Delete old keys, finished results and workflows.")
@APP_OPTION
@click.option(
    "--older-than", "older_than", metavar="AGE",
    help="Delete idempotency keys older than AGE (e.g. 7d, 12h, 30m, 90s); "
    "default: the processed_retention_s setting.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=1000, show_default=True)
def db_prune(app_path: str, older_than: str | None, batch_size: int) -> None:
    """Delete old idempotency keys (taskq_processed), finished results (taskq_results),
    task state records (taskq_task_states) and finished workflows with their members, in
    small batches, without long locks."""
    from taskq.idempotency import IdempotencyStore
    from taskq.states.store import TaskStateStore
    from taskq.workflows.store import prune_workflows

    app = load(app_path)
    age_s = parse_duration(older_than) if older_than else app.settings.processed_retention_s
    try:
        deleted = IdempotencyStore(app.engine).prune(
            older_than=timedelta(seconds=age_s), batch_size=batch_size
        )
        results = app.results.prune(older_than=timedelta(seconds=age_s), batch_size=batch_size)
        workflows = prune_workflows(app.engine, older_than=timedelta(seconds=age_s),
                                    batch_size=batch_size)
        states = TaskStateStore(app.engine).prune(older_than=timedelta(seconds=age_s),
                                                  batch_size=batch_size)
    except ConfigurationError as exc:
        fail(str(exc), exc.exit_code)
    except Exception as exc:
        fail(f"cannot prune keys in {redact_url(app.settings.database_url)}: "
             f"{describe_database_error(exc)}; {reach_advice(app.settings.database_url)}")
    click.echo(f"deleted {deleted} idempotency keys older than {timedelta(seconds=age_s)}")
    click.echo(f"deleted {results} finished task results older than {timedelta(seconds=age_s)}")
    click.echo(f"deleted {workflows} finished workflows (and their members) older than "
               f"{timedelta(seconds=age_s)}")
    click.echo(f"deleted {states} task state records older than {timedelta(seconds=age_s)}")
