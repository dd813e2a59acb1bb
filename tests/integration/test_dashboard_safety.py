"""The dashboard's safety rules (docs/dashboard.md, "Safety"), through the real Flask app and
the real server: which ``Host`` it answers (DNS rebinding), that a token guards reads of a
bare :func:`~taskq.dashboard.web.create_app`, that login never redirects to another site,
that refused tokens are logged without their value, and the documented cut lengths.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.dashboard import data
from taskq.dashboard.server import DashboardServer
from taskq.dashboard.web import create_app
from taskq.message import Envelope, encode
from taskq.republish import dead_letter_headers
from tests.conftest import BROKER_URL
from tests.support.rabbitmq_nodes import answers, free_port
from tests.support.waiting import wait_until
from tests.system.workers import ROOT, declare_topology

TOKEN = "the-dashboard-token"


@pytest.fixture
def app(make_app: Any) -> App:
    app = make_app()
    app.create_tables()
    return app


@pytest.fixture
def serve(app: App) -> Iterator[Any]:
    """Factory: a real :class:`DashboardServer` on a free port of ``host``; returns it."""
    servers: list[DashboardServer] = []

    def start(host: str = "127.0.0.1", **options: Any) -> DashboardServer:
        server = DashboardServer(app, host=host, port=0, **options)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def _get(port: int, path: str, host: str, address: str = "127.0.0.1") -> tuple[int, str]:
    """GET ``path`` from ``address:port`` with ``Host: host``, as a rebound page's script
    would send it (the browser names the page's host, whatever address it resolved to)."""
    connection = http.client.HTTPConnection(address, port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=True)
        connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


# -- 3.7: DNS rebinding --------------------------------------------------------------------


def test_a_request_for_another_host_name_is_refused_on_loopback(
    app: App, broker: Any, serve: Any
) -> None:
    # Given a dashboard on loopback (no token: reading needs nothing there) and a dead letter
    _park(app, broker, error="boom", argument="secret argument")
    server = serve()
    port = server.port
    dead_letters = f"/api/queues/{app.settings.default_queue}/dead-letters"

    # When a page whose name was rebound to 127.0.0.1 reads it (Host: its own name)
    for path in (dead_letters, "/api/outbox", "/", "/login", "/static/dashboard.css"):
        status, body = _get(port, path, f"evil.example:{port}")
        # Then every path is refused, saying which Host and how to allow it
        assert status == 400, (path, body)
        assert f"evil.example:{port}" in body
        assert "--allow-host evil.example" in body
        assert "TASKQ_DASHBOARD_ALLOWED_HOSTS" in body
        assert "secret argument" not in body
    # (and nothing was taken off the parking queue to answer it)
    assert broker.depth(topo.dlq_name(app.settings.default_queue)) == 1

    # While the names it was bound as are answered
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        status, body = _get(port, dead_letters, host)
        assert status == 200, (host, body)
        assert '"d1"' in body
    status, body = _get(port, f"{dead_letters}/m/d1", f"127.0.0.1:{port}")
    assert status == 200 and "secret argument" in body


def test_names_given_with_allow_host_or_the_setting_are_answered(make_app: Any) -> None:
    # Given a dashboard told about two names: one option, one setting
    app = make_app(dashboard_allowed_hosts="dash.example, Ops.Example")
    server = DashboardServer(app, port=0, allowed_hosts=("cli.example",))
    server.start()
    try:
        port = server.port
        # Then those names are answered (any case), and others still refused
        for host in ("cli.example", "dash.example", "ops.example", "OPS.EXAMPLE"):
            assert _get(port, "/login", f"{host}:{port}")[0] == 200, host
        assert _get(port, "/login", f"evil.example:{port}")[0] == 400
        assert _get(port, "/login", f"dash.example.evil.example:{port}")[0] == 400
    finally:
        server.stop()


def test_taskq_dashboard_answers_allow_host_names_and_the_setting(
    app: App, tmp_path: Path
) -> None:
    # Given `taskq dashboard --allow-host cli.example` with TASKQ_DASHBOARD_ALLOWED_HOSTS set
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
           "PYTHONPATH": str(ROOT), "TASKQ_BROKER_URL": BROKER_URL,
           "TASKQ_NAMESPACE": app.settings.namespace,
           "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
           "TASKQ_DATABASE_URL": app.settings.database_url,
           "TASKQ_DASHBOARD_ALLOWED_HOSTS": "env.example"}
    log_path = tmp_path / "dashboard.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "taskq", "dashboard", "-A", "tests.tasks_dashboard:app",
             "--port", str(port), "--allow-host", "cli.example"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: answers(port) or process.poll() is not None, timeout_s=20,
                   message=log_path.read_text)
        assert process.poll() is None, log_path.read_text()
        # Then both names are answered, and any other is refused with the way to allow it
        assert _get(port, "/api/outbox", f"cli.example:{port}")[0] == 200
        assert _get(port, "/api/outbox", f"env.example:{port}")[0] == 200
        status, body = _get(port, "/api/outbox", f"other.example:{port}")
        assert status == 400 and "--allow-host other.example" in body
    finally:
        process.terminate()
        process.wait(10)
    assert "refused" in log_path.read_text()  # the refusal is logged


