"""Ordered queues end to end: ``taskq worker`` processes, the shared broker, PostgreSQL.

Each test has its own namespace, ordered queue (16 partitions) and PostgreSQL schema. Tasks
record one effect row per finished run in their own transaction (tests/ordering_tasks.py), so
the rows tell the order per key, gaps and repeats, which process ran what and when.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App
from taskq.dlq import replay
from taskq.ordering.keys import partition_of
from tests import ordering_tasks
from tests.conftest import BROKER_URL
from tests.support.waiting import wait_until
from tests.system.ordering import (
    bound,
    effect_count,
    effects,
    max_parallel_partitions,
    order_problems,
)
from tests.system.workers import ROOT, Worker

pytestmark = pytest.mark.slow

PARTITIONS = 16


@pytest.fixture
def queue(namespace: str) -> str:
    """The test's ordered queue."""
    return f"{namespace}.ledger"


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str, queue: str) -> Iterator[App]:
    """The test's app on PostgreSQL with the ordered queue, and the effects table."""
    engine = sa.create_engine(postgres_url)
    ordering_tasks.effects_metadata.create_all(engine)
    app = make_app(database_url=postgres_url)
    app.queue(queue, partitions=PARTITIONS)
    yield app
    ordering_tasks.effects_metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def start(start_worker: Callable[..., Worker], queue: str) -> Callable[..., Worker]:
    """Start ``taskq worker -A tests.ordering_tasks:app`` with ``args`` on the test's queue."""

    def run(
        *args: str, env: dict[str, str] | None = None, loglevel: str = "INFO", **options: Any
    ) -> Worker:
        return start_worker(
            *args, app_path="tests.ordering_tasks:app", loglevel=loglevel,
            env={"TASKQ_TEST_ORDERED_QUEUE": queue, "TASKQ_TEST_PARTITIONS": str(PARTITIONS),
                 **(env or {})},
            **options,
        )

    return run


def _calls(keys: int, per_key: int, seed: int) -> tuple[list[tuple[str, int, int]],
                                                       dict[str, list[int]]]:
    rand = random.Random(seed)
    names = [f"acct-{k}" for k in range(keys)]
    calls = [(key, seq, rand.randint(1, 30)) for seq in range(per_key) for key in names]
    return calls, {key: list(range(per_key)) for key in names}


def _wait_effects(url: str, count: int, worker: Worker, timeout_s: float) -> None:
    wait_until(
        lambda: effect_count(url) >= count, timeout_s=timeout_s, interval_s=0.2,
        message=lambda: f"{count} effects, got {effect_count(url)}; log:\n{worker.log()[-4000:]}",
    )


def test_each_key_runs_in_enqueue_order_while_partitions_run_in_parallel(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker]
) -> None:
    # Given 4 worker processes on a 16-partition queue
    worker = start("-c", "4")
    worker.wait_consuming(4)
    calls, expected = _calls(keys=50, per_key=40, seed=16)
    # When 50 keys x 40 tasks of 1-30 ms are sent in bulk (map/starmap routing)
    bound(app, ordering_tasks.step, queue).starmap(calls)
    _wait_effects(postgres_url, len(calls), worker, timeout_s=90)
    # Then every key's effects are exactly its enqueue order, and partitions ran in parallel
    rows = effects(postgres_url)
    assert order_problems(rows, expected) == []
    assert len(rows) == len(calls)
    assert max_parallel_partitions(rows) >= 3
    assert len({row.pid for row in rows}) == 4  # the partitions spread over every process


@pytest.mark.faults  # a kill storm: runs with the fault suite (`make faults`, CI)
def test_order_and_exactly_once_survive_a_process_killed_every_half_second(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker]
) -> None:
    # Given 4 worker processes that may be killed many times (no crash-loop dead letters)
    worker = start("-c", "4", env={"TASKQ_MAX_PROCESS_DEATHS": "1000"})
    worker.wait_consuming(4)
    calls, expected = _calls(keys=50, per_key=40, seed=17)
    bound(app, ordering_tasks.step, queue).starmap(calls)
    # When one worker process is killed -9 every 500 ms for 15 s
    rand = random.Random(17)
    kills = 0
    ends_at = time.monotonic() + 15
    while time.monotonic() < ends_at:
        children = sorted(worker.children())
        if children:
            os.kill(rand.choice(children), signal.SIGKILL)
            kills += 1
        time.sleep(0.5)  # the fault schedule itself, not a wait for a condition
    _wait_effects(postgres_url, len(calls), worker, timeout_s=120)
    # Then order is exact per key and every effect happened once (no loss, no duplicate)
    rows = effects(postgres_url)
    assert kills >= 25
    assert order_problems(rows, expected) == []
    assert len(rows) == len(calls)
    assert len({row.task_id for row in rows}) == len(calls)


