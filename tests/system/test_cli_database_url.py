"""A database URL that cannot work (issue 28, item 5), through the real CLI.

The error says which databases taskq supports and what to check; it never suggests turning a
safety feature off (``idempotent=False``), carries no SQLAlchemy background link in the middle
of its sentence, and the relay reports it in one line instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskq import App
from tests.conftest import BROKER_URL, POSTGRES_URL
from tests.system.cli_user import run_taskq, write_module

SUPPORTED = ("taskq keeps its tables in PostgreSQL (postgresql://user:password@host:5432/"
             "dbname, with `pip install taskq[postgres]`) or SQLite (sqlite:///path/to/"
             "file.sqlite3, the default)")
COMMANDS = [("worker", "-c", "1"), ("relay",), ("db", "create")]
# The user's app; its queue (named by the test) and namespace are the test's own.
TASKS = """
    import os

    import taskq

    app = taskq.App("nc")
    QUEUE = app.queue(os.environ["NC_QUEUE"])


    @app.task(queue=os.environ["NC_QUEUE"])
    def send(to: str) -> None:
        print("sent", to)
"""


@pytest.fixture
def run(tmp_path: Path, make_app: Callable[..., App], namespace: str) -> Callable[..., Any]:
    """Run a command of the user's app; what the worker declared is deleted afterwards."""
    queue = f"{namespace}.mail"
    make_app().queue(queue)  # make_app's finaliser deletes the namespace's topology
    write_module(tmp_path, "nc_app/tasks.py", TASKS)

    def run(command: tuple[str, ...], database_url: str) -> tuple[int, str]:
        env = {"TASKQ_DATABASE_URL": database_url, "TASKQ_BROKER_URL": BROKER_URL,
               "TASKQ_NAMESPACE": namespace, "TASKQ_DEFAULT_QUEUE": queue, "NC_QUEUE": queue}
        app_option = ("-A", "nc_app.tasks:app")
        args = ((*command, *app_option) if command[0] == "db"
                else (command[0], *app_option, *command[1:]))
        result = run_taskq(tmp_path, *args, env=env)
        return result.returncode, result.stderr

    return run


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_mysql_url_names_the_supported_databases(run, command: tuple[str, ...]) -> None:
    code, stderr = run(command, "mysql://shop:s3cret@localhost/shop")

    assert code == 2
    assert stderr.strip().splitlines()[-1] == (
        f"Error: database URL mysql://shop:***@localhost/shop: mysql is not supported; "
        f"{SUPPORTED}"
    )
    assert "s3cret" not in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_string_that_is_no_url_says_so(run, command: tuple[str, ...]) -> None:
    code, stderr = run(command, "localhost/shop")

    assert code == 2
    assert stderr.strip().splitlines()[-1] == (
        f"Error: database URL 'localhost/shop' is not a URL; {SUPPORTED}"
    )


def test_an_unreachable_database_says_what_to_check_and_keeps_idempotency_on(run) -> None:
    url = POSTGRES_URL.rsplit("/", 1)[0] + "/taskq_no_such_database"

    code, stderr = run(COMMANDS[0], url)

    assert code == 2
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("Error: cannot reach the database ")
    assert "(database_url, TASKQ_DATABASE_URL)" in line
    assert 'database "taskq_no_such_database" does not exist' in line
    assert line.endswith("The worker keeps idempotency keys there: check that the server "
                         "runs, that the database exists and that user and password are right")
    assert "idempotent=False" not in stderr
    assert "Background on this error" not in stderr
    assert "sqlalche.me" not in stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_sqlite_file_that_cannot_be_opened_gets_sqlite_advice(
    run, tmp_path: Path, command: tuple[str, ...]
) -> None:
    code, stderr = run(command, f"sqlite:///{tmp_path}/missing/dir/taskq.sqlite3")

    assert code in (1, 2)
    assert "(sqlite3.OperationalError) unable to open database file" in stderr
    assert ("check that the SQLite file's directory exists and that this user may write "
            "there") in stderr
    assert "sqlalche.me" not in stderr
    assert "idempotent=False" not in stderr
    assert "Traceback" not in stderr