def test_create_app_answers_only_loopback_names_unless_told(app: App) -> None:
    client = create_app(app).test_client()
    assert client.get("/api/outbox").status_code == 200  # the test client's Host: localhost
    refused = client.get("/api/outbox", headers={"Host": "evil.example"})
    assert refused.status_code == 400
    assert "'evil.example'" in refused.get_json()["error"]
    told = create_app(app, allowed_hosts=("evil.example",)).test_client()
    assert told.get("/api/outbox", headers={"Host": "evil.example"}).status_code == 200


def test_create_app_with_a_token_serves_no_read_without_it(app: App) -> None:
    # A WSGI server elsewhere may listen on any address: the token guards every page
    client = create_app(app, token=TOKEN).test_client()
    assert client.get("/api/outbox").status_code == 403
    assert client.get("/").status_code == 403
    assert client.get("/outbox").status_code == 403
    assert client.get("/login").status_code == 200
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/outbox", headers=bearer).status_code == 200


# -- 3.8: no open redirect at login ---------------------------------------------------------

HOSTILE_NEXT = [
    ("tab", "/\t/evil.example/x"),
    ("tab-first", "\t//evil.example/x"),
    ("encoded-tab", "/%09/evil.example/x"),
    ("newline", "/\n/evil.example/x"),
    ("cr-lf", "/\r\n/evil.example/x"),
    ("encoded-cr-lf", "/%0d%0a/evil.example/x"),
    ("nul", "/\x00/evil.example/x"),
    ("scheme-relative", "//evil.example/x"),
    ("three-slashes", "///evil.example/x"),
    ("slash-backslash", "/\\evil.example/x"),
    ("backslashes", "\\\\evil.example/x"),
    ("backslash-slash", "\\/evil.example/x"),
    ("encoded-slash", "/%2Fevil.example/x"),
    ("encoded-slash-upper", "/%2f%2Fevil.example/x"),
    ("encoded-backslash", "/%5Cevil.example/x"),
    ("space-first", " //evil.example/x"),
    ("http", "http://evil.example/x"),
    ("https-no-slashes", "https:evil.example/x"),
    ("javascript", "javascript:alert(1)"),
    ("data", "data:text/html,<script>alert(1)</script>"),
    ("bare-host", "evil.example/x"),
    ("unicode-line-separator", "/\u2028/evil.example/x"),
    ("zero-width-space", "/\u200b/evil.example/x"),
    ("empty", ""),
]

SAFE_NEXT = ["/queues/q/dead-letters/?task=t.x", "/tasks/abc-1", "/", "/queues/a%20b"]


def _login(client: Any, next_path: str, token: str = TOKEN) -> Any:
    page = client.get("/login?next=" + quote(next_path, safe=""))
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
    assert csrf is not None
    return client.post("/login", data={"token": token, "csrf_token": csrf[1],
                                       "next": next_path})


@pytest.mark.parametrize("next_path", [n for _, n in HOSTILE_NEXT],
                         ids=[i for i, _ in HOSTILE_NEXT])
def test_login_never_redirects_to_another_site(app: App, next_path: str) -> None:
    client = create_app(app, token=TOKEN).test_client()
    response = _login(client, next_path)
    assert response.status_code == 302
    assert response.headers["Location"] == "/"


@pytest.mark.parametrize("next_path", SAFE_NEXT)
def test_login_returns_to_the_page_it_came_from(app: App, next_path: str) -> None:
    client = create_app(app, token=TOKEN).test_client()
    response = _login(client, next_path)
    assert response.status_code == 302
    assert response.headers["Location"] == next_path


# -- docs/dashboard.md "Safety" agrees with the code ----------------------------------------


