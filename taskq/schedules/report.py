"""What ``taskq status`` and ``taskq beat list`` show of periodic tasks.

:func:`collect` reads the app's definitions with their stored rows (next and last run) and
the schedulers seen (heartbeat rows). Times are ISO 8601 UTC strings, ready for JSON (the
dashboard reads the same ``Status.to_dict()``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from taskq._table import aligned
from taskq.db import utcnow
from taskq.schedules.definitions import Schedules, iso_utc
from taskq.schedules.store import ScheduleRow, SchedulerRow, ScheduleStore

logger = logging.getLogger(__name__)


class ReportApp(Protocol):
    """What the report reads of an app."""

    schedules: Schedules

    @property
    def engine(self) -> Any:
        """The SQLAlchemy engine of ``database_url``."""


@dataclass(frozen=True)
class ScheduleStatus:
    """One periodic task: its schedule and its next and last run (ISO 8601 UTC or None)."""

    name: str
    task: str
    schedule: str
    next_run: str | None
    last_run: str | None


@dataclass(frozen=True)
class SchedulerStatus:
    """One scheduler seen: its heartbeat row."""

    id: str
    host: str
    pid: int
    last_seen: str


@dataclass(frozen=True)
class ScheduleReport:
    """Schedules of the app, rows of schedules it does not define, schedulers seen."""

    schedules: list[ScheduleStatus]
    undefined: list[ScheduleStatus]
    schedulers: list[SchedulerStatus]
    error: str | None = None


def collect(app: ReportApp) -> ScheduleReport:
    """Read what the app's schedules look like now (an unreadable database is ``error``)."""
    if not len(app.schedules):
        return ScheduleReport([], [], [])
    error = None
    rows: dict[str, ScheduleRow] = {}
    seen: list[SchedulerRow] = []
    try:
        store = ScheduleStore(app.engine)
        rows = {row.name: row for row in store.rows()}
        seen = store.schedulers()
    except Exception as exc:  # a missing table, an unreachable database, a bad URL
        error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    schedules = [
        _status(d.name, d.task.name, d.schedule.describe(), rows.get(d.name))
        for d in app.schedules
    ]
    undefined = [
        _status(name, row.task, row.schedule, row)
        for name, row in sorted(rows.items()) if app.schedules.get(name) is None
    ]
    schedulers = [SchedulerStatus(s.id, s.host, s.pid, iso_utc(s.last_seen_at)) for s in seen]
    return ScheduleReport(schedules, undefined, schedulers, error)


def _status(name: str, task: str, schedule: str, row: ScheduleRow | None) -> ScheduleStatus:
    next_run = iso_utc(row.next_run_at) if row is not None else None
    last_run = iso_utc(row.last_run_at) if row is not None and row.last_run_at else None
    return ScheduleStatus(name, task, schedule, next_run, last_run)


def render(report: ScheduleReport, *, now: datetime | None = None) -> list[str]:
    """Lines for humans: a table of schedules, then the schedulers seen."""
    if not report.schedules:
        return []
    now = now or utcnow()
    rows = [["schedule", "task", "when", "next run", "last run"]]
    rows += [_row(s) for s in report.schedules]
    rows += [[*_row(s)[:-1], _row(s)[-1] + " (not defined in this app)"]
             for s in report.undefined]
    lines = aligned(rows)
    if report.error:
        lines.append(f"  schedules: ERROR cannot read taskq_schedule: {report.error}")
    lines.append(f"  schedulers seen: {len(report.schedulers)}")
    for seen in report.schedulers:
        age_s = (now - datetime.fromisoformat(seen.last_seen.replace("Z", "+00:00")))
        lines.append(f"    {seen.id[:8]} on {seen.host} pid {seen.pid}, last seen "
                     f"{age_s.total_seconds():.1f}s ago")
    return lines


def _row(status: ScheduleStatus) -> list[str]:
    return [status.name, status.task, status.schedule, status.next_run or "not stored yet",
            status.last_run or "never"]
