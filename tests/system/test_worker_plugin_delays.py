"""With the delayed-message plugin, a retry survives its queue being deleted and re-created.

The plugin routes a delayed message only when it is due and drops it if its queue has no
binding to ``ns.delayed`` then, so a worker that re-creates its queue must bind it again.
Skipped, with the reason, on a broker without the plugin (like the test broker); the
declarations themselves are checked in tests/unit/test_topology.py and the plugin
publisher's re-declaring in tests/integration/test_plugin_publisher.py.
"""

from __future__ import annotations

import pytest

from taskq import App
from tests import tasks
from tests.conftest import BROKER_URL
from tests.contract.test_delay_backends import plugin_enabled
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send

pytestmark = [pytest.mark.slow, pytest.mark.plugin]


@pytest.fixture(autouse=True)
def _needs_plugin() -> None:
    if not plugin_enabled():
        pytest.skip(
            "rabbitmq_delayed_message_exchange is not enabled on the test broker "
            f"({BROKER_URL.split('@')[-1]}); enable it (rabbitmq-plugins enable "
            "rabbitmq_delayed_message_exchange) to run the plugin backend's worker tests"
        )


def test_a_delayed_retry_arrives_after_its_queue_was_deleted_and_recreated(
    app: App, start_worker, runs, broker
):
    queue = app.settings.default_queue
    worker = start_worker("-c", "1", env={"TASKQ_DELAY_BACKEND": "plugin"})
    worker.wait_consuming(1)
    # Given a retry waiting 4 s in the plugin's exchange (confirmed; the original acked),
    send(app, tasks.fail_once_retry_later, runs)
    wait_until(lambda: "retry 1 in" in worker.log(), timeout_s=15, message=worker.log)

    # when its queue is deleted (the worker's consumer is cancelled and the worker
    # re-creates the queue as it consumes again),
    broker.delete_queue(queue)
    wait_until(lambda: worker.log().count("connected to the broker") >= 2, message=worker.log)

    # then the retry still arrives when due, and runs once.
    wait_until(lambda: count_runs(runs, "attempt1") == 1, timeout_s=20, message=worker.log)
    assert count_runs(runs, "attempt0") == 1
    assert broker.depth(queue) == 0
