"""Flask integration, through the example shop, against real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from taskq import ConfigurationError, SerializationError
from taskq.contrib.flask import TaskQ, settings_from_config
from taskq.testing import WorkerProcess
from taskq.worker.process import load_app
from tests.conftest import BROKER_URL, delete_topology
from tests.contrib.conftest import ROOT, count_rows
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def shop_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``examples.flask_shop.shop``; its module-level app gets a throwaway SQLite file."""
    import os

    path = tmp_path_factory.mktemp("flask_shop") / "import.sqlite3"
    previous = os.environ.get("SHOP_DATABASE_URL")
    os.environ["SHOP_DATABASE_URL"] = f"sqlite:///{path}"
    try:
        from examples.flask_shop import shop
    finally:
        os.environ.pop("SHOP_DATABASE_URL")
        if previous is not None:
            os.environ["SHOP_DATABASE_URL"] = previous
    return shop


@pytest.fixture
def make_shop(shop_module: Any, namespace: str) -> Iterator[Callable[..., Flask]]:
    """Factory of shop apps in this test's namespace, their tables created and dropped."""
    apps: list[Flask] = []

    def make(database_url: str, **config: Any) -> Flask:
        app = shop_module.create_app(
            {
                "TESTING": True,
                "SHOP_NAME": "Test shop",
                "SQLALCHEMY_DATABASE_URI": database_url,
                "TASKQ_BROKER_URL": BROKER_URL,
                "TASKQ_NAMESPACE": namespace,
                "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
                **config,
            }
        )
        with app.app_context():
            shop_module.db.create_all()
        apps.append(app)
        return app

    yield make
    taskq_app = shop_module.taskq.taskq_app
    for app in apps:
        with app.app_context():
            shop_module.db.drop_all()
            shop_module.db.engine.dispose()
    taskq_app.close()
    delete_topology(taskq_app)


def orders(app: Flask, shop: Any) -> list[Any]:
    with app.app_context():
        return list(shop.db.session.scalars(shop.db.select(shop.Order)))


def test_committed_request_enqueues_one_task_that_the_worker_runs_in_an_app_context(
    shop_module: Any,
    make_shop: Callable[..., Flask],
    pg_url: str,
    worker_env: dict[str, str],
    start_command: Callable[..., WorkerProcess],
    broker: Any,
    namespace: str,
) -> None:
    app = make_shop(pg_url)
    client = app.test_client()

    # When: a request places an order (and commits), before any worker runs
    response = client.post("/orders", json={"email": "ada@example.com", "total_cents": 4200})

    # Then: exactly one task waits in the outbox, nothing was published directly
    assert response.status_code == 201
    assert count_rows(pg_url, "taskq_outbox") == 1
    queue = f"{namespace}.default"
    assert not broker.exists(queue) or broker.depth(queue) == 0

    # When: `flask taskq worker` (with its relay) runs
    worker = start_command(
        ["-m", "flask", "taskq", "worker", "-c", "1", "--loglevel", "INFO"],
        cwd=ROOT,
        env={
            **worker_env,
            "FLASK_APP": "examples.flask_shop.shop",
            "SHOP_DATABASE_URL": pg_url,
        },
    )

    # Then: the task ran once, in the worker's app context (its config, its db.session)
    order_id = response.get_json()["id"]
    wait_until(
        lambda: orders(app, shop_module)[0].confirmation,
        timeout_s=30,
        message=lambda: f"the confirmation; worker log:\n{worker.log()}",
    )
    assert orders(app, shop_module)[0].confirmation == (
        f"Flask shop: order #{order_id} confirmed, 42.00 EUR"
    )
    wait_until(lambda: count_rows(pg_url, "taskq_outbox") == 0, timeout_s=10)
    assert worker.log().count("confirmation to ada@example.com") == 1
    assert worker.stop(timeout_s=20) == 0


