"""The SQL of ``taskq_schedule`` (one row per schedule) and ``taskq_schedulers`` (heartbeats).

The tick transaction is built from :meth:`ScheduleStore.lock_due` and
:meth:`ScheduleStore.advance` (see :mod:`taskq.schedules.scheduler`):

- PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` of the due row, so of several schedulers
  one takes the tick and the others pass at once instead of queueing on the lock;
- SQLite: the transaction starts with an ``UPDATE`` of the due row, which takes SQLite's one
  write lock before anything is read (a transaction that read first could not write after a
  producer's commit: ``SQLITE_BUSY`` on the stale snapshot);
- both: ``advance`` compares the stored ``next_run_at`` with the one read (a compare-and-set),
  and the outbox's unique idempotency key refuses a second row for the same tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from taskq.db import as_aware
from taskq.schema import schedule_table, schedulers_table

logger = logging.getLogger(__name__)

# Heartbeat rows not seen for this long are deleted when a scheduler starts.
FORGET_SCHEDULERS_AFTER = timedelta(hours=1)


@dataclass(frozen=True)
class ScheduleRow:
    """One ``taskq_schedule`` row."""

    name: str
    task: str
    schedule: str
    fingerprint: str
    next_run_at: datetime
    last_run_at: datetime | None
    updated_at: datetime


@dataclass(frozen=True)
class SchedulerRow:
    """One ``taskq_schedulers`` row: a scheduler process and when it was last seen."""

    id: str
    host: str
    pid: int
    started_at: datetime
    last_seen_at: datetime


class ScheduleStore:
    """Reads and writes the schedule and scheduler rows of one database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_postgres = engine.dialect.name == "postgresql"

    # -- schedules ---------------------------------------------------------------------------

    def sync(self, wanted: Iterable[ScheduleRow]) -> list[str]:
        """Insert missing rows; recompute rows whose fingerprint changed.

        Each ``wanted`` row carries its first run after now as ``next_run_at``. Returns the
        names whose schedule changed (their next run was recomputed).
        """
        changed = []
        with self.engine.begin() as conn:
            for row in wanted:
                conn.execute(_insert_missing(conn, row))
                stored = conn.execute(
                    sa.select(schedule_table.c.fingerprint).where(schedule_table.c.name == row.name)
                ).scalar_one()
                if stored != row.fingerprint:
                    conn.execute(
                        schedule_table.update()
                        .where(schedule_table.c.name == row.name)
                        .values(task=row.task, schedule=row.schedule, fingerprint=row.fingerprint,
                                next_run_at=row.next_run_at, updated_at=row.updated_at)
                    )
                    changed.append(row.name)
        return changed

    def lock_due(self, conn: Connection, name: str, now: datetime) -> ScheduleRow | None:
        """Lock the row of ``name`` if it is due; ``None`` if not due or another holds it."""
        t = schedule_table
        due = (t.c.name == name) & (t.c.next_run_at <= now)
        if not self.is_postgres:
            if conn.execute(t.update().where(due).values(updated_at=now)).rowcount != 1:
                return None
            return _row(conn.execute(sa.select(t).where(t.c.name == name)).mappings().one())
        found = conn.execute(
            sa.select(t).where(due).with_for_update(skip_locked=True)
        ).mappings().first()
        return _row(found) if found is not None else None

    def advance(
        self,
        conn: Connection,
        row: ScheduleRow,
        *,
        next_run_at: datetime,
        last_run_at: datetime | None,
        now: datetime,
    ) -> bool:
        """Move ``row`` on to ``next_run_at`` if nobody moved it since it was read."""
        t = schedule_table
        result = conn.execute(
            t.update()
            .where((t.c.name == row.name) & (t.c.next_run_at == row.next_run_at))
            .values(next_run_at=next_run_at, last_run_at=last_run_at, updated_at=now)
        )
        return bool(result.rowcount == 1)

    def due(self, names: list[str], now: datetime) -> list[str]:
        """The names among ``names`` whose next run is at or before ``now``."""
        t = schedule_table
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(t.c.name).where(t.c.name.in_(names), t.c.next_run_at <= now)
                .order_by(t.c.next_run_at)
            )
            return [name for (name,) in found]

    def next_due_at(self, names: list[str]) -> datetime | None:
        """The earliest next run among ``names``."""
        t = schedule_table
        with self.engine.connect() as conn:
            value = conn.execute(
                sa.select(sa.func.min(t.c.next_run_at)).where(t.c.name.in_(names))
            ).scalar()
        return as_aware(value)

    def rows(self) -> list[ScheduleRow]:
        """Every schedule row, by name."""
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(schedule_table).order_by(schedule_table.c.name))
            return [_row(r) for r in found.mappings()]

    # -- schedulers --------------------------------------------------------------------------

    def register(
        self,
        me: SchedulerRow,
        *,
        exclusive: bool,
        live_after: datetime,
        is_gone: Callable[[SchedulerRow], bool],
    ) -> SchedulerRow | None:
        """Add the heartbeat row of ``me``; with ``exclusive``, only if no other is live.

        The own row is written first, so SQLite's write lock is held while the others are
        read: two schedulers starting at once cannot both see an empty table. A row not seen
        since ``live_after``, or one that ``is_gone`` (a dead process on this host), is
        deleted. Returns the live holder that refused ``me`` (nothing was written), or
        ``None``.
        """
        try:
            self._register(me, exclusive=exclusive, live_after=live_after, is_gone=is_gone)
        except _Refused as refused:  # raised inside the transaction: it rolled back
            return refused.holder
        return None

    def _register(
        self,
        me: SchedulerRow,
        *,
        exclusive: bool,
        live_after: datetime,
        is_gone: Callable[[SchedulerRow], bool],
    ) -> None:
        t = schedulers_table
        with self.engine.begin() as conn:
            conn.execute(t.insert().values(**_scheduler_values(me)))
            conn.execute(t.delete().where(t.c.last_seen_at < me.last_seen_at
                                          - FORGET_SCHEDULERS_AFTER))
            others = [
                _scheduler(r)
                for r in conn.execute(sa.select(t).where(t.c.id != me.id)).mappings()
            ]
            stale = [o.id for o in others if o.last_seen_at < live_after or is_gone(o)]
            live = [o for o in others if o.id not in stale]
            if exclusive and live:
                raise _Refused(live[0])
            if exclusive and stale:
                conn.execute(t.delete().where(t.c.id.in_(stale)))

    def heartbeat(self, scheduler_id: str, now: datetime) -> bool:
        """Record that ``scheduler_id`` is alive; ``False`` if its row was taken away."""
        t = schedulers_table
        with self.engine.begin() as conn:
            result = conn.execute(t.update().where(t.c.id == scheduler_id)
                                  .values(last_seen_at=now))
        return bool(result.rowcount == 1)

    def unregister(self, scheduler_id: str) -> None:
        """Delete the heartbeat row of a scheduler that stops."""
        with self.engine.begin() as conn:
            conn.execute(schedulers_table.delete().where(schedulers_table.c.id == scheduler_id))

    def schedulers(self) -> list[SchedulerRow]:
        """Every scheduler seen, most recently seen first."""
        t = schedulers_table
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(t).order_by(t.c.last_seen_at.desc()))
            return [_scheduler(r) for r in found.mappings()]


