"""A worker that loses the broker reconnects, re-declares and consumes again; nothing lost."""

from __future__ import annotations

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
