"""The tick transaction and the scheduler against real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from taskq import App, ConfigurationError, crontab
from taskq.cli import main
from taskq.schedules.scheduler import Scheduler
from taskq.schedules.store import SchedulerRow, ScheduleStore
from taskq.schema import outbox_table, schedule_table, schedulers_table
from taskq.status import render

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def periodic_app(make_app: Callable[..., App], database_url: str) -> App:
    app = make_app(database_url=database_url)
    app.create_tables()

    @app.task(name="report")
    def report(kind: str) -> None: ...

    app.add_periodic_task(1, report, name="every-second", args=("sales",))
    return app


@pytest.fixture
def schedulers() -> Iterator[Callable[..., Scheduler]]:
    started: list[Scheduler] = []

    def start(app: App, clock: Clock) -> Scheduler:
        scheduler = Scheduler(app, clock=clock)
        scheduler.start()
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.stop()


def _outbox(app: App) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(
            sa.select(outbox_table.c.id, outbox_table.c.idempotency_key, outbox_table.c.queue)
            .order_by(outbox_table.c.idempotency_key)
        ))


def _row(app: App, name: str = "every-second") -> Any:
    with app.engine.connect() as conn:
        return conn.execute(sa.select(schedule_table).where(schedule_table.c.name == name)).one()


def test_a_tick_adds_one_outbox_row_and_advances_the_schedule(
    periodic_app: App, schedulers
) -> None:
    clock = Clock(T0)
    scheduler = schedulers(periodic_app, clock)  # first run: the next grid second, T0 + 1s

    clock.advance(1.2)
    scheduler.step()
    scheduler.step()  # the same moment again: nothing more is due

    rows = _outbox(periodic_app)
    assert [r.idempotency_key for r in rows] == [
        "taskq-schedule:every-second@2026-12-01T12:00:01Z"]
    assert rows[0].queue == periodic_app.settings.default_queue
    stored = _row(periodic_app)
    assert stored.next_run_at.replace(tzinfo=timezone.utc) == T0 + timedelta(seconds=2)
    assert stored.last_run_at.replace(tzinfo=timezone.utc) == T0 + timedelta(seconds=1)
    assert scheduler.fired == 1


def test_a_restarted_scheduler_neither_forgets_nor_repeats_a_tick(
    periodic_app: App, schedulers
) -> None:
    clock = Clock(T0)
    first = schedulers(periodic_app, clock)
    clock.advance(1.1)
    first.step()
    first.stop()

    second = schedulers(periodic_app, clock)  # same moment: the tick is already done
    second.step()
    clock.advance(1.0)
    second.step()

    keys = [r.idempotency_key for r in _outbox(periodic_app)]
    assert keys == ["taskq-schedule:every-second@2026-12-01T12:00:01Z",
                    "taskq-schedule:every-second@2026-12-01T12:00:02Z"]


def test_ticks_missed_while_stopped_run_once_by_default(periodic_app: App, schedulers) -> None:
    clock = Clock(T0)
    scheduler = schedulers(periodic_app, clock)
    clock.advance(1.1)
    scheduler.step()

    clock.advance(10.0)  # nothing ran for 10 s
    scheduler.step()

    keys = [r.idempotency_key.rsplit("@", 1)[1] for r in _outbox(periodic_app)]
    # 12:00:01 on time; 02..10 missed: one run stands for them (10); 11 is on time.
    assert keys == ["2026-12-01T12:00:01Z", "2026-12-01T12:00:10Z", "2026-12-01T12:00:11Z"]


def test_a_row_held_by_another_scheduler_is_passed_over_and_fired_once(
    make_app: Callable[..., App], pg_schema_url: str, schedulers
) -> None:
    from tests.conftest import truncate_taskq_tables

    truncate_taskq_tables(pg_schema_url)
    apps = [make_app(database_url=pg_schema_url) for _ in range(2)]
    for app in apps:
        task = app.task(name="report")(lambda: None)
        app.add_periodic_task(1, task, name="every-second")
    clock = Clock(T0)
    one, other = schedulers(apps[0], clock), schedulers(apps[1], clock)
    clock.advance(1.1)

    # While one scheduler holds the due row in its tick transaction...
    store = ScheduleStore(apps[0].engine)
    with apps[0].engine.begin() as conn:
        held = store.lock_due(conn, "every-second", clock())
        assert held is not None
        assert other.tick(apps[1].schedules.get("every-second")) == 0  # SKIP LOCKED: no wait
    # ... and once it let go without firing, the other fires it, and the first finds nothing.
    assert other.tick(apps[1].schedules.get("every-second")) == 1
    assert one.tick(apps[0].schedules.get("every-second")) == 0
    assert len(_outbox(apps[0])) == 1


def test_a_changed_schedule_is_noticed_and_its_next_run_recomputed(
    periodic_app: App, make_app: Callable[..., App], schedulers, caplog
) -> None:
    clock = Clock(T0)
    schedulers(periodic_app, clock).stop()
    assert _row(periodic_app).schedule == "every 1s"

    changed = make_app(database_url=periodic_app.settings.database_url)
    task = changed.task(name="report")(lambda kind: None)
    changed.add_periodic_task(crontab("*/5 * * * *", timezone="Europe/Berlin"), task,
                              name="every-second", args=("sales",))
    with caplog.at_level(logging.WARNING, logger="taskq.schedules.scheduler"):
        scheduler = schedulers(changed, clock)

    stored = _row(periodic_app)
    assert stored.schedule == "cron */5 * * * * Europe/Berlin"
    assert stored.next_run_at.replace(tzinfo=timezone.utc) == T0 + timedelta(minutes=5)
    assert "schedule every-second changed" in caplog.text
    # The old definition's scheduler, still running somewhere, leaves the row alone.
    clock.advance(300.5)
    old = Scheduler(periodic_app, clock=clock)
    assert old.tick(periodic_app.schedules.get("every-second")) == 0
    assert scheduler.tick(changed.schedules.get("every-second")) == 1


def test_a_second_scheduler_on_sqlite_is_refused_naming_the_holder(
    make_app: Callable[..., App], database_file_url: str, schedulers
) -> None:
    app = make_app(database_url=database_file_url)
    app.create_tables()
    app.add_periodic_task(60, app.task(name="t")(lambda: None), name="minutely")
    clock = Clock(T0)
    holder = schedulers(app, clock)

    with pytest.raises(ConfigurationError) as refused:
        Scheduler(app, clock=clock).start()
    text = str(refused.value)
    assert "another scheduler already runs on the SQLite database" in text
    assert f"pid {holder.pid}" in text and holder.host in text and "PostgreSQL" in text

    holder.stop()
    schedulers(app, clock)  # the holder stopped: accepted


def test_a_dead_holder_on_this_host_is_taken_over_at_once(
    make_app: Callable[..., App], database_file_url: str, schedulers
) -> None:
    app = make_app(database_url=database_file_url)
    app.create_tables()
    app.add_periodic_task(60, app.task(name="t")(lambda: None), name="minutely")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    clock = Clock(T0)
    dead = Scheduler(app, clock=clock)
    ScheduleStore(app.engine).register(
        SchedulerRow("dead", dead.host, int(gone.stdout), T0, T0),
        exclusive=True, live_after=T0 - timedelta(seconds=15), is_gone=lambda row: False,
    )

    scheduler = schedulers(app, clock)  # the row is fresh, but its process is gone

    with app.engine.connect() as conn:
        ids = [r.id for r in conn.execute(sa.select(schedulers_table.c.id))]
    assert ids == [scheduler.id]


def test_status_shows_schedules_and_schedulers(periodic_app: App, schedulers) -> None:
    from taskq.status import collect

    clock = Clock(datetime.now(timezone.utc))
    scheduler = schedulers(periodic_app, clock)
    clock.advance(1.0)
    scheduler.step()

    status = collect(periodic_app)
    data = status.to_dict()

    [schedule] = data["schedules"]
    assert set(schedule) == {"name", "task", "schedule", "next_run", "last_run"}
    assert schedule["name"] == "every-second" and schedule["schedule"] == "every 1s"
    assert schedule["task"] == "report"
    assert schedule["next_run"].endswith("Z") and schedule["last_run"].endswith("Z")
    [seen] = data["schedulers"]
    assert set(seen) == {"id", "host", "pid", "last_seen"}
    assert seen["id"] == scheduler.id and seen["pid"] == scheduler.pid
    text = render(status)
    assert "every-second" in text and "schedulers seen: 1" in text


def test_status_of_an_app_without_periodic_tasks_has_empty_lists(
    make_app: Callable[..., App],
) -> None:
    from taskq.status import collect

    data = collect(make_app()).to_dict()

    assert data["schedules"] == [] and data["schedulers"] == []


def test_beat_list_shows_every_schedule_with_next_and_last_run(
    periodic_app: App, make_app: Callable[..., App], schedulers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(datetime.now(timezone.utc))
    scheduler = schedulers(periodic_app, clock)
    clock.advance(1.0)
    scheduler.step()
    listed = make_app(database_url=periodic_app.settings.database_url)  # the CLI closes it
    listed.add_periodic_task(1, listed.task(name="report")(lambda kind: None),
                             name="every-second", args=("sales",))
    module = types.ModuleType("taskq_beat_list_probe")
    module.app = listed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    result = CliRunner().invoke(main, ["beat", "list", "-A", f"{module.__name__}:app"])

    assert result.exit_code == 0, result.output
    assert "every-second" in result.output and "every 1s" in result.output
    assert "never" not in result.output  # it ran once: a last run is shown
    assert f"pid {scheduler.pid}" in result.output
    as_json = CliRunner().invoke(main, ["beat", "list", "-A", f"{module.__name__}:app",
                                        "--json"])
    assert '"name": "every-second"' in as_json.output


def test_beat_without_app_says_how_to_give_it() -> None:
    result = CliRunner().invoke(main, ["beat"])

    assert result.exit_code == 2
    assert "give the app with -A MODULE:APP" in result.output


def test_a_database_outage_backs_off_and_fires_the_ticks_once_it_is_back(
    make_app: Callable[..., App], postgres_url: str, schedulers, caplog
) -> None:
    from tests.support.proxy import TcpProxy

    with TcpProxy("127.0.0.1", 5432) as proxy:
        app = make_app(database_url=proxy.url(postgres_url))
        app.add_periodic_task(1, app.task(name="report")(lambda: None), name="every-second")
        clock = Clock(T0)
        scheduler = schedulers(app, clock)

        # While the database cannot be reached, a step backs off and says so once
        caplog.set_level(logging.WARNING, logger="taskq.schedules.scheduler")
        proxy.cut()
        clock.advance(1.2)
        pauses = [scheduler.step(), scheduler.step()]
        assert pauses[0] > 0 and pauses[1] > pauses[0]
        assert caplog.text.count("cannot reach the database") == 1
        assert "no tick is lost" in caplog.text

        # Once it is back, the due tick fires, once
        proxy.restore()
        scheduler.step()
        scheduler.step()
        keys = [r.idempotency_key for r in _outbox(app)]
        assert keys == ["taskq-schedule:every-second@2026-12-01T12:00:01Z"]
        assert "reaches the database again" in caplog.text and scheduler.fired == 1
        scheduler.stop()
        app.close()
