"""Fixtures for the Flask and Django integrations: a PostgreSQL schema, worker subprocesses.

Each session gets its own PostgreSQL schema (taskq's tables created by SQLAlchemy, the
shops' tables by the frameworks); each test its own broker namespace and queue, given to
the in-process App in code and to worker subprocesses through ``TASKQ_*`` variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from taskq.schema import metadata
from taskq.testing import WorkerProcess
from tests.conftest import BROKER_URL, postgres_schema, schema_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pg_schema() -> Iterator[str]:
    """A PostgreSQL schema only this session uses, with taskq's tables; dropped afterwards."""
    with postgres_schema("tqc") as schema:
        yield schema


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    """The session schema's URL, taskq's tables emptied."""
    url = schema_url(pg_schema)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()
    return url


def count_rows(url: str, table: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def worker_env(namespace: str) -> dict[str, str]:
    """``TASKQ_*`` variables that put a worker in this test's namespace and queue."""
    return {
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
        # Fast relay polling: the tests wait for it.
        "TASKQ_OUTBOX_POLL_INTERVAL_S": "0.2",
    }


@pytest.fixture
def start_command(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory: run a worker command line as a subprocess in its own session; killed after."""
    started: list[WorkerProcess] = []

    def start(command: list[str], *, cwd: Path, env: dict[str, str]) -> WorkerProcess:
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
            "PYTHONPATH": str(ROOT),
            **env,
        }
        log_path = tmp_path / f"worker-{len(started) + 1}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, *command], cwd=cwd, env=environment, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        worker = WorkerProcess(process, log_path)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
