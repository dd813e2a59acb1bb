"""Infrastructure faults are not task failures (docs/reliability.md): outages of taskq's own
database and broker paths send deliveries back or hold them; they use no attempt, re-run no finished
work and never end in ``Q.dlq``.

taskq's PostgreSQL is reached through a :class:`~tests.support.proxy.TcpProxy` that the test
cuts (every connection reset, new ones refused) and restores; the shared server is never
touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App
from taskq.broker.topology import dlq_name
from taskq.schema import processed_table
from tests import tasks_infra
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_until
from tests.system.workers import Worker, count_runs, declare_topology, send, send_many
from tests.tasks import read_lines

INFRA_APP = "tests.tasks_infra:app"


@pytest.fixture
def pg_proxy() -> Iterator[TcpProxy]:
    """A cuttable TCP path to the shared PostgreSQL."""
    with TcpProxy("127.0.0.1", 5432) as proxy:
        yield proxy


def _through(proxy: TcpProxy, url: str) -> str:
    assert "@127.0.0.1:5432/" in url
    return url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{proxy.port}/")


@pytest.fixture
def effects_table(postgres_url: str) -> Iterator[None]:
    """The effect rows of :func:`tests.tasks_infra.write_effect`, beside taskq's tables."""
    engine = sa.create_engine(postgres_url)
    tasks_infra.effects_metadata.drop_all(engine)
    tasks_infra.effects_metadata.create_all(engine)
    yield
    tasks_infra.effects_metadata.drop_all(engine)
    engine.dispose()


def _effects(app: App) -> list[tuple[int, int]]:
    with app.engine.connect() as conn:
        rows = conn.execute(sa.select(tasks_infra.effects.c.n, tasks_infra.effects.c.retries))
        return [(row.n, row.retries) for row in rows]


def _start(
    start_worker: Callable[..., Worker], *args: str, database_url: str, kind: str = ""
) -> Worker:
    env = {"TASKQ_DATABASE_URL": database_url, "TASKQ_TEST_QUEUE_KIND": kind}
    return start_worker(*args, env=env, loglevel="INFO", app_path=INFRA_APP)


@pytest.mark.slow
def test_a_database_outage_during_transactional_tasks_dead_letters_nothing(
    make_app: Callable[..., App], postgres_url: str, pg_proxy: TcpProxy,
    start_worker: Callable[..., Worker], broker: Any, effects_table: None,
) -> None:
    # Given 120 transactional tasks, each holding its transaction open 50 ms, run by two
    # processes whose database connections go through the proxy
    app = make_app(database_url=postgres_url)
    worker = _start(start_worker, "-c", "2", database_url=_through(pg_proxy, postgres_url))
    worker.wait_consuming(2)
    total = 120
    send_many(app, tasks_infra.write_effect, [(n, 0.05) for n in range(total)])

    # When the database becomes unreachable for 4 seconds while tasks are mid-transaction
    wait_until(lambda: len(_effects(app)) >= 20, timeout_s=30,
               message=lambda: f"{len(_effects(app))} effects; log:\n{worker.log()}")
    pg_proxy.cut()
    outage_ends_at = time.monotonic() + 4.0
    wait_until(lambda: time.monotonic() >= outage_ends_at, timeout_s=10)
    pg_proxy.restore()

    # Then every task's effect lands exactly once, with no retry used, none dead-lettered
    queue = app.settings.default_queue
    # (A dead-lettered task never adds its effect: count those too, to fail fast.)
    wait_until(lambda: len(_effects(app)) + broker.depth(dlq_name(queue)) >= total
               and broker.depth(queue) == 0,
               timeout_s=90, interval_s=0.2,
               message=lambda: f"{len(_effects(app))} of {total}; log:\n{worker.log()}")
    effects = _effects(app)
    assert sorted(n for n, _ in effects) == list(range(total))
    assert {retries for _, retries in effects} == {0}
    assert broker.depth(dlq_name(queue)) == 0
    assert "infrastructure fault" in worker.log()


