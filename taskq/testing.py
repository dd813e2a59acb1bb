"""Helpers for testing code that uses taskq: eager mode and a real worker fixture.

Unit tests, no broker: run enqueued tasks in-process, synchronously.

.. code-block:: python

    from taskq.testing import eager

    def test_checkout_sends_a_receipt():
        with eager(app):
            checkout(cart)              # send_receipt.delay(...) runs right here

Or set ``task_always_eager`` (``TASKQ_TASK_ALWAYS_EAGER=1``, Flask's
``TASKQ_TASK_ALWAYS_EAGER = True``, Django's ``TASKQ = {..., "task_always_eager": True}``).
Each call is encoded and decoded as on its way through RabbitMQ: an argument msgpack cannot
carry raises ``SerializationError`` and an oversized call ``MessageTooLarge``, at the
``delay()``; the task receives what a worker would (tuples as lists). A direct ``delay()``
runs the task at once and its exception propagates; a ``delay()`` through the outbox (a
``session``, a Flask request, Django's ``atomic()``) runs it after the transaction commits,
never if it rolls back (details: :mod:`taskq.eager`). Under Django's ``TestCase`` the
transaction never commits: use ``self.captureOnCommitCallbacks(execute=True)``.

Integration tests, real broker: ``pytest_plugins = ["taskq.testing"]`` in the root
``conftest.py`` provides the ``taskq_worker`` fixture, a ``taskq worker`` subprocess for
the App named by the ``taskq_app`` ini option (or an overridden ``taskq_app_path`` fixture).
It inherits the environment, so ``TASKQ_*`` variables reach it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.app import App

__all__ = ["WorkerProcess", "eager", "start_worker"]

# What each worker process logs once consuming (taskq.broker.subscription).
_READY_LINE = "connected to the broker"


@contextlib.contextmanager
def eager(app: App) -> Iterator[App]:
    """Run ``app``'s enqueued tasks in-process while the block runs (``task_always_eager``).

    Yields:
        ``app``, in eager mode; the previous mode is restored afterwards.
    """
    previous = app.settings.task_always_eager
    app.configure(task_always_eager=True)
    try:
        yield app
    finally:
        app.configure(task_always_eager=previous)


class WorkerProcess:
    """A running ``taskq worker`` subprocess (its own session) and its log file.

    Args:
        process: The supervisor process.
        log_path: File receiving its stdout and stderr.
    """

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    def __repr__(self) -> str:
        return f"<WorkerProcess pid={self.process.pid} log={self.log_path}>"

    def log(self) -> str:
        """Everything the worker logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, processes: int = 1, timeout_s: float = 30.0) -> None:
        """Wait until ``processes`` worker processes consume.

        Raises:
            AssertionError: the worker exited or was not ready in time (with its log).
        """
        self.wait_for(lambda: self.log().count(_READY_LINE) >= processes, timeout_s=timeout_s)

    def wait_for(self, predicate: Callable[[], object], timeout_s: float = 30.0) -> None:
        """Poll ``predicate`` until it is true while the worker runs.

        Raises:
            AssertionError: the worker exited, or ``timeout_s`` passed (with its log).
        """
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"taskq worker exited with status {self.process.returncode}; "
                    f"log:\n{self.log()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"not true after {timeout_s}s; worker log:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int:
        """Warm shutdown (SIGTERM) and wait; kill the process group if it takes longer.

        Returns:
            The supervisor's exit status.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (supervisor and worker processes)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def start_worker(
    app_path: str,
    *args: str,
    log_path: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    """Start ``taskq worker -A app_path *args`` with this interpreter, in a new session.

    Args:
        app_path: ``module:app`` (or ``module:extension`` for Flask).
        *args: More ``taskq worker`` options, e.g. ``"-c", "2"``.
        log_path: Where its output goes.
        cwd: Working directory; its modules are importable by the worker.
        env: Variables added to this process's environment.
    """
    cwd = cwd or Path.cwd()
    environment = {**os.environ, **(env or {})}
    paths = [str(cwd), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    command = [sys.executable, "-m", "taskq", "worker", "-A", app_path, *args]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=environment, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(process, log_path)


if importlib.util.find_spec("pytest") is not None:
    import pytest

    def pytest_addoption(parser: pytest.Parser) -> None:
        """The ``taskq_app`` ini option: ``module:app`` for the ``taskq_worker`` fixture."""
        parser.addini("taskq_app", "module:app of the taskq App the taskq_worker fixture runs")

    @pytest.fixture
    def taskq_app_path(request: pytest.FixtureRequest) -> str:
        """``module:app`` for ``taskq_worker``: the ``taskq_app`` ini option; override freely."""
        try:
            path = str(request.config.getini("taskq_app") or "")
        except ValueError:  # the plugin's ini option is not registered
            path = ""
        if not path:
            pytest.fail(
                "taskq_worker needs the App: set `taskq_app = module:app` in the pytest ini "
                "options or override the taskq_app_path fixture"
            )
        return path

    @pytest.fixture
    def taskq_worker_args() -> Sequence[str]:
        """Extra ``taskq worker`` options (default: one process); override freely."""
        return ("-c", "1")

    @pytest.fixture
    def taskq_worker(
        request: pytest.FixtureRequest,
        tmp_path: Path,
        taskq_app_path: str,
        taskq_worker_args: Sequence[str],
    ) -> Iterator[WorkerProcess]:
        """A real ``taskq worker`` against the real broker, consuming when the test starts.

        Stopped warmly afterwards (then killed, if need be). Its log is
        ``taskq_worker.log()``; ``taskq_worker.wait_for(predicate)`` polls while it runs.
        """
        worker = start_worker(
            taskq_app_path,
            *taskq_worker_args,
            log_path=tmp_path / "taskq-worker.log",
            cwd=Path(str(request.config.rootpath)),
        )
        try:
            worker.wait_ready(_processes(taskq_worker_args))
            yield worker
        finally:
            worker.stop(timeout_s=15.0)
            worker.kill()


def _processes(args: Sequence[str]) -> int:
    """How many worker processes ``-c N`` / ``--concurrency N`` asks for (0: one per CPU)."""
    items = list(args)
    for flag in ("-c", "--concurrency"):
        if flag in items[:-1]:
            count = int(items[items.index(flag) + 1])
            return count or (os.cpu_count() or 1)
    return os.cpu_count() or 1
