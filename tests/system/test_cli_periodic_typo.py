"""A periodic task that names a task the app does not have (issue 28, item 5): the error,
seen through the real CLI, offers the registered names it most likely meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.cli_user import run_taskq, write_module

TASKS = """
    import taskq

    app = taskq.App("nc", database_url="sqlite:///nc.sqlite3")


    @app.task
    def send_digest() -> None:
        print("digest")


    @app.task
    def send_reminders() -> None:
        print("reminders")


    app.add_periodic_task(3600, {name!r}, name="digest")
"""


@pytest.mark.parametrize(
    ("named", "meant"),
    [
        ("nc_app.tasks.send_digset", "'nc_app.tasks.send_digest'"),
        ("send_digest", "'nc_app.tasks.send_digest'"),
    ],
)
def test_an_unregistered_task_name_gets_did_you_mean(
    tmp_path: Path, named: str, meant: str
) -> None:
    write_module(tmp_path, "nc_app/tasks.py", TASKS.format(name=named))

    result = run_taskq(tmp_path, "beat", "list", "-A", "nc_app.tasks:app")

    assert result.returncode == 2
    assert (f"periodic task: task {named!r} is not registered in app 'nc' (did you mean "
            f"{meant}?)") in result.stderr
    assert "register it with @app.task before the schedule that names it" in result.stderr


def test_a_name_close_to_nothing_gets_no_guess(tmp_path: Path) -> None:
    write_module(tmp_path, "nc_app/tasks.py", TASKS.format(name="billing.charge"))

    result = run_taskq(tmp_path, "beat", "-A", "nc_app.tasks:app")

    assert result.returncode == 2
    assert "task 'billing.charge' is not registered in app 'nc';" in result.stderr
    assert "did you mean" not in result.stderr
