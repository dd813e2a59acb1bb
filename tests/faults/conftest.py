"""Fixtures of the fault suite: private services, one Scenario per test, seed and scale.

The suite runs with ``make faults`` (``TASKQ_FAULTS=1 pytest tests/faults``). In any other run
(``make test``) its tests are collected with their markers and skipped, unless
``TASKQ_FAULTS=1``, which CI sets (``.ci/run``): CI runs the whole fault suite.

- ``TASKQ_FAULT_SEED``: replay a run (every random choice of a scenario comes from it; the
  counts line prints the seed in use). Default: a new random seed per scenario.
- ``TASKQ_FAULT_SCALE``: multiply sizes and storm lengths (default 1 = the sizes of issue
  13; 0.2 for a quick look, 5 for a long soak).
- ``TASKQ_FAULT_DONE_TIMEOUT_S``: cap the wait for "all done" (for runs with a deliberate
  break, which would otherwise wait out the whole deadline).

Both are read when this module is imported: the project's autouse fixture removes every
``TASKQ_*`` variable from the environment of each test.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.harness import Scenario
from tests.faults.services import PrivatePostgres, PrivateRabbit
from tests.support.layers import record_line, skip_unless_enabled, write_summary

_SEED = os.environ.get("TASKQ_FAULT_SEED", "")
SCALE = float(os.environ.get("TASKQ_FAULT_SCALE", "") or 1.0)
_ENABLED = os.environ.get("TASKQ_FAULTS", "") == "1"
# Caps every "all done" wait (a run with a deliberate break need not wait the full deadline).
_DONE_TIMEOUT_S = float(os.environ.get("TASKQ_FAULT_DONE_TIMEOUT_S", "") or 0)

_LINES_KEY = pytest.StashKey[list[str]]()


def scaled(value: float, minimum: int = 1) -> int:
    """``value`` times ``TASKQ_FAULT_SCALE``, rounded, at least ``minimum``."""
    return max(minimum, round(value * SCALE))


def done_timeout_s(base_s: float) -> float:
    """Deadline of a scenario's "all done" wait: ``base_s``, longer for scaled-up runs."""
    timeout_s = base_s * max(1.0, SCALE)
    return min(timeout_s, _DONE_TIMEOUT_S) if _DONE_TIMEOUT_S else timeout_s


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_enabled(
        config, items, marker="faults", enabled=_ENABLED,
        how="fault suite: run it with `make faults` (or TASKQ_FAULTS=1)",
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write_summary(terminalreporter, _LINES_KEY, "fault scenarios: counts, seed and schedule")


@pytest.fixture(scope="session")
def private_rabbit() -> Iterator[PrivateRabbit]:
    """A RabbitMQ node of the suite's own (killed and removed at the end)."""
    node = PrivateRabbit()
    try:
        node.start()
        print(f"fault suite: private node {node.node} runs {node.install.label}")
        yield node
        # Nothing taskq or the suite does may use a feature the broker deprecates (RabbitMQ
        # logs each use; 4.3 refuses some outright): a session that did fails here.
        used = node.deprecated_feature_lines()
        assert not used, "the private node logged deprecated features used:\n" + "\n".join(used)
    finally:
        node.close()


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of the suite's own (stopped and removed at the end)."""
    cluster = PrivatePostgres()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def seed() -> int:
    """The scenario's seed: ``TASKQ_FAULT_SEED`` or a new one."""
    return int(_SEED) if _SEED else random.SystemRandom().randrange(2**32)


@pytest.fixture
def scenario_factory(
    private_rabbit: PrivateRabbit, private_postgres: PrivatePostgres, tmp_path: Path,
    seed: int, request: pytest.FixtureRequest,
) -> Iterator[Callable[[str], Scenario]]:
    """Build the test's Scenario; afterwards kill its processes and keep its counts line."""
    # An earlier scenario may have left a service down when it failed half-way.
    if not private_rabbit.is_running():
        private_rabbit.start()
    if not private_postgres.is_running():
        private_postgres.start()
    made: list[Scenario] = []

    def make(name: str) -> Scenario:
        scenario = Scenario(name, rabbit=private_rabbit, postgres=private_postgres,
                            directory=tmp_path, seed=seed)
        made.append(scenario)
        return scenario

    yield make
    for scenario in made:
        scenario.close()
        if scenario.counts is not None:
            line = scenario.counts.line(scenario.name, scenario.schedule, scenario.notes)
            record_line(request.config, _LINES_KEY, line)