def test_a_task_retried_in_place_runs_before_the_later_tasks_of_its_key(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker]
) -> None:
    worker = start("-c", "2")
    worker.wait_consuming(2)
    # Given a task of key K that fails twice then succeeds, followed by 10 more of K
    bound(app, ordering_tasks.flaky, queue).apply_async(("K", 0, 2))
    bound(app, ordering_tasks.step, queue).starmap([("K", seq, 1) for seq in range(1, 11)])
    _wait_effects(postgres_url, 11, worker, timeout_s=30)
    rows = effects(postgres_url)
    # Then they ran after it, in order; it ran on its third attempt, in place
    assert [row.seq for row in rows] == list(range(11))
    assert rows[0].retries == 2
    assert worker.log().count("in place") == 2
    assert all(row.started >= rows[0].finished for row in rows[1:])


def test_an_idempotent_task_retried_in_place_keeps_its_keys_order(
    app: App, queue: str, start: Callable[..., Worker], tmp_path: Any
) -> None:
    # The idempotency pre-check of prefetched deliveries stays on (not transactional)
    worker = start("-c", "1")
    worker.wait_consuming(1)
    path = str(tmp_path / "lines.txt")
    task = bound(app, ordering_tasks.flaky_line, queue)
    task.apply_async(("K", 0, 2, path))
    task.starmap([("K", seq, 0, path) for seq in range(1, 6)])
    lines_file = Path(path)
    wait_until(lambda: lines_file.exists() and len(lines_file.read_text().splitlines()) >= 6,
               timeout_s=30, message=lambda: worker.log()[-3000:])
    lines = [line.split() for line in lines_file.read_text().splitlines()]
    assert [(k, int(seq), int(r)) for k, seq, r, _ in lines] == [
        ("K", 0, 2), *(("K", seq, 0) for seq in range(1, 6))
    ]


def test_each_partition_is_active_on_one_supervisor_and_moves_when_it_stops(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker]
) -> None:
    # Given two `taskq worker` supervisors ("hosts") with 2 processes each on one queue
    first, second = start("-c", "2"), start("-c", "2")
    first.wait_consuming(2)
    second.wait_consuming(2)
    wait_until(lambda: "standby consumer" in first.log() and "standby consumer" in second.log(),
               timeout_s=20, message="both supervisors registered their standbys")
    first_pids, second_pids = first.children(), second.children()
    step = bound(app, ordering_tasks.step, queue)
    keys = [f"acct-{k}" for k in range(64)]
    step.starmap([(key, 0, 5) for key in keys])
    _wait_effects(postgres_url, len(keys), first, timeout_s=30)
    rows = effects(postgres_url)
    # Then each partition ran on exactly one of them; every partition was served
    by_partition: dict[str, set[str]] = {}
    for row in rows:
        host = "first" if row.pid in first_pids else "second" if row.pid in second_pids else "?"
        by_partition.setdefault(row.queue, set()).add(host)
    assert len(by_partition) == PARTITIONS
    assert all(len(hosts) == 1 and "?" not in hosts for hosts in by_partition.values())
    # When the first supervisor stops, its partitions move to the second
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    step.starmap([(key, 1, 5) for key in keys])
    _wait_effects(postgres_url, 2 * len(keys), second, timeout_s=30)
    later = [row for row in effects(postgres_url) if row.seq == 1]
    assert {row.pid for row in later} <= second_pids
    assert len({row.queue for row in later}) == PARTITIONS


