"""Fixtures of the cluster tests: one private 3-node RabbitMQ cluster per test module.

The cluster (tests/support/rabbitmq_nodes.py) boots once per module (about 30 s on a busy
2-core machine) and is removed after its last test; each test gets its own namespace and
quorum queue through a :class:`~tests.cluster.harness.ClusterScenario`, and leaves every node
running again for the next one. Effects go to a PostgreSQL schema of the module's own on the
machine's PostgreSQL. Where ``rabbitmq-server`` is not installed every test is skipped with
the reason.

The tests run with ``make cluster`` (``TASKQ_CLUSTER=1 pytest tests/cluster``) and in CI
(``.ci/run`` sets ``TASKQ_CLUSTER=1``); a developer's ``make test`` skips them, as it skips
the fault suite.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cluster import tasks
from tests.cluster.harness import ClusterScenario
from tests.conftest import postgres_schema, schema_url
from tests.support.layers import record_line, skip_unless_enabled, write_summary
from tests.support.rabbitmq_nodes import RabbitCluster

_LINES_KEY = pytest.StashKey[list[str]]()
# What docs/cluster.md recommends ("Known limits"):
# - for quorum delay tiers on RabbitMQ 3.10: a dead-letter worker whose forward was refused
#   (its target's first listed node is down) tries again after 5 s instead of 180 s, so a
#   tier held back by a node's death moves on within seconds of the node's return;
# - for quorum queues on RabbitMQ 4.x: the deliveries a consumer on a dead or cut-off node
#   held go back to the queue after 5 s instead of 60 s (4.x waits that long in case the
#   node returns; 3.10 returned them at once and has no such setting, so it ignores it).
BROKER_SETTINGS = {"dead_letter_worker_publisher_confirm_timeout": 5000,
                   "consumer_disconnected_timeout": 5000}
_ENABLED = os.environ.get("TASKQ_CLUSTER", "") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_enabled(
        config, items, marker="cluster", enabled=_ENABLED,
        how="cluster tests: run them with `make cluster` (or TASKQ_CLUSTER=1)",
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write_summary(
        terminalreporter, _LINES_KEY, "cluster scenarios: lost / unexpected / duplicate effects"
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    """Three private RabbitMQ nodes in one cluster, running (killed and removed at the end)."""
    with RabbitCluster(3, rabbit_env=BROKER_SETTINGS) as nodes:
        boot_s = nodes.start()
        print(f"cluster of 3 ({nodes.install.label}) formed in {boot_s:.1f}s")
        yield nodes
        # Nothing taskq or the tests do may use a feature the broker deprecates (module
        # docstring of tests/support/rabbitmq_nodes.py): a module that did fails here.
        used = nodes.deprecated_feature_lines()
        assert not used, "the cluster logged deprecated features used:\n" + "\n".join(used)


@pytest.fixture(scope="module")
def cluster_database_url() -> Iterator[str]:
    """A PostgreSQL schema of this module's own, with taskq's tables and cluster_effects."""
    with postgres_schema("tqcluster") as schema:
        url = schema_url(schema)
        engine = sa.create_engine(url)
        tasks.effects_metadata.create_all(engine)
        engine.dispose()
        yield url


@pytest.fixture
def scenario_factory(
    cluster: RabbitCluster, cluster_database_url: str, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[str], ClusterScenario]]:
    """Build the test's scenario; afterwards kill its processes and bring every node back."""
    made: list[ClusterScenario] = []

    def make(name: str) -> ClusterScenario:
        scenario = ClusterScenario(name, cluster=cluster, database_url=cluster_database_url,
                                   directory=tmp_path)
        made.append(scenario)
        return scenario

    yield make
    for scenario in made:
        scenario.close()
        if scenario.counts is not None:
            record_line(request.config, _LINES_KEY, scenario.counts.line(scenario.name))
    for node in cluster.nodes:  # a failed test may have left a node down or cut off
        if not node.is_alive():
            node.start()
    cluster.wait_formed()