def test_every_refused_token_is_logged_without_its_value(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a dashboard whose pages need the token (as off loopback)
    client = create_app(app, token=TOKEN, reads_need_login=True).test_client()
    wrong = "not-the-token-6f1e2d"
    bearer = {"Authorization": f"Bearer {wrong}"}
    caplog.set_level(logging.WARNING, logger="taskq.dashboard")

    # When a wrong token is given to a read, to an action and at login
    read = client.get("/api/outbox", headers=bearer)
    action = client.post(f"/api/queues/{app.settings.default_queue}/dead-letters/purge",
                         json={"confirm": "x"}, headers=bearer)
    login = _login(client, "/", token=wrong)

    # Then each is refused, and each refusal is logged with the client's address and what
    # was refused, never with the token given
    assert (read.status_code, action.status_code, login.status_code) == (403, 403, 403)
    refusals = [r for r in caplog.records if r.name == "taskq.dashboard.security"
                and r.levelno == logging.WARNING]
    assert len(refusals) == 3, [r.getMessage() for r in refusals]
    messages = [r.getMessage() for r in refusals]
    assert all("127.0.0.1" in m and "refused" in m for m in messages)
    assert ["GET /api/outbox" in messages[0], "POST /api/" in messages[1],
            "POST /login" in messages[2]] == [True, True, True]
    assert wrong not in caplog.text and TOKEN not in caplog.text


def test_values_are_cut_where_the_docs_say(app: App, broker: Any) -> None:
    # Given a dead letter with a long error and argument, and an outbox row with a long error
    long_error, long_argument = "e" * 1000, "a" * 1000
    _park(app, broker, error=long_error, argument=long_argument)
    client = create_app(app).test_client()
    queue = app.settings.default_queue

    # Then the dead-letter list cuts the error; the message page shows it whole and cuts
    # the argument; an outbox row's error is shown as the relay stored it (cut to its
    # first OUTBOX_ERROR_MAX_CHARS characters)
    listing = client.get(f"/api/queues/{queue}/dead-letters").get_json()
    value = data.VALUE_MAX_CHARS
    assert listing["messages"][0]["error"] == f"{'e' * value}... ({1000 - value} more characters)"
    message = client.get(f"/api/queues/{queue}/dead-letters/m/d1").get_json()
    assert message["error"] == long_error
    assert message["args"] == [f"{'a' * value}... ({1000 - value} more characters)"]
    _outbox_row_failing_with(app, "o" * 3000)
    (row,) = client.get("/api/outbox").get_json()["failing"]
    cut = data.OUTBOX_ERROR_MAX_CHARS
    assert row["last_error"] == "o" * cut

    # And docs/dashboard.md states those lengths
    safety = (ROOT / "docs" / "dashboard.md").read_text().split("## Safety")[1]
    safety = " ".join(safety.split("## ")[0].split())
    assert f"cut at {value} characters" in safety
    assert f"first {cut} characters" in safety


def _park(app: App, broker: Any, *, error: str, argument: str) -> None:
    """One dead letter ``d1`` in the app's ``Q.dlq``, as a worker leaves it."""
    declare_topology(app)
    queue = app.settings.default_queue
    wire = encode(Envelope(task_id="d1", task="t.x", args=[argument]))
    headers = dead_letter_headers(wire.headers, error_type="ValueError", error=error,
                                  traceback=None, attempts=1, origin_queue=queue,
                                  traceback_max_chars=100)
    with pika.BlockingConnection(pika.URLParameters(BROKER_URL)) as connection:
        connection.channel().basic_publish(app.topology.dlx, queue, wire.body,
                                           pika.BasicProperties(
                                               message_id="d1", headers=headers,
                                               delivery_mode=2,
                                               content_type=wire.content_type))
    wait_until(lambda: broker.depth(topo.dlq_name(queue)) == 1)


def _outbox_row_failing_with(app: App, error: str) -> None:
    from datetime import timedelta

    from taskq.db import utcnow
    from taskq.outbox.store import OutboxRow, OutboxStore

    store = OutboxStore()
    row = OutboxRow(id="o1", queue=app.settings.default_queue, task="shop.mail",
                    body=b"\x92\x90\x80", headers={}, priority=0, eta=None,
                    idempotency_key=None, created_at=store.created_at())
    with app.engine.begin() as conn:
        store.add(conn, row)
        store.defer(conn, row, next_attempt_at=utcnow() + timedelta(minutes=5), error=error)