def test_a_warm_stop_hands_a_partition_over_only_after_its_task_in_hand_finished(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker]
) -> None:
    # Given two supervisors; the first is active on every partition and holds 4 deliveries
    first = start("-c", "1", "--prefetch", "4", loglevel="DEBUG")
    first.wait_consuming(1)  # one process: every partition is its share, registered at once
    second = start("-c", "1")
    second.wait_consuming(1)  # registered after the first: standby everywhere
    step = bound(app, ordering_tasks.step, queue)
    # When a long task of key K runs on the first, with 20 more of K behind it, and the
    # first is stopped (SIGTERM) meanwhile
    long_one = step.apply_async(("K", 0, 2000))
    step.starmap([("K", seq, 1) for seq in range(1, 21)])
    started = f"[{long_one.id}] from {queue}.p{partition_of('K', PARTITIONS)} started"
    wait_until(lambda: started in first.log(), timeout_s=20, message="K/0 started")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    _wait_effects(postgres_url, 21, second, timeout_s=30)
    # Then the second ran the rest only after the first finished K/0, all in order
    rows = effects(postgres_url)
    assert [row.seq for row in rows] == list(range(21))
    assert all(row.started >= rows[0].finished for row in rows[1:])
    assert len({row.pid for row in rows[1:]} & {rows[0].pid}) == 0  # they moved


@pytest.fixture
def start_relay(
    app: App, namespace: str, queue: str, tmp_path: Any
) -> Iterator[Callable[..., Worker]]:
    """Factory: ``taskq relay -A tests.ordering_tasks:app`` subprocesses, killed at the end."""
    relays: list[Worker] = []

    def start(**settings: str) -> Worker:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
            "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
            "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
            "TASKQ_DATABASE_URL": app.settings.database_url,
            "TASKQ_TEST_ORDERED_QUEUE": queue, "TASKQ_TEST_PARTITIONS": str(PARTITIONS),
            **{f"TASKQ_{name.upper()}": value for name, value in settings.items()},
        }
        log_path = tmp_path / f"relay-{len(relays) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "taskq", "relay", "-A", "tests.ordering_tasks:app",
                 "--loglevel", "INFO"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        relays.append(Worker(process, log_path))
        return relays[-1]

    yield start
    for relay in relays:
        relay.kill_tree()


def test_two_relays_publish_each_keys_outbox_rows_in_commit_order(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker],
    start_relay: Callable[..., Worker],
) -> None:
    # Given 20 keys x 25 tasks committed one transaction each through the outbox
    step = bound(app, ordering_tasks.step, queue)
    calls, expected = _calls(keys=20, per_key=25, seed=18)
    for key, seq, _ in calls:
        with app.engine.begin() as conn:
            step.apply_async((key, seq, 0), session=conn)
    # When two relays with small batches race for them, and a worker runs what they publish
    relays = [start_relay(outbox_batch_size="7", outbox_poll_interval_s="0.05") for _ in "ab"]
    worker = start("-c", "2")
    _wait_effects(postgres_url, len(calls), worker, timeout_s=90)
    # Then each key's tasks ran in commit order, once each
    rows = effects(postgres_url)
    assert order_problems(rows, expected) == []
    assert len(rows) == len(calls)
    assert all(relay.process.poll() is None for relay in relays)  # both relays were running


def test_a_task_out_of_retries_goes_to_the_dlq_and_its_key_continues(
    app: App, queue: str, postgres_url: str, start: Callable[..., Worker], broker: Any
) -> None:
    worker = start("-c", "1")
    worker.wait_consuming(1)
    # Given a task of key K that always fails (3 retries in place), then 3 more of K
    failing = bound(app, ordering_tasks.flaky, queue).apply_async(("K", 0, 99))
    bound(app, ordering_tasks.step, queue).starmap([("K", seq, 1) for seq in range(1, 4)])
    _wait_effects(postgres_url, 3, worker, timeout_s=30)
    # Then it is parked in Q.dlq and the key went on in order
    wait_until(lambda: broker.depth(f"{queue}.dlq") == 1, timeout_s=10, message="parked")
    assert [row.seq for row in effects(postgres_url)] == [1, 2, 3]
    assert worker.log().count("in place") == 3
    # And a replay sends it back to its partition (where it runs, and fails, again)
    assert replay(app, queue).replayed == 1
    wait_until(lambda: worker.log().count("in place") == 6 and broker.depth(f"{queue}.dlq"),
               timeout_s=30, message=lambda: f"parked again; log:\n{worker.log()[-3000:]}")
    assert broker.depth(f"{app.settings.namespace}.unroutable") == 0  # nothing went astray
    # With its reason and its partition as origin
    parked = broker.get_all(f"{queue}.dlq")
    assert [props.message_id for _, props, _ in parked] == [failing.id]
    headers = parked[0][1].headers
    assert headers["taskq-error-type"] == "Flaky"
    assert headers["taskq-attempts"] == 4
    assert headers["taskq-origin-queue"] == f"{queue}.p{partition_of('K', PARTITIONS)}"
