"""The scheduler loop: wake at the next due tick, fire it in one transaction, sleep again.

One tick of one schedule is one database transaction (:meth:`Scheduler.tick`): lock the
schedule's row if it is due, decide the runs (:func:`~taskq.schedules.catchup.plan_ticks`),
add each run's outbox row through the app's outbox path (idempotency key from the schedule
name and the tick time), advance ``next_run_at``, commit. The relay publishes the rows. A
scheduler killed at any point leaves either the whole tick or nothing, so several
schedulers on PostgreSQL never fire a tick twice and a survivor fires the next one on time.

On SQLite one scheduler runs: a second one is refused at start with an error naming the
holder (its heartbeat row), and takes over once the holder has not been seen for three
heartbeats (at once when the holder is a dead process on this host).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa

from taskq.db import utcnow
from taskq.errors import ConfigurationError
from taskq.road import Outgoing
from taskq.schedules.catchup import plan_ticks
from taskq.schedules.definitions import PeriodicTask, Schedules, iso_utc
from taskq.schedules.store import ScheduleRow, SchedulerRow, ScheduleStore
from taskq.settings import Settings, redact_url

logger = logging.getLogger(__name__)

# A heartbeat row not refreshed for this many heartbeats belongs to a scheduler that is gone.
LEASE_HEARTBEATS = 3
# The longest sleep between two looks at the table (rows moved by other schedulers).
MAX_PAUSE_S = 1.0
# Pause while a due row is held by another scheduler (it commits within milliseconds).
BUSY_PAUSE_S = 0.05
# A schedule whose tick failed, or whose row another definition owns, waits this long.
SCHEDULE_BACKOFF_S = 5.0
_DB_BACKOFF_MAX_S = 30.0


class BeatApp(Protocol):
    """What a scheduler needs of its app (:class:`~taskq.app.App` provides it)."""

    name: str
    settings: Settings
    schedules: Schedules

    @property
    def engine(self) -> Any:
        """The SQLAlchemy engine of ``database_url``."""

    def enqueue(self, session: Any, outgoing: Outgoing) -> bool:
        """Add a message to the outbox in ``session``'s transaction."""


class _LostRace(Exception):
    """Another scheduler moved the row between our read and our update: roll back."""


