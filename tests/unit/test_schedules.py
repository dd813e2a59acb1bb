"""Schedules: cron across daylight saving, interval grids, catch-up plans, bad definitions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from taskq import App, ConfigurationError, SerializationError, crontab
from taskq.schedules.catchup import plan_ticks
from taskq.schedules.spec import Every

BERLIN = ZoneInfo("Europe/Berlin")
UTC = timezone.utc


def _runs(schedule, start: datetime, end: datetime) -> list[datetime]:
    """Every run of ``schedule`` in ``(start, end]``, by repeated next_after."""
    runs, moment = [], start
    while True:
        moment = schedule.next_after(moment)
        if moment > end:
            return runs
        runs.append(moment)


def _berlin(*fields: int, fold: int = 0) -> datetime:
    return datetime(*fields, tzinfo=BERLIN, fold=fold).astimezone(UTC)


# 2026: clocks go forward on Sunday 29 March at 02:00 CET (to 03:00 CEST) and back on
# Sunday 25 October at 03:00 CEST (to 02:00 CET).


def test_daily_run_in_the_skipped_hour_runs_right_after_the_gap() -> None:
    runs = _runs(crontab("30 2 * * *", timezone="Europe/Berlin"),
                 _berlin(2026, 3, 27, 12), _berlin(2026, 3, 31, 12))

    assert runs == [
        _berlin(2026, 3, 28, 2, 30),  # 01:30 UTC (CET)
        _berlin(2026, 3, 29, 3, 0),   # 02:30 does not exist: at 03:00 CEST, not lost
        _berlin(2026, 3, 30, 2, 30),  # 00:30 UTC (CEST)
        _berlin(2026, 3, 31, 2, 30),
    ]
    assert runs[1] == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_daily_run_in_the_repeated_hour_runs_once_at_its_first_occurrence() -> None:
    runs = _runs(crontab("30 2 * * *", timezone="Europe/Berlin"),
                 _berlin(2026, 10, 23, 12), _berlin(2026, 10, 27, 12))

    assert runs == [
        _berlin(2026, 10, 24, 2, 30),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST; not again at 02:30 CET
        _berlin(2026, 10, 26, 2, 30),               # 01:30 UTC (CET)
        _berlin(2026, 10, 27, 2, 30),
    ]


def test_runs_in_the_skipped_hour_collapse_into_one_after_the_gap() -> None:
    runs = _runs(crontab("*/15 2 * * *", timezone="Europe/Berlin"),
                 _berlin(2026, 3, 29, 0), _berlin(2026, 3, 30, 0))

    assert runs == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]  # 03:00 CEST, once


def test_named_hours_in_the_repeated_hour_run_only_in_the_first_copy() -> None:
    runs = _runs(crontab("0,30 1-3 * * *", timezone="Europe/Berlin"),
                 _berlin(2026, 10, 25, 0), _berlin(2026, 10, 25, 5))

    local = [r.astimezone(BERLIN).strftime("%H:%M %Z") for r in runs]
    assert local == ["01:00 CEST", "01:30 CEST", "02:00 CEST", "02:30 CEST",
                     "03:00 CET", "03:30 CET"]


def test_wildcard_hours_follow_elapsed_time_through_both_changes() -> None:
    schedule = crontab("0 * * * *", timezone="Europe/Berlin")
    spring = _runs(schedule, _berlin(2026, 3, 29, 0), _berlin(2026, 3, 30, 0))
    autumn = _runs(schedule, _berlin(2026, 10, 25, 0), _berlin(2026, 10, 26, 0))

    assert len(spring) == 23 and len(autumn) == 25  # the days are 23 and 25 hours long
    for runs in (spring, autumn):
        steps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
        assert set(steps) == {timedelta(hours=1)}  # no gap, no twin


def test_every_quarter_hour_over_both_changes_has_no_gap_and_no_duplicate() -> None:
    schedule = crontab("*/15 * * * *", timezone="Europe/Berlin")
    for day in (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 10, 24, 12, tzinfo=UTC)):
        runs = _runs(schedule, day, day + timedelta(days=2))
        assert len(runs) == 2 * 24 * 4
        assert all(b - a == timedelta(minutes=15) for a, b in zip(runs, runs[1:], strict=False))


def test_wall_clock_time_is_kept_across_the_changes() -> None:
    runs = _runs(crontab("0 9 * * 1-5", timezone="Europe/Berlin"),
                 _berlin(2026, 3, 26, 12), _berlin(2026, 3, 31, 12))

    assert [r.astimezone(BERLIN).hour for r in runs] == [9, 9, 9]  # Fri, Mon, Tue
    assert [r.hour for r in runs] == [8, 7, 7]  # UTC: CET, then CEST


def test_intervals_tick_on_a_grid_anchored_at_the_epoch() -> None:
    every = Every(timedelta(minutes=5))

    assert every.next_after(datetime(2026, 12, 1, 11, 42, 1, tzinfo=UTC)) == datetime(
        2026, 12, 1, 11, 45, tzinfo=UTC)
    assert every.next_after(datetime(2026, 12, 1, 11, 45, tzinfo=UTC)) == datetime(
        2026, 12, 1, 11, 50, tzinfo=UTC)
    assert every.describe() == "every 300s"


def test_fingerprints_change_with_the_schedule_only() -> None:
    assert crontab("*/5 * * * *").fingerprint == crontab("*/5  *  * * *").fingerprint
    assert crontab("*/5 * * * *").fingerprint != crontab("*/10 * * * *").fingerprint
    assert crontab("0 3 * * *", "Europe/Berlin").fingerprint != crontab("0 3 * * *").fingerprint
    assert Every(timedelta(seconds=5)).fingerprint != Every(timedelta(seconds=6)).fingerprint
    assert crontab("*/5 * * * *", timezone="Europe/Berlin").describe() == (
        "cron */5 * * * * Europe/Berlin")


# -- catch-up plans ---------------------------------------------------------------------------

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
EVERY_S = Every(timedelta(seconds=1))


def _plan(missed: str, *, down_s: float, max_runs: int = 100):
    # The next tick was T0; the scheduler comes back down_s later.
    return plan_ticks(EVERY_S, T0, T0 + timedelta(seconds=down_s), missed=missed,
                      grace_s=1.0, max_runs=max_runs)


def test_an_on_time_tick_runs_whatever_the_policy() -> None:
    for missed in ("once", "skip", "all"):
        plan = _plan(missed, down_s=0.3)
        assert plan.runs == [T0] and plan.missed == 0
        assert plan.next_run_at == T0 + timedelta(seconds=1)


def test_after_downtime_once_runs_one_catch_up_beside_the_current_tick() -> None:
    plan = _plan("once", down_s=10.4)

    # T0..T0+9 are more than a second late: one run stands for them (the newest, T0+9);
    # T0+10 is on time.
    assert plan.runs == [T0 + timedelta(seconds=9), T0 + timedelta(seconds=10)]
    assert plan.missed == 10 and plan.dropped == 9
    assert plan.next_run_at == T0 + timedelta(seconds=11)


def test_after_downtime_skip_drops_the_missed_ticks() -> None:
    plan = _plan("skip", down_s=10.4)

    assert plan.runs == [T0 + timedelta(seconds=10)]
    assert plan.missed == 10 and plan.dropped == 10


def test_after_downtime_all_runs_each_missed_tick_up_to_the_bound() -> None:
    plan = _plan("all", down_s=10.4)
    assert plan.runs == [T0 + timedelta(seconds=s) for s in range(11)]

    bounded = _plan("all", down_s=10.4, max_runs=3)
    assert bounded.runs == [T0 + timedelta(seconds=s) for s in (7, 8, 9, 10)]
    assert bounded.dropped == 7


def test_a_year_of_downtime_is_planned_in_bounded_work() -> None:
    plan = _plan("all", down_s=365 * 86400 + 0.5, max_runs=100)

    assert len(plan.runs) == 101  # the 100 newest missed ticks and the current one
    assert plan.runs == sorted(set(plan.runs))
    assert plan.runs[-1] == T0 + timedelta(seconds=365 * 86400)
    assert plan.next_run_at == plan.runs[-1] + timedelta(seconds=1)


def test_a_month_of_downtime_of_a_cron_schedule_keeps_the_newest_missed_runs() -> None:
    schedule = crontab("*/5 * * * *", timezone="Europe/Berlin")
    plan = plan_ticks(schedule, T0, T0 + timedelta(days=30, seconds=0.5), missed="all",
                      grace_s=1.0, max_runs=100)

    late, on_time = plan.runs[:-1], plan.runs[-1]
    assert on_time == T0 + timedelta(days=30)
    assert len(late) == 100 and late[-1] == on_time - timedelta(minutes=5)
    assert {b - a for a, b in zip(plan.runs, plan.runs[1:], strict=False)} == {
        timedelta(minutes=5)}


# -- bad definitions are refused at definition, with the reason --------------------------------


@pytest.fixture
def app() -> App:
    return App("schedules-unit", broker_url="amqp://guest:guest@127.0.0.1:5672/%2F",
               database_url="sqlite:///:memory:")


@pytest.mark.parametrize(
    ("schedule", "reason"),
    [
        (lambda: crontab("61 * * * *"), r"'61 \* \* \* \*' is not valid.*out of range"),
        (lambda: crontab("* * *"), r"3 fields, expected 5"),
        (lambda: crontab("0 0 * * * *"), r"6 fields, expected 5"),
        (lambda: crontab("@reboot"), r"shorthands are"),
        (lambda: crontab("0 0 30 2 *"), r"'0 0 30 2 \*' is not valid"),
        (lambda: crontab("*/5 * * * *", timezone="Europe/Berlinn"),
         r"unknown time zone 'Europe/Berlinn'"),
        (lambda: crontab(""), r"non-empty str"),
    ],
)
def test_bad_cron_strings_and_time_zones_are_refused_with_the_reason(schedule, reason) -> None:
    with pytest.raises(ConfigurationError, match=reason):
        schedule()


def test_bad_periodic_definitions_are_refused_with_the_reason(app: App) -> None:
    @app.task
    def ping(x: object = None) -> None: ...

    other = App("other", broker_url="amqp://guest:guest@127.0.0.1:5672/%2F")

    @other.task
    def foreign() -> None: ...

    cases = [
        (dict(schedule=0.5, task=ping, name="fast"), r"at least 1 second"),
        (dict(schedule="*/5 * * * *", task=ping, name="s"), r"write taskq.crontab"),
        (dict(schedule=True, task=ping, name="b"), r"seconds, a timedelta or taskq.crontab"),
        (dict(schedule=5, task="no.such.task", name="n"), r"'no.such.task' is not registered"),
        (dict(schedule=5, task=foreign, name="f"), r"belongs to another app"),
        (dict(schedule=5, task=ping, name=""), r"non-empty name"),
        (dict(schedule=5, task=ping, name="x" * 201), r"longer than 200"),
        (dict(schedule=5, task=ping, name="m", missed="never"), r"missed must be one of"),
        (dict(schedule=5, task=ping, name="p", priority=12), r"priority must be from 0 to 9"),
        (dict(schedule=5, task=ping, name="q", queue="bad queue!"), r"queue"),
    ]
    for kwargs, reason in cases:
        schedule, task, name = kwargs.pop("schedule"), kwargs.pop("task"), kwargs.pop("name")
        with pytest.raises(ConfigurationError, match=reason):
            app.add_periodic_task(schedule, task, name=name, **kwargs)
    with pytest.raises(SerializationError, match=r"args\[0\]"):
        app.add_periodic_task(5, ping, name="args", args=({1, 2},))
    assert len(app.schedules) == 0  # nothing half-defined


def test_names_are_unique_per_app(app: App) -> None:
    @app.periodic(crontab("0 3 * * *", timezone="Europe/Berlin"), name="nightly")
    @app.task
    def cleanup() -> None: ...

    with pytest.raises(ConfigurationError, match=r"'nightly' is already defined"):
        app.add_periodic_task(60, cleanup, name="nightly")
    app.add_periodic_task(timedelta(minutes=1), cleanup, name="minutely", args=(), queue="low")

    assert [d.name for d in app.schedules] == ["nightly", "minutely"]
    assert app.schedules.get("minutely").target_queue == "low"  # type: ignore[union-attr]


def test_periodic_over_a_plain_function_registers_it_as_a_task(app: App) -> None:
    @app.periodic(30)
    def heartbeat() -> None: ...

    definition = next(iter(app.schedules))
    assert definition.task.name == definition.name == heartbeat.name
    assert heartbeat.name in app.registry


def test_each_tick_has_its_own_idempotency_key_and_task_id(app: App) -> None:
    @app.task
    def report(kind: str) -> None: ...

    definition = app.add_periodic_task(60, report, name="hourly-report", args=("sales",))
    first = definition.envelope(T0)
    again = definition.envelope(T0)
    second = definition.envelope(T0 + timedelta(minutes=1))

    assert first.idempotency_key == "taskq-schedule:hourly-report@2026-12-01T12:00:00Z"
    assert first.task_id == again.task_id != second.task_id
    assert first.args == ["sales"] and first.headers["taskq-schedule"] == "hourly-report"


def test_framework_commands_fill_in_the_app_for_beat() -> None:
    from taskq.contrib._cli import with_app

    assert with_app(["beat"], "proj:app") == ["beat", "-A", "proj:app"]
    assert with_app(["beat", "list"], "proj:app") == ["beat", "list", "-A", "proj:app"]
    assert with_app(["worker", "--beat"], "proj:app") == ["worker", "-A", "proj:app", "--beat"]
