"""The dashboard in a real browser, against the real broker and a real ``taskq worker``."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest

from taskq import App
from taskq.broker import _management as management
from taskq.broker import topology as topo
from taskq.dashboard.server import DashboardServer
from taskq.status import collect
from tests import tasks_dashboard
from tests.browser.conftest import (
    TOKEN,
    Page,
    dlq_depth,
    login,
    park_dead_letters,
    screenshot,
    worker_with_dashboard,
)
from tests.faults.services import ManagedRabbit
from tests.support.rabbitmq_nodes import free_port
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, declare_topology, send

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT = "<script>alert(1)</script>"


def _cell(page: Any, queue: str, field: str) -> str:
    return str(page.inner_text(f"#queues tr[data-queue='{queue}'] [data-field={field}]"))


def test_overview_shows_the_depths_the_broker_reports_and_keeps_them_live(
    app: App, broker: Any, page: Page, start_dashboard: Any, runs: str
) -> None:
    # Given 3 ready messages and 2 dead letters in the test's queue, and no worker
    queue = app.settings.default_queue
    app.create_tables()
    declare_topology(app)
    for tag in ("a", "b", "c"):
        send(app, tasks_dashboard.record, runs, tag)
    park_dead_letters(app, [("d1", "t.x", [1]), ("d2", "t.x", [2])])
    wait_until(lambda: broker.depth(queue) == 3 and dlq_depth(broker, app) == 2)
    base = start_dashboard()

    # When the overview is opened
    page.page.goto(base + "/")

    # Then its queue row shows what the broker reports
    assert _cell(page.page, queue, "ready") == str(broker.depth(queue)) == "3"
    assert _cell(page.page, queue, "dead_letters") == str(dlq_depth(broker, app)) == "2"
    assert _cell(page.page, queue, "consumers") == "0"
    screenshot(page.page, "dashboard-overview")

    # And its queue page says the same
    page.page.click(f"#queues a:has-text('{queue}')")
    assert page.page.inner_text("#queue [data-field=ready]") == "3"
    assert "tests.tasks_dashboard.record" in page.page.inner_text("main")
    page.page.go_back()

    # And a new message shows up without reloading (the page polls /api/overview)
    send(app, tasks_dashboard.record, runs, "d")
    wait_until(lambda: broker.depth(queue) == 4)
    from playwright.sync_api import expect

    cell = page.page.locator(f"#queues tr[data-queue='{queue}'] [data-field=ready]")
    expect(cell).to_have_text("4", timeout=10_000)


def test_a_dead_letter_is_found_replayed_with_a_click_and_then_runs(
    app: App, broker: Any, page: Page, start_worker: Any, runs: str, tmp_path: Path
) -> None:
    # Given a worker serving the dashboard, and a task that failed and was dead-lettered
    # (its argument holds a script)
    app.create_tables()
    flag = str(tmp_path / "fixed.flag")
    worker, base = worker_with_dashboard(start_worker, "--metrics-port", str(free_port()))
    result = send(app, tasks_dashboard.broken_until_fixed, runs, flag, SCRIPT)
    wait_until(lambda: dlq_depth(broker, app) == 1, timeout_s=30, message=worker.log)
    assert count_runs(runs) == 1

    # The overview shows the worker's processes
    page.page.goto(base + "/")
    assert "processes alive: 1 of 1" in page.page.inner_text("#workers")

    # When the operator finds it in the dead-letter browser, logs in and opens it
    page.page.goto(f"{base}/queues/{app.settings.default_queue}/dead-letters/")
    row = page.page.locator(f"#dead-letters tr[data-id='{result.id}']")
    assert "ValueError" in row.inner_text()
    assert page.page.locator("button[name=replay-one]").count() == 0  # not logged in yet
    page.page.click("text=Log in with the token")
    page.page.fill("input[name=token]", TOKEN)
    page.page.click("button[name=login]")
    screenshot(page.page, "dashboard-dead-letters")
    page.page.click(f"a:has-text('{result.id}')")

    # Then its argument shows as text, never run as a script
    assert SCRIPT in page.page.inner_text("#arguments")
    assert page.page.locator("#arguments script").count() == 0
    assert "taskq-error-type" in page.page.inner_text("#headers")
    assert page.dialogs == []
    screenshot(page.page, "dashboard-message")

    # And the task page shows the stored failure with its traceback
    message_url = page.page.url
    page.page.click("text=task page")
    assert page.page.inner_text("#state") == "FAILURE"
    assert "ValueError: the flag file" in page.page.inner_text(".traceback")
    page.page.goto(message_url)

    # When the cause is fixed and the operator clicks Replay
    Path(flag).touch()
    page.page.click("button[name=replay-one]")

    # Then it is replayed once, runs, and its task page shows the success
    assert "replayed 1 of 1" in page.page.inner_text(".flash")
    wait_until(lambda: count_runs(runs) == 2, timeout_s=30, message=worker.log)
    assert result.get(timeout_s=30) == f"fixed {len(SCRIPT)}"
    assert dlq_depth(broker, app) == 0
    page.page.goto(f"{base}/tasks/{result.id}")
    assert page.page.inner_text("#state") == "SUCCESS"
    assert page.dialogs == []

    # And with the worker's metrics on, the acked rate is counted from them (two runs)
    def finished_per_s() -> Any:
        rates = page.page.request.get(f"{base}/api/overview").json()["rates"]["queues"]
        return rates[app.settings.default_queue]["finished_per_s"] is not None
    wait_until(finished_per_s, timeout_s=15, interval_s=1.1)

    # And when a worker process dies, the overview counts the restart (live)
    from playwright.sync_api import expect

    page.page.goto(base + "/")
    assert page.page.inner_text("[data-live='workers.restarts']") == "0"
    (victim,) = worker.children()
    os.kill(victim, signal.SIGKILL)
    expect(page.page.locator("[data-live='workers.restarts']")).to_have_text("1",
                                                                           timeout=15_000)
    expect(page.page.locator("[data-live='workers.alive']")).to_have_text("1", timeout=15_000)


def _form_csrf(page: Any, base: str) -> str:
    page.goto(f"{base}/login")
    return str(page.get_attribute("input[name=csrf_token]", "value"))


def test_without_the_token_a_replay_is_refused_with_403(
    app: App, broker: Any, page: Page, serve_dashboard: Any
) -> None:
    # Given a dead letter and a dashboard with a token, and a browser that has not logged in
    park_dead_letters(app, [("n1", "t.x", [1])])
    wait_until(lambda: dlq_depth(broker, app) == 1)
    base = serve_dashboard()
    replay_url = f"{base}/queues/{app.settings.default_queue}/dead-letters/replay"
    csrf = _form_csrf(page.page, base)

    # When replays are sent without the token (form with the CSRF token; API without or
    # with a wrong bearer token)
    form = page.page.request.post(replay_url, form={"csrf_token": csrf, "id": "n1"})
    api_url = f"{base}/api/queues/{app.settings.default_queue}/dead-letters/replay"
    bare = page.page.request.post(api_url, data=json.dumps({"ids": ["n1"]}),
                                  headers={"Content-Type": "application/json"})
    wrong = page.page.request.post(api_url, data=json.dumps({"ids": ["n1"]}), headers={
        "Content-Type": "application/json", "Authorization": "Bearer nope"})

    # Then each is refused with 403 and the message stays parked
    assert (form.status, bare.status, wrong.status) == (403, 403, 403)
    assert "token" in form.text()
    assert dlq_depth(broker, app) == 1

    # And once logged in, a form without its CSRF token, or from another site, is refused too
    login(page.page, base)
    no_csrf = page.page.request.post(replay_url, form={"id": "n1"})
    cross_site = page.page.request.post(replay_url, form={"csrf_token": csrf, "id": "n1"},
                                        headers={"Origin": "http://evil.example"})
    assert (no_csrf.status, cross_site.status) == (403, 403)
    assert dlq_depth(broker, app) == 1


def test_a_filtered_selection_is_replayed_and_the_rest_stays(
    app: App, broker: Any, page: Page, serve_dashboard: Any
) -> None:
    # Given dead letters of two tasks and an operator logged in
    park_dead_letters(app, [("f1", "t.x", [1]), ("f2", "t.y", [2]), ("f3", "t.x", [3])])
    wait_until(lambda: dlq_depth(broker, app) == 3)
    base = serve_dashboard()
    login(page.page, base)
    queue = app.settings.default_queue

    # When the list is filtered to t.x and that selection is replayed
    page.page.goto(f"{base}/queues/{queue}/dead-letters/")
    page.page.select_option("select[name=task]", "t.x")
    page.page.click("button:has-text('Filter')")
    assert page.page.locator("#dead-letters tr[data-id]").count() == 2
    page.page.click("button:has-text('Replay every t.x')")

    # Then the two t.x messages went back to the queue and the t.y one stayed parked
    assert "replayed 2 of 3" in page.page.inner_text(".flash")
    wait_until(lambda: broker.depth(queue) == 2)
    assert dlq_depth(broker, app) == 1
    ids = page.page.locator("#dead-letters tr[data-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.id)")
    assert ids == ["f2"]


def test_a_purge_needs_its_confirmation(
    app: App, broker: Any, page: Page, serve_dashboard: Any
) -> None:
    # Given two dead letters and an operator logged in
    park_dead_letters(app, [("p1", "t.x", [1]), ("p2", "t.y", [2])])
    wait_until(lambda: dlq_depth(broker, app) == 2)
    base = serve_dashboard()
    login(page.page, base)
    label = topo.dlq_name(app.settings.default_queue)

    # When Purge is clicked, nothing is deleted yet: a confirmation page asks
    page.page.goto(f"{base}/queues/{app.settings.default_queue}/dead-letters/")
    page.page.click("text=Purge…")
    assert page.page.inner_text("#purge-depth") == "2"
    assert dlq_depth(broker, app) == 2

    # When it is confirmed with the wrong name, nothing is deleted
    page.page.fill("input[name=confirm]", "something else")
    page.page.click("button[name=purge]")
    assert f"not purged: type {label}" in page.page.inner_text(".flash")
    assert dlq_depth(broker, app) == 2

    # When the queue's name is typed, the queue is purged
    page.page.fill("input[name=confirm]", label)
    page.page.click("button[name=purge]")
    assert f"purged 2 messages from {label}" in page.page.inner_text(".flash")
    assert dlq_depth(broker, app) == 0


def test_read_only_mode_has_no_action_buttons(
    app: App, broker: Any, page: Page, serve_dashboard: Any
) -> None:
    # Given a read-only dashboard (with a token, logged in) and a parked message
    park_dead_letters(app, [("r1", "t.x", [1])])
    wait_until(lambda: dlq_depth(broker, app) == 1)
    base = serve_dashboard(read_only=True)
    login(page.page, base)
    queue = app.settings.default_queue

    # Then neither the list nor the message nor the purge page offers any action
    page.page.goto(f"{base}/queues/{queue}/dead-letters/")
    assert page.page.locator("#dead-letters tr[data-id='r1']").count() == 1
    assert "read-only mode" in page.page.inner_text("main")
    page.page.goto(f"{base}/queues/{queue}/dead-letters/m/r1")
    assert page.page.inner_text("#summary")
    for path in (f"/queues/{queue}/dead-letters/", f"/queues/{queue}/dead-letters/m/r1"):
        page.page.goto(base + path)
        assert page.page.locator("form[method=post]").count() == 0
        assert page.page.locator("a.button, button:has-text('Replay')").count() == 0
    assert page.page.goto(f"{base}/queues/{queue}/dead-letters/purge").status == 403

    # And the API refuses a replay even with the token
    refused = page.page.request.post(
        f"{base}/api/queues/{queue}/dead-letters/replay", data='{"all": true}',
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    assert refused.status == 403
    assert "read-only" in refused.json()["error"]
    assert dlq_depth(broker, app) == 1


def test_an_unknown_queue_is_404_and_an_undeclared_parking_queue_is_empty(
    app: App, page: Page, serve_dashboard: Any
) -> None:
    # Given a dashboard without a token, before any worker declared the app's queues
    base = serve_dashboard(token=None)

    # Then a queue the app does not know is a 404 naming the ones it knows
    response = page.page.goto(f"{base}/queues/no-such-{uuid.uuid4().hex[:6]}")
    assert response.status == 404
    assert f"this app knows {app.settings.default_queue}" in page.page.inner_text("main")

    # And the unroutable queue, not declared yet, is shown empty with the reason
    response = page.page.goto(f"{base}/unroutable/")
    assert response.status == 200
    assert "not declared yet" in page.page.inner_text("#missing")
    assert "no token" in page.page.inner_text("main")


def test_with_the_management_api_the_overview_shows_unacked_and_the_brokers_rates(
    page: Page, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a private node with the management plugin, a publisher sending 20 messages/s,
    # a consumer holding 3 unacked messages and another acking the rest
    node = ManagedRabbit()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    server: DashboardServer | None = None
    try:
        node.start()
        monkeypatch.setattr(management, "MANAGEMENT_PORT", node.management_port)
        app = App("managed", broker_url=node.url, namespace=f"dash{uuid.uuid4().hex[:6]}",
                  database_url=f"sqlite:///{tmp_path}/t.db")
        queue = app.settings.default_queue
        app.create_tables()
        declare_topology(app)
        threads = [threading.Thread(target=target, args=(node.url, queue, stop), daemon=True)
                   for target in (_publish_20_per_s, _hold_3_unacked, _ack_everything)]
        for thread in threads:
            thread.start()
        server = DashboardServer(app, port=0, token=TOKEN)
        server.start()
        base = f"http://127.0.0.1:{server.port}"

        # When the overview is opened and its live counts have caught up
        page.page.goto(base + "/")

        def row_shows_the_rates() -> bool:
            published = _rate_cell(page.page, queue, "published_per_s")
            acked = _rate_cell(page.page, queue, "acked_per_s")
            return (_cell(page.page, queue, "unacked") == "3" and published is not None
                    and 10 <= published <= 30 and acked is not None and 10 <= acked <= 30)

        wait_until(row_shows_the_rates, timeout_s=45, interval_s=0.5,
                   message=lambda: page.page.inner_text("#queues"))

        # Then it names its source and shows the broker's counts, and no note says n/a
        assert "via the management API" in " ".join(page.page.inner_text(".source").split())
        assert _cell(page.page, queue, "consumers") == "2"
        # (the notes are live too: the first observation's "refresh again" goes)
        wait_until(lambda: "refresh again" not in page.page.inner_text("#rate-notes"),
                   timeout_s=15, interval_s=0.5)
        assert "management plugin" not in page.page.inner_text("#rate-notes")
        screenshot(page.page, "dashboard-overview-management")
        # And the JSON API's queue figures equal taskq status --json's
        api = page.page.request.get(f"{base}/api/overview").json()["status"]["queues"]
        status = collect(app).to_dict()["queues"]
        pick = ("name", "unacked", "consumers", "dead_letters")
        assert [{k: q[k] for k in pick} for q in api] == [{k: q[k] for k in pick}
                                                          for q in status]
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        if server is not None:
            server.stop()
        node.close()


def _rate_cell(page: Any, queue: str, rate: str) -> float | None:
    text = page.inner_text(f"#queues tr[data-queue='{queue}'] [data-rate={rate}]")
    try:
        return float(text)
    except ValueError:
        return None  # n/a, not collected yet


def _publish_20_per_s(url: str, queue: str, stop: threading.Event) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    try:
        while not stop.is_set():
            channel.basic_publish("", queue, b"x")
            connection.sleep(0.05)
    finally:
        connection.close()


def _hold_3_unacked(url: str, queue: str, stop: threading.Event) -> None:
    _consume(url, queue, stop, prefetch=3, ack=False)


def _ack_everything(url: str, queue: str, stop: threading.Event) -> None:
    _consume(url, queue, stop, prefetch=50, ack=True)


def _consume(url: str, queue: str, stop: threading.Event, *, prefetch: int, ack: bool) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=prefetch)

    def on_message(ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
        if ack:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    try:
        while not stop.is_set():
            connection.process_data_events(time_limit=0.2)
    finally:
        connection.close()