class _Refused(Exception):
    def __init__(self, holder: SchedulerRow) -> None:
        super().__init__(holder.id)
        self.holder = holder


def _insert_missing(conn: Connection, row: ScheduleRow) -> sa.Executable:
    values = {
        "name": row.name, "task": row.task, "schedule": row.schedule,
        "fingerprint": row.fingerprint, "next_run_at": row.next_run_at,
        "last_run_at": None, "updated_at": row.updated_at,
    }
    if conn.dialect.name == "postgresql":
        return postgresql.insert(schedule_table).values(values).on_conflict_do_nothing()
    return sqlite.insert(schedule_table).values(values).on_conflict_do_nothing()


def _row(r: sa.RowMapping) -> ScheduleRow:
    return ScheduleRow(
        name=r["name"],
        task=r["task"],
        schedule=r["schedule"],
        fingerprint=r["fingerprint"],
        next_run_at=as_aware(r["next_run_at"]),  # type: ignore[arg-type]
        last_run_at=as_aware(r["last_run_at"]),
        updated_at=as_aware(r["updated_at"]),  # type: ignore[arg-type]
    )


def _scheduler(r: sa.RowMapping) -> SchedulerRow:
    return SchedulerRow(
        id=r["id"],
        host=r["host"],
        pid=r["pid"],
        started_at=as_aware(r["started_at"]),  # type: ignore[arg-type]
        last_seen_at=as_aware(r["last_seen_at"]),  # type: ignore[arg-type]
    )


def _scheduler_values(row: SchedulerRow) -> dict[str, object]:
    return {
        "id": row.id, "host": row.host, "pid": row.pid,
        "started_at": row.started_at, "last_seen_at": row.last_seen_at,
    }
