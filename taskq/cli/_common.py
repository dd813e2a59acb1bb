"""What every ``taskq`` command shares: the -A and -l options, loading the app, errors."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

import click

from taskq.broker.topology import validate_queue_name
from taskq.errors import TaskqError
from taskq.worker.process import load_app

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

APP_OPTION = click.option(
    "-A", "--app", "app_path", required=True, metavar="MODULE:APP",
    help="The taskq.App, e.g. myproject.tasks:app.",
)
LOGLEVEL_OPTION = click.option(
    "-l", "--loglevel", type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="INFO", show_default=True, help="Logging level.",
)


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn taskq errors into one ``Error: ...`` line and the error's exit code."""
    try:
        yield
    except TaskqError as exc:
        fail(str(exc), exc.exit_code)


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


def load(app_path: str) -> Any:
    """Import the app named by -A (``module:attribute``), from the working directory too."""
    import_from_cwd()
    try:
        return load_app(app_path)
    except TaskqError as exc:
        raise click.BadParameter(str(exc), param_hint="'-A' / '--app'") from None


# The tables each command reads or writes (all made by `taskq db create`).
OUTBOX_TABLES = ("taskq_outbox",)
SCHEDULE_TABLES = ("taskq_schedule", "taskq_schedulers", "taskq_outbox")
RESULT_TABLES = ("taskq_results", "taskq_workflows", "taskq_workflow_members")


def tables_advice(
    app: Any, app_path: str, tables: Iterable[str], *, created: bool = False
) -> str | None:
    """What to run when ``tables`` are missing from the app's database; ``None`` if none is.

    Args:
        app: The loaded App.
        app_path: The ``-A`` value, repeated in the advice.
        tables: The tables the command needs.
        created: The command creates the tables itself on the embedded SQLite default
            (worker, relay, beat), so there is nothing to check there.

    A database that cannot be reached is left to the command's own error.
    """
    from taskq.db import missing_tables, missing_tables_message

    try:
        engine = app.engine
        if created and engine.dialect.name == "sqlite":
            return None
        missing = missing_tables(engine, tables)
    except Exception:  # unreachable or bad URL: the command reports it in its own words
        return None
    finally:
        app.close()
    if not missing:
        return None
    return missing_tables_message(app.settings.database_url, missing, app_path)


def require_tables(
    app: Any, app_path: str, tables: Iterable[str], *, exit_code: int, created: bool = False
) -> None:
    """Stop with ``Error: <what to run>`` and ``exit_code`` when ``tables`` are missing."""
    advice = tables_advice(app, app_path, tables, created=created)
    if advice:
        fail(advice, exit_code)


def fail(message: str, exit_code: int = 1) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    sys.exit(exit_code)


def queue_names(app: Any, option: str | None) -> tuple[str, ...]:
    if not option:
        return tuple(app.queue_names())
    names = tuple(dict.fromkeys(name.strip() for name in option.split(",") if name.strip()))
    if not names:
        raise click.BadParameter("give at least one queue name", param_hint="'-Q'")
    for name in names:
        validate_queue_name(name)
    return names


def import_from_cwd() -> None:
    # Like `python -m`, let -A name modules of the directory the command runs in; the
    # console script alone would not (its sys.path[0] is the script's directory).
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def without_none(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def stop_on_signals() -> Callable[[], bool]:
    """Install SIGTERM and SIGINT handlers for a long-running command; return ``stopping()``.

    The first signal asks for a clean stop (``stopping()`` turns true; the command finishes
    what it holds and exits); a second one raises ``KeyboardInterrupt``. Installed before the
    app is imported, so a signal while it loads still ends in a clean exit.
    """
    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        if stop:
            raise KeyboardInterrupt
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return lambda: stop
