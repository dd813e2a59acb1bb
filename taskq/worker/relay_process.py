"""The outbox relay as a supervised process of ``taskq worker`` (and ``taskq relay``).

It runs :class:`~taskq.outbox.relay.OutboxRelay` until SIGTERM, like a worker process: the
app is imported from ``module:app`` in the fresh (spawned) interpreter, with the same
command-line overrides. The supervisor restarts it when it dies; rows never depend on it
being up, they only wait longer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from taskq.broker.connection import LOGIN_REFUSED, check_login
from taskq.db import describe_database_error, missing_tables_message, reach_advice
from taskq.errors import BrokerConnectionError, ConfigurationError
from taskq.settings import redact_url
from taskq.worker.process import (
    EXIT_FATAL,
    ChildSpec,
)
from taskq.worker.side_process import SupervisedProcess, run_side_process
from taskq.worker.single_relay import RelayLock

if TYPE_CHECKING:
    from taskq.app import App

logger = logging.getLogger(__name__)


def ensure_table(app: App, table: str, purpose: str, *, log: logging.Logger = logger) -> bool:
    """Make sure ``table`` exists; return whether ``purpose`` can go ahead.

    The embedded SQLite default gets taskq's tables created (zero set-up); on other
    databases tables are the application's to migrate (Alembic with ``taskq.metadata``, or
    ``taskq db create``), so a missing table is reported, not created, on ``log`` (the
    logger of the part that needs the table).
    """
    engine = app.engine
    if sa.inspect(engine).has_table(table):
        return True
    if engine.dialect.name == "sqlite":
        app.create_tables()
        log.info("created taskq's tables in %s", redact_url(app.settings.database_url))
        return True
    log.error(
        "%s; %s cannot run without it",
        missing_tables_message(app.settings.database_url, [table]), purpose,
    )
    return False


def ensure_outbox_table(app: App) -> bool:
    """Make sure ``taskq_outbox`` exists (see :func:`ensure_table`)."""
    return ensure_table(app, "taskq_outbox", "the outbox relay")


def check_relay_start(app: App) -> None:
    """What ``taskq relay`` checks before it starts, as ``taskq worker`` does at its start.

    A database URL that cannot work and a login the broker refuses are configuration
    errors: the relay does not start. A broker that does not answer is only logged: riding
    out broker outages is the relay's job (rows wait in the outbox).

    Raises:
        ConfigurationError: the database URL cannot be used.
        BrokerConnectionError: the broker refused the login (``reason`` ``login_refused``).
    """
    app.engine.dialect  # noqa: B018 - building the engine checks the URL and its driver
    try:
        check_login(app.settings, client_name=f"taskq relay {app.name} (start check)")
    except BrokerConnectionError as exc:
        if getattr(exc, "reason", None) == LOGIN_REFUSED:
            raise
        logger.warning("outbox relay: %s; rows stay in the outbox until it answers", exc)


def run_relay(app: App, should_stop: Any) -> int:
    """Run the relay of ``app`` until ``should_stop()``; return an exit code."""
    try:
        if not ensure_outbox_table(app):
            return EXIT_FATAL
    except ConfigurationError as exc:
        logger.error("%s", exc)
        return EXIT_FATAL
    except sa.exc.SQLAlchemyError as exc:
        logger.error("outbox relay cannot reach the database %s: %s; %s",
                     redact_url(app.settings.database_url), describe_database_error(exc),
                     reach_advice(app.settings.database_url))
        return 1
    lock = RelayLock(app)
    try:
        lock.acquire()
    except ConfigurationError as exc:  # another relay runs on this SQLite database
        logger.error("%s", exc)
        app.close()
        return EXIT_FATAL
    try:
        _relay_until_stopped(app, should_stop)
    finally:
        lock.release()
        app.close()
    return 0


def _relay_until_stopped(app: App, should_stop: Any) -> None:
    relay = app.relay()
    from taskq.worker import metrics

    if metrics.is_enabled():
        relay.on_published = metrics.outbox_published().inc
    relay.run(should_stop)


def relay_main(spec: ChildSpec) -> None:
    """Entry point of the relay process started by the supervisor.

    Like a worker process it dies with its supervisor: Linux sends it SIGTERM when the
    supervisor dies (``PR_SET_PDEATHSIG``), and it also stops when its parent pid changes.
    An orphaned relay would go on publishing beside the next supervisor's relay, which on
    SQLite (no ``SKIP LOCKED``) republishes the same rows.
    """
    run_side_process(spec, run_relay, "outbox relay")


class RelayProcess(SupervisedProcess):
    """Starts, watches and restarts the outbox relay process for the supervisor."""

    def __init__(self, context: Any, spec: ChildSpec) -> None:
        super().__init__(context, spec, target=relay_main, name="relay", label="outbox relay")