def test_request_that_raises_after_enqueueing_publishes_nothing(
    shop_module: Any,
    make_shop: Callable[..., Flask],
    pg_url: str,
    broker: Any,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_shop(pg_url)

    @app.post("/orders-then-fail")
    def fail_after_enqueueing() -> Any:
        shop_module.place_order("bob@example.com", 100)
        raise RuntimeError("payment declined")

    with pytest.raises(RuntimeError, match="payment declined"):
        app.test_client().post("/orders-then-fail")

    assert orders(app, shop_module) == []
    assert count_rows(pg_url, "taskq_outbox") == 0
    queue = f"{namespace}.default"
    assert not broker.exists(queue) or broker.depth(queue) == 0
    assert "not committed" not in caplog.text  # the rollback was the point


def test_a_request_that_never_commits_warns_that_its_task_is_discarded(
    shop_module: Any,
    make_shop: Callable[..., Flask],
    pg_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_shop(pg_url)

    @app.post("/orders-without-commit")
    def forget_to_commit() -> Any:
        shop_module.place_order("carol@example.com", 100)
        return {}, 202

    with caplog.at_level(logging.WARNING, logger="taskq.contrib.flask"):
        assert app.test_client().post("/orders-without-commit").status_code == 202

    assert count_rows(pg_url, "taskq_outbox") == 0
    assert "was not committed before the end of the request" in caplog.text


def test_eager_mode_runs_the_task_after_commit_in_a_fresh_app_context(
    shop_module: Any, make_shop: Callable[..., Flask], tmp_path: Path, broker: Any,
    namespace: str,
) -> None:
    app = make_shop(f"sqlite:///{tmp_path}/shop.sqlite3", TASKQ_TASK_ALWAYS_EAGER=True)
    client = app.test_client()

    response = client.post("/orders", json={"email": "dan@example.com", "total_cents": 999})

    order_id = response.get_json()["id"]
    assert client.get(f"/orders/{order_id}").get_json()["confirmation"] == (
        f"Test shop: order #{order_id} confirmed, 9.99 EUR"
    )
    assert not broker.exists(f"{namespace}.default")  # nothing reached the broker


def test_eager_mode_raises_serialization_errors_at_delay(
    shop_module: Any, make_shop: Callable[..., Flask], tmp_path: Path
) -> None:
    app = make_shop(f"sqlite:///{tmp_path}/shop.sqlite3", TASKQ_TASK_ALWAYS_EAGER=True)

    with app.app_context(), pytest.raises(SerializationError, match=r"args\[0\]"):
        shop_module.send_confirmation.delay(object())

    with app.app_context():  # nothing half-done was committed or run
        assert shop_module.db.session.scalars(shop_module.db.select(shop_module.Order)).all() == []


def test_config_keys_are_settings_that_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flask_sqlalchemy import SQLAlchemy

    monkeypatch.setenv("TASKQ_PREFETCH_COUNT", "5")
    monkeypatch.setenv("TASKQ_HEARTBEAT_S", "30")
    app = Flask("configured")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path}/db.sqlite3", TASKQ_PREFETCH_COUNT=7
    )
    db = SQLAlchemy()
    db.init_app(app)

    extension = TaskQ(app, db=db)

    settings = extension.taskq_app.settings
    assert settings.prefetch_count == 7  # config beats environment
    assert settings.heartbeat_s == 30  # environment fills what the config does not
    assert settings.database_url == f"sqlite:///{tmp_path}/db.sqlite3"  # the app's database
    assert extension.taskq_app.name == "configured"
    with pytest.raises(ConfigurationError, match="TASKQ_PREFECH_COUNT"):
        settings_from_config({"TASKQ_PREFECH_COUNT": 3})


def test_delay_outside_an_app_context_publishes_directly(tmp_path: Path) -> None:
    from flask_sqlalchemy import SQLAlchemy

    app = Flask("direct")
    app.config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{tmp_path}/db.sqlite3"
    db = SQLAlchemy()
    db.init_app(app)
    extension = TaskQ(app, db=db)
    provider = extension.taskq_app.session_provider
    assert provider is not None

    assert provider() is None
    with app.app_context():
        assert provider() is db.session()


def test_the_worker_finds_the_app_through_the_extension(shop_module: Any) -> None:
    assert load_app("examples.flask_shop.shop:taskq") is shop_module.taskq.taskq_app


def test_the_flask_cli_shows_taskq_commands(shop_module: Any) -> None:
    from flask.testing import FlaskCliRunner

    result = FlaskCliRunner(shop_module.app).invoke(args=["taskq", "--help"])

    assert result.exit_code == 0, result.output
    assert "worker" in result.output and "relay" in result.output
