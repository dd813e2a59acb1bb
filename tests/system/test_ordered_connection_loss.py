"""Ordered queues when a consuming process loses its connection or its channel.

A worker process of an ordered queue keeps its partition consumers to the end of its
channel and holds prefetched deliveries behind the task in hand. These tests cut its
connection mid-task, and make the broker close or cancel its consumers, and check that every
task of the key still runs, once and in order, and that the process consumes again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from taskq.broker.connection import declare, open_connection
from taskq.ordering.keys import partition_of
from tests import connection_loss_tasks
from tests.conftest import BROKER_URL
from tests.support.broker import BrokerAdmin
from tests.support.proxy import TcpProxy
from tests.support.rabbitmq_nodes import RabbitCluster
from tests.support.rabbitmq_root import HOST
from tests.support.waiting import wait_until
from tests.system.ordering import bound
from tests.system.workers import Worker

pytestmark = pytest.mark.slow

PARTITIONS = 4


@pytest.fixture
def queue(namespace: str) -> str:
    """The test's ordered queue."""
    return f"{namespace}.ledger"


@pytest.fixture
def app(make_app: Callable[..., App], postgres_url: str, queue: str) -> App:
    """The test's app on PostgreSQL (keys are claimed there) with the ordered queue."""
    app = make_app(database_url=postgres_url)
    app.queue(queue, partitions=PARTITIONS)
    return app


@pytest.fixture
def start(start_worker: Callable[..., Worker], queue: str) -> Callable[..., Worker]:
    """Start ``taskq worker -A tests.connection_loss_tasks:app`` on the test's queue."""

    def run(*args: str, env: dict[str, str] | None = None, loglevel: str = "INFO") -> Worker:
        return start_worker(
            *args, app_path="tests.connection_loss_tasks:app", loglevel=loglevel,
            env={"TASKQ_TEST_ORDERED_QUEUE": queue, "TASKQ_TEST_PARTITIONS": str(PARTITIONS),
                 **(env or {})},
        )

    return run


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    """A TCP proxy to the test broker, stopped at the end of the test."""
    proxy = TcpProxy.for_url(BROKER_URL).start()
    yield proxy
    proxy.stop()


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _declare(app: App, queue: str) -> None:
    """Declare the app's exchanges and ``queue``'s partitions, as a worker would at start."""
    connection = open_connection(app.settings, client_name="taskq tests")
    try:
        declare(declare(connection.channel(), app.topology.base()),
                app.topology.for_queue(queue))
    finally:
        connection.close()


def _connections(worker: Worker) -> int:
    return worker.log().count("connected to the broker")


def test_a_cut_connection_mid_task_leaves_no_claim_behind_and_every_task_of_the_key_runs(
    app: App, queue: str, start: Callable[..., Worker], proxy: TcpProxy, broker: Any,
    tmp_path: Path,
) -> None:
    path = tmp_path / "lines.txt"
    partition = f"{queue}.p{partition_of('K', PARTITIONS)}"
    task = bound(app, connection_loss_tasks.slow_line, queue)
    # Given K/0 (10 s) and K/1..K/5 waiting in their partition,
    _declare(app, queue)
    calls = [("K", 0, 10_000, str(path)), *(("K", seq, 0, str(path)) for seq in range(1, 6))]
    first_id = task.starmap(calls)[0].id
    # an active process (through a proxy the test can cut) that takes all six in one
    # prefetch batch (their keys claimed together) and starts K/0,
    active = start("-c", "1", "--prefetch", "16", loglevel="DEBUG",
                   env={"TASKQ_BROKER_URL": proxy.url(BROKER_URL)})
    wait_until(lambda: f"[{first_id}] from {partition} started" in active.log(), timeout_s=30,
               message=lambda: f"K/0 never started in the active process:\n{active.log()}")
    assert broker.depth(partition) == 0
    # and a standby process of another supervisor on a direct connection,
    standby = start("-c", "1", "--prefetch", "16")
    standby.wait_consuming(1)  # registered second: single active consumer keeps it waiting
    # When the active process's connection is cut mid-task (K/0 finishes and records its key
    # there all the same) and comes back,
    proxy.cut()
    cut_at = time.monotonic()
    wait_until(lambda: _lines(path), timeout_s=15, message="K/0 finished in the cut process")
    proxy.restore()
    # Then every task of K runs within 15 s of the cut, once each, in order
    wait_until(lambda: len(_lines(path)) >= 6, timeout_s=cut_at + 15 - time.monotonic(),
               message=lambda: f"lines {_lines(path)}; standby:\n{standby.log()[-4000:]}"
                               f"\nactive:\n{active.log()[-4000:]}")
    assert [(key, int(seq)) for key, seq, *_ in _lines(path)] == [("K", seq) for seq in range(6)]
    # and the process whose connection was cut consumes again
    wait_until(lambda: _connections(active) >= 2, timeout_s=15, message=active.log)



