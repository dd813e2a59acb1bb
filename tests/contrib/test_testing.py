"""taskq.testing: eager mode for users' unit tests, the taskq_worker fixture, CLI delegation."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from taskq import App, MessageTooLarge, SerializationError
from taskq.contrib._cli import with_app
from taskq.testing import eager
from tests.conftest import BROKER_URL
from tests.contrib.conftest import ROOT


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    app = make_app(task_always_eager=True)
    app.create_tables()
    with app.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE notes (text VARCHAR(50))"))
    return app


@pytest.fixture
def runs(app: App) -> list[tuple[Any, ...]]:
    """Calls of the ``record`` task, in order."""
    return []


@pytest.fixture
def record(app: App, runs: list[tuple[Any, ...]]) -> Any:
    @app.task(name="record")
    def record(*args: Any, **kwargs: Any) -> str:
        with app.engine.connect() as conn:  # another connection: sees committed rows only
            notes = [row[0] for row in conn.execute(sa.text("SELECT text FROM notes"))]
        runs.append((list(args), kwargs, notes))
        return "done"

    return record


def write_note(target: Session | sa.Connection, text: str) -> None:
    target.execute(sa.text("INSERT INTO notes VALUES (:text)"), {"text": text})


def test_a_direct_delay_runs_at_once_on_what_a_worker_would_receive(
    app: App, record: Any, runs: list[Any], broker: Any
) -> None:
    record.delay((1, 2), "x", when={"nested": (3,)})

    assert runs == [([[1, 2], "x"], {"when": {"nested": [3]}}, [])]  # tuples became lists
    assert not broker.exists(record.queue)  # nothing was published


def test_eager_mode_raises_what_production_raises_at_enqueue(app: App, record: Any) -> None:
    with pytest.raises(SerializationError, match=r"kwargs\['when'\]"):
        record.delay(when=object())
    app.configure(max_message_size_bytes=100)
    with pytest.raises(MessageTooLarge):
        record.delay("x" * 200)


def test_a_failing_task_raises_into_the_caller(app: App) -> None:
    @app.task(name="boom")
    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        boom.delay()


def test_through_a_session_the_task_runs_after_commit_and_sees_the_commit(
    app: App, record: Any, runs: list[Any]
) -> None:
    with Session(app.engine) as session:
        write_note(session, "order 1")
        record.apply_async(("a",), session=session)
        assert runs == []  # not before the commit
        session.commit()

    assert runs == [(["a"], {}, ["order 1"])]


def test_through_a_session_a_rollback_discards_the_task(
    app: App, record: Any, runs: list[Any]
) -> None:
    with Session(app.engine) as session:
        record.apply_async(("never",), session=session)  # the first statement of the txn
        session.rollback()
        record.apply_async(("later",), session=session)
        session.commit()
    with Session(app.engine) as session:
        record.apply_async(("closed",), session=session)  # closed without a commit

    assert [run[0] for run in runs] == [["later"]]


def test_a_rolled_back_savepoint_takes_its_tasks_along(
    app: App, record: Any, runs: list[Any]
) -> None:
    with Session(app.engine) as session:
        record.apply_async(("outer",), session=session)
        with contextlib.suppress(RuntimeError), session.begin_nested():
            record.apply_async(("savepoint",), session=session)
            raise RuntimeError
        with session.begin_nested():
            record.apply_async(("released",), session=session)
        session.commit()

    assert [run[0] for run in runs] == [["outer"], ["released"]]


def test_through_a_connection_the_task_runs_after_the_commit(
    app: App, record: Any, runs: list[Any]
) -> None:
    with app.engine.begin() as conn:
        write_note(conn, "order 2")
        record.delay_on(conn, "b")
    assert runs == [(["b"], {}, ["order 2"])]

    with contextlib.suppress(RuntimeError), app.engine.begin() as conn:
        record.delay_on(conn, "rolled back")
        raise RuntimeError

    with app.engine.connect() as conn:
        record.delay_on(conn, "c")
        conn.commit()
        conn.execute(sa.text("SELECT 1"))  # the next transaction: the connection is idle
        assert [run[0] for run in runs] == [["b"], ["c"]]
        conn.rollback()


def test_tasks_run_inside_the_apps_task_context(app: App) -> None:
    entered: list[str] = []

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        entered.append("enter")
        yield
        entered.append("exit")

    @app.task(name="inside")
    def inside() -> None:
        entered.append("task")

    app.task_context.append(context)

    inside.delay()

    assert entered == ["enter", "task", "exit"]


def test_a_bound_task_sees_its_request_as_in_a_worker(app: App) -> None:
    seen: list[Any] = []

    @app.task(name="bound", bind=True)
    def bound(self: Any, x: int) -> None:
        seen.append((x, self.request.task_id, self.request.queue, self.request.retries))

    result = bound.apply_async((7,), queue="elsewhere")

    assert seen == [(7, result.id, "elsewhere", 0)]


def test_a_transactional_task_gets_a_session_that_commits_its_writes(app: App) -> None:
    @app.task(name="transactional", transactional=True)
    def transactional(text: str, *, session: Session) -> None:
        write_note(session, text)

    transactional.delay("kept")

    with app.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT text FROM notes")).scalars().all() == ["kept"]


def test_eager_restores_the_previous_mode(make_app: Callable[..., App]) -> None:
    app = make_app()

    with eager(app) as same:
        assert same is app and app.settings.task_always_eager

    assert not app.settings.task_always_eager


def test_commands_get_the_app_added_after_the_command_name() -> None:
    path = "pkg:app"

    assert with_app(["worker", "-c", "2"], path) == ["worker", "-A", path, "-c", "2"]
    assert with_app(["db", "create"], path) == ["db", "create", "-A", path]
    assert with_app(["worker", "-A", "other:app"], path) == ["worker", "-A", "other:app"]
    assert with_app(["--help"], path) == ["--help"]
    assert with_app(["db"], path) == ["db"]  # a group alone takes no -A


def test_the_taskq_worker_fixture_runs_a_real_worker(tmp_path: Path, namespace: str) -> None:
    # Given: a user's project with the plugin and a test that needs a real worker
    (tmp_path / "proj.py").write_text(textwrap.dedent("""
        from pathlib import Path
        from taskq import App

        app = App("proj")

        @app.task
        def touch(path: str) -> None:
            Path(path).write_text("ran")
    """))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["taskq.testing"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\ntaskq_app = proj:app\n")
    (tmp_path / "test_proj.py").write_text(textwrap.dedent("""
        from pathlib import Path
        from proj import app, touch

        def test_touch(taskq_worker, tmp_path):
            target = tmp_path / "out.txt"
            touch.delay(str(target))
            taskq_worker.wait_for(target.exists, timeout_s=20)
            app.close()
    """))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": namespace,
        "TASKQ_DEFAULT_QUEUE": f"{namespace}.default",
        "TASKQ_DATABASE_URL": f"sqlite:///{tmp_path}/taskq.sqlite3",
    }

    # When: the user runs pytest
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_proj.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
    )

    _delete_namespace(namespace)

    # Then: the worker ran the task and stopped cleanly
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def _delete_namespace(namespace: str) -> None:
    from tests.conftest import delete_topology

    app = App("cleanup", broker_url=BROKER_URL, namespace=namespace,
              default_queue=f"{namespace}.default")
    delete_topology(app)
