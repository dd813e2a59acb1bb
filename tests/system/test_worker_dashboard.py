"""``taskq worker --dashboard-port``: what the supervisor refuses before it starts anything.

The dashboard served by a worker is driven in a browser in tests/browser.
"""

from __future__ import annotations

import socket
from typing import Any

APP_PATH = "tests.tasks_dashboard:app"


def test_a_busy_dashboard_port_stops_the_worker_before_any_process_starts(
    start_worker: Any
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        worker = start_worker("-c", "1", "--dashboard-port", str(port), app_path=APP_PATH,
                              loglevel="INFO")
        code = worker.wait(30)
    assert code != 0
    assert (f"cannot serve the dashboard on 127.0.0.1:{port}: the address is in use"
            in worker.log())
    assert "connected to the broker" not in worker.log()


def test_a_non_loopback_dashboard_without_a_token_is_refused(start_worker: Any) -> None:
    worker = start_worker("--dashboard-port", "0", "--dashboard-host", "0.0.0.0",
                          app_path=APP_PATH, loglevel="INFO")
    assert worker.wait(30) != 0
    assert "refusing to serve the dashboard on 0.0.0.0" in worker.log()
    assert "set TASKQ_DASHBOARD_TOKEN (or --token for taskq dashboard" in worker.log()
