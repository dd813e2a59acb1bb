"""Django integration, through the example shop, against real RabbitMQ and PostgreSQL.

Django is set up once in this process (the example's settings plus tests/contrib/djapp, a
PostgreSQL schema of this session: tests/contrib/conftest.py); only the Django test modules
import it. Worker subprocesses run
``manage.py taskq worker`` with the same settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from taskq import App, ConfigurationError, OutboxError, SerializationError
from taskq.schema import metadata
from taskq.testing import WorkerProcess, eager
from tests.conftest import POSTGRES_URL
from tests.contrib.conftest import ROOT, SHOP_DIR, count_rows, schema_url, shop_database_env
from tests.support.waiting import wait_until


def post_order(email: str, total_cents: int) -> Any:
    from django.test import Client

    return Client().post(
        "/orders", {"email": email, "total_cents": total_cents}, content_type="application/json"
    )


def confirmation(order_id: int) -> str | None:
    from orders.models import Order

    return Order.objects.get(pk=order_id).confirmation


def start_shop_worker(start_command: Callable[..., WorkerProcess], worker_env: dict[str, str],
                      django_schema: str) -> WorkerProcess:
    """`manage.py taskq worker -c 1` of the example shop (with its relay), on the schema."""
    return start_command(
        ["manage.py", "taskq", "worker", "-c", "1", "--loglevel", "INFO"],
        cwd=SHOP_DIR,
        env={**worker_env, **shop_database_env(django_schema)},
    )


def test_committed_request_enqueues_one_task_that_the_worker_runs_with_django_settings(
    shop_app: App,
    django_schema: str,
    worker_env: dict[str, str],
    start_command: Callable[..., WorkerProcess],
    broker: Any,
    namespace: str,
) -> None:
    from django.test import Client

    # When: a request places an order inside transaction.atomic(), before any worker runs
    response = post_order("ada@example.com", 4200)

    # Then: its outbox row was written through Django's connection and committed
    assert response.status_code == 201
    url = schema_url(django_schema)
    assert count_rows(url, "taskq_outbox") == 1
    queue = f"{namespace}.default"
    assert not broker.exists(queue) or broker.depth(queue) == 0

    # When: `manage.py taskq worker` (with its relay) runs
    worker = start_shop_worker(start_command, worker_env, django_schema)

    # Then: the task ran once, with Django set up, and its write landed
    order_id = response.json()["id"]
    wait_until(
        lambda: confirmation(order_id),
        timeout_s=30,
        message=lambda: f"the confirmation; worker log:\n{worker.log()}",
    )
    assert confirmation(order_id) == f"Django shop: order #{order_id} confirmed, 42.00 EUR"
    wait_until(lambda: count_rows(url, "taskq_outbox") == 0, timeout_s=10)
    assert worker.log().count("confirmation to ada@example.com") == 1
    # The order's confirmation is written inside the task, its result just after it
    task_url = f"/tasks/{response.json()['task_id']}"  # get_result()
    wait_until(lambda: Client().get(task_url).json()["status"] != "RUNNING", timeout_s=10)
    task = Client().get(task_url).json()
    assert (task["status"], task["attempts"]) == ("SUCCESSFUL", 1)
    assert task["return_value"] == confirmation(order_id)
    assert worker.stop(timeout_s=20) == 0


def _fail_after_enqueueing(request: Any) -> Any:
    from django.db import transaction
    from orders.views import place_order

    with transaction.atomic():
        place_order("bob@example.com", 100)
        raise RuntimeError("payment declined")


def _urlpatterns() -> list[Any]:
    from django.urls import path

    return [path("orders-then-fail", _fail_after_enqueueing)]


def __getattr__(name: str) -> Any:  # this module is the failing view's ROOT_URLCONF
    if name == "urlpatterns":
        return _urlpatterns()
    raise AttributeError(name)


def test_request_that_raises_after_enqueueing_publishes_nothing(
    shop_app: App, django_schema: str, broker: Any, namespace: str
) -> None:
    from django.test import Client, override_settings
    from orders.models import Order

    with override_settings(ROOT_URLCONF=__name__), pytest.raises(RuntimeError):
        Client().post("/orders-then-fail")

    assert Order.objects.count() == 0
    assert count_rows(schema_url(django_schema), "taskq_outbox") == 0
    queue = f"{namespace}.default"
    assert not broker.exists(queue) or broker.depth(queue) == 0


def test_delay_outside_an_atomic_block_publishes_directly(shop_app: App, broker: Any) -> None:
    from orders.models import Order

    from tests.contrib.djapp.tasks import note

    order = Order.objects.create(email="eve@example.com", total_cents=1)  # autocommit

    result = note.delay(order.id)  # taskq's own @app.task API, beside django.tasks

    assert broker.depth(result.queue) == 1
    assert Order.objects.get(pk=order.id).confirmation is None  # a worker would run it


def test_a_chain_started_in_an_atomic_block_is_written_in_it_and_runs_after_commit(
    shop_app: App, django_schema: str, worker_env: dict[str, str],
    start_command: Callable[..., WorkerProcess],
) -> None:
    from django.db import transaction
    from orders.models import Order

    from taskq.workflows import WorkflowState, chain
    from tests.contrib.djapp.tasks import double, plus

    url = schema_url(django_schema)
    # When: an order and a chain are written in one atomic block, and the block goes on
    with transaction.atomic():
        order = Order.objects.create(email="wf@example.com", total_cents=700)
        result = chain(double.s(2), plus.s(3)).apply_async()
        # Then: nothing is visible outside the block before it commits
        assert count_rows(url, "taskq_workflows") == 0
        assert count_rows(url, "taskq_outbox") == 0

    # Then: the commit made the workflow, its two members and its first step's outbox row
    assert Order.objects.filter(pk=order.pk).exists()
    assert count_rows(url, "taskq_workflows") == 1
    assert count_rows(url, "taskq_workflow_members") == 2
    assert count_rows(url, "taskq_outbox") == 1
    assert result.state is WorkflowState.RUNNING

    # When: a worker (with its relay) runs; Then: double(2) = 4, plus(4, 3) = 7
    worker = start_shop_worker(start_command, worker_env, django_schema)
    wait_until(lambda: result.state.is_ready, timeout_s=60,
               message=lambda: f"the chain's end; worker log:\n{worker.log()}")
    assert (result.state, result.get(timeout_s=1)) == (WorkflowState.SUCCESS, 7)


def test_a_chain_started_in_an_atomic_block_that_rolls_back_leaves_nothing(
    shop_app: App, django_schema: str, broker: Any, namespace: str
) -> None:
    from django.db import transaction

    from taskq.workflows import chain, group
    from tests.contrib.djapp.tasks import double, plus

    with pytest.raises(RuntimeError), transaction.atomic():
        chain(group(double.s(1), double.s(2)), plus.s(3)).apply_async()
        raise RuntimeError("the view failed after starting the workflow")

    url = schema_url(django_schema)
    for table in ("taskq_workflows", "taskq_workflow_members", "taskq_outbox"):
        assert count_rows(url, table) == 0, table
    queue = f"{namespace}.default"
    assert not broker.exists(queue) or broker.depth(queue) == 0


def test_a_workflow_whose_tables_are_missing_fails_with_what_to_run(shop_app: App) -> None:
    from django.db import connection, transaction

    from taskq.contrib.django.outbox import DjangoOutbox

    missing = sa.table("taskq_workflows_not_migrated", sa.column("id"))
    with pytest.raises(OutboxError) as caught, transaction.atomic():
        DjangoOutbox(connection).execute(missing.insert().values(id="wf-1"))

    message = caught.value.message
    assert "taskq_workflows_not_migrated" in message and "'default'" in message
    assert "python manage.py migrate taskq" in message


def test_eager_mode_runs_the_task_on_commit_and_never_on_rollback(shop_app: App) -> None:
    from django.db import transaction
    from orders.models import Order
    from orders.views import place_order

    with eager(shop_app):
        order_id = post_order("dan@example.com", 999).json()["id"]
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = place_order("fay@example.com", 1)
            raise RuntimeError("rolled back")

    assert confirmation(order_id) == f"Django shop: order #{order_id} confirmed, 9.99 EUR"
    assert not Order.objects.filter(pk=rolled_back.id).exists()


def test_eager_mode_raises_serialization_errors_at_delay(shop_app: App) -> None:
    from django.db import transaction

    from tests.contrib.djapp.tasks import note

    with eager(shop_app), transaction.atomic():
        with pytest.raises(SerializationError, match=r"args\[0\]"):
            note.delay({1, 2})


def _columns(url: str, schema: str | None = None) -> dict[str, Any]:
    """What matters of taskq's tables as the database reports it."""
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        dialect = engine.dialect
        described = {}
        for table in metadata.sorted_tables:
            name = table.name
            described[name] = {
                "columns": [
                    (c["name"], c["type"].compile(dialect=dialect), c["nullable"])
                    for c in inspector.get_columns(name, schema)
                ],
                "primary_key": inspector.get_pk_constraint(name, schema)["constrained_columns"],
                "indexes": sorted(
                    (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                    for i in inspector.get_indexes(name, schema)
                ),
                "unique": sorted(
                    tuple(u["column_names"]) for u in inspector.get_unique_constraints(name, schema)
                ),
            }
        return described
    finally:
        engine.dispose()


def test_migrations_create_exactly_taskq_schema_on_postgresql(
    django_schema: str, pg_schema: str
) -> None:
    from_django = _columns(POSTGRES_URL, django_schema)
    from_sqlalchemy = _columns(POSTGRES_URL, pg_schema)  # taskq.metadata.create_all()

    assert from_django == from_sqlalchemy
    assert ("next_attempt_at", "TIMESTAMP WITH TIME ZONE", False) in (
        from_django["taskq_outbox"]["columns"]
    )


def test_migrations_create_exactly_taskq_schema_on_sqlite(tmp_path: Path) -> None:
    migrated = tmp_path / "django.sqlite3"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SHOP_", "DJANGO_"))},
        "SHOP_SQLITE_PATH": str(migrated),
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "taskq", "-v", "0"],
        cwd=SHOP_DIR, env=env, check=True, timeout=60,
    )
    created = sa.create_engine(f"sqlite:///{tmp_path}/sqlalchemy.sqlite3")
    metadata.create_all(created)
    created.dispose()

    assert _columns(f"sqlite:///{migrated}") == _columns(f"sqlite:///{tmp_path}/sqlalchemy.sqlite3")


