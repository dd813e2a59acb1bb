"""``taskq teardown`` on the real broker (3.10, or 4.3 with TASKQ_TEST_BROKER_URL).

The app (tests/tasks_teardown.py) has a classic, a quorum and an ordered queue, messages in
each and a delayed one in the delay tiers; the command runs as ``python -m taskq``, as from
a user's shell. What remains is checked with passive declares (the shared brokers' management
API is not a reliable witness here: one port serves only one of them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest

from taskq import App
from taskq.broker import topology as topo
from tests.conftest import BROKER_URL
from tests.system.workers import ROOT
from tests.tasks_teardown import build

APP = "tests.tasks_teardown:app"


def exchange_exists(broker: Any, name: str) -> bool:
    try:
        broker.channel.exchange_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    return True


def teardown(app: App, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DELAY_TIER_QUEUE_TYPE": app.settings.delay_tier_queue_type,
    }
    return subprocess.run(
        [sys.executable, "-m", "taskq", "teardown", "-A", APP, *args], cwd=ROOT, env=env,
        input=stdin, capture_output=True, text=True, timeout=60,
    )


def populated(make_app: Callable[..., App], *, delayed: bool = True, **settings: Any) -> App:
    """The teardown app with one message in each queue and (``delayed``) one in the tiers."""
    app = build(make_app("teardown-tests", **settings))
    tasks = {task.name: task for task in app.registry}
    tasks["teardown.work"].delay(1)
    tasks["teardown.bill"].delay(2)
    tasks["teardown.post"].delay("acct-1", 3)
    if delayed:
        tasks["teardown.work"].apply_async((4,), countdown=3600)
    return app


def everything(app: App, tier_type: str) -> tuple[list[str], list[str]]:
    """Queue and exchange names the app declared (as taskq's topology names them)."""
    ns = app.settings.namespace
    queues = [f"{ns}.work", f"{ns}.work.dlq", f"{ns}.billing", f"{ns}.billing.dlq",
              f"{ns}.ledger.p0", f"{ns}.ledger.p1", f"{ns}.ledger.p2", f"{ns}.ledger.dlq",
              topo.unroutable_name(ns)]
    tiers = [topo.delay_tier_name(ns, level, tier_type) for level in (0, 17, 35)]
    exchanges = [topo.exchange_name(ns), topo.dlx_name(ns), topo.unroutable_name(ns)]
    return queues + tiers, exchanges + tiers


@pytest.mark.parametrize("tier_type", ["classic", "quorum"])
def test_teardown_removes_everything_the_app_declared_and_nothing_else(
    make_app: Callable[..., App], broker: Any, namespace: str, tier_type: str
) -> None:
    # Given the app's topology with messages, and another app's queue in another namespace
    app = populated(make_app, delay_tier_queue_type=tier_type)
    other = make_app("other", namespace=f"{namespace}x", default_queue=f"{namespace}x.default")
    other_task = other.task(name="other.keep", idempotent=False)(lambda: None)
    other_task.delay()
    queues, exchanges = everything(app, tier_type)
    assert all(broker.exists(name) for name in queues)
    assert all(exchange_exists(broker, name) for name in exchanges)

    # When it is torn down from a script
    done = teardown(app, "--yes")

    # Then nothing of it remains, and the other app's queue still holds its message
    assert done.returncode == 0, done.stderr
    assert f"{namespace}.billing " in done.stdout and "1 delayed messages" in done.stdout
    assert [name for name in queues if broker.exists(name)] == []
    assert [name for name in exchanges if exchange_exists(broker, name)] == []
    assert broker.depth(f"{namespace}x.default") == 1
    assert exchange_exists(broker, f"{namespace}x")
    again = teardown(app, "--yes")
    assert "nothing of this app is on the broker" in again.stdout


def test_teardown_lists_first_and_deletes_nothing_unless_the_answer_is_yes(
    make_app: Callable[..., App], broker: Any, namespace: str
) -> None:
    app = populated(make_app, delayed=False)

    declined = teardown(app, stdin="n\n")
    kept = broker.depth(f"{namespace}.work")
    accepted = teardown(app, stdin="y\n")

    assert declined.returncode == 1
    listing = declined.stdout
    assert listing.index(f"{namespace}.work ") < listing.index("Delete these? 3 message(s)")
    assert kept == 1
    assert accepted.returncode == 0, accepted.stderr
    assert not broker.exists(f"{namespace}.work")


def test_teardown_refuses_while_a_worker_consumes_unless_forced(
    make_app: Callable[..., App], broker: Any, namespace: str
) -> None:
    app = populated(make_app, delayed=False)
    consumer = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        consumer.channel().basic_consume(f"{namespace}.billing", lambda *a: None)

        refused = teardown(app, "--yes")
        still_there = broker.exists(f"{namespace}.billing")
        forced = teardown(app, "--yes", "--force")
    finally:
        if consumer.is_open:
            consumer.close()

    assert refused.returncode == 1
    assert f"consumers are attached to {namespace}.billing (1)" in refused.stderr
    assert "--force" in refused.stderr
    assert still_there
    assert forced.returncode == 0, forced.stderr
    assert not broker.exists(f"{namespace}.billing")


def test_a_namespace_another_app_uses_keeps_its_exchanges(
    make_app: Callable[..., App], broker: Any, namespace: str
) -> None:
    # Given two apps in one namespace with queues of their own
    app = populated(make_app)
    neighbour = make_app("neighbour", default_queue=f"{namespace}.neighbour")
    neighbour_task = neighbour.task(name="neighbour.keep", idempotent=False)(lambda: None)
    neighbour_task.delay()

    # When the first is torn down
    done = teardown(app, "--yes")

    # Then its queues are gone, the shared exchanges stay and the neighbour still publishes
    assert done.returncode == 0, done.stderr
    assert "another app uses namespace" in done.stdout
    assert not broker.exists(f"{namespace}.work")
    assert exchange_exists(broker, namespace)
    assert broker.exists(topo.delay_tier_name(namespace, 0))
    neighbour_task.delay()
    assert broker.depth(f"{namespace}.neighbour") == 2
