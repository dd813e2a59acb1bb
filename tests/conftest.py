"""Shared fixtures: real services, a namespace per test, apps that clean up after themselves.

A missing RabbitMQ or PostgreSQL is a loud failure saying how to start it, never a skip.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse

import pytest
import sqlalchemy as sa

from taskq import App
from taskq.broker import topology as topo
from taskq.schema import metadata
from tests.support import deprecations, rabbitmq4
from tests.support.layers import skip_unless_enabled

logger = logging.getLogger(__name__)

BROKER_URL = os.environ.get("TASKQ_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
POSTGRES_URL = os.environ.get(
    "TASKQ_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)

_BROKER_PORT = urlparse(BROKER_URL).port or 5672
_SERVICES = {
    "RabbitMQ": (
        _BROKER_PORT,
        "make rabbitmq4" if _BROKER_PORT == urlparse(rabbitmq4.URL).port
        else "rabbitmq-server -detached (or: make services)",
    ),
    "PostgreSQL": (
        5432,
        "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start "
        "(or: make services)",
    ),
}


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The slow layer (kill storms, several real workers, the browser): CI runs it (.ci/run
    # sets TASKQ_SLOW=1), a developer's ``make test`` skips it; ``make slow`` runs it alone.
    skip_unless_enabled(
        config, items, marker="slow", enabled=os.environ.get("TASKQ_SLOW", "") == "1",
        how="slow test: run it with `make slow` (or TASKQ_SLOW=1); CI runs it",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [
        f"{name} does not answer on 127.0.0.1:{port}; start it with: {how}"
        for name, (port, how) in _SERVICES.items()
        if not _answers(port)
    ]
    if missing:
        pytest.exit("\n".join(missing), returncode=3)
    if on_rabbitmq4_node() and not session.config.option.collectonly:
        _watch_deprecations(session.config)


# The deprecated-feature check (tests/support/deprecations.py): a session on the RabbitMQ 4.x
# node fails when the node's log reports a deprecated feature used while it ran.
_DEPRECATIONS_WINDOW = pytest.StashKey[deprecations.LogWindow]()
_DEPRECATIONS_FOUND = pytest.StashKey[list[str]]()


def on_rabbitmq4_node() -> bool:
    """Whether this session's broker is the RabbitMQ 4.x node of tests/support/rabbitmq4.py."""
    broker, node = urlparse(BROKER_URL), urlparse(rabbitmq4.URL)
    return (broker.hostname, broker.port) == (node.hostname, node.port)


def _watch_deprecations(config: pytest.Config) -> None:
    try:
        deprecations.forget_warnings()
        config.stash[_DEPRECATIONS_WINDOW] = deprecations.open_window()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.exit(
            f"the deprecated-feature check cannot watch the RabbitMQ 4.x node at {BROKER_URL} "
            f"(its log {deprecations.node_log()}, its rabbitmqctl: RMQ4_ROOT, RMQ4_NODE): {exc}",
            returncode=3,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    window = session.config.stash.get(_DEPRECATIONS_WINDOW, None)
    if window is None:
        return
    try:
        found = deprecations.close_window(window)
    except (OSError, RuntimeError, AssertionError, subprocess.TimeoutExpired) as exc:
        found = [f"(the check could not read the node's log to its end: {exc})"]
    session.config.stash[_DEPRECATIONS_FOUND] = found
    if found and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    found = terminalreporter.config.stash.get(_DEPRECATIONS_FOUND, [])
    if found:
        terminalreporter.section("deprecated RabbitMQ features used", red=True)
        for line in found:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"The run fails: {len(found)} use(s) of a deprecated feature in the log of the "
            f"RabbitMQ 4.x node ({deprecations.node_log()}) while it ran. Nothing taskq or "
            "its tests declare or call may depend on one (docs/rabbitmq.md)."
        )
        if any("management_metrics_collection" in line for line in found):
            terminalreporter.write_line(
                "management_metrics_collection is the node's own management statistics: it was "
                "started with the management plugin; restart it with "
                "scripts/ensure-rabbitmq4.sh --stop, then scripts/ensure-rabbitmq4.sh."
            )