def test_settings_taskq_configures_the_app_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, django_schema: str
) -> None:
    from taskq.contrib.django.apps import configure
    from taskq.contrib.django.outbox import OutboxSessions

    monkeypatch.setenv("TASKQ_PREFETCH_COUNT", "5")
    monkeypatch.setenv("TASKQ_HEARTBEAT_S", "30")
    module = types.ModuleType("taskq_config_probe")
    module.app = App("probe")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    databases = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/db.sqlite3"}}

    app = configure({"app": "taskq_config_probe:app", "prefetch_count": 7}, databases)

    assert app.settings.prefetch_count == 7  # settings.TASKQ beats the environment
    assert app.settings.heartbeat_s == 30  # the environment fills the rest
    assert app.settings.database_url == "sqlite:////srv/db.sqlite3"
    assert isinstance(app.session_provider, OutboxSessions)
    with pytest.raises(ConfigurationError, match="prefech_count"):
        configure({"app": "taskq_config_probe:app", "prefech_count": 7}, databases)
    with pytest.raises(ConfigurationError, match="must name the project's App"):
        configure({}, databases)


def test_database_url_is_derived_from_django_databases() -> None:
    from taskq.contrib.django.outbox import database_url

    assert database_url(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "shop",
            "USER": "ada",
            "PASSWORD": "p@ss:word",
            "HOST": "db.internal",
            "PORT": "5433",
            "OPTIONS": {"sslmode": "require", "options": "-c search_path=shop", "pool": True},
        }
    ) == (
        "postgresql+psycopg://ada:p%40ss%3Aword@db.internal:5433/shop"
        "?options=-c%20search_path%3Dshop&sslmode=require"
    )
    with pytest.raises(ConfigurationError, match="database_url"):
        database_url({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    with pytest.raises(ConfigurationError, match="database_url"):
        database_url({"ENGINE": "django.db.backends.mysql", "NAME": "shop"})


def test_manage_py_taskq_delegates_to_the_taskq_command_line(django_schema: str) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    call_command("taskq", "worker", "--help")  # exits 0: returns
    with pytest.raises(CommandError, match="status 2"):
        call_command("taskq", "no-such-command")