class Scheduler:
    """Fires the ticks of an app's periodic tasks until told to stop.

    Args:
        app: The app whose ``schedules`` run.
        clock: Returns the current aware UTC time (tests inject one).
    """

    def __init__(self, app: BeatApp, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.app = app
        self.clock = clock
        self.store = ScheduleStore(app.engine)
        self.id = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.fired = 0
        self._definitions = {d.name: d for d in app.schedules}
        self._held_until: dict[str, float] = {}
        self._heartbeat_at = 0.0
        self._db_failures = 0

    # -- life cycle ------------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Register, sync the definitions, then fire ticks until ``should_stop()``.

        Raises:
            ConfigurationError: no periodic tasks, a definition whose runs could not be
                enqueued (see :meth:`PeriodicTask.check`), or another scheduler holds SQLite.
        """
        self.start()
        try:
            while not should_stop():
                self._sleep(self.step(), should_stop)
        finally:
            self.stop()

    def start(self) -> None:
        """Record this scheduler (refused on SQLite while another runs) and sync rows."""
        if not self._definitions:
            raise ConfigurationError(
                f"app {self.app.name!r} defines no periodic tasks; add some with "
                "app.add_periodic_task(...) or @app.periodic(...)"
            )
        # Checked again against the queues as the app now declares them: a queue made
        # ordered (or quorum) after a schedule was defined would refuse every tick.
        for definition in self._definitions.values():
            definition.check()
        self._register()
        try:
            self._sync()
        except BaseException:
            self.stop()
            raise
        logger.info(
            "scheduler %s (pid %d) for app %s: %d schedules in %s", self.id[:8], self.pid,
            self.app.name, len(self._definitions), redact_url(self.app.settings.database_url),
        )

    def stop(self) -> None:
        """Delete this scheduler's heartbeat row (a killed one's row just ages)."""
        try:
            self.store.unregister(self.id)
        except sa.exc.SQLAlchemyError as exc:
            logger.warning("scheduler %s could not delete its heartbeat row: %s", self.id[:8], exc)
        logger.info("scheduler %s stopped; %d runs enqueued", self.id[:8], self.fired)

    def _register(self) -> None:
        now = self.clock()
        me = SchedulerRow(self.id, self.host, self.pid, now, now)
        exclusive = not self.store.is_postgres
        holder = self.store.register(
            me, exclusive=exclusive, live_after=now - self._lease(), is_gone=self._is_gone
        )
        if holder is not None:
            age_s = (now - holder.last_seen_at).total_seconds()
            raise ConfigurationError(
                f"another scheduler already runs on the SQLite database "
                f"{redact_url(self.app.settings.database_url)}: host {holder.host} pid "
                f"{holder.pid} (id {holder.id[:8]}, last seen {age_s:.1f}s ago). SQLite "
                "supports one scheduler: stop that one (or wait "
                f"{self._lease().total_seconds():g}s after it died), or use PostgreSQL to "
                "run several"
            )
        self._heartbeat_at = time.monotonic()

    def _sync(self) -> None:
        now = self.clock()
        wanted = [
            ScheduleRow(d.name, d.task.name, d.schedule.describe(), d.schedule.fingerprint,
                        d.schedule.next_after(now), None, now)
            for d in self._definitions.values()
        ]
        for name in self.store.sync(wanted):
            logger.warning(
                "schedule %s changed (now %s); its next run is recomputed: %s", name,
                self._definitions[name].schedule.describe(),
                iso_utc(self._definitions[name].schedule.next_after(now)),
            )

    def _lease(self) -> timedelta:
        return timedelta(seconds=LEASE_HEARTBEATS * self.app.settings.beat_heartbeat_s)

    def _is_gone(self, other: SchedulerRow) -> bool:
        return other.host == self.host and other.pid != self.pid and not _pid_alive(other.pid)

    # -- the loop -------------------------------------------------------------------------------

    def step(self) -> float:
        """Heartbeat when due, fire every due tick; return the seconds to sleep."""
        try:
            self._heartbeat()
            for name in self.store.due(self._active(), self.clock()):
                self.tick(self._definitions[name])
            pause_s = self._pause_s()
        except sa.exc.SQLAlchemyError as exc:
            return self._database_failed(exc)
        if self._db_failures:
            logger.warning("scheduler %s reaches the database again", self.id[:8])
            self._db_failures = 0
        return pause_s

    def tick(self, definition: PeriodicTask) -> int:
        """Fire the due ticks of ``definition`` in one transaction; return the runs added."""
        now = self.clock()
        try:
            with self.app.engine.begin() as conn:
                row = self.store.lock_due(conn, definition.name, now)
                if row is None:
                    return 0  # not due any more, or another scheduler is firing it
                if row.fingerprint != definition.schedule.fingerprint:
                    self._foreign(definition, row)
                    return 0
                runs = self._fire(conn, definition, row, now)
        except _LostRace:
            return 0
        except sa.exc.SQLAlchemyError:
            raise
        except Exception as exc:  # OutboxError, MessageTooLarge: this schedule only
            self._hold(definition.name)
            logger.error(
                "schedule %s could not enqueue task %s for queue %s: %s; retrying in %gs",
                definition.name, definition.task.name, definition.target_queue, exc,
                SCHEDULE_BACKOFF_S,
            )
            return 0
        self.fired += len(runs)
        for tick_at in runs:
            logger.debug("schedule %s: task %s enqueued for queue %s, tick %s",
                         definition.name, definition.task.name, definition.target_queue,
                         iso_utc(tick_at))
        return len(runs)

    def _fire(
        self, conn: Any, definition: PeriodicTask, row: ScheduleRow, now: datetime
    ) -> list[datetime]:
        settings = self.app.settings
        plan = plan_ticks(
            definition.schedule, row.next_run_at, now, missed=definition.missed,
            grace_s=settings.beat_grace_s, max_runs=settings.beat_max_catchup_runs,
        )
        if plan.missed != 0:
            logger.warning("%s", _missed_text(definition, row, plan.missed, plan.dropped))
        for tick_at in plan.runs:
            self.app.enqueue(conn, definition.outgoing(tick_at))
        last_run_at = plan.runs[-1] if plan.runs else row.last_run_at
        if not self.store.advance(conn, row, next_run_at=plan.next_run_at,
                                  last_run_at=last_run_at, now=now):
            raise _LostRace()
        return plan.runs

    def _foreign(self, definition: PeriodicTask, row: ScheduleRow) -> None:
        self._hold(definition.name)
        logger.warning(
            "schedule %s is stored as %r by another scheduler's definition, not %r as here; "
            "this scheduler leaves it to that one (restart this one to make its definition "
            "the stored one)", definition.name, row.schedule, definition.schedule.describe(),
        )

    def _hold(self, name: str) -> None:
        self._held_until[name] = time.monotonic() + SCHEDULE_BACKOFF_S

    def _active(self) -> list[str]:
        now = time.monotonic()
        return [n for n in self._definitions if self._held_until.get(n, 0.0) <= now]

    def _heartbeat(self) -> None:
        if time.monotonic() - self._heartbeat_at < self.app.settings.beat_heartbeat_s:
            return
        if not self.store.heartbeat(self.id, self.clock()):
            if not self.store.is_postgres:
                raise ConfigurationError(
                    f"scheduler {self.id[:8]} (pid {self.pid}) was not seen for "
                    f"{self._lease().total_seconds():g}s and another scheduler took over the "
                    "SQLite database; stopping this one"
                )
            self._register()  # its row was forgotten (not seen for an hour): come back
        self._heartbeat_at = time.monotonic()

    def _pause_s(self) -> float:
        active = self._active()
        due_at = self.store.next_due_at(active) if active else None
        if due_at is None:
            return MAX_PAUSE_S
        until_s = (due_at - self.clock()).total_seconds()
        if until_s <= 0:
            return BUSY_PAUSE_S
        return min(MAX_PAUSE_S, until_s)

    def _database_failed(self, exc: BaseException) -> float:
        self._db_failures += 1
        delay_s = min(_DB_BACKOFF_MAX_S, 0.5 * 2.0 ** self._db_failures)
        if self._db_failures == 1:
            logger.warning(
                "scheduler %s cannot reach the database (%s); no tick is lost, the next "
                "ones fire once it is back (retrying with backoff up to %gs)",
                self.id[:8], str(exc).splitlines()[0], _DB_BACKOFF_MAX_S,
            )
        return delay_s

    @staticmethod
    def _sleep(pause_s: float, should_stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + pause_s
        while not should_stop():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))


def _missed_text(
    definition: PeriodicTask, row: ScheduleRow, missed: int | None, dropped: int | None
) -> str:
    count = "many" if missed is None else str(missed)
    outcome = {
        "once": "one run stands for them",
        "skip": "they are skipped",
        "all": "each runs" if not dropped else
        f"the newest run, {dropped if dropped is not None else 'older ones'} dropped "
        "(beat_max_catchup_runs)",
    }[definition.missed]
    return (
        f"schedule {definition.name} (task {definition.task.name}, queue "
        f"{definition.target_queue}): {count} ticks missed since {iso_utc(row.next_run_at)} "
        f"while no scheduler fired them; missed={definition.missed!r}: {outcome}"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