@pytest.fixture(autouse=True)
def _clean_taskq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never inherit TASKQ_* settings from the developer's shell."""
    for key in list(os.environ):
        if key.startswith("TASKQ_") and not key.startswith("TASKQ_TEST_"):
            monkeypatch.delenv(key)


@pytest.fixture
def namespace() -> str:
    """A namespace (exchange prefix) no other test or run uses."""
    return f"tq{uuid.uuid4().hex[:10]}"


@pytest.fixture
def broker() -> Iterator[Any]:
    """A :class:`tests.support.broker.BrokerAdmin` on the shared test broker."""
    from tests.support.broker import BrokerAdmin

    admin = BrokerAdmin(BROKER_URL)
    try:
        yield admin
    finally:
        admin.close()


def delete_topology(app: App, extra_queues: tuple[str, ...] = ()) -> None:
    """Delete every queue and exchange ``app`` may have declared (errors are logged)."""
    from tests.support.broker import BrokerAdmin

    admin = BrokerAdmin(BROKER_URL)
    try:
        ns = app.settings.namespace
        for queue in {*app.queue_names(), *extra_queues}:
            for name in (queue, topo.dlq_name(queue), *app.topology.partition_queues(queue)):
                _safely(admin.delete_queue, name)
        _safely(admin.delete_queue, topo.unroutable_name(ns))
        for exchange in (
            topo.exchange_name(ns),
            topo.dlx_name(ns),
            topo.unroutable_name(ns),
            topo.delayed_exchange_name(ns),
        ):
            _safely(admin.delete_exchange, exchange)
        for queue_type in ("classic", "quorum"):  # delay tiers, when a test used them
            if admin.exists(topo.delay_tier_name(ns, 0, queue_type)):
                for level in range(topo.DELAY_TIER_LEVELS):
                    name = topo.delay_tier_name(ns, level, queue_type)
                    _safely(admin.delete_queue, name)
                    _safely(admin.delete_exchange, name)
    finally:
        _safely(admin.close)


def _safely(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # teardown must not hide the test's own result
        logger.warning("teardown step %s%r failed", getattr(fn, "__name__", fn), args,
                       exc_info=True)


@pytest.fixture
def database_file_url(tmp_path: Any) -> str:
    """The embedded SQLite default, in this test's own directory."""
    return f"sqlite:///{tmp_path}/taskq.sqlite3"


@pytest.fixture
def make_app(namespace: str, database_file_url: str) -> Iterator[Callable[..., App]]:
    """Factory of Apps in this test's namespace; their topology is deleted afterwards.

    The default queue is ``<namespace>.default`` so that runs never share a queue, and the
    database is a SQLite file of the test's own unless the test names another.
    """
    apps: list[App] = []

    def factory(name: str = "test", **settings: Any) -> App:
        settings.setdefault("broker_url", BROKER_URL)
        settings.setdefault("namespace", namespace)
        settings.setdefault("default_queue", f"{namespace}.default")
        settings.setdefault("database_url", database_file_url)
        app = App(name, **settings)
        apps.append(app)
        return app

    yield factory
    for app in apps:
        _safely(app.close)
        delete_topology(app)


def schema_url(schema: str) -> str:
    """POSTGRES_URL with ``schema`` as its search_path."""
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


@contextmanager
def postgres_schema(prefix: str, *, taskq_tables: bool = True) -> Iterator[str]:
    """A new PostgreSQL schema named ``prefix_<random>`` (with taskq's tables unless told
    otherwise), dropped with everything in it at the end."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        if taskq_tables:
            engine = sa.create_engine(schema_url(schema))
            metadata.create_all(engine)
            engine.dispose()
        yield schema
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_schema_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema only this test session uses."""
    with postgres_schema("tq") as schema:
        yield schema_url(schema)


def truncate_taskq_tables(url: str) -> None:
    """Empty taskq's tables (tests of one session share the schema)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture
def postgres_url(pg_schema_url: str) -> str:
    """PostgreSQL only (SKIP LOCKED, LISTEN/NOTIFY), with empty tables."""
    truncate_taskq_tables(pg_schema_url)
    return pg_schema_url
