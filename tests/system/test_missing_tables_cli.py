"""Every command on a database without taskq's tables says first what to run.

Only the embedded SQLite default gets its tables created by the worker, the relay and the
scheduler; on PostgreSQL a newcomer who skipped ``taskq db create`` must read that advice
in the first words of the first line, whatever command they ran first. The commands run as
``python -m taskq`` subprocesses, as from a user's shell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import BROKER_URL, postgres_schema, schema_url
from tests.system.workers import ROOT

APP = "tests.tasks_periodic:app"
ADVICE = f"Error: taskq's tables are missing: run `taskq db create -A {APP}` once"

# command, expected exit status, tables it must name
COMMANDS = [
    (["worker", "-c", "1"], 2, ["taskq_processed", "taskq_outbox"]),
    (["worker", "-c", "1", "--beat", "--no-relay"], 2, ["taskq_schedule", "taskq_processed"]),
    (["relay"], 78, ["taskq_outbox"]),
    (["beat"], 78, ["taskq_schedule", "taskq_schedulers", "taskq_outbox"]),
    (["beat", "list"], 1, ["taskq_schedule", "taskq_schedulers"]),
    (["status"], 1, ["taskq_outbox", "taskq_schedule"]),
    (["inspect", "no-such-task-id"], 1, ["taskq_results", "taskq_workflows"]),
]


@pytest.fixture
def bare_database() -> Iterator[str]:
    """A PostgreSQL schema without taskq's tables."""
    with postgres_schema("tqbare", taskq_tables=False) as schema:
        yield schema_url(schema)


def taskq(namespace: str, database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
        "TASKQ_DATABASE_URL": database_url,
        "TASKQ_TEST_RUNS": os.devnull,
    }
    return subprocess.run(
        [sys.executable, "-m", "taskq", *args, "-A", APP], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(("args", "code", "tables"), COMMANDS, ids=lambda v: str(v))
def test_missing_tables_are_reported_first_with_the_command_to_run(
    namespace: str, bare_database: str, args: list[str], code: int, tables: list[str]
) -> None:
    done = taskq(namespace, bare_database, *args)

    first_line = done.stderr.splitlines()[0] if done.stderr else ""
    assert done.returncode == code, done.stderr
    assert first_line.startswith(ADVICE), done.stderr
    assert "every database but the embedded SQLite default needs it" in first_line
    for table in tables:
        assert table in first_line
    assert "Traceback" not in done.stderr


def test_db_create_makes_the_advice_go_away(namespace: str, bare_database: str) -> None:
    created = taskq(namespace, bare_database, "db", "create")
    listed = taskq(namespace, bare_database, "beat", "list")
    inspected = taskq(namespace, bare_database, "inspect", "no-such-task-id")

    assert created.returncode == 0, created.stderr
    assert "taskq tables ready" in created.stdout
    assert listed.returncode == 0, listed.stderr
    assert "every-second" in listed.stdout
    assert "tables are missing" not in inspected.stderr + inspected.stdout
