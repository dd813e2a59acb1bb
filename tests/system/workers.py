"""Helpers for ``taskq worker`` subprocess tests: a worker handle, sending, counting runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from taskq import App
from taskq.results import AsyncResult
from taskq.task import Task
from tests.support.waiting import wait_until
from tests.tasks import read_lines

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """A running ``taskq worker`` subprocess and its log file."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The supervisor's pid."""
        return self.process.pid

    def log(self) -> str:
        """Everything the worker logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def children(self) -> set[int]:
        """Pids of the live worker processes (not multiprocessing's resource tracker)."""
        pids = set()
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (task / "children").read_text().split())
        return {pid for pid in pids if _is_worker_process(pid)}

    def wait_consuming(self, processes: int, timeout_s: float = 20.0) -> None:
        """Wait until ``processes`` worker processes have connected and consume."""
        wait_until(
            lambda: self.log().count("connected to the broker") >= processes,
            timeout_s=timeout_s,
            message=lambda: f"{processes} consuming processes; log:\n{self.log()}",
        )

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the supervisor."""
        self.process.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        """Wait for the supervisor to exit; return its exit status."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker did not exit within {timeout_s}s; log:\n{self.log()}"
            ) from None

    def kill_tree(self) -> None:
        """SIGKILL the supervisor's whole session (used by the finaliser)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


def _is_worker_process(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"spawn_main" in cmdline and b"resource_tracker" not in cmdline


def send(app: App, task: Task[Any, Any], *args: Any, **options: Any) -> AsyncResult:
    """Publish a call of ``task`` (a :mod:`tests.tasks` task) through the test's App."""
    bound: Task[Any, Any] = Task(app, task.fn, name=task.name, options=task.options)
    return bound.apply_async(args, **options)


def count_runs(path: str, word: str = "ran") -> int:
    """How many lines of ``path`` start with ``word``."""
    return sum(1 for line in read_lines(path) if line[0] == word)


def send_many(app: App, task: Task[Any, Any], calls: list[tuple[Any, ...]]) -> list[str]:
    """Publish many calls of ``task`` with windowed confirms; return their task ids."""
    from taskq.message import encode

    bound: Task[Any, Any] = Task(app, task.fn, name=task.name, options=task.options)
    envelopes = [bound.envelope(args) for args in calls]
    app.publisher.publish_many(
        (app.topology.exchange, bound.queue, encode(envelope)) for envelope in envelopes
    )
    return [envelope.task_id for envelope in envelopes]


def dead_letters(broker: Any, queue: str, count: int, timeout_s: float = 20.0) -> dict[str, Any]:
    """Wait for ``count`` messages in ``queue``'s ``.dlq``; return them by message id."""
    from taskq.broker.topology import dlq_name

    wait_until(
        lambda: broker.depth(dlq_name(queue)) >= count,
        timeout_s=timeout_s,
        message=f"{count} dead letters in {dlq_name(queue)}",
    )
    return {props.message_id: (props, body) for _, props, body in broker.get_all(dlq_name(queue))}


def declare_topology(app: App) -> None:
    """Declare the app's exchanges and default queue, as a worker would at start."""
    from taskq.broker.connection import declare, open_connection

    connection = open_connection(app.settings, client_name="taskq tests")
    try:
        channel = declare(connection.channel(), app.topology.base())
        declare(channel, app.topology.for_queue(app.settings.default_queue))
    finally:
        connection.close()
