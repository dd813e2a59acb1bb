"""Fixtures for ``taskq worker`` subprocess tests: start workers, send tasks, read runs.

Each test has its own namespace and queue (``<namespace>.default``), given to the worker
through ``TASKQ_*`` variables and to the in-test App by ``make_app``. Workers run in their
own session so that the finaliser can SIGKILL the whole tree (supervisor, worker processes,
multiprocessing's resource tracker) whatever the test did; it runs before ``make_app`` deletes
the queues, so no worker re-declares them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from taskq import App
from tests.conftest import BROKER_URL
from tests.system.workers import ROOT, Worker


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    """The test's own App: same namespace and default queue as its workers."""
    return make_app()


@pytest.fixture
def runs(tmp_path: Path) -> str:
    """Path of the file tasks append one line per run to."""
    return str(tmp_path / "runs.txt")


@pytest.fixture
def start_worker(
    app: App, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Worker]]:
    # The worker's outbox relay uses the same database as the test's App.
    """Factory: ``start_worker("-c", "2", env={...})`` runs ``taskq worker -A tests.tasks:app``."""
    workers: list[Worker] = []

    def start(
        *args: str, env: dict[str, str] | None = None, loglevel: str = "DEBUG",
        relay: bool = False, app_path: str = "tests.tasks:app",
    ) -> Worker:
        # Most tests count worker processes; the relay process is opt-in for them.
        if not relay and "--relay" not in args and "--no-relay" not in args:
            args = (*args, "--no-relay")
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")},
            "PYTHONPATH": str(ROOT),
            "TASKQ_BROKER_URL": BROKER_URL,
            "TASKQ_NAMESPACE": namespace,
            "TASKQ_DEFAULT_QUEUE": app.settings.default_queue,
            "TASKQ_DATABASE_URL": app.settings.database_url,
            **(env or {}),
        }
        log_path = tmp_path / f"worker-{len(workers) + 1}.log"
        command = [
            sys.executable, "-m", "taskq", "worker", "-A", app_path,
            "--loglevel", loglevel, *args,
        ]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(process, log_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.kill_tree()
