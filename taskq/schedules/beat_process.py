"""``taskq beat`` and the scheduler process that ``taskq worker --beat`` supervises.

Like the outbox relay's process (:mod:`taskq.worker.relay_process`), the child imports the
app itself from ``module:app`` (spawn), applies the command-line overrides, stops warmly on
SIGTERM (after its tick transaction) and dies with its supervisor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq.errors import ConfigurationError
from taskq.schedules.scheduler import Scheduler
from taskq.worker.process import (
    EXIT_FATAL,
    ChildSpec,
)
from taskq.worker.relay_process import ensure_table
from taskq.worker.side_process import SupervisedProcess, run_side_process

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)

_TABLES = ("taskq_schedule", "taskq_schedulers", "taskq_outbox")


def run_beat(app: App, should_stop: Callable[[], bool]) -> int:
    """Run the scheduler of ``app`` until ``should_stop()``; return an exit code.

    ``EXIT_FATAL`` (78) when it cannot run at all (no periodic tasks, missing tables, another
    scheduler on SQLite); 1 when the database cannot be reached at start.
    """
    try:
        for table in _TABLES:
            if not ensure_table(app, table, "the scheduler", log=logger):
                return EXIT_FATAL
        Scheduler(app).run(should_stop)
    except ConfigurationError as exc:
        logger.error("%s", exc)
        return EXIT_FATAL
    except sa.exc.SQLAlchemyError as exc:
        logger.error("the scheduler cannot reach the database: %s", str(exc).splitlines()[0])
        return 1
    finally:
        app.close()
    return 0


def beat_main(spec: ChildSpec) -> None:
    """Entry point of the scheduler process started by the supervisor."""
    run_side_process(spec, run_beat, "scheduler")


class BeatProcess(SupervisedProcess):
    """Starts, watches and restarts the scheduler process for the supervisor."""

    def __init__(self, context: Any, spec: ChildSpec) -> None:
        super().__init__(context, spec, target=beat_main, name="beat", label="scheduler")
