"""Browser tests of the dashboard: Playwright driving Debian's Chromium (docs/dashboard.md).

``playwright install`` downloads browser builds from a host this machine cannot reach, so
the tests launch the system Chromium (``/usr/bin/chromium``, or ``TASKQ_TEST_CHROMIUM``),
which ``make test`` installs with ``scripts/ensure-browser.sh``. Without Playwright or
Chromium every test here is skipped with the reason.

The dashboard and the worker run as real ``python -m taskq`` processes with the test's
``TASKQ_*`` settings against the shared broker and the test's own SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from taskq import App
from taskq.broker import topology as topo
from taskq.message import Envelope, encode
from taskq.republish import dead_letter_headers
from tests.conftest import BROKER_URL
from tests.support.rabbitmq_nodes import answers, free_port
from tests.support.waiting import wait_until
from tests.system.conftest import app, runs, start_worker  # noqa: F401 - fixtures
from tests.system.workers import ROOT, Worker, declare_topology

CHROMIUM = os.environ.get("TASKQ_TEST_CHROMIUM", "/usr/bin/chromium")
IMAGES = ROOT / "docs" / "images"
# Read at import: the autouse fixture of tests/conftest.py removes TASKQ_* variables (other
# than TASKQ_TEST_*) from every test's environment, this one included.
SCREENSHOTS = os.environ.get("TASKQ_SCREENSHOTS") == "1"
TOKEN = "s3cret-dashboard-token"
APP_PATH = "tests.tasks_dashboard:app"


def _why_no_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"Playwright is not installed ({exc}): pip install -e '.[dev]' (make test does)"
    if not os.access(CHROMIUM, os.X_OK):
        return (f"no Chromium at {CHROMIUM}: apt-get install -y chromium as root "
                "(make test runs scripts/ensure-browser.sh), or set TASKQ_TEST_CHROMIUM")
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, headless, driven by Playwright (skips with the reason when unavailable).

    Module-scoped, not session-scoped: Playwright's sync API keeps an asyncio loop running
    in the main thread while it is started, and Django refuses database calls from a thread
    with a running loop (SynchronousOnlyOperation), so it must stop before other tests run.
    """
    reason = _why_no_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            chromium.close()


class Page:
    """A browser page and the dialogs (``alert``...) it opened."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        page.on("dialog", self._on_dialog)

    def _on_dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield Page(context.new_page())
    finally:
        context.close()


def taskq_env(app: App, **extra: str) -> dict[str, str]:  # noqa: F811
    """The environment a ``python -m taskq`` process of this test runs with."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": BROKER_URL,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
        **extra,
    }


@pytest.fixture
def start_dashboard(app: App, tmp_path: Path) -> Iterator[Callable[..., str]]:  # noqa: F811
    """Factory: ``start_dashboard("--read-only", token=...)`` runs ``taskq dashboard``
    and returns its base URL once it answers."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(*args: str, token: str | None = TOKEN) -> str:
        port = free_port()
        log_path = tmp_path / f"dashboard-{len(processes) + 1}.log"
        env = taskq_env(app, **({"TASKQ_DASHBOARD_TOKEN": token} if token else {}))
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "taskq", "dashboard", "-A", APP_PATH, "--port",
                 str(port), *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        processes.append(process)
        wait_until(lambda: answers(port) or process.poll() is not None, timeout_s=20,
                   message=lambda: log_path.read_text())
        assert process.poll() is None, log_path.read_text()
        return f"http://127.0.0.1:{port}"

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture
def serve_dashboard(app: App) -> Iterator[Callable[..., str]]:  # noqa: F811
    """Factory: the same server as ``taskq dashboard``, on a thread of the test process
    (saves starting an interpreter; the command itself is driven by ``start_dashboard``)."""
    from taskq.dashboard.server import DashboardServer

    servers: list[DashboardServer] = []

    def serve(*, token: str | None = TOKEN, read_only: bool = False) -> str:
        server = DashboardServer(app, port=0, token=token, read_only=read_only)
        servers.append(server)
        server.start()
        return f"http://127.0.0.1:{server.port}"

    yield serve
    for server in servers:
        server.stop()


def worker_with_dashboard(start: Callable[..., Worker], *args: str) -> tuple[Worker, str]:
    """Start ``taskq worker --dashboard-port`` (token from the environment); return it and
    the dashboard's base URL."""
    port = free_port()
    worker = start("-c", "1", "--dashboard-port", str(port), *args, app_path=APP_PATH,
                   loglevel="INFO", env={"TASKQ_DASHBOARD_TOKEN": TOKEN})
    wait_until(lambda: answers(port), timeout_s=30, message=worker.log)
    return worker, f"http://127.0.0.1:{port}"


def park_dead_letters(app: App, calls: list[tuple[str, str, list[Any]]]) -> None:  # noqa: F811
    """Put dead letters ``(task_id, task, args)`` in Q.dlq as a worker leaves them."""
    declare_topology(app)
    queue = app.settings.default_queue
    connection = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    try:
        channel = connection.channel()
        for task_id, task, args in calls:
            wire = encode(Envelope(task_id=task_id, task=task, args=args))
            headers = dead_letter_headers(
                wire.headers, error_type="ValueError", error="boom", traceback=None,
                attempts=1, origin_queue=queue, traceback_max_chars=100,
            )
            channel.basic_publish(app.topology.dlx, queue, wire.body, pika.BasicProperties(
                message_id=task_id, headers=headers, delivery_mode=2,
                content_type=wire.content_type, timestamp=wire.timestamp))
    finally:
        connection.close()


def login(page: Any, base: str, token: str = TOKEN) -> None:
    """Log in through the form (the token is kept in the session cookie)."""
    page.goto(f"{base}/login")
    page.fill("input[name=token]", token)
    page.click("button[name=login]")


def screenshot(page: Any, name: str) -> None:
    """Take the page's screenshot for docs/dashboard.md.

    ``make screenshots`` (``TASKQ_SCREENSHOTS=1``) writes it to docs/images/NAME.png; other
    runs write it under the temporary directory, so a test run leaves the tree clean.
    """
    if SCREENSHOTS:
        directory = IMAGES
    else:
        directory = Path(tempfile.gettempdir()) / "taskq-screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(directory / f"{name}.png"), full_page=True)


def dlq_depth(broker: Any, app: App) -> int:  # noqa: F811
    return int(broker.depth(topo.dlq_name(app.settings.default_queue)))
