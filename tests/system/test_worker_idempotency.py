"""Exactly-once effects: the idempotency table under duplicates, crashes and concurrency."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App
from taskq.broker.topology import dlq_name
from taskq.message import encode
from taskq.schema import processed_table
from taskq.task import Task
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send

ACCOUNTS = 10
OPENING_BALANCE = 1_000_000


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str) -> Iterator[App]:
    """These tests run on PostgreSQL: bank tables next to taskq's, emptied per test."""
    app = make_app(database_url=postgres_url)
    tasks.bank.drop_all(app.engine)
    tasks.bank.create_all(app.engine)
    with app.engine.begin() as conn:
        conn.execute(tasks.accounts.insert(), [
            {"id": n, "balance": OPENING_BALANCE} for n in range(ACCOUNTS)
        ])
    yield app
    tasks.bank.drop_all(app.engine)


def _bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    return Task(app, task.fn, name=task.name, options=task.options)


def _scalar(app: App, query: Any) -> Any:
    with app.engine.connect() as conn:
        return conn.execute(query).scalar()


def _keys(app: App, task: Task[Any, Any]) -> int:
    count = sa.select(sa.func.count()).where(processed_table.c.task == task.name)
    return int(_scalar(app, count))


@pytest.mark.slow
def test_1000_transfers_delivered_twice_with_kills_keep_exact_balances(
    app: App, start_worker: Callable[..., Any]
) -> None:
    # Given 1,000 transfers, each published twice with the same task id
    rng = random.Random(42)
    transfers = []
    for transfer_id in range(1000):
        source, target = rng.sample(range(ACCOUNTS), 2)
        transfers.append((transfer_id, source, target, rng.randint(1, 500)))
    bound = _bound(app, tasks.transfer)
    envelopes = [bound.envelope(t) for t in transfers]
    items = [
        (app.topology.exchange, bound.queue, encode(envelope))
        for envelope in envelopes + [dataclasses.replace(e) for e in envelopes]
    ]
    rng.shuffle(items)
    app.publisher.publish_many(items)

    # When three worker processes run them while processes are killed -9 at random moments
    worker = start_worker(
        "-c", "3", "--prefetch", "4", loglevel="INFO",
        env={"TASKQ_DATABASE_URL": app.settings.database_url, "TASKQ_MAX_PROCESS_DEATHS": "50"},
    )
    done = threading.Event()
    kills = 0

    def killer() -> None:
        # Kills at random moments, but only once the workers got on since the last kill: a
        # replacement process needs ~0.5 s to start on a slow machine, and killing faster
        # than processes start would stop all progress (not what this test is about).
        nonlocal kills
        finished_at_last_kill = -1
        while not done.wait(rng.uniform(0.2, 0.6)):
            finished = _keys(app, tasks.transfer)
            if finished < finished_at_last_kill + 20:
                continue
            children = sorted(worker.children())
            if children:
                finished_at_last_kill = finished
                with_suppressed = rng.choice(children)
                try:
                    os.kill(with_suppressed, signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        wait_until(lambda: _keys(app, tasks.transfer) == 1000, timeout_s=100, interval_s=0.2,
                   message=lambda: f"{_keys(app, tasks.transfer)} of 1000 transfers done")
    finally:
        done.set()
        thread.join(timeout=10)
    wait_until(lambda: "is a duplicate" in worker.log(), timeout_s=30)
    worker.signal(signal.SIGTERM)
    worker.wait(60)

    # Then every balance is exact and each transfer's effects and key exist once
    expected = {n: OPENING_BALANCE for n in range(ACCOUNTS)}
    for _, source, target, amount in transfers:
        expected[source] -= amount
        expected[target] += amount
    with app.engine.connect() as conn:
        balances = {row.id: row.balance for row in conn.execute(sa.select(tasks.accounts))}
        applied = conn.execute(sa.select(tasks.applied.c.transfer_id)).scalars().all()
    assert kills >= 3, "the run finished before enough processes were killed"
    assert balances == expected
    assert sorted(applied) == list(range(1000))
    assert _keys(app, tasks.transfer) == 1000


def test_the_same_task_id_delivered_twice_at_once_runs_once(
    app: App, start_worker: Callable[..., Any], runs: str
) -> None:
    # Given two processes that each take one copy of the same task at the same time
    worker = start_worker(
        "-c", "2", "--prefetch", "1", env={"TASKQ_DATABASE_URL": app.settings.database_url}
    )
    worker.wait_consuming(2)
    bound = _bound(app, tasks.slow_transfer)
    envelope = bound.envelope((7, runs, 1.0))
    wire = encode(envelope)
    app.publisher.publish_many([(app.topology.exchange, bound.queue, wire)] * 2)

    # Then one copy writes and records its key; the other waits on the key and acks as a
    # duplicate without writing
    wait_until(lambda: "is a duplicate" in worker.log(), timeout_s=30,
               message=lambda: worker.log())
    assert _scalar(app, sa.select(sa.func.count()).select_from(tasks.applied)) == 1
    assert _keys(app, tasks.slow_transfer) == 1
    assert count_runs(runs, "start") == 1


def test_a_failed_transactional_task_leaves_no_key_and_no_write(
    app: App, start_worker: Callable[..., Any], broker: Any
) -> None:
    worker = start_worker("-c", "1", env={"TASKQ_DATABASE_URL": app.settings.database_url})
    result = send(app, tasks.failing_transfer, 5)

    wait_until(lambda: broker.depth(dlq_name(app.settings.default_queue)) == 1, timeout_s=30,
               message=lambda: worker.log())

    assert _scalar(app, sa.select(sa.func.count()).select_from(tasks.applied)) == 0
    assert _keys(app, tasks.failing_transfer) == 0
    [(_, props, _)] = broker.get_all(dlq_name(app.settings.default_queue))
    assert props.message_id == result.id
    assert props.headers["taskq-error-type"] == "RuntimeError"


def test_a_recorded_key_makes_a_redelivered_copy_a_duplicate(
    app: App, start_worker: Callable[..., Any], runs: str
) -> None:
    # Non-transactional idempotent task: the second copy of a finished task is skipped
    worker = start_worker("-c", "1", env={"TASKQ_DATABASE_URL": app.settings.database_url})
    first = send(app, tasks.record, runs, "once")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=30)

    send(app, tasks.record, runs, "once", task_id=first.id)

    wait_until(lambda: "is a duplicate" in worker.log(), timeout_s=30)
    assert count_runs(runs) == 1


def test_copies_of_one_task_taken_in_one_batch_run_once(
    app: App, start_worker: Callable[..., Any], runs: str
) -> None:
    # Given 20 copies of one task (same id, hence the same key) waiting before any worker
    bound = _bound(app, tasks.record)
    wire = encode(bound.envelope((runs, "batched")))
    app.publisher.publish_many([(app.topology.exchange, bound.queue, wire)] * 20)

    # When one process takes them in one prefetch batch (one SELECT for their keys)
    worker = start_worker(
        "-c", "1", "--prefetch", "32", env={"TASKQ_DATABASE_URL": app.settings.database_url}
    )

    # Then the first copy runs and records the key; the other 19 are duplicates
    wait_until(lambda: worker.log().count("is a duplicate") == 19, timeout_s=30,
               message=lambda: worker.log())
    assert count_runs(runs) == 1
