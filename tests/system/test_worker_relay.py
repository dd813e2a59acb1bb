"""The outbox relay inside `taskq worker` and on its own (`taskq relay`), and `taskq db`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App
from taskq.schema import processed_table
from taskq.task import Task
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, count_runs
from tests.tasks import record


def _enqueue(app: App, session: Session, *args: Any) -> str:
    bound: Task[Any, Any] = Task(app, record.fn, name=record.name, options=record.options)
    return bound.delay_on(session, *args).id


def test_worker_relays_committed_rows_and_runs_them(app: App, start_worker, runs) -> None:
    # Given rows committed (and one rolled back) before any worker runs
    app.create_tables()
    with Session(app.engine) as session, session.begin():
        for n in range(20):
            _enqueue(app, session, runs, f"c{n}")
    with Session(app.engine) as session:
        _enqueue(app, session, runs, "rolled-back")
        session.rollback()

    # When a worker with its default relay starts
    worker = start_worker("-c", "2", relay=True)

    # Then every committed task runs once, the rolled back one never
    wait_until(lambda: count_runs(runs) == 20, timeout_s=30,
               message=lambda: f"{count_runs(runs)} of 20 ran; log:\n{worker.log()}")
    # The relay deletes rows once their publish is confirmed, in a transaction of its own
    # (SQLite: beside the workers' key inserts), so the tasks may run a moment before it.
    wait_until(lambda: app.outbox_backlog().rows == 0, timeout_s=10,
               message=lambda: f"{app.outbox_backlog()}; log:\n{worker.log()}")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert count_runs(runs) == 20
    with open(runs) as file:
        assert "rolled-back" not in file.read()
    assert "started outbox relay process" in worker.log()


def test_no_relay_leaves_rows_in_the_outbox(app: App, start_worker, runs) -> None:
    app.create_tables()
    with Session(app.engine) as session, session.begin():
        _enqueue(app, session, runs, "waiting")

    worker = start_worker("-c", "1", "--no-relay")
    worker.wait_consuming(1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0

    assert app.outbox_backlog().rows == 1
    assert count_runs(runs) == 0
    assert "outbox relay" not in worker.log()


def test_standalone_relay_publishes_and_stops_on_sigterm(
    app: App, namespace: str, broker: Any, runs: str
) -> None:
    app.create_tables()
    with Session(app.engine) as session, session.begin():
        ids = {_enqueue(app, session, runs, n) for n in range(5)}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": app.settings.broker_url,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskq", "relay", "-A", "tests.tasks:app"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: app.outbox_backlog().rows == 0, timeout_s=30,
                   message="the standalone relay did not publish the rows")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
        proc.stderr.close()
    published = {props.message_id for _, props, _ in broker.get_all(app.settings.default_queue)}
    assert published == ids, log


def _taskq(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_DATABASE_URL": database_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "taskq", *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60,
    )


def test_db_create_and_prune_commands(database_file_url: str) -> None:
    created = _taskq("db", "create", "-A", "tests.tasks:app", database_url=database_file_url)
    assert created.returncode == 0, created.stderr
    assert "taskq tables ready in sqlite:///" in created.stdout

    engine = sa.create_engine(database_file_url)
    assert {"taskq_schedule", "taskq_schedulers"} <= set(sa.inspect(engine).get_table_names())
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(processed_table.insert(), [
            {"key": "old", "task": "t", "finished_at": now - timedelta(days=9)},
            {"key": "new", "task": "t", "finished_at": now},
        ])
    pruned = _taskq("db", "prune", "-A", "tests.tasks:app", "--older-than", "7d",
                    database_url=database_file_url)
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 1 idempotency keys" in pruned.stdout
    with engine.connect() as conn:
        assert conn.execute(sa.select(processed_table.c.key)).scalars().all() == ["new"]
    engine.dispose()

    bad = _taskq("db", "prune", "-A", "tests.tasks:app", "--older-than", "soon",
                 database_url=database_file_url)
    assert bad.returncode == 2
    assert "not a duration" in bad.stderr
