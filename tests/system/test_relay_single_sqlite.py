"""A second outbox relay on the same SQLite database is refused (issue 28, item 5), the way
a second scheduler is: it would publish every row twice (no SKIP LOCKED on SQLite)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from taskq import App
from tests.support.waiting import wait_until
from tests.system.workers import ROOT

EXIT_FATAL = 78


def _start_relay(app: App, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
        "PYTHONPATH": str(ROOT),
        "TASKQ_BROKER_URL": app.settings.broker_url,
        "TASKQ_NAMESPACE": app.settings.namespace,
        "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
        "TASKQ_DATABASE_URL": app.settings.database_url,
    }
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "taskq", "relay", "-A", "tests.tasks:app"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_a_second_relay_on_one_sqlite_file_is_refused_naming_the_first(
    app: App, tmp_path: Path
) -> None:
    database = app.settings.database_url.removeprefix("sqlite:///")
    first_log, second_log, third_log = (tmp_path / f"relay-{n}.log" for n in (1, 2, 3))
    first = _start_relay(app, first_log)
    second = third = None
    try:
        wait_until(lambda: "outbox relay started" in first_log.read_text(), timeout_s=30,
                   message=lambda: f"the first relay; log:\n{first_log.read_text()}")

        # A second relay on the same file exits at once, saying who holds it and what to do
        second = _start_relay(app, second_log)
        assert second.wait(30) == EXIT_FATAL
        log = second_log.read_text()
        assert (f"another outbox relay already runs on the SQLite database "
                f"{app.settings.database_url} (host {socket.gethostname()} pid "
                f"{first.pid}; lock file {database}.relay-lock)") in log
        assert ("SQLite supports one relay (a second would publish every row twice): stop "
                "that one, or use PostgreSQL to run several") in log
        assert "outbox relay started" not in log

        # Once the first is gone (even killed), the next one starts
        first.kill()
        first.wait(10)
        third = _start_relay(app, third_log)
        wait_until(lambda: "outbox relay started" in third_log.read_text(), timeout_s=30,
                   message=lambda: f"the third relay; log:\n{third_log.read_text()}")
    finally:
        for process in (first, second, third):
            if process is not None:
                _stop(process)


def test_a_worker_beside_a_relay_runs_without_its_own_relay(
    app: App, tmp_path: Path, start_worker
) -> None:
    relay_log = tmp_path / "relay.log"
    relay = _start_relay(app, relay_log)
    try:
        wait_until(lambda: "outbox relay started" in relay_log.read_text(), timeout_s=30)

        worker = start_worker("-c", "1", relay=True, loglevel="INFO")

        wait_until(lambda: "the workers go on without it" in worker.log(), timeout_s=30,
                   message=lambda: f"the worker's relay refusal; log:\n{worker.log()}")
        log = worker.log()
        assert re.search(r"another outbox relay already runs on the SQLite database .* pid "
                         rf"{relay.pid};", log)
        assert "outbox relay cannot run (see above); the workers go on without it" in log
        assert worker.process.poll() is None  # the worker itself goes on
    finally:
        _stop(relay)
