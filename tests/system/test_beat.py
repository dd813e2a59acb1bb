"""``taskq beat`` and ``taskq worker --beat`` as subprocesses: exactly one run per tick.

The schedules are in :mod:`tests.tasks_periodic`. Ticks are counted Jepsen style: every
tick of the 1-second grid between the first and the last one seen must be seen once (lost,
duplicate and unexpected all 0).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App
from taskq.schema import outbox_table, schedule_table
from tests.conftest import BROKER_URL, postgres_schema, schema_url
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, declare_topology
from tests.tasks import read_lines

SECOND = timedelta(seconds=1)


class Process:
    """A ``taskq`` subprocess of this test and its log."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM, then wait for the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not stop within {timeout_s}s; log:\n{self.log()}") from None


@pytest.fixture
def start_taskq(namespace: str, tmp_path: Path) -> Iterator[Callable[..., Process]]:
    """Factory: ``start_taskq("beat", env={...})`` runs ``python -m taskq beat -A ...``."""
    started: list[Process] = []

    def start(*args: str, env: dict[str, str]) -> Process:
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
            "PYTHONPATH": str(ROOT),
            "TASKQ_BROKER_URL": BROKER_URL,
            "TASKQ_NAMESPACE": namespace,
            "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
            **env,
        }
        log_path = tmp_path / f"{args[0]}-{len(started) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "taskq", *args, "-A", "tests.tasks_periodic:app",
                 "--loglevel", "DEBUG"],
                cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(Process(process, log_path))
        return started[-1]

    yield start
    for item in started:  # only the processes this test started, each by its own group
        try:
            os.killpg(item.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        item.process.wait(10)


def _tick(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _counts(ticks: list[datetime]) -> dict[str, Any]:
    """Lost, duplicate and unexpected ticks of a 1-second grid from the first to the last."""
    seen = collections.Counter(ticks)
    unexpected = [t for t in seen if t.microsecond != 0]
    first, last = min(seen), max(seen)
    grid = {first + n * SECOND for n in range(int((last - first) / SECOND) + 1)}
    return {
        "ticks": len(seen),
        "lost": sorted(grid - set(seen)),
        "duplicate": sorted(t for t, n in seen.items() if n > 1),
        "unexpected": unexpected,
    }


@pytest.mark.slow
def test_three_schedulers_killed_and_restarted_enqueue_every_tick_once(
    make_app: Callable[..., App], start_taskq, broker: Any, tmp_path: Path
) -> None:
    with postgres_schema("tqbeat") as schema:
        url = schema_url(schema)
        app = make_app(database_url=url)
        declare_topology(app)
        env = {"TASKQ_DATABASE_URL": url, "TASKQ_TEST_SCHEDULES": "ha",
               "TASKQ_TEST_RUNS": str(tmp_path / "runs")}
        # Given three schedulers and a relay on one PostgreSQL database
        relay = start_taskq("relay", env=env)
        beats = [start_taskq("beat", env=env) for _ in range(3)]
        wait_until(lambda: _last_run(app) is not None, timeout_s=30,
                   message=lambda: "a first tick; log:\n" + beats[0].log())

        # When for 15 s one of them is killed -9 and restarted every 3 s
        overdue_s = _kill_storm(app, beats, lambda: start_taskq("beat", env=env))

        for beat in beats:  # a scheduler started last may still be importing the app
            wait_until(lambda beat=beat: "schedules in postgresql" in beat.log(), timeout_s=30,
                       message=lambda beat=beat: "the scheduler started; log:\n" + beat.log())
            assert beat.stop() == 0, beat.log()
        wait_until(lambda: app.outbox_backlog().rows == 0, timeout_s=30,
                   message=lambda: f"{app.outbox_backlog()}; relay log:\n{relay.log()}")
        assert relay.stop() == 0
        last_run = _last_run(app)
        app.close()

    # Then every tick from the first to the last is in the queue exactly once
    messages = broker.get_all(app.settings.default_queue)
    ticks = [_tick(props.headers["taskq-schedule-tick"]) for _, props, _ in messages]
    counts = _counts(ticks)
    print(f"three schedulers, kill -9 every 3 s: {counts['ticks']} ticks, lost "
          f"{len(counts['lost'])}, duplicate {len(counts['duplicate'])}, unexpected "
          f"{len(counts['unexpected'])}; longest overdue {overdue_s:.3f}s")
    assert counts["lost"] == [] and counts["duplicate"] == [] and counts["unexpected"] == []
    assert counts["ticks"] >= 14  # the 15 s window, and more
    assert max(ticks) == last_run
    assert len({props.message_id for _, props, _ in messages}) == len(messages)
    # A survivor fires the next tick within the interval (the machine may be loaded).
    assert overdue_s < 2.0


def _kill_storm(app: App, beats: list[Any], restart: Callable[[], Any]) -> float:
    """Kill -9 one scheduler every 3 s for 15 s, restarting it; return the longest time a
    tick was overdue (next_run_at in the past), sampled every 50 ms."""
    started = time.monotonic()
    next_kill, victim, kills, overdue_s = started + 3, 0, 0, 0.0
    while time.monotonic() - started < 15:
        next_run_at = _next_run(app)
        overdue_s = max(overdue_s, (datetime.now(timezone.utc) - next_run_at).total_seconds())
        if time.monotonic() >= next_kill:
            os.kill(beats[victim].pid, signal.SIGKILL)
            beats[victim].process.wait(10)
            beats[victim] = restart()
            victim, kills, next_kill = (victim + 1) % 3, kills + 1, next_kill + 3
        time.sleep(0.05)  # the sampling period of the overdue measurement
    assert kills == 4
    return overdue_s


def _next_run(app: App) -> datetime:
    with app.engine.connect() as conn:
        value = conn.execute(sa.select(schedule_table.c.next_run_at)).scalar_one()
    return value.astimezone(timezone.utc)


def _last_run(app: App, name: str | None = None) -> datetime | None:
    query = sa.select(schedule_table.c.last_run_at)
    if name is not None:
        query = query.where(schedule_table.c.name == name)
    with app.engine.connect() as conn:
        value = conn.execute(query).scalar_one_or_none()
    return value.replace(tzinfo=timezone.utc) if value is not None else None


@pytest.fixture(params=["sqlite", "postgresql"])
def beat_database_url(request: pytest.FixtureRequest, database_file_url: str) -> Iterator[str]:
    """The embedded SQLite default, or a PostgreSQL schema of the test's own."""
    if request.param == "sqlite":
        yield database_file_url
        return
    with postgres_schema("tqbeat") as schema:
        yield schema_url(schema)


@pytest.mark.slow
def test_a_scheduler_stopped_for_10s_catches_up_per_missed_policy(
    make_app: Callable[..., App], start_taskq, beat_database_url: str, tmp_path: Path
) -> None:
    app = make_app(database_url=beat_database_url)
    app.create_tables()
    env = {"TASKQ_DATABASE_URL": beat_database_url, "TASKQ_TEST_SCHEDULES": "downtime",
           "TASKQ_BEAT_MAX_CATCHUP_RUNS": "5", "TASKQ_TEST_RUNS": str(tmp_path / "runs")}
    names = [f"every-second-{missed}" for missed in ("once", "skip", "all")]

    # Given a scheduler that fired a few ticks of each schedule, then stopped
    first = start_taskq("beat", env=env)
    wait_until(lambda: len(_outbox_ticks(app)) >= 9, timeout_s=30,
               message=lambda: "3 ticks of each schedule; log:\n" + first.log())
    assert first.stop() == 0, first.log()
    stopped = {name: _last_run(app, name) for name in names}

    # When it stays down for 10 s and comes back
    time.sleep(10)  # the downtime itself
    restarted_at = datetime.now(timezone.utc)
    second = start_taskq("beat", env=env)
    def on_time_after_restart(name: str) -> int:
        return sum(1 for n, t, created in _outbox_ticks(app)
                   if n == name and t > restarted_at and created - t <= SECOND)

    # two on-time ticks each: a scheduler starved for a second on a busy machine is late once
    wait_until(lambda: all(on_time_after_restart(n) >= 2 for n in names), timeout_s=60,
               message=lambda: "on-time ticks after the restart; log:\n" + second.log())
    assert second.stop() == 0, second.log()

    # Then: once -> one catch-up run, skip -> none, all -> the newest 5 (the bound)
    ticks = _outbox_ticks(app)
    expected_catch_up = {"every-second-once": 1, "every-second-skip": 0, "every-second-all": 5}
    for name in names:
        mine = sorted(t for n, t, _ in ticks if n == name)
        before = [t for t in mine if t <= stopped[name]]
        after = [t for t in mine if t > stopped[name]]
        late = [t for n, t, created in ticks if n == name and created - t > SECOND]
        on_time_after = [t for t in after if t not in late]
        assert _counts(before)["lost"] == [] and _counts(on_time_after)["lost"] == []
        assert len(mine) == len(set(mine))
        gap = on_time_after[0] - stopped[name]
        assert gap >= 9 * SECOND, (name, gap)  # the scheduler was really down
        assert len(late) == expected_catch_up[name], (name, late)
        # the catch-up runs are the newest missed ticks, right before the first on-time one
        assert sorted(late) == [on_time_after[0] - n * SECOND
                                for n in range(len(late), 0, -1)], (name, late)
    assert "missed='once': one run stands for them" in second.log()
    app.close()  # before a PostgreSQL schema is dropped


def _outbox_ticks(app: App) -> list[tuple[str, datetime, datetime]]:
    """(schedule, tick, created_at) of every outbox row (no relay runs in that test)."""
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(outbox_table.c.idempotency_key, outbox_table.c.created_at))
        found = []
        for key, created_at in rows:
            name, _, tick = key.removeprefix("taskq-schedule:").rpartition("@")
            found.append((name, _tick(tick), created_at.replace(tzinfo=timezone.utc)))
        return found


@pytest.mark.slow
def test_a_second_beat_on_sqlite_exits_with_an_error_naming_the_holder(
    make_app: Callable[..., App], start_taskq, database_file_url: str, tmp_path: Path
) -> None:
    app = make_app(database_url=database_file_url)
    app.create_tables()
    env = {"TASKQ_DATABASE_URL": database_file_url, "TASKQ_TEST_RUNS": str(tmp_path / "r")}
    holder = start_taskq("beat", env=env)
    wait_until(lambda: "schedules in sqlite" in holder.log(), timeout_s=30,
               message=lambda: "the first scheduler running; log:\n" + holder.log())

    second = start_taskq("beat", env=env)

    assert second.process.wait(30) == 78, second.log()
    assert "another scheduler already runs on the SQLite database" in second.log()
    assert f"pid {holder.pid}" in second.log()
    assert holder.process.poll() is None  # the holder goes on
    assert holder.stop() == 0


@pytest.mark.slow
def test_worker_with_beat_runs_each_tick_once(
    make_app: Callable[..., App], start_taskq, database_file_url: str, tmp_path: Path
) -> None:
    make_app(database_url=database_file_url)  # its topology is deleted afterwards
    runs = tmp_path / "runs"
    env = {"TASKQ_DATABASE_URL": database_file_url, "TASKQ_TEST_SCHEDULES": "ha",
           "TASKQ_TEST_RUNS": str(runs)}

    worker = start_taskq("worker", "--beat", "-c", "1", env=env)
    wait_until(lambda: len(read_lines(str(runs))) >= 4, timeout_s=40,
               message=lambda: "4 runs of the every-second schedule; log:\n" + worker.log())
    assert worker.stop(40) == 0, worker.log()

    ticks = [_tick(words[2]) for words in read_lines(str(runs))]
    counts = _counts(ticks)
    assert counts["lost"] == [] and counts["duplicate"] == [] and counts["unexpected"] == []
    assert {words[1] for words in read_lines(str(runs))} == {"every-second"}
    assert "started scheduler process" in worker.log()
