"""Fixtures for the Flask and Django integrations: a PostgreSQL schema, worker subprocesses.

Django is set up once per session (``django_schema``), for every Django test module.

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

from taskq import App
from taskq.schema import metadata
from taskq.testing import WorkerProcess
from tests.conftest import BROKER_URL, POSTGRES_URL, delete_topology, postgres_schema, schema_url

ROOT = Path(__file__).resolve().parents[2]
SHOP_DIR = ROOT / "examples" / "django_shop"
#: The example shop's settings plus an app of test tasks (tests/contrib/djapp).
DJANGO_SETTINGS = "tests.contrib.django_settings"


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


def shop_database_env(schema: str) -> dict[str, str]:
    """The example settings' SHOP_DATABASE_* variables for POSTGRES_URL, in ``schema``."""
    url = sa.engine.make_url(POSTGRES_URL)
    return {
        "SHOP_DATABASE_NAME": url.database or "",
        "SHOP_DATABASE_USER": url.username or "",
        "SHOP_DATABASE_PASSWORD": url.password or "",
        "SHOP_DATABASE_HOST": url.host or "",
        "SHOP_DATABASE_PORT": str(url.port or ""),
        "SHOP_DATABASE_OPTIONS": f"-csearch_path={schema}",
    }


@pytest.fixture(scope="session")
def django_schema() -> Iterator[str]:
    """Django set up on the example shop, migrated into a schema of this session."""
    with postgres_schema("tqd", taskq_tables=False) as schema:  # the migrations make them
        os.environ.update(shop_database_env(schema))
        os.environ["DJANGO_SETTINGS_MODULE"] = DJANGO_SETTINGS
        sys.path.insert(0, str(SHOP_DIR))
        import django
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        call_command("migrate", verbosity=0)
        try:
            yield schema
        finally:
            connections.close_all()


@pytest.fixture
def shop_app(django_schema: str, namespace: str) -> Iterator[App]:
    """The example's App in this test's namespace; orders and outbox emptied afterwards."""
    from django.db import connection
    from orders.models import Order

    from taskq.contrib.django import get_app

    app = get_app()
    app.configure(
        broker_url=BROKER_URL, namespace=namespace, default_queue=f"{namespace}.default"
    )
    yield app
    Order.objects.all().delete()
    with connection.cursor() as cursor:
        for table in ("taskq_outbox", "taskq_results", "taskq_processed", "taskq_django_tasks",
                      "taskq_workflow_members", "taskq_workflows"):
            cursor.execute(f"DELETE FROM {table}")
    app.close()
    delete_topology(app)
