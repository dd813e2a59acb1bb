"""`-A` mistakes a newcomer makes, through the real CLI (issue 28, item 5).

Each names what is wrong and the value to give instead; nothing connects before -A loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.cli_user import run_taskq, write_module

TASKS = """
    import taskq

    app = taskq.App("nc")
    billing = taskq.App("nc-billing")


    @app.task
    def send(to: str) -> None:
        print("sent", to)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_module(tmp_path, "nc_app/tasks.py", TASKS)
    write_module(tmp_path, "nc_app/plain.py", "VALUE = 1\n")
    return tmp_path


def test_a_misspelt_attribute_is_named_missing_with_the_apps_the_module_has(
    project: Path,
) -> None:
    result = run_taskq(project, "status", "-A", "nc_app.tasks:ap")

    assert result.returncode == 2
    assert "NoneType" not in result.stderr
    assert "module nc_app.tasks has no attribute 'ap'" in result.stderr
    assert "give -A nc_app.tasks:app or -A nc_app.tasks:billing" in result.stderr


def test_an_attribute_that_is_no_app_says_what_it_is_and_which_apps_exist(
    project: Path,
) -> None:
    result = run_taskq(project, "dlq", "list", "x", "-A", "nc_app.tasks:send")

    assert result.returncode == 2
    assert "nc_app.tasks.send is a Task, not a taskq.App" in result.stderr
    assert "-A nc_app.tasks:app or -A nc_app.tasks:billing" in result.stderr


def test_a_module_without_apps_says_so(project: Path) -> None:
    result = run_taskq(project, "status", "-A", "nc_app.plain")

    assert result.returncode == 2
    assert "module nc_app.plain has no attribute 'app'" in result.stderr
    assert "defines no taskq.App at its top level" in result.stderr


@pytest.mark.parametrize(
    ("given", "suggested"),
    [
        ("nc_app/tasks.py", "-A nc_app.tasks:app"),
        ("./nc_app/tasks.py:billing", "-A nc_app.tasks:billing"),
        ("nc_app/tasks", "-A nc_app.tasks:app"),
    ],
)
def test_a_file_path_gets_the_dotted_form(project: Path, given: str, suggested: str) -> None:
    result = run_taskq(project, "worker", "-A", given)

    assert result.returncode == 2
    assert f"-A {given!r} names a file" in result.stderr
    assert f"dotted name, as import would: {suggested}" in result.stderr
    assert "No module named" not in result.stderr


def test_the_suggested_dotted_form_works(project: Path) -> None:
    result = run_taskq(project, "beat", "list", "-A", "nc_app.tasks:app")

    assert result.returncode == 0, result.stderr
    assert "app nc defines no periodic tasks" in result.stdout
