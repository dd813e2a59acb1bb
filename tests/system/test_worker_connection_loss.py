"""A worker that loses the broker reconnects, re-declares and consumes again; nothing lost."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from taskq import App
from tests import tasks
from tests.conftest import BROKER_URL
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send
from tests.tasks import read_lines

pytestmark = pytest.mark.slow


@pytest.fixture
def proxy():
    """A TCP proxy to the test broker, stopped at the end of the test."""
    proxy = TcpProxy.for_url(BROKER_URL).start()
    yield proxy
    proxy.stop()


def test_after_a_lost_connection_the_worker_reconnects_and_runs_later_tasks(
    app: App, start_worker, runs, broker, proxy
):
    def tags() -> list[str]:
        return [line[1] for line in read_lines(runs)]

    worker = start_worker("-c", "2", env={"TASKQ_BROKER_URL": proxy.url(BROKER_URL)})
    worker.wait_consuming(2)
    send(app, tasks.record, runs, "before")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=15)

    # When the network between worker and broker is cut...
    proxy.cut()
    wait_until(lambda: worker.log().count("broker connection lost") >= 2)
    # ...tasks published meanwhile (the test's own connection is direct) wait in the queue,
    for i in range(5):
        send(app, tasks.record, runs, f"during{i}")
    proxy.restore()

    # ...and run once the worker is back, as do tasks published afterwards: exactly once.
    wait_until(lambda: len(tags()) >= 6, timeout_s=30, message=worker.log)
    for i in range(5):
        send(app, tasks.record, runs, f"after{i}")
    expected = {"before", *(f"during{i}" for i in range(5)), *(f"after{i}" for i in range(5))}
    wait_until(lambda: set(tags()) == expected, timeout_s=15, message=lambda: str(tags()))
    # "before" may have run twice: its ack can be lost with the cut (at least once).
    assert all(tags().count(tag) == 1 for tag in expected - {"before"})
    assert broker.depth(app.settings.default_queue) == 0
    assert "reconnecting in" in worker.log()


def test_prefetched_deliveries_of_a_lost_connection_never_run_in_the_disconnected_process(
    app: App, start_worker, runs, broker, proxy
):
    def ran(tag: str) -> list[str]:
        """Pids of the processes that ran ``tag`` (a ``record`` or the end of a ``blocked``)."""
        return [line[2] for line in read_lines(runs) if line[0] in ("ran", "done")
                and line[1] == tag]

    queue = app.settings.default_queue
    records = [f"r{i}" for i in range(4)]
    # Given a worker whose only process runs a long task with four more deliveries prefetched
    # behind it (through a proxy the test can cut),
    cut_off = start_worker("-c", "1", "--prefetch", "5",
                           env={"TASKQ_BROKER_URL": proxy.url(BROKER_URL)})
    cut_off.wait_consuming(1)
    cut_off_pids = {str(pid) for pid in cut_off.children()}
    send(app, tasks.blocked, runs, "long")
    for tag in records:  # not idempotent: a second run would not be absorbed by the key
        send(app, tasks.record_unkeyed, runs, tag)
    wait_until(lambda: any(line[:2] == ["start", "long"] for line in read_lines(runs)))
    wait_until(lambda: broker.depth(queue) == 0, message="all five delivered to the worker")
    # and a sibling worker on a direct connection, idle: the first one holds everything.
    sibling = start_worker("-c", "1")
    sibling.wait_consuming(1)

    # When the connection of the first worker is cut (and its reconnects refused), the broker
    # requeues its five messages to the sibling, which runs them, while the first worker
    # finishes its task in hand during its reconnect backoff,
    proxy.cut()
    wait_until(lambda: "broker connection lost" in cut_off.log(), message=cut_off.log)
    Path(runs + ".go").touch()  # the long task ends, in both workers
    wait_until(lambda: all(ran(tag) for tag in records) and cut_off_pids & set(ran("long")),
               timeout_s=30, message=lambda: f"runs: {read_lines(runs)}")
    sibling.signal(signal.SIGTERM)
    assert sibling.wait(20) == 0
    proxy.restore()
    wait_until(lambda: cut_off.log().count("connected to the broker") >= 2, timeout_s=30,
               message=cut_off.log)
    # A later message runs in the first worker: it has gone past what it had prefetched.
    send(app, tasks.record, runs, "marker")
    wait_until(lambda: ran("marker"), timeout_s=15, message=cut_off.log)

    # Then the prefetched deliveries of the dead connection were dropped unexecuted there:
    # each ran exactly once, in the sibling.
    assert {tag: len(ran(tag)) for tag in records} == {tag: 1 for tag in records}, (
        read_lines(runs), cut_off.log())
    assert not cut_off_pids & {pid for tag in records for pid in ran(tag)}
    assert cut_off_pids & set(ran("marker"))
    assert broker.depth(queue) == 0
