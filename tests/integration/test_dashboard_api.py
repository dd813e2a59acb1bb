"""The dashboard's JSON API against the real broker: its numbers are ``taskq status``'s.

``taskq dashboard`` and ``taskq status`` run as ``python -m taskq`` processes with the
test's ``TASKQ_*`` settings (``-A tests.tasks_dashboard:app``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.dashboard.web import create_app
from taskq.message import Envelope, encode
from taskq.republish import dead_letter_headers
from tests.conftest import BROKER_URL
from tests.support.rabbitmq_nodes import answers, free_port
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, declare_topology

APP_PATH = "tests.tasks_dashboard:app"


def _env(app: App) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
    }


@pytest.fixture
def app(make_app: Any) -> App:
    app = make_app()
    app.create_tables()
    return app


@pytest.fixture
def dashboard_url(app: App, tmp_path: Any) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "taskq", "dashboard", "-A", APP_PATH, "--port", str(port)],
        cwd=ROOT, env=_env(app), stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: answers(port) or process.poll() is not None, timeout_s=20)
        assert process.poll() is None, (tmp_path / "dashboard.log").read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _status_json(app: App) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "taskq", "status", "-A", APP_PATH, "--json"],
                          cwd=ROOT, env=_env(app), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _publish(app: App, ready: int, dead: int) -> None:
    declare_topology(app)
    queue = app.settings.default_queue
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        channel = connection.channel()
        for n in range(ready + dead):
            wire = encode(Envelope(task_id=f"m{n}", task="t.x", args=[n]))
            headers, exchange = wire.headers, app.topology.exchange
            if n >= ready:
                exchange = app.topology.dlx
                headers = dead_letter_headers(
                    wire.headers, error_type="ValueError", error="boom", traceback=None,
                    attempts=1, origin_queue=queue, traceback_max_chars=100)
            channel.basic_publish(exchange, queue, wire.body, pika.BasicProperties(
                message_id=f"m{n}", headers=headers, delivery_mode=2))
    finally:
        connection.close()


def test_api_numbers_equal_taskq_status_json(app: App, broker: Any, dashboard_url: str) -> None:
    # Given 5 ready messages and 2 dead letters in the app's queue
    queue = app.settings.default_queue
    _publish(app, ready=5, dead=2)
    wait_until(lambda: broker.depth(queue) == 5 and broker.depth(topo.dlq_name(queue)) == 2)

    # When the API and `taskq status --json` are asked
    api = _get(f"{dashboard_url}/api/status")
    overview = _get(f"{dashboard_url}/api/overview")
    cli = _status_json(app)

    # Then they agree, number for number, and match the broker
    assert api == cli == overview["status"]
    row = next(q for q in api["queues"] if q["name"] == queue)
    assert (row["ready"], row["dead_letters"]) == (5, 2)
    assert api["outbox"] == {"rows": 0, "oldest_age_s": 0.0, "failing_rows": 0, "error": None}
    assert "***" in api["broker_url"] and "guest:guest" not in json.dumps(overview)

    # And the dead-letter listing names both parked messages
    listing = _get(f"{dashboard_url}/api/queues/{queue}/dead-letters")
    assert listing["depth"] == 2
    assert [m["task_id"] for m in listing["messages"]] == ["m5", "m6"]
    message = _get(f"{dashboard_url}/api/queues/{queue}/dead-letters/m/m5")
    assert message["args"] == ["5"] and message["headers"]["taskq-error-type"] == "ValueError"
    task = _get(f"{dashboard_url}/api/tasks/m5")
    assert (task["task_id"], task["state"], task["stored"]) == ("m5", "DEAD", False)
    assert task["dead_letter_queue"] == topo.dlq_name(queue)


def test_a_non_loopback_host_without_a_token_is_refused(app: App) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "taskq", "dashboard", "-A", APP_PATH, "--host", "0.0.0.0"],
        cwd=ROOT, env=_env(app), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "refusing to serve the dashboard on 0.0.0.0" in done.stderr
    assert "set TASKQ_DASHBOARD_TOKEN (or --token for taskq dashboard" in done.stderr


def test_without_flask_the_command_says_how_to_install_it(app: App) -> None:
    code = ("import sys; sys.modules['flask'] = None; from taskq.cli import main; "
            f"sys.argv = ['taskq', 'dashboard', '-A', {APP_PATH!r}]; main()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(app),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "pip install 'taskq[dashboard]'" in done.stderr


def test_off_loopback_every_page_needs_the_token(app: App) -> None:
    client = create_app(app, token="tok", reads_need_login=True).test_client()
    assert client.get("/api/status").status_code == 403
    assert client.get("/").status_code == 403
    assert client.get("/login").status_code == 200
    assert client.get("/api/status", headers={"Authorization": "Bearer tok"}).status_code == 200


def test_responses_forbid_inline_script_and_framing(app: App) -> None:
    response = create_app(app).test_client().get("/login")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"


def _outbox_rows(app: App) -> None:
    """Two rows through the store's own SQL; the second one's publish failed once."""
    from datetime import timedelta

    from taskq.db import utcnow
    from taskq.outbox.store import OutboxRow, OutboxStore

    store = OutboxStore()
    rows = [OutboxRow(id=f"o{n}", queue=app.settings.default_queue, task="shop.mail",
                      body=b"\x92\x90\x80", headers={}, priority=0, eta=None,
                      idempotency_key=None, created_at=store.created_at()) for n in (1, 2)]
    with app.engine.begin() as conn:
        for row in rows:
            store.add(conn, row)
        store.defer(conn, rows[1], next_attempt_at=utcnow() + timedelta(minutes=5),
                    error="<b>PublishError</b>: the broker nacked it")


def test_outbox_page_lists_waiting_and_failing_rows_with_their_error(app: App) -> None:
    _outbox_rows(app)
    client = create_app(app).test_client()

    api = client.get("/api/outbox").get_json()
    page = client.get("/outbox").get_data(as_text=True)

    assert (api["rows"], api["failing_rows"]) == (2, 1)
    assert [r["id"] for r in api["waiting"]] == ["o1", "o2"]
    assert [(r["id"], r["attempts"]) for r in api["failing"]] == [("o2", 1)]
    assert api["failing"][0]["last_error"] == "<b>PublishError</b>: the broker nacked it"
    failing = page[page.index('id="failing"'):page.index('id="waiting"')]
    assert "<code>o2</code>" in failing and "<code>o1</code>" not in failing
    assert "&lt;b&gt;PublishError&lt;/b&gt;: the broker nacked it" in failing
    assert "<b>PublishError" not in page


def test_queue_page_and_api_show_the_queue(app: App, broker: Any) -> None:
    queue = app.settings.default_queue
    _publish(app, ready=2, dead=1)
    wait_until(lambda: broker.depth(queue) == 2)
    client = create_app(app).test_client()

    api = client.get(f"/api/queues/{queue}").get_json()
    page = client.get(f"/queues/{queue}").get_data(as_text=True)

    assert (api["queue"]["ready"], api["queue"]["dead_letters"]) == (2, 1)
    assert api["rates"]["published_per_s"] is None and api["rate_notes"]
    assert '<td class="n" data-field="ready">2</td>' in page
    assert client.get("/queues/not-a-queue-of-this-app").status_code == 404


def test_unroutable_messages_are_listed_and_replayed_once_their_queue_exists(
    app: App, broker: Any
) -> None:
    # Given a message published before its queue existed: parked in ns.unroutable
    from taskq.broker.connection import declare, open_connection

    queue = app.settings.default_queue
    connection = open_connection(app.settings, client_name="taskq tests")
    try:
        declare(connection.channel(), app.topology.base())
    finally:
        connection.close()
    with pika.BlockingConnection(pika.URLParameters(BROKER_URL)) as raw:
        wire = encode(Envelope(task_id="u1", task="t.x", args=["<i>x</i>"]))
        raw.channel().basic_publish(app.topology.exchange, queue, wire.body, pika.BasicProperties(
            message_id="u1", headers=wire.headers, delivery_mode=2))
    unroutable = topo.unroutable_name(app.settings.namespace)
    wait_until(lambda: broker.depth(unroutable) == 1)
    client = create_app(app, token="tok").test_client()
    auth = {"Authorization": "Bearer tok"}

    # Then it is listed with the queue a replay sends it to (create_app with a token: reads
    # need it too)
    listing = client.get("/api/unroutable", headers=auth).get_json()
    assert [(m["task_id"], m["destination"]) for m in listing["messages"]] == [("u1", queue)]
    assert client.get("/api/unroutable/m/u1", headers=auth).get_json()["args"] == ["<i>x</i>"]

    # While its queue does not exist, a replay leaves it parked and says why
    first = client.post("/api/unroutable/replay", json={"all": True}, headers=auth).get_json()
    assert (first["replayed"], first["unroutable"]) == (0, 1)
    assert broker.depth(unroutable) == 1

    # Once the queue exists, the replay moves it there
    declare_topology(app)
    second = client.post("/api/unroutable/replay", json={"ids": ["u1"]}, headers=auth)
    assert second.get_json()["replayed"] == 1
    wait_until(lambda: broker.depth(queue) == 1)
    assert broker.depth(unroutable) == 0

    # And a purge needs the confirmation in its body
    wrong = client.post("/api/unroutable/purge", json={"confirm": "yes"}, headers=auth)
    assert wrong.status_code == 400 and "unroutable (parked)" in wrong.get_json()["error"]
    right = client.post("/api/unroutable/purge", json={"confirm": "unroutable (parked)"},
                        headers=auth)
    assert right.get_json() == {"purged": 0}


def test_the_overview_shows_the_apps_schedules_and_the_scheduler_that_fired_them(
    app: App,
) -> None:
    # Given an app with a periodic task whose scheduler fired its first tick
    from taskq.schedules.scheduler import Scheduler

    app.task(name="tests.dashboard.report")(lambda: None)
    app.add_periodic_task(3600, "tests.dashboard.report", name="hourly-report")
    scheduler = Scheduler(app)
    scheduler.start()
    try:
        scheduler.step()
        # When the overview and its API are read
        client = create_app(app).test_client()
        page = client.get("/").get_data(as_text=True)
        data = client.get("/api/status").get_json()
    finally:
        scheduler.stop()
    # Then the schedule is listed with its next and last run, beside the scheduler seen
    (schedule,) = data["schedules"]
    assert schedule["name"] == "hourly-report" and schedule["next_run"]
    assert [s["pid"] for s in data["schedulers"]] == [os.getpid()]
    assert 'id="schedules"' in page and "hourly-report" in page
    assert schedule["next_run"][:16] in page.replace("T", " ") or schedule["next_run"][:16] in page
