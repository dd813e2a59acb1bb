"""`taskq worker -Q` consumes only queues the app knows, unless told (issue 26, 3.13).

Before the check, ``-Q`` with a typo started a worker that declared the misspelt queue and
its ``.dlq`` and waited on them, while the tasks of the queue meant never ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from taskq import App
from taskq.broker import topology as topo
from tests.system.workers import Worker

ORDERED_APP = "tests.ordering_tasks:app"


@pytest.fixture
def leftovers(broker: Any) -> Iterator[list[str]]:
    """Queues a test expects never to exist, deleted with their ``.dlq`` afterwards if they
    do (a worker that wrongly declared them was killed before: request this fixture before
    ``start_worker``)."""
    names: list[str] = []
    yield names
    for name in names:
        for queue in (name, topo.dlq_name(name)):
            if broker.exists(queue):
                broker.delete_queue(queue)


def ordered_env(app: App, partitions: int = 4) -> dict[str, str]:
    """Workers of tests.ordering_tasks get the ordered queue ``<namespace>.ledger``; the
    test's App declares it too, so that its topology is deleted after the test."""
    queue = f"{app.settings.namespace}.ledger"
    app.queue(queue, partitions=partitions)
    return {"TASKQ_TEST_ORDERED_QUEUE": queue, "TASKQ_TEST_PARTITIONS": str(partitions)}


def test_a_misspelt_queue_is_refused_with_the_known_ones_and_nothing_is_declared(
    app: App, leftovers: list[str], start_worker: Callable[..., Worker], broker: Any
) -> None:
    meant = app.settings.default_queue
    typo = meant.replace(".default", ".defualt")
    leftovers.append(typo)

    worker = start_worker("-Q", typo, "-c", "1")

    assert worker.wait(30) == 2
    log = worker.log()
    assert f"unknown queue {typo!r} (did you mean {meant!r}?)" in log
    assert f"knows {meant}" in log
    assert "--declare-new-queues" in log
    assert "Traceback" not in log
    for name in (typo, topo.dlq_name(typo), topo.unroutable_name(app.settings.namespace)):
        assert not broker.exists(name), name  # on main: the typo and its .dlq existed


def test_declare_new_queues_consumes_a_queue_the_app_does_not_name(
    app: App, leftovers: list[str], start_worker: Callable[..., Worker], broker: Any
) -> None:
    new = f"{app.settings.namespace}.elsewhere"
    leftovers.append(new)

    worker = start_worker("-Q", new, "-c", "1", "--declare-new-queues")

    worker.wait_consuming(1)
    assert f"queue {new!r} is not named by app taskq-tests's code" in worker.log()
    assert broker.exists(new) and broker.exists(topo.dlq_name(new))


def test_a_partition_of_an_ordered_queue_is_a_known_queue(
    app: App, start_worker: Callable[..., Worker], broker: Any
) -> None:
    env = ordered_env(app)
    partition = f"{app.settings.namespace}.ledger.p3"

    worker = start_worker("-A", ORDERED_APP, "-Q", partition, "-c", "1", env=env)

    worker.wait_consuming(1)
    assert broker.exists(partition)


def test_a_partition_past_the_count_is_refused_with_the_partitions_listed(
    app: App, leftovers: list[str], start_worker: Callable[..., Worker], broker: Any
) -> None:
    env = ordered_env(app)
    ledger = f"{app.settings.namespace}.ledger"
    leftovers.append(f"{ledger}.p4")

    worker = start_worker("-A", ORDERED_APP, "-Q", f"{ledger}.p4", "-c", "1", env=env)

    assert worker.wait(30) == 2
    log = worker.log()
    assert f"unknown queue '{ledger}.p4' (did you mean" in log
    assert f"{ledger} (partitions {ledger}.p0..{ledger}.p3)" in log
    assert not broker.exists(f"{ledger}.p4")
    assert not broker.exists(f"{ledger}.p0")  # nothing of the ordered queue either