@pytest.mark.slow
def test_a_retry_that_cannot_be_published_is_held_and_the_body_does_not_run_again(
    make_app: Callable[..., App], start_worker: Callable[..., Worker], broker: Any,
    runs: str, tmp_path: Path,
) -> None:
    # Given a queue that holds one ready message at most and refuses more (reject-publish),
    # and a task whose first attempt asks for an immediate retry once a gate opens
    app = make_app()
    tasks_infra.shape_queue(app, "full")
    declare_topology(app)
    worker = _start(
        start_worker, "-c", "1", "--prefetch", "1",
        database_url=app.settings.database_url, kind="full",
    )
    worker.wait_consuming(1)
    gate = str(tmp_path / "gate")
    task_id = send(app, tasks_infra.retry_once_after_gate, runs, gate).id
    wait_until(lambda: count_runs(runs, "run") == 1, timeout_s=20, message=worker.log)

    # When the queue fills up (one waiting message) before the task asks for its retry
    send(app, tasks_infra.mark, str(tmp_path / "filler.txt"))
    Path(gate).touch()
    queue = app.settings.default_queue

    # Then the retry is not published, the delivery is held, and the body does not run again
    def failed_publishes() -> int:
        lines = worker.log().splitlines()
        return sum(1 for line in lines if task_id in line and "could not be" in line)

    wait_until(lambda: failed_publishes() >= 3, timeout_s=30, message=worker.log)
    assert [line[:2] for line in read_lines(runs)] == [["run", "0"]]
    assert broker.depth(dlq_name(queue)) == 0

    # And once there is room again, the held retry lands and runs
    assert len(broker.get_all(queue)) == 1  # the filler, taken off the queue
    wait_until(lambda: count_runs(runs, "run") == 2, timeout_s=40, message=worker.log)
    assert [line[:2] for line in read_lines(runs)] == [["run", "0"], ["run", "1"]]
    assert broker.depth(dlq_name(queue)) == 0


@pytest.mark.slow
def test_a_database_outage_does_not_use_up_a_quorum_queues_delivery_limit(
    make_app: Callable[..., App], postgres_url: str, pg_proxy: TcpProxy,
    start_worker: Callable[..., Worker], broker: Any, runs: str,
) -> None:
    # Given a quorum work queue with x-delivery-limit 2 and taskq's database unreachable
    app = make_app(database_url=postgres_url)
    tasks_infra.shape_queue(app, "quorum")
    declare_topology(app)
    worker = _start(
        start_worker, "-c", "1", database_url=_through(pg_proxy, postgres_url), kind="quorum",
    )
    worker.wait_consuming(1)  # it checks the database at start
    pg_proxy.cut()

    # When an idempotent task arrives and is turned away more times than the limit allows
    result = send(app, tasks_infra.mark, runs)
    turned_away = f"[{result.id}] from {app.settings.default_queue} not run"
    queue = app.settings.default_queue
    wait_until(
        lambda: worker.log().count(turned_away) > tasks_infra.DELIVERY_LIMIT + 1
        or broker.depth(dlq_name(queue)) > 0,
        timeout_s=40, message=worker.log,
    )
    assert broker.depth(dlq_name(queue)) == 0
    assert count_runs(runs) == 0

    # Then, once the database is back, it runs once and nothing is dead-lettered
    pg_proxy.restore()
    wait_until(lambda: count_runs(runs) == 1 and broker.depth(queue) == 0, timeout_s=60,
               message=worker.log)
    assert broker.depth(dlq_name(queue)) == 0
    assert count_runs(runs) == 1


@pytest.mark.slow
def test_a_key_that_cannot_be_recorded_after_success_is_retried_not_dropped(
    make_app: Callable[..., App], postgres_url: str, pg_proxy: TcpProxy,
    start_worker: Callable[..., Worker], runs: str,
) -> None:
    # Given an idempotent task running while taskq's database becomes unreachable
    app = make_app(database_url=postgres_url)
    worker = _start(start_worker, "-c", "1", database_url=_through(pg_proxy, postgres_url))
    worker.wait_consuming(1)
    result = send(app, tasks_infra.slow_mark, runs, 1.0)
    wait_until(lambda: count_runs(runs, "start") == 1, timeout_s=20, message=worker.log)
    pg_proxy.cut()

    # When the task succeeds but its key cannot be written, and the database comes back
    wait_until(lambda: count_runs(runs, "done") == 1, timeout_s=20, message=worker.log)
    wait_until(lambda: "could not be recorded" in worker.log()
               or "was not recorded" in worker.log(), timeout_s=20, message=worker.log)
    pg_proxy.restore()

    # Then the key is recorded (a later duplicate is recognised), and the task ran once
    with app.engine.connect() as conn:
        def recorded() -> bool:
            query = sa.select(processed_table.c.key).where(processed_table.c.key == result.id)
            return conn.execute(query).first() is not None

        wait_until(recorded, timeout_s=30, message=worker.log)
    assert count_runs(runs, "start") == 1
