"""The dashboard's task page, dead letters and login in a real browser (docs/states.md).

A real ``taskq worker --dashboard-port`` runs the tasks and serves the pages; the test's App
sends them through the shared broker (``TASKQ_TEST_BROKER_URL`` picks 3.10 or 4.3).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from taskq import App, Task
from taskq.workflows import group
from tests import tasks_dashboard
from tests.browser.conftest import TOKEN, Page, worker_with_dashboard
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _bound(app: App, task: Task[Any, Any]) -> Task[Any, Any]:
    copy: Task[Any, Any] = Task(app, task.fn, name=task.name, options=task.options)
    app.registry.add(copy)
    return copy


def _page_state(page: Any, base: str, task_id: str) -> str:
    page.goto(f"{base}/tasks/{task_id}")
    return str(page.inner_text("#state"))


def test_task_pages_tell_each_state_and_link_dead_letters_and_workflows(
    app: App, runs: str, tmp_path: Path, start_worker: Any, page: Page
) -> None:
    # Given a worker serving the dashboard, a task that succeeds without keeping its value
    # and a one-member group whose member fails (dead-lettered with its workflow header)
    app.create_tables()
    worker, base = worker_with_dashboard(start_worker, "--relay")  # workflows use the outbox
    tab = page.page
    tab.goto(base + "/")
    first_notes = tab.inner_text("#rate-notes")
    done = send(app, tasks_dashboard.record, runs, "plain")
    broken = _bound(app, tasks_dashboard.broken_until_fixed)
    started = group(broken.s(runs, str(tmp_path / "missing-flag"))).apply_async()
    (member,) = [m.task_id for m in started.members()]
    wait_until(lambda: count_runs(runs) == 2, timeout_s=60, message=worker.log)

    # Then the first render of this worker-served dashboard does not tell the user to serve
    # it from a worker
    assert "serve the dashboard from" not in first_notes

    # And the succeeded task's page says so, and that no value was kept
    # (the worker's record, written within a second, names the worker; the finished key
    # alone says SUCCESS earlier)
    wait_until(lambda: _page_state(tab, base, done.id) == "SUCCESS"
               and tab.locator("[data-field=worker]").count() == 1, timeout_s=20)
    assert "no value kept: set store_result=True" in tab.inner_text("#summary")
    assert " pid " in tab.inner_text("[data-field=worker]")

    # And the member's page says FAILURE, links its dead letter and its workflow
    wait_until(lambda: _page_state(tab, base, member) == "FAILURE", timeout_s=20)
    assert f"{app.settings.default_queue}.dlq" in tab.inner_text("#dead-letter")
    tab.click("#dead-letter")

    # And the dead letter shows when it failed as a time and an age, its workflow as a link
    failed_at = tab.inner_text("[data-header=taskq-failed-at]")
    assert failed_at.endswith(" ago)") and " UTC (" in failed_at
    tab.click("[data-header=taskq-workflow]")
    assert tab.inner_text("h1") == f"Workflow {started.id}"
    assert tab.inner_text("#workflow-state") == "FAILURE"
    assert tab.locator(f"[data-member='{member}']").inner_text().split()[2] == "FAILURE"

    # And an id nobody used is UNKNOWN, with a 404
    made_up = str(uuid.uuid4())
    response = tab.goto(f"{base}/tasks/{made_up}")
    assert response is not None and response.status == 404
    assert tab.inner_text("#state") == "UNKNOWN"
    assert page.dialogs == []


def test_a_wrong_token_shows_the_login_form_again(
    app: App, start_dashboard: Any, page: Page
) -> None:
    # Given the dashboard with a token
    base = start_dashboard()
    tab = page.page

    # When a wrong token is typed
    tab.goto(f"{base}/login")
    tab.fill("input[name=token]", "not-" + TOKEN)
    with tab.expect_response(lambda r: r.url.endswith("/login")) as answer:
        tab.click("button[name=login]")

    # Then the form is shown again with the reason (still a 403), and the right token works
    assert answer.value.status == 403
    assert "wrong dashboard token" in tab.inner_text("#login-error")
    tab.fill("input[name=token]", TOKEN)
    tab.click("button[name=login]")
    tab.wait_for_url(f"{base}/")
    assert tab.locator("#login-error").count() == 0
