"""`taskq worker` when its supervisor is killed or a process dies of an unusual signal."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from taskq import App
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may never be reaped here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_relay_process_dies_with_a_sigkilled_supervisor(app: App, start_worker) -> None:
    # Given a worker with its outbox relay running
    app.create_tables()
    worker = start_worker("-c", "1", relay=True)
    worker.wait_consuming(1)
    wait_until(lambda: "outbox relay started" in worker.log(), timeout_s=20,
               message=lambda: f"relay start; log:\n{worker.log()}")
    match = re.search(r"started outbox relay process \(pid (\d+)\)", worker.log())
    assert match is not None, worker.log()
    relay_pid = int(match[1])
    assert _running(relay_pid)

    # When the supervisor is SIGKILLed (no chance to stop its processes)
    worker.signal(signal.SIGKILL)
    worker.wait(10)

    # Then the relay process does not go on publishing as an orphan
    wait_until(lambda: not _running(relay_pid), timeout_s=15,
               message=lambda: f"relay pid {relay_pid} still running; log:\n{worker.log()}")


def test_a_process_killed_by_a_real_time_signal_is_reported_and_replaced(
    app: App, start_worker
) -> None:
    # Given two worker processes
    worker = start_worker("-c", "2")
    worker.wait_consuming(2)
    before = worker.children()
    assert len(before) == 2
    victim = min(before)

    # When one is killed by a real-time signal (SIGRTMIN+4 is 38 with glibc), which has no
    # name in the signal module
    os.kill(victim, signal.SIGRTMIN + 4)

    # Then it is reported and replaced, and the supervisor and the other process go on
    wait_until(lambda: len(worker.children()) == 2 and victim not in worker.children(),
               timeout_s=20, message=lambda: f"replacement; log:\n{worker.log()}")
    assert worker.process.poll() is None
    assert (before - {victim}) <= worker.children()
    wait_until(lambda: "died (signal SIGRTMIN+4)" in worker.log(),
               message=lambda: worker.log())
