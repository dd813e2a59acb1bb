"""``taskq beat`` and the scheduler process that ``taskq worker --beat`` supervises.

Like the outbox relay's process (:mod:`taskq.worker.relay_process`), the child imports the
app itself from ``module:app`` (spawn), applies the command-line overrides, stops warmly on
SIGTERM (after its tick transaction) and dies with its supervisor.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq.errors import ConfigurationError
from taskq.schedules.scheduler import Scheduler
from taskq.worker.process import (
    EXIT_FATAL,
    STARTUP_BLOCKED_SIGNALS,
    ChildSpec,
    _die_with_parent,
    configure_logging,
    load_spec_app,
)
from taskq.worker.relay_process import ensure_table

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from taskq.app import App

logger = logging.getLogger(__name__)

# A scheduler that dies sooner than this after starting is restarted only after this long.
_RESTART_PAUSE_S = 1.0
_TABLES = ("taskq_schedule", "taskq_schedulers", "taskq_outbox")


def run_beat(app: App, should_stop: Callable[[], bool]) -> int:
    """Run the scheduler of ``app`` until ``should_stop()``; return an exit code.

    ``EXIT_FATAL`` (78) when it cannot run at all (no periodic tasks, missing tables, another
    scheduler on SQLite); 1 when the database cannot be reached at start.
    """
    try:
        for table in _TABLES:
            if not ensure_table(app, table, "the scheduler"):
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
    configure_logging(spec.loglevel, spec.log_format)
    _die_with_parent(spec.supervisor_pid)
    stop = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    def should_stop() -> bool:
        if not stop and spec.supervisor_pid and os.getppid() != spec.supervisor_pid:
            logger.warning("the supervisor process is gone; stopping the scheduler")
            return True
        return stop

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_BLOCKED_SIGNALS)
    sys.exit(run_beat(load_spec_app(spec), should_stop))


class BeatProcess:
    """Starts, watches and restarts the scheduler process for the supervisor."""

    def __init__(self, context: Any, spec: ChildSpec) -> None:
        self._context = context
        self._spec = spec
        self.process: BaseProcess | None = None
        self._started_at = 0.0
        self._restart_at = 0.0

    @property
    def sentinel(self) -> int | None:
        """What the supervisor waits on, or ``None`` when no process runs."""
        return self.process.sentinel if self.process is not None else None

    def start(self) -> None:
        """Start the scheduler process (signals blocked until its handlers are installed)."""
        process = self._context.Process(target=beat_main, args=(self._spec,), name="beat")
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STARTUP_BLOCKED_SIGNALS)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        self.process, self._started_at = process, time.monotonic()
        logger.info("started scheduler process (pid %d)", process.pid)

    def check(self, now: float, *, stopping: bool) -> None:
        """Reap an exited scheduler and restart it unless shutting down or misconfigured."""
        process = self.process
        if process is None:
            if self._restart_at and now >= self._restart_at and not stopping:
                self._restart_at = 0.0
                self.start()
            return
        if process.exitcode is None:
            return
        code = process.exitcode
        process.join()
        process.close()
        self.process = None
        if stopping:
            return
        if code == EXIT_FATAL:
            logger.error("the scheduler cannot run (see above); the workers go on without it")
            return
        logger.error("scheduler process died (exit %s); restarting it", code)
        quick = now - self._started_at < _RESTART_PAUSE_S
        self._restart_at = now + (_RESTART_PAUSE_S if quick else 0.0)

    def terminate(self) -> None:
        """Ask the scheduler to stop after its current tick."""
        if self.process is not None and self.process.pid is not None:
            _signal(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        """Stop the scheduler at once (its tick transaction rolls back: nothing is lost)."""
        process = self.process
        if process is not None and process.exitcode is None and process.pid is not None:
            _signal(process.pid, signal.SIGKILL)
        if process is not None:
            process.join(5)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
