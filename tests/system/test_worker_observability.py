"""Results, Prometheus metrics, health probes and JSON logs of a real `taskq worker`."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskq import App, TaskFailed
from taskq.results import ResultState
from tests import tasks
from tests.support.waiting import wait_until
from tests.system.workers import count_runs, send


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - local test URL
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture
def observed(app: App, start_worker: Callable[..., Any], tmp_path: Path) -> dict[str, Any]:
    app.create_tables()
    port = _free_port()
    health = tmp_path / "healthy"
    worker = start_worker(
        "-c", "2", "--metrics-port", str(port), "--health-file", str(health),
        "--log-format", "json", loglevel="INFO",
    )
    return {"worker": worker, "port": port, "health": health}


def test_results_metrics_health_and_json_logs(
    app: App, observed: dict[str, Any], runs: str
) -> None:
    worker, port = observed["worker"], observed["port"]
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _get(base + "/healthz")[0] == 200, timeout_s=30,
               message=lambda: f"never healthy; log:\n{worker.log()}")
    wait_until(lambda: observed["health"].exists(), timeout_s=10)

    # When tasks succeed, fail, and one is delivered twice
    sums = [send(app, tasks.add, n, n) for n in range(3)]
    failed = send(app, tasks.explode, runs)
    first = send(app, tasks.record, runs, "twice")
    wait_until(lambda: count_runs(runs) == 1, timeout_s=30)
    send(app, tasks.record, runs, "twice", task_id=first.id)

    # Then results are stored and readable through the handles
    assert [r.get(timeout_s=30) for r in sums] == [0, 2, 4]
    assert sums[0].state is ResultState.SUCCESS
    with pytest.raises(TaskFailed, match="ZeroDivisionError") as info:
        failed.get(timeout_s=30)
    assert info.value.state == "FAILURE"  # type: ignore[attr-defined]
    assert "the numbers did not add up" in info.value.remote_traceback  # type: ignore[attr-defined]

    # And metrics count them
    def scraped() -> str:
        return _get(base + "/metrics")[1]

    wait_until(lambda: _metric(scraped(), "taskq_duplicates_total") == 1, timeout_s=30,
               message=lambda: scraped())
    text = scraped()
    assert _metric(text, "taskq_tasks_total", task=tasks.add.name, outcome="succeeded") == 3
    assert _metric(text, "taskq_tasks_total", outcome="dead_lettered") == 1
    assert _metric(text, "taskq_dead_letters_total", error_type="ZeroDivisionError") == 1
    assert _metric(text, "taskq_task_duration_seconds_count", task=tasks.add.name) == 3
    assert _metric(text, "taskq_worker_processes_alive") == 2
    assert _metric(text, "taskq_outbox_backlog_rows") == 0

    # And the health file is fresh, and every task event is a JSON line with its fields
    assert time.time() - os.path.getmtime(observed["health"]) < 5
    events = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    succeeded = [e for e in events if e.get("task") == tasks.add.name and "duration_s" in e]
    assert len(succeeded) == 3
    assert all({"task_id", "queue", "attempt"} <= set(e) for e in succeeded)
    assert any(e.get("task_id") == failed.id and e["level"] == "ERROR" for e in events)


def test_a_dead_worker_process_counts_as_a_restart_and_health_recovers(
    app: App, observed: dict[str, Any]
) -> None:
    worker, base = observed["worker"], f"http://127.0.0.1:{observed['port']}"
    wait_until(lambda: _get(base + "/healthz")[0] == 200, timeout_s=30)
    wait_until(lambda: len(worker.children()) == 2, timeout_s=10)

    victim = sorted(worker.children())[0]
    os.kill(victim, 9)

    wait_until(lambda: "worker_process_restarts_total 1.0" in _get(base + "/metrics")[1],
               timeout_s=10)
    wait_until(lambda: _get(base + "/healthz")[0] == 200, timeout_s=30,
               message="the replacement never became healthy")