def test_a_partition_queue_deleted_under_its_consumer_is_consumed_again(
    app: App, queue: str, start: Callable[..., Worker], broker: Any, tmp_path: Path
) -> None:
    path = tmp_path / "lines.txt"
    # Given one worker process consuming every partition of an ordered queue
    worker = start("-c", "1")
    worker.wait_consuming(1)
    pid = worker.children()
    partition = f"{queue}.p{partition_of('K', PARTITIONS)}"
    # When the broker cancels its consumer of one partition (the queue is deleted)
    broker.delete_queue(partition)
    # Then within 15 s the process (or its replacement) consumes again, the queue re-declared
    wait_until(lambda: _connections(worker) >= 2, timeout_s=15,
               message=lambda: f"the process never consumed again; log:\n{worker.log()}")
    wait_until(lambda: broker.exists(partition), timeout_s=5, message="re-declared")
    # and tasks of that partition run
    bound(app, connection_loss_tasks.slow_line, queue).apply_async(("K", 0, 0, str(path)))
    wait_until(lambda: _lines(path), timeout_s=15, message=worker.log)
    assert "broker I/O thread failed" not in worker.log()
    assert worker.children() == pid or len(worker.children()) == 1
    assert os.path.exists(path)


@pytest.fixture(scope="module")
def timeout_node() -> Iterator[RabbitCluster]:
    """A private RabbitMQ 3.10 node whose consumer_timeout is 3 s, checked every second.

    Always the machine's 3.10, whichever broker the run is on: these tests are about a broker
    that closes the channel of a held delivery on a classic queue. RabbitMQ 4.3 no longer
    times out classic queues, and on its quorum queues taskq's consumers ask for a timeout
    of their own (tests/system/test_worker_quorum_limits.py covers 4.3).
    """
    with RabbitCluster(1, install=HOST, rabbit_env={"consumer_timeout": 3000,
                                                    "channel_tick_interval": 1000}) as node:
        node.start()
        yield node


def test_a_channel_the_broker_closes_on_consumer_timeout_is_consumed_again(
    app: App, queue: str, start: Callable[..., Worker], timeout_node: RabbitCluster,
    tmp_path: Path,
) -> None:
    path = tmp_path / "lines.txt"
    url = timeout_node.urls[0]
    node_app = App("node", broker_url=url, namespace=app.settings.namespace,
                   database_url=app.settings.database_url)
    node_app.queue(queue, partitions=PARTITIONS)
    task = bound(node_app, connection_loss_tasks.slow_line, queue)
    try:
        # Given one worker process consuming an ordered queue on a broker whose
        # consumer_timeout is 3 s
        worker = start("-c", "1", env={"TASKQ_BROKER_URL": url})
        worker.wait_consuming(1)
        # When a task keeps its delivery unacked for 6 s, the broker closes the channel
        task.apply_async(("K", 0, 6000, str(path)))
        wait_until(lambda: "timed out" in worker.log(), timeout_s=15,
                   message=lambda: f"no consumer timeout; log:\n{worker.log()}")
        closed_at = time.monotonic()
        # Then the process consumes again within 15 s,
        wait_until(lambda: _connections(worker) >= 2, timeout_s=15,
                   message=lambda: f"the process never consumed again; log:\n{worker.log()}")
        # the task ran once (its redelivery is a duplicate), and a later one runs
        task.apply_async(("K", 1, 0, str(path)))
        wait_until(lambda: len(_lines(path)) >= 2, timeout_s=closed_at + 15 - time.monotonic(),
                   message=lambda: f"lines {_lines(path)}; log:\n{worker.log()}")
        assert [int(seq) for _, seq, *_ in _lines(path)] == [0, 1]
        assert "broker I/O thread failed" not in worker.log()
    finally:
        node_app.close()


def test_an_ordered_task_failing_past_half_the_consumer_timeout_reaches_the_dlq_in_order(
    app: App, queue: str, start: Callable[..., Worker], timeout_node: RabbitCluster,
    tmp_path: Path,
) -> None:
    path = tmp_path / "lines.txt"
    url = timeout_node.urls[0]
    node_app = App("node", broker_url=url, namespace=app.settings.namespace,
                   database_url=app.settings.database_url)
    node_app.queue(queue, partitions=PARTITIONS)
    admin = BrokerAdmin(url)
    try:
        # Given a worker process on a broker whose consumer_timeout is 3 s (and told so)
        worker = start("-c", "1", env={"TASKQ_BROKER_URL": url, "TASKQ_CONSUMER_TIMEOUT_S": "3"})
        worker.wait_consuming(1)
        # When a task of K that always fails (3 retries in place, backoffs 1, 2, 4 s: more in
        # all than the timeout) is followed by K/1 and K/2, prefetched behind it
        failing = bound(node_app, connection_loss_tasks.failing, queue).apply_async(
            ("K", 0, str(path)))
        bound(node_app, connection_loss_tasks.slow_line, queue).starmap(
            [("K", seq, 0, str(path)) for seq in (1, 2)])
        # Then it runs its 4 attempts, goes to Q.dlq, and K/1 and K/2 run after it
        wait_until(lambda: len(_lines(path)) >= 6, timeout_s=40,
                   message=lambda: f"lines {_lines(path)}; log:\n{worker.log()[-5000:]}")
        lines = _lines(path)
        assert [line[0] for line in lines] == ["attempt"] * 4 + ["K", "K"], lines
        assert [int(line[3]) for line in lines[:4]] == [0, 1, 2, 3]
        assert [int(line[1]) for line in lines[4:]] == [1, 2]
        wait_until(lambda: admin.depth(f"{queue}.dlq") == 1, timeout_s=10, message="parked")
        (parked,) = admin.get_all(f"{queue}.dlq")
        assert parked[1].message_id == failing.id
        assert parked[1].headers["taskq-attempts"] == 4
        # without ever holding a delivery past the broker's consumer_timeout
        assert "giving it back" in worker.log()
        assert "timed out" not in worker.log()
    finally:
        admin.close()
        node_app.close()
